"""Stops a managed server when nobody needs it any more.

Runs in its own session beside the server. It stops the server's process group when the owning
Snakemake process has died (Ctrl-C, SIGKILL, a crashed run), when no cell has touched the lease for
`--idle` seconds, or when it is itself terminated; it exits when the server exits.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from .server import pid_alive, stop_process_group


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specmatch.watchdog")
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--owner", type=int)
    p.add_argument("--idle", type=float, default=900.0)
    p.add_argument("--interval", type=float, default=1.0)
    a = p.parse_args(argv)
    lease, current = a.state_dir / "lease", a.state_dir / "current.json"

    def log(msg):
        print(f"{time.strftime('%H:%M:%S')} watchdog[{os.getpid()}] server {a.pid}: {msg}", file=sys.stderr, flush=True)

    def stop(reason):
        log(f"stopping ({reason})")
        stop_process_group(a.pid, grace_s=20.0)
        try:
            cur = json.loads(current.read_text())
            if cur.get("pid") == a.pid:
                current.unlink()
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        sys.exit(0)

    signal.signal(signal.SIGTERM, lambda *_: stop("watchdog terminated"))
    signal.signal(signal.SIGINT, lambda *_: stop("watchdog interrupted"))
    while True:
        if not pid_alive(a.pid):
            stop("server exited")
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
