"""The parent of a managed server: starts it, stops it when nobody needs it, and records how it ended.

Runs in its own session. It starts the server (the argv after `--`) as its child in a process group
of its own, prints `{"pid": N}` on stdout for the server manager, and then stops the whole group
when the owning Snakemake process has died (Ctrl-C, SIGKILL, a crashed run), when no cell has
touched the lease for `--idle` seconds, or when it is itself terminated. Because it is the parent,
it learns the server's exit status: `exit.json` in the state folder says how the server ended, so
a cell whose requests fail can say that the server died, and how.

    python -m specmatch watchdog --state-dir DIR --log server.log [--owner PID] [--idle S] -- ARGV...
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from ..files import write_json
from .server import pid_alive, stop_process_group


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m specmatch watchdog [options] -- SERVER_ARGV...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m specmatch watchdog")
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--owner", type=int)
    p.add_argument("--idle", type=float, default=900.0)
    p.add_argument("--interval", type=float, default=1.0)
    a = p.parse_args(argv[:cut])
    server_argv = argv[cut + 1:]
    lease, current = a.state_dir / "lease", a.state_dir / "current.json"
    with open(a.log, "ab") as log:
        proc = subprocess.Popen(server_argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    print(json.dumps({"pid": proc.pid}), flush=True)
    sys.stdout.close()
    stopped: list[str] = []

    def log_line(msg):
        print(f"{time.strftime('%H:%M:%S')} watchdog[{os.getpid()}] server {proc.pid}: {msg}", file=sys.stderr,
              flush=True)

    def finish() -> int:
        rc = proc.wait()
        write_json(a.state_dir / "exit.json", {"pid": proc.pid, "returncode": rc, "at": time.time(),
                                                "stopped": stopped[0] if stopped else None})
        try:
            cur = json.loads(current.read_text())
            if cur.get("pid") == proc.pid:
                current.unlink()
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        log_line(f"exited with {rc}" + (f" ({stopped[0]})" if stopped else ""))
        return 0

    def stop(reason):
        if not stopped:
            stopped.append(reason)
            log_line(f"stopping ({reason})")
            stop_process_group(proc.pid, grace_s=20.0)
        sys.exit(finish())

    signal.signal(signal.SIGTERM, lambda *_: stop("watchdog terminated"))
    signal.signal(signal.SIGINT, lambda *_: stop("watchdog interrupted"))
    while True:
        if proc.poll() is not None:
            stop_process_group(proc.pid, grace_s=5.0)  # what it left behind in its group
            return finish()
        if a.owner and not pid_alive(a.owner):
            stop(f"owner process {a.owner} is gone")
        try:
            idle = time.time() - lease.stat().st_mtime
        except FileNotFoundError:
            idle = 0.0
        if idle > a.idle:
            stop(f"idle for {idle:.0f} s")
        time.sleep(a.interval)


if __name__ == "__main__":
    sys.exit(main())
