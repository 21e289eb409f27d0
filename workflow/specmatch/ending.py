"""Why a step was stopped, said in its own log before it dies: a SIGTERM is how SLURM ends an
allocation (scancel, time limit, preemption), and an empty log is what a user would otherwise read.

Standard library only, so `python -m specmatch` installs it before any step's imports: a step
stopped while it loads (or while its server starts) says why as surely as one stopped mid-measurement.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time


def slurm_ending_why(job: str, timeout: float = 5.0) -> str:
    """Why SLURM is ending job `job`, as squeue says while its processes are being signalled: the
    state is COMPLETING then, whatever the cause, and the reason tells (SLURM 22.05: `TimeLimit`
    past the time limit, `None` after scancel)."""
    try:
        r = subprocess.run(["squeue", "--noheader", "--states=all", "--jobs", job, "--format=%T|%r"],
                           capture_output=True, text=True, timeout=timeout)
        state, reason = r.stdout.strip().split("|", 1) if r.returncode == 0 and "|" in r.stdout else ("", "")
    except (OSError, subprocess.SubprocessError):
        state, reason = "", ""
    seen = f"squeue: {state} {reason}".strip() if state else "squeue gave no state"
    if state == "TIMEOUT" or reason == "TimeLimit":
        why = "past its time limit"
    elif state == "PREEMPTED" or "preempt" in reason.lower():
        why = "preempted"
    elif state == "NODE_FAIL" or reason == "NodeDown":
        why = "its node failed"
    elif state == "CANCELLED" or (state == "COMPLETING" and reason == "None"):
        why = "cancelled (scancel)"
    else:
        why = "cancelled, past its time limit or preempted"
    return f"{why} ({seen})"


def termination_cause(signum: int) -> str:
    """Why this process got `signum`, as far as it can tell: inside a SLURM allocation, SLURM is
    ending the job (scancel, time limit, preemption), and squeue says which."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return f"stopped by {name}"
    return f"stopped by {name}: SLURM is ending allocation {job}: {slurm_ending_why(job)}"


def die_saying(signum: int, message: str) -> None:
    """Print `message` on stderr, then die of `signum` as without a handler (the exit status a
    scheduler and Snakemake read stays "killed by SIGTERM")."""
    print(message, file=sys.stderr, flush=True)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def announce_termination(step: str) -> bool:
    """From now on a SIGTERM makes this process say why in its log (`specmatch <step>: stopped by
    ...`) before it dies of it. Only where SIGTERM still has its default action and only in the main
    thread (a handler someone else installed is theirs); True when installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False

    def handler(signum, frame):
        die_saying(signum, f"specmatch {step}: {termination_cause(signum)}; it is aborted and writes no result")

    signal.signal(signal.SIGTERM, handler)
    return True


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (nearest first; zombies left out), from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                state, ppid = fh.read().rsplit(") ", 1)[1].split()[:2]
        except (OSError, IndexError, ValueError):
            continue
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(d))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children.get(p, [])
    return out


def end_when_orphaned(grace_s: float = 20.0, poll_s: float = 1.0) -> threading.Thread | None:
    """Inside a SLURM allocation, end this process (and whatever it started) `grace_s` after its
    parent has died; returns the watching thread, or None outside an allocation.

    Why: SLURM ends an allocation by SIGTERM to its processes, then SIGKILL after KillWait, but with
    `proctrack/linuxproc` it finds them by their parent links. A job's Snakemake whose parent shell
    died of the SIGTERM is re-parented to init and out of reach of the SIGKILL, and Snakemake's own
    SIGTERM handler can hang (it takes the scheduler's lock, which the interrupted main thread may
    hold): such a Snakemake, and the cell or server it watches, would outlive the allocation
    forever. A job's Snakemake never outlives its parent otherwise, so the parent's death (or a
    parent already gone when the guard starts) means the allocation is being taken down; the grace
    leaves Snakemake time to end on its own, as SLURM's KillWait would."""
    if not os.environ.get("SLURM_JOB_ID"):
        return None
    parent, me = os.getppid(), os.getpid()

    def watch() -> None:
        while parent != 1 and os.getppid() == parent:
            time.sleep(poll_s)
        time.sleep(grace_s)
        try:
            print(f"specmatch: the parent of this job's Snakemake (pid {parent}) ended {grace_s:.0f} s ago and "
                  f"SLURM allocation {os.environ.get('SLURM_JOB_ID')} is being taken down; it ends now "
                  f"(SIGKILL), with what it started", file=sys.stderr, flush=True)
        except Exception:   # a closed or full stderr must not keep it alive
            pass
        finally:
            kill_tree(me)

    t = threading.Thread(target=watch, name="specmatch-orphan-guard", daemon=True)
    t.start()
    return t


def kill_tree(pid: int, rounds: int = 20) -> None:
    """SIGKILL everything below `pid`, then `pid`. Each round stops the tree from the top (a stopped
    process starts nothing new) and kills it; a process started between two scans is caught by the
    next round."""
    for _ in range(rounds):
        below = descendants(pid)
        if not below:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for p in below:
                try:
                    os.kill(p, sig)
                except OSError:
                    pass
    os.kill(pid, signal.SIGKILL)
