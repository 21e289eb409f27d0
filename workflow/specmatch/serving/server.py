"""The server manager: each server session starts once, cells attach to it, nothing is orphaned.

Why not Snakemake service() jobs (tried with Snakemake 9): a service job that runs on every
invocation marks all consumers as updated, so one changed cell would rerun every cell. Instead a
cell (or the launch step) calls `attach()`, which reuses the running server when its configuration
hash and session (the repeat it belongs to) match, and otherwise stops it (waiting until it has
exited and released the accelerator) and starts the needed one. That no two cells load the
machine at once is the workflow's business: the `serving_slot` resource of the launch and cell
rules (workflow/rules/cells.smk).

A server outlives the job that started it so the next cell can reuse it. Its parent is a watchdog
process (specmatch.serving.watchdog), which stops it when the owning Snakemake process dies (Ctrl-C,
SIGKILL), when no cell has used it for `idle_timeout_s`, or when asked, and which records the
server's exit status if it dies, so a cell can say why its requests failed. Servers run in their
own process group, so the whole tree (API server, engine core workers) is signalled together.

State lives in one folder (default results/.servers/<host>): current.json, lease, exit.json.
    python -m specmatch server status|stop [--state-dir DIR]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from .engines import LaunchPlan, get_engine, redact_argv, redact_env
from ..files import WORKFLOW_DIR, SpecmatchError, stable_hash, write_json


def session_of(repeat: int) -> str:
    """The server session a repeat's cells share: each repeat gets a fresh server."""
    return f"r{repeat}"


def default_state_dir() -> Path:
    """One state folder per host (and per SLURM allocation): servers bind to their node's loopback,
    so two allocations must never share a slot lock or a current-server record."""
    if os.environ.get("SPECMATCH_STATE_DIR"):
        return Path(os.environ["SPECMATCH_STATE_DIR"])
    name = socket.gethostname() or "localhost"
    if os.environ.get("SLURM_JOB_ID"):
        name += f"-slurm{os.environ['SLURM_JOB_ID']}"
    return Path("results/.servers") / name


OWNER_ENV = "SPECMATCH_OWNER_PID"
START_MARKER = "=== specmatch: starting "  # each session's first line in the server log


