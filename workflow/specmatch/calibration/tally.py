"""Rates of what the simulated experiments decided, with Monte-Carlo errors that stay honest.

Verdicts of one experiment move together: they share server sessions and one estimate of the
run-to-run variance, so a share of verdicts is not a binomial proportion. Every rate here is a ratio
estimator over experiments (the independent units), whose standard error is right however strongly
an experiment's verdicts are correlated; a gate that checks the error stays within its plan then
catches a change that correlates them more. Where each experiment gives one outcome the binomial
error is the same thing (`share`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .grid import CONCURRENCIES, DECISIONS, METRICS


def ratio_rate(k: np.ndarray, n: np.ndarray) -> tuple[float, float]:
    """(sum k / sum n, its standard error over experiments): k events among n trials per experiment."""
    N = float(n.sum())
    p = float(k.sum()) / N
    E = len(n)
    return p, math.sqrt(E / max(E - 1, 1) * float(((k - p * n) ** 2).sum())) / N


def stated_and_decided(rows: list, stated: int, decided: int) -> tuple[float, float, float, int]:
    """(mean stated probability, share decided, its Monte-Carlo error, n) of rows whose first field is
    their experiment: a ratio estimator's error over experiments (the statements of one experiment share
    its sessions)."""
    if not rows:
        return float("nan"), float("nan"), float("nan"), 0
    ids: dict = {}
    e = np.array([ids.setdefault(r[0], len(ids)) for r in rows])
    p, se = ratio_rate(np.bincount(e, [float(r[decided]) for r in rows]), np.bincount(e).astype(float))
    return float(np.mean([r[stated] for r in rows])), p, se, len(rows)


def stated_gap(rows: list, stated: int, decided: int) -> tuple[float, float, float, float, int]:
    """(mean stated probability, share decided, decided - stated, its Monte-Carlo error, n) of rows whose first
    field is their experiment: the gap's error is a ratio estimator's over experiments, paired (each row's
    decided less its own stated), so it is smaller than the share's own where statements vary; never
    below the error calibrated statements would have if each came true on its own (sqrt(sum p(1 - p)) / n),
    which few experiments' spread can understate (all of 23 decided gives a spread of the stated
    probabilities alone)."""
    if not rows:
        return float("nan"), float("nan"), float("nan"), float("nan"), 0
    ids: dict = {}
    e = np.array([ids.setdefault(r[0], len(ids)) for r in rows])
    n = np.bincount(e).astype(float)
    st = np.array([float(r[stated]) for r in rows])
    dec = np.array([float(r[decided]) for r in rows])
    gap, se = ratio_rate(np.bincount(e, dec - st), n)
    se = max(se, float(np.sqrt(np.sum(st * (1 - st)))) / len(rows))
    return float(st.mean()), float(dec.mean()), gap, se, len(rows)


def share(flags: list) -> tuple[float, float, int]:
    """(share, binomial Monte-Carlo se, n): experiments are independent, one outcome each."""
    n = len(flags)
    p = sum(map(bool, flags)) / n if n else float("nan")
    return p, math.sqrt(p * (1 - p) / n) if n else float("nan"), n


@dataclass
class Tally:
    """Verdict counts per experiment x metric x concurrency x decision (DECISIONS)."""
    counts: np.ndarray

    @classmethod
    def empty(cls, experiments: int) -> "Tally":
        return cls(np.zeros((experiments, len(METRICS), len(CONCURRENCIES), len(DECISIONS)), np.int64))

    def add(self, e: int, verdicts, server: str = "spec") -> None:
        for v in verdicts:
            if v.server != server or v.metric not in METRICS:
                continue
            d = "none" if v.speedup is None else getattr(v.verdict, "value", str(v.verdict))
            self.counts[e, METRICS.index(v.metric), CONCURRENCIES.index(v.concurrency), DECISIONS.index(d)] += 1

    def __add__(self, other: "Tally") -> "Tally":
        return Tally(np.concatenate([self.counts, other.counts]))

    @property
    def experiments(self) -> int:
        return self.counts.shape[0]

    def rate(self, kinds=("pays", "loses"), metric: str | tuple | None = None, c: int | None = None
             ) -> tuple[float, float, int]:
        """(rate, Monte-Carlo standard error, verdicts) of `kinds` among the verdicts with a figure
        (ratio_rate over experiments)."""
        x = self.counts
        if metric is not None:
            ms = (metric,) if isinstance(metric, str) else metric
            x = x[:, [METRICS.index(m) for m in ms]]
        if c is not None:
            x = x[:, :, [CONCURRENCIES.index(c)]]
        x = x.sum((1, 2))
        k = x[:, [DECISIONS.index(d) for d in kinds]].sum(1).astype(float)
        n = x[:, :DECISIONS.index("none")].sum(1).astype(float)
        if n.sum() == 0:
            return float("nan"), float("nan"), 0
        p, se = ratio_rate(k, n)
        return p, se, int(n.sum())

    def design_effect(self, metric=None) -> float:
        """Variance of the rate over what independent verdicts would give (the verdicts' clustering)."""
        p, se, n = self.rate(metric=metric)
        return se ** 2 / (p * (1 - p) / n) if 0 < p < 1 else float("nan")


def fmt(r: tuple) -> str:
    """A (rate, se, n) as 'rate±se' (n/a where there was nothing to count)."""
    p, se, n = r
    return "   n/a    " if not n else f"{p:5.1%}±{se:4.1%}"


def pct(r: tuple) -> str:
    return f"{r[0]:.0%}" if r[2] else "-"
