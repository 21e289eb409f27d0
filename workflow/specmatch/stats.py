"""Distribution summaries used by every report (numpy only, no framework)."""
from __future__ import annotations

import numpy as np


def describe(values, percentiles=(50, 90, 99)) -> dict | None:
    """count, mean, p50/p90/p99 and max of a sample; None when the sample is empty."""
    a = np.asarray([v for v in values if v is not None], dtype=float)
    if a.size == 0:
        return None
    out = {"count": int(a.size), "mean": float(a.mean()), "min": float(a.min())}
    for p in percentiles:
        out[f"p{p}"] = float(np.percentile(a, p))
    out["max"] = float(a.max())
    return out


def total_variation(p: dict[str, float], q: dict[str, float]) -> float:
    """Total variation distance between two categorical distributions (0 = identical, 1 = disjoint)."""
    keys = set(p) | set(q)
    sp, sq = sum(p.values()) or 1.0, sum(q.values()) or 1.0
    return 0.5 * sum(abs(p.get(k, 0) / sp - q.get(k, 0) / sq) for k in keys)


def ks_statistic(a, b) -> float | None:
    """Two-sample Kolmogorov-Smirnov statistic (max distance between the empirical CDFs)."""
    a, b = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    if a.size == 0 or b.size == 0:
        return None
    grid = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, grid, side="right") / a.size
    cdf_b = np.searchsorted(b, grid, side="right") / b.size
    return float(np.max(np.abs(cdf_a - cdf_b)))


def ks_critical(n: int, m: int, alpha: float = 0.05) -> float:
    """Asymptotic critical value of the two-sample KS statistic at level alpha."""
    c = np.sqrt(-0.5 * np.log(alpha / 2))
    return float(c * np.sqrt((n + m) / (n * m)))
