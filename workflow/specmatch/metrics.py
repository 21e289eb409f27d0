"""The one definition of every metric a verdict, a traffic prediction, an attribution or the report
speaks of: its name, label, direction, what one request contributes, which requests meet the SLO, and
the cell estimator the bootstrap resamples and the step model's simulated suites are read by.

Each formula is written here and nowhere else (tests/test_metrics.py searches the package for
copies), so a measured traffic check and its prediction, a verdict and the figure beside it, cannot
come to read a cell differently.

**TPOT** is vLLM's: (end-to-end latency - TTFT) / (output tokens - 1), output tokens from the
server's usage, undefined for fewer than two tokens.

**Good requests** are vLLM's `--goodput`: every configured SLO (ttft_ms, tpot_ms, e2el_ms) met; a
request of one token has TPOT 0 there, so it meets any TPOT SLO.

**A closed loop's throughput is its rate at the load** (Little's law): C x output tokens / the sum
of the requests' latencies, C the workers that had a request (min(concurrency, requests)): the
tokens per second a stream of requests at this concurrency delivers. Not the cell's tokens over its
duration (vLLM's `output_throughput`, kept in the cell table), whose end is the slowest request's: at
C >= requests (one burst) that is a maximum over prompts, whose variance a bootstrap understates
(deciding.reading.measurements). Goodput the same with good requests for tokens. An open loop (a request
rate) has no workers: its rates are over the cell's duration.

**TPOT and end-to-end latency** are means over requests. Speedups are always "higher is better":
throughput over the baseline's, the baseline's latency over the server's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Metric:
    """One metric: how it is named and read, and what each request contributes to it. A rate's
    `per_request` is its numerator (output tokens, or 1 for a good request); a mean's is the value
    averaged (end-to-end latency or TPOT, seconds)."""
    name: str
    label: str
    lower_is_better: bool
    rate: bool
    per_request: str             # "out" | "good" | "e2e" | "tpot"


TABLE: dict[str, Metric] = {m.name: m for m in (
    Metric("output_throughput", "throughput", False, True, "out"),
    Metric("goodput", "goodput", False, True, "good"),
    Metric("tpot", "TPOT", True, False, "tpot"),
    Metric("e2el", "end-to-end latency", True, False, "e2e"),
)}
NAMES = tuple(TABLE)
LATENCY = frozenset(n for n, m in TABLE.items() if m.lower_is_better)
LABEL = {n: m.label for n, m in TABLE.items()}


def tpot_tokens(out):
    """The tokens TPOT divides its time by: output tokens after the first (at least 1)."""
    return np.maximum(np.asarray(out, float) - 1, 1)


def tpot(e2e, ttft, out):
    """Seconds per output token after the first (module docstring); NaN for fewer than two tokens or
    no TTFT. Scalars or arrays."""
    out = np.asarray(out, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(out > 1, (np.asarray(e2e, float) - np.asarray(ttft, float)) / tpot_tokens(out), np.nan)


def good(e2e, ttft, tpot_s, slo: dict) -> np.ndarray:
    """Which requests meet every configured SLO (config summary.slo: ttft_ms, tpot_ms, e2el_ms)."""
    e2e = np.asarray(e2e, float)
    ok = np.ones(e2e.shape, bool)
    if slo.get("ttft_ms") is not None:
        ok &= np.asarray(ttft, float) * 1000 <= slo["ttft_ms"]
    if slo.get("tpot_ms") is not None:
        ok &= np.nan_to_num(np.asarray(tpot_s, float), nan=0.0) * 1000 <= slo["tpot_ms"]
    if slo.get("e2el_ms") is not None:
        ok &= e2e * 1000 <= slo["e2el_ms"]
    return ok


def values(name: str, out, good_, e2e, tpot_s) -> np.ndarray:
    """What each request contributes to `name` (Metric.per_request), as floats."""
    pick = {"out": out, "good": good_, "e2e": e2e, "tpot": tpot_s}[TABLE[name].per_request]
    return np.asarray(pick, float)


def workers(concurrency: int, requests: int) -> int:
    """C of a closed loop: the workers that had a request (min(concurrency, requests), at least 1)."""
    return max(1, min(concurrency, requests))


def estimate(name: str, workers: int, v, latency=None) -> np.ndarray:
    """The cell estimator of a closed loop over the last axis (one cell, or rows of bootstrap resamples
    or simulated suites), from what each request contributes (`v`, values()): a rate at the load,
    C x sum(v) / sum(latency), or a mean (NaN-aware: TPOT is undefined for one token). `latency` is
    what a rate divides by (the bootstrap passes each request's latency with its influence on the
    others', deciding.reading.measurements)."""
    v = np.asarray(v, float)
    if TABLE[name].rate:
        with np.errstate(invalid="ignore", divide="ignore"):
            return workers * v.sum(-1) / np.asarray(latency, float).sum(-1)
    with np.errstate(invalid="ignore"):
        return np.nanmean(v, axis=-1)


def closed_loop(name: str, workers: int, out, good_, e2e, tpot_s) -> np.ndarray:
    """A closed loop's figure from its requests' outputs, SLO flags, latencies and TPOT (estimate())."""
    return estimate(name, workers, values(name, out, good_, e2e, tpot_s), e2e)


def open_loop_rate(v, duration: float):
    """An open loop's rate over the last axis: sum of what each request contributes (values()) over the
    cell's duration (vLLM's definition)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(v, float).sum(-1) / duration


def log_speedup(name: str, server, baseline):
    """log of the speedup, higher is better: log(server / baseline) for a rate, log(baseline / server)
    for a latency."""
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.log(np.asarray(server, float)) - np.log(np.asarray(baseline, float))
    return -d if name in LATENCY else d
