"""Many simulated experiments on every core, reproducibly.

The calibration's tasks are independent chunks of experiments; each runs in its own process
(spawned: polars does not survive a fork), single-threaded, so `workers` processes use that many
cores and no more. The processes run at the lowest priority (`NICE`): they are batch work, and what
shares the machine with them (a test suite that times a server, a user's shell) keeps its CPU while
they take every idle cycle. Every chunk's random stream comes from its spec and position
(`seed_of`), never from the order chunks run in, so a rate is the same whatever the number of
workers.
"""
from __future__ import annotations

import multiprocessing
import os
import zlib
from concurrent.futures import ProcessPoolExecutor

NICE = 19


def workers() -> int:
    """Worker processes (SPECMATCH_CALIBRATION_WORKERS; default: up to 2, the cores a default run has)."""
    return max(1, int(os.environ.get("SPECMATCH_CALIBRATION_WORKERS", min(2, os.cpu_count() or 1))))


def _worker_start() -> None:
    """One thread per process, at the lowest priority (before any task imports numpy or polars)."""
    for k in ("POLARS_MAX_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[k] = "1"
    os.nice(NICE)


def _call(job: tuple):
    fn, args = job
    return fn(args)


def run_tasks(jobs: list[tuple], n_workers: int | None = None) -> list:
    """[(function, args)] -> results, in order; in `n_workers` processes (_worker_start), or in this
    one where there is one worker or one job."""
    n_workers = workers() if n_workers is None else n_workers
    if n_workers <= 1 or len(jobs) <= 1:
        return [_call(j) for j in jobs]
    with ProcessPoolExecutor(n_workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_start) as pool:
        return list(pool.map(_call, jobs, chunksize=1))


def seed_of(*key) -> int:
    """A seed from any repr-able key (a spec, a chunk's position)."""
    return zlib.crc32(repr(key).encode())
