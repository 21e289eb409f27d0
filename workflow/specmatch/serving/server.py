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
    python -m specmatch server status|stop|clean [--state-dir DIR]

On SLURM (profiles/slurm) each allocation has its own folder, results/.servers/<host>-slurm<jobid>,
and its server ends with it: SLURM ends every process of a job, and the watchdog stops the server as
soon as the allocation's Snakemake (its owner) is gone. What the workflow does when it ends
(`end_of_run`) is therefore to stop this host's server and to remove the folders of allocations
that have ended; a step stopped by SLURM (scancel, time limit) says so in its log (specmatch.ending; `LeaseKeeper` for a
cell mid-measurement).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
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
from ..ending import die_saying, termination_cause
from ..files import WORKFLOW_DIR, SpecmatchError, stable_hash, write_json


def session_of(repeat: int) -> str:
    """The server session a repeat's cells share: each repeat gets a fresh server."""
    return f"r{repeat}"


STATE_ROOT = Path("results/.servers")
ALLOCATION_DIR = re.compile(r"^(?P<host>.+)-slurm(?P<job>\d+)$")   # <host>-slurm<jobid>


def default_state_dir() -> Path:
    """One state folder per host (and per SLURM allocation): servers bind to their node's loopback,
    so two allocations must never share a slot lock or a current-server record."""
    if os.environ.get("SPECMATCH_STATE_DIR"):
        return Path(os.environ["SPECMATCH_STATE_DIR"])
    name = socket.gethostname() or "localhost"
    if os.environ.get("SLURM_JOB_ID"):
        name += f"-slurm{os.environ['SLURM_JOB_ID']}"
    return STATE_ROOT / name


# SLURM job states in which a job may still have processes (squeue --states=all; the others are final)
SLURM_ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING",
                          "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SIGNALING", "STAGE_OUT", "STOPPED"})


def slurm_job_states(job_ids: list[str], timeout: float = 30.0) -> dict[str, str]:
    """{job id: state} of the given jobs as squeue knows them (finished jobs stay known for MinJobAge
    seconds; a job squeue no longer lists has ended long ago). Raises OSError or
    subprocess.SubprocessError when squeue cannot be asked."""
    if not job_ids:
        return {}
    r = subprocess.run(["squeue", "--noheader", "--states=all", "--format=%i %T"], capture_output=True,
                       text=True, timeout=timeout)
    if r.returncode != 0:
        raise subprocess.SubprocessError(f"squeue exit {r.returncode}: {r.stderr.strip()[-300:]}")
    states = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return {j: states[j] for j in job_ids if j in states}


def allocation_dirs(root: Path = STATE_ROOT) -> dict[str, Path]:
    """{SLURM job id: state folder} of every allocation that kept its server state under `root`."""
    out = {}
    if root.is_dir():
        for d in sorted(root.iterdir()):
            m = ALLOCATION_DIR.match(d.name)
            if m and d.is_dir():
                out[m.group("job")] = d
    return out


def clean_allocations(root: Path = STATE_ROOT, wait_s: float = 30.0, states=slurm_job_states) -> list[str]:
    """Remove the server state of SLURM allocations that have ended; returns what it did, in lines.

    Their servers are gone (SLURM ends every process of a job; the watchdog ends the server with the
    allocation's Snakemake), so their folders only record how the last server ended, which the cells'
    logs already say. An allocation still pending or running keeps its folder (its server ends with
    it); one still COMPLETING is waited for up to `wait_s`. Nothing is removed when SLURM cannot be
    asked."""
    dirs = allocation_dirs(root)
    if not dirs:
        return []
    deadline = time.time() + wait_s
    while True:
        try:
            known = states(list(dirs))
        except (OSError, subprocess.SubprocessError) as exc:
            return [f"kept the server state of {len(dirs)} SLURM allocation(s) under {root}: cannot ask SLURM "
                    f"which have ended ({exc})"]
        active = {j: st for j, st in known.items() if st in SLURM_ACTIVE}
        if not any(st == "COMPLETING" for st in active.values()) or time.time() > deadline:
            break
        time.sleep(1.0)
    ended = [j for j in dirs if j not in active]
    for j in ended:
        shutil.rmtree(dirs[j], ignore_errors=True)
    lines = []
    if ended:
        lines.append(f"removed the server state of {len(ended)} ended SLURM allocation(s) "
                     f"({', '.join(ended)}): their servers ended with them")
    if active:
        lines.append("kept the server state of SLURM allocation(s) still "
                     + ", ".join(f"{j} {st}" for j, st in active.items())
                     + ": each one's server ends with it")
    return lines


def end_of_run(root: Path = STATE_ROOT) -> list[str]:
    """What the workflow does when it ends, fails or is interrupted (Snakemake's onsuccess/onerror, in
    the Snakemake that was started, never in a job): stop the server this host runs, if any, and
    clean up after SLURM allocations (`clean_allocations`). Returns what it did, in lines."""
    lines = []
    here = default_state_dir()
    if here.is_dir():   # never create the folder: a cluster run starts no server on this host
        cur = Manager(here).stop_current(reason="workflow finished")
        if cur:
            lines.append(f"stopped server {cur['name']} (pid {cur['pid']})")
    lines += clean_allocations(root)   # an allocation still running (this one, if any) keeps its folder
    return lines


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
    """Touches the lease while a cell runs, exits the process if the owning Snakemake dies, and, when
    the cell is terminated (SIGTERM: SLURM ending its allocation, or anyone), says why in the cell's
    log before it dies of that signal."""

    def __init__(self, manager: Manager, interval: float = 2.0):
        self.manager, self.interval = manager, interval
        self._stop = threading.Event()
        self.owner = int(os.environ[OWNER_ENV]) if os.environ.get(OWNER_ENV, "").isdigit() else None
        self._t = threading.Thread(target=self._run, daemon=True)
        self._previous = None

    def _run(self):
        while not self._stop.wait(self.interval):
            self.manager.touch()
            if self.owner and not pid_alive(self.owner):
                print("specmatch: the Snakemake process that owns this job is gone; aborting the cell",
                      file=sys.stderr, flush=True)
                os._exit(3)

    @staticmethod
    def _terminated(signum, frame):
        die_saying(signum, f"specmatch: the cell was {termination_cause(signum)}; it is aborted and writes no result")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._terminated)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        self.manager.touch()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specmatch server", description="Inspect or stop the managed server.")
    p.add_argument("action", choices=["status", "stop", "clean"],
                   help="status: this host's server and the SLURM allocations' state; stop: stop this host's "
                        "server; clean: remove the state of SLURM allocations that have ended")
    p.add_argument("--state-dir", type=Path, default=None, help="default: results/.servers/<host>")
    a = p.parse_args(argv)
    if a.action == "clean":
        for line in clean_allocations(STATE_ROOT) or ["no SLURM allocation state under " + str(STATE_ROOT)]:
            print(line)
        return 0
    m = Manager(a.state_dir)
    if a.action == "status":
        cur = m.read_current()
        print(json.dumps(cur, indent=2) if cur else "no server running")
        allocs = allocation_dirs(STATE_ROOT) if a.state_dir is None else {}
        if allocs:
            print(f"SLURM allocations with server state: {', '.join(allocs)} (each one's server runs on its "
                  "node and ends with it; `clean` removes those that have ended)")
    else:
        cur = m.stop_current(reason="asked")
        print(f"stopped {cur['name']} (pid {cur['pid']})" if cur else "no server running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