def pid_alive(pid: int | None) -> bool:
    """Whether a process runs; a zombie counts as dead, so a crashed server is never taken for live."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill(0); treat it as dead
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return True


def free_port(host: str, low: int = 20000, high: int = 32767) -> int:
    """A free port below the kernel's ephemeral range (32768+ on Linux), chosen at random.

    Why not bind(0): that hands out an ephemeral port, which the kernel may give to any outgoing
    connection (or another server) in the minute before the engine binds it; a foreign process
    answering /health on "our" port would look like a healthy server."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(low, high)
        with socket.socket(fam, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise SpecmatchError(f"no free port on {host} between {low} and {high}")


def config_hash(server_cfg: dict, max_batch: int) -> str:
    """Identity of a running server: what would make it behave differently."""
    plan = get_engine(server_cfg).launch_plan(port=0, max_batch=max_batch)
    return stable_hash({"argv": plan.argv, "env": plan.env})


@dataclass
class Attached:
    name: str
    base_url: str
    pid: int | None
    config_hash: str
    reused: bool
    startup_s: float | None
    plan_argv: list[str]
    plan_env: dict
    log: str | None
    session: str = ""


class Check:
    """A check run in a background thread: `raise_if_refused` raises its error once it has failed
    (without waiting), `wait` waits for it and raises its error."""

    def __init__(self, fn, *args):
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn, *args), daemon=True)
        self.thread.start()

    def _run(self, fn, *args) -> None:
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 (raised again in the caller's thread)
            self.error = e

    def raise_if_refused(self) -> None:
        if not self.thread.is_alive() and self.error is not None:
            raise self.error

    def wait(self) -> None:
        while self.thread.is_alive():  # in short joins: a Ctrl-C handled in another thread still gets through
            self.thread.join(0.2)
        if self.error is not None:
            raise self.error


class Manager:
    def __init__(self, state_dir: Path | str | None = None):
        self.dir = Path(state_dir) if state_dir else default_state_dir()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.current = self.dir / "current.json"
        self.lease = self.dir / "lease"

    # -- state ------------------------------------------------------------------------------
    def read_current(self) -> dict | None:
        try:
            return json.loads(self.current.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def touch(self) -> None:
        self.lease.touch()

    def read_exit(self, pid: int | None) -> dict | None:
        """How server `pid` ended (written by its watchdog), or None if it has not."""
        try:
            rec = json.loads((self.dir / "exit.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return rec if pid and rec.get("pid") == pid else None

    def death_notice(self, att: Attached, wait_s: float = 2.0) -> str | None:
        """If the attached server has died (or dies within `wait_s`: a server that is exiting has
        already closed its sockets): its exit status and the tail of its log."""
        if att.pid is None:
            return None
        deadline = time.time() + wait_s
        while pid_alive(att.pid):
            if time.time() > deadline:
                return None
            time.sleep(0.05)
        rec = None
        for _ in range(20):  # the watchdog writes the record a moment after the exit
            rec = self.read_exit(att.pid)
            if rec:
                break
            time.sleep(0.1)
        how = describe_exit(rec) if rec else "exit status unknown (its watchdog recorded none)"
        return f"server {att.name} (pid {att.pid}) died: {how}; last lines of {att.log}:\n{tail(att.log)}"

    # -- lifecycle --------------------------------------------------------------------------
    def stop_current(self, reason: str = "stop", grace_s: float = 30.0) -> dict | None:
        cur = self.read_current()
        if not cur:
            return None
        stop_process_group(cur.get("pgid") or cur.get("pid"), grace_s)
        wd = cur.get("watchdog_pid")
        if wd and wd != os.getpid() and pid_alive(wd):
            with contextlib.suppress(ProcessLookupError):
                os.kill(wd, signal.SIGTERM)
            deadline = time.time() + 10  # it records the exit and leaves: nothing outlives a stop
            while pid_alive(wd) and time.time() < deadline:
                time.sleep(0.05)
        with contextlib.suppress(FileNotFoundError):
            self.current.unlink()
        cur["stopped"] = reason
        return cur

    def healthy(self, base_url: str, engine, timeout: float = 5.0) -> bool:
        try:
            return requests.get(base_url + engine.health_path, timeout=timeout).status_code == 200
        except requests.RequestException:
            return False

    def attach(self, name: str, server_cfg: dict, max_batch: int, log_path: Path | None = None,
               session: str = "") -> Attached:
        """Make `name` (in `session`, e.g. the repeat "r2") the running server: reuse or (re)start."""
        engine = get_engine(server_cfg)
        if not engine.launches:
            base = engine.base_url()
            return Attached(name, base, None, stable_hash(server_cfg), True, None, [], {}, None, session)
        chash = config_hash(server_cfg, max_batch)
        cur = self.read_current()
        if cur and cur.get("config_hash") == chash and cur.get("session", "") == session \
                and pid_alive(cur.get("pid")) and self.healthy(cur["base_url"], engine):
            self.touch()
            return Attached(name, cur["base_url"], cur["pid"], chash, True, cur.get("startup_s"),
                            cur["argv"], cur["env"], cur.get("log"), session)
        if cur:
            self.stop_current(reason=f"replaced by {name} {session}".strip())
        return self._start(name, server_cfg, engine, chash, max_batch, log_path, session)

    def _start(self, name, server_cfg, engine, chash, max_batch, log_path, session) -> Attached:
        # What needs the engine's own code (vLLM: its speculative config's keys, read by importing vLLM:
        # about 12 s of one core) runs beside the start-up, whose imports leave the other core idle; a
        # refusal stops the server before anything is measured (and as soon as it is known).
        checked = Check(engine.validate, self.dir)
        host = server_cfg.get("host", "127.0.0.1")
        port = server_cfg.get("port") or free_port(host)
        plan: LaunchPlan = engine.launch_plan(port=port, max_batch=max_batch)
        log_path = Path(log_path or self.dir / f"{name}.log")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(plan.env)
        t0 = time.time()
        with open(log_path, "ab") as log:
            log.write(f"\n{START_MARKER}{name} {session} at {time.strftime('%Y-%m-%dT%H:%M:%S')}: "
                      f"{' '.join(redact_argv(plan.argv))}\n".encode())
        self.touch()
        idle = float(server_cfg.get("idle_timeout_s", 900))
        owner = os.environ.get(OWNER_ENV)
        # The watchdog starts the server as its own child: it reaps it and records how it ended.
        wd_argv = [sys.executable, "-m", "specmatch.serving.watchdog", "--state-dir", str(self.dir), "--idle", str(idle),
                   "--log", str(log_path)] + (["--owner", owner] if owner else []) + ["--", *plan.argv]
        env["PYTHONPATH"] = os.pathsep.join([str(WORKFLOW_DIR)] +
                                            [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        wd = subprocess.Popen(wd_argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=open(self.dir / "watchdog.log", "ab"), start_new_session=True, env=env)
        line = wd.stdout.readline()
        wd.stdout.close()
        try:
            pid = int(json.loads(line)["pid"])
        except (ValueError, KeyError, TypeError):
            wd.wait(10)
            raise SpecmatchError(f"server {name}: the watchdog could not start it (exit {wd.returncode}); see "
                                 f"{self.dir / 'watchdog.log'}") from None
        state = {"name": name, "session": session, "config_hash": chash, "pid": pid, "pgid": pid,
                 "base_url": plan.base_url, "argv": redact_argv(plan.argv), "env": redact_env(plan.env),
                 "log": str(log_path), "watchdog_pid": wd.pid, "started_at": t0, "startup_s": None,
                 "owner_pid": int(owner) if owner else None}
        write_json(self.current, state)
        att = Attached(name, plan.base_url, pid, chash, False, None, state["argv"], state["env"], str(log_path),
                       session)
        timeout = float(server_cfg.get("startup_timeout_s", 1200))
        try:
            while True:
                checked.raise_if_refused()
                if not pid_alive(pid):
                    raise SpecmatchError(f"server {name} exited during start-up: " + self.death_notice(att))
                if self.healthy(plan.base_url, engine, timeout=2):
                    time.sleep(0.2)
                    if not pid_alive(pid):
                        raise SpecmatchError(f"{self.death_notice(att)}\n(although {plan.base_url} answered: is "
                                             "another process using that port?)")
                    break
                if time.time() - t0 > timeout:
                    raise SpecmatchError(f"server {name} not healthy after {timeout:g} s "
                                         f"(servers.{name}.startup_timeout_s); last lines of {log_path}:\n{tail(log_path)}")
                self.touch()
                time.sleep(1.0)
            checked.wait()
        except BaseException:
            self.stop_current(reason="start-up failed")
            raise
        state["startup_s"] = att.startup_s = round(time.time() - t0, 2)
        write_json(self.current, state)
        self.touch()
        return att


def describe_exit(rec: dict) -> str:
    """"exit status 1", or "killed by signal 9 (SIGKILL)", and why the watchdog stopped it if it did."""
    rc = rec.get("returncode")
    if rc is None:
        how = "exit status unknown"
    elif rc < 0:
        try:
            how = f"killed by signal {-rc} ({signal.Signals(-rc).name})"
        except ValueError:
            how = f"killed by signal {-rc}"
    else:
        how = f"exit status {rc}"
    return how + (f", stopped by its watchdog ({rec['stopped']})" if rec.get("stopped") else "")


def stop_process_group(pgid: int | None, grace_s: float = 30.0) -> None:
    """SIGTERM the group, wait, SIGKILL what is left; returns when every member is gone."""
    if not pgid:
        return
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + grace_s
    while time.time() < deadline:
        if not group_alive(pgid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    for _ in range(50):
        if not group_alive(pgid):
            return
        time.sleep(0.1)


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process of the group exists."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                fields = fh.read().rsplit(") ", 1)[1].split()
        except (FileNotFoundError, IndexError, ProcessLookupError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def tail(path: Path | str | None, lines: int = 40) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except (FileNotFoundError, TypeError):
        return "(no log)"


class LeaseKeeper:
    """Touches the lease while a cell runs, and exits the process if the owning Snakemake dies."""

    def __init__(self, manager: Manager, interval: float = 2.0):
        self.manager, self.interval = manager, interval
        self._stop = threading.Event()
        self.owner = int(os.environ[OWNER_ENV]) if os.environ.get(OWNER_ENV, "").isdigit() else None
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(self.interval):
            self.manager.touch()
            if self.owner and not pid_alive(self.owner):
                print("specmatch: the Snakemake process that owns this job is gone; aborting the cell",
                      file=sys.stderr, flush=True)
                os._exit(3)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.manager.touch()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specmatch server", description="Inspect or stop the managed server.")
    p.add_argument("action", choices=["status", "stop"])
    p.add_argument("--state-dir", type=Path, default=None, help="default: results/.servers/<host>")
    a = p.parse_args(argv)
    m = Manager(a.state_dir)
    if a.action == "status":
        cur = m.read_current()
        print(json.dumps(cur, indent=2) if cur else "no server running")
    else:
        cur = m.stop_current(reason="asked")
        print(f"stopped {cur['name']} (pid {cur['pid']})" if cur else "no server running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
