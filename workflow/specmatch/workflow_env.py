"""Environment of the jobs a Snakemake run starts (called once from workflow/rules/common.smk).

Why here and not in the Snakefile: this is logic (and testable), and jobs must see it:
- the package of this checkout on PYTHONPATH, whatever environment runs a job;
- the interpreter running Snakemake first on PATH, so `python -m specmatch.<step>` in a rule means
  the same interpreter (unless conda deployment provides its own);
- SPECMATCH_OWNER_PID: the Snakemake process, which server watchdogs and cells watch, so that a
  killed run never leaves a server behind.
A job's Snakemake inside a SLURM allocation also ends itself once the allocation is being taken
down and SLURM's process tracking can no longer reach it (`ending.end_when_orphaned`).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .ending import end_when_orphaned


def prepare(package_dir: str | Path, conda: bool, job: bool = False) -> None:
    """`job`: this Snakemake runs jobs for another one (Snakemake's remote mode: inside a cluster
    allocation)."""
    env = os.environ
    parts = [str(package_dir)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    if not conda:
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env["SPECMATCH_OWNER_PID"] = str(os.getpid())
    if job:
        end_when_orphaned()
