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
