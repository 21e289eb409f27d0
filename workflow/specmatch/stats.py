"""Distribution summaries used by every report, and the distributions the decision rules need.

The special functions and distributions are SciPy's (scipy.special: tested to machine precision,
vectorised); this module keeps the names and signatures the decision rules call, and what SciPy
lacks: the inverse of the trigamma function and the median fit's degrees of freedom. Each takes a
number (and returns a Python float) or an array (and returns an array).
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special
from scipy import stats as distributions


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


def ks_statistic(a, b, wb=None) -> float | None:
    """Two-sample Kolmogorov-Smirnov statistic (max distance between the empirical CDFs); `wb`
    weights the second sample (e.g. each training cut by its source's share of the target mix)."""
    a = np.sort(np.asarray(a, float))
    b = np.asarray(b, float)
    if a.size == 0 or b.size == 0:
        return None
    wb = np.ones(b.size) if wb is None else np.asarray(wb, float)
    order = np.argsort(b, kind="stable")
    b, cw = b[order], np.cumsum(wb[order]) / wb.sum()
    grid = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, grid, side="right") / a.size
    k = np.searchsorted(b, grid, side="right")
    cdf_b = np.where(k > 0, cw[np.maximum(k - 1, 0)], 0.0)
    return float(np.max(np.abs(cdf_a - cdf_b)))


def ks_critical(n: float, m: float, alpha: float = 0.05) -> float:
    """Asymptotic critical value of the two-sample KS statistic at level alpha (m may be a weighted
    sample's effective size)."""
    if n <= 0 or m <= 0:
        raise ValueError("ks_critical: both samples need at least one value")
    c = np.sqrt(-0.5 * np.log(alpha / 2))
    return float(c * np.sqrt((n + m) / (n * m)))


# -- distributions -------------------------------------------------------------------------------
def _value(x):
    """A Python float for a scalar result (records, JSON and f-strings get plain floats), else the array."""
    return float(x) if np.ndim(x) == 0 else x


def t_cdf(t, dof):
    """Student t distribution function (dof may be fractional or inf: the normal)."""
    return _value(special.stdtr(dof, t))


T_MAX = 1e3


def t_ppf(p, dof):
    """Quantile of the Student t distribution (dof may be fractional or inf: the normal), held within
    +-T_MAX. Satterthwaite's rule gives dof far below 1 when a part with few dof dominates a variance
    (0.05 occurs in tests/test_analysis.py), where the 95% quantile is 4e19: an interval of
    exp(estimate +- t se) then overflows. The hand-written quantile this replaces searched [-1000, 1000]
    only; the cap keeps its numbers, and the verdicts, unchanged (such an interval decides only an
    effect beyond 1000 standard errors)."""
    q = special.stdtrit(dof, p)
    return min(max(float(q), -T_MAX), T_MAX) if np.ndim(q) == 0 else np.clip(q, -T_MAX, T_MAX)


def t_ppf_many(p, dof):
    """t quantiles at p for many dofs at once (arrays broadcast), a dof below 1 read as 1 and an infinite
    one as the normal: the predictions' quantiles (comparison.decides_probability, whose sequential looks
    each have their own level, and sequential.chance_decided_many)."""
    dof = np.asarray(dof, float)
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(dof), special.stdtrit(np.maximum(np.where(np.isfinite(dof), dof, 1.0), 1.0), p),
                        special.ndtri(p))


# -- Student t intervals: every two-sided interval of the decisions is built here, so its level is read
# one way everywhere (the quantile at 0.5 + confidence / 2) and a log-scale one is exponentiated one way
def t_critical(dof, confidence: float) -> float:
    """The multiplier of a two-sided Student t interval at `confidence` with `dof`: the quantile at
    0.5 + confidence / 2 (t_ppf: held within +-T_MAX)."""
    return t_ppf(0.5 + confidence / 2, dof)


def t_half_width(se: float, dof, confidence: float) -> float:
    """Half the width of a two-sided Student t interval at `confidence`: t_critical x se."""
    return t_critical(dof, confidence) * se


def t_interval(estimate: float, se: float, dof, confidence: float) -> tuple[float, float]:
    """(lo, hi) = estimate -+ t se, the two-sided Student t interval at `confidence` with `dof`."""
    t = t_critical(dof, confidence)
    return estimate - t * se, estimate + t * se


def log_t_interval(log_estimate: float, se: float, dof, confidence: float) -> tuple[float, float]:
    """A ratio's (lo, hi) from its log estimate and the log's standard error: exp(log_estimate -+ t se),
    the Student t interval taken on the log scale (where a speedup's estimate is near normal and its
    parts add) and carried back to the ratio."""
    lo, hi = t_interval(log_estimate, se, dof, confidence)
    return math.exp(lo), math.exp(hi)


def chi2_cdf(x, dof):
    """Chi-square distribution function (0 at and below 0)."""
    return _value(special.chdtr(dof, np.maximum(x, 0.0)))


def chi2_pdf(x, dof):
    """Chi-square density."""
    return _value(distributions.chi2.pdf(x, dof))


def chi2_ppf(p, dof):
    """Quantile of the chi-square distribution (from the lower tail, as scipy.stats.chi2.ppf)."""
    return _value(2.0 * special.gammaincinv(np.divide(dof, 2.0), p))


def digamma(x):
    """psi(x) = d log Gamma(x) / dx."""
    return _value(special.digamma(x))


def trigamma(x):
    """psi'(x), the derivative of the digamma function: the Hurwitz zeta function zeta(2, x) (what
    scipy.special.polygamma(1, x) computes, without its Python-level wrapping: 20x faster per call)."""
    return _value(special.zeta(2, x))


def trigamma_inverse(y):
    """The x > 0 with psi'(x) = y, for y > 0 (inf for y <= 0: psi' is positive and falls to 0).

    SciPy has no inverse. This is Smyth's (2004) Newton iteration (limma's trigammaInverse): Newton's
    method on 1/psi'(x) = 1/y, which is nearly linear in x (x - 1/2 far out, x^2 near 0), from
    x0 = 1/2 + 1/y; it takes 2 to 20 steps for y from 1e-12 to 1e12 and ends at relative 1e-15."""
    shape = np.shape(y)
    y = np.asarray(y, dtype=float).ravel()
    ok = y > 0
    x = 0.5 + 1.0 / np.where(ok, y, 1.0)
    todo = ok.copy()
    for _ in range(100):
        if not todo.any():
            break
        tri = special.zeta(2, x[todo])                                 # psi'
        step = tri * (1.0 - tri / y[todo]) / (-2.0 * special.zeta(3, x[todo]))   # psi'' = -2 zeta(3, x)
        x[todo] += step
        todo[todo] = np.abs(step) > 1e-15 * x[todo]
    return _value(np.where(ok, x, np.inf).reshape(shape))


def median_fit_dof(dofs) -> float:
    """Effective degrees of freedom of tau^2 fitted as the value at which the median over n
    configurations of P(chi2_{d_k} <= Q_k / tau^2) is one half (deciding.verdicts.noise.fit_tau2).

    It is an M-estimator with estimating function 1{F_d(Q/tau^2) <= 1/2} - 1/2, so (the asymptotics
    of a sample median: Serfling 1980, "Approximation Theorems of Mathematical Statistics", 2.3.3;
    van der Vaart 1998, "Asymptotic Statistics", 21.2) Var(log tau^2_hat) = 1 / (4 n g^2) with
    g = mean_k f_{d_k}(m_k) m_k, m_k the median of chi2_{d_k} and f its density. A variance estimate
    with nu degrees of freedom has Var(log s^2) = 2 / nu, so nu = 8 n g^2. For d = 1 (two repeats)
    that is 0.368 n: the efficiency of a median of chi2_1 against the mean is 0.37 (not the 2/pi of a
    median of normals); for d = 2, 0.48. tests/test_analysis.py checks it by simulation."""
    d = np.asarray(dofs, dtype=float).ravel()
    if d.size == 0:
        return 0.0
    m = chi2_ppf(0.5, d)
    g = chi2_pdf(m, d) * m
    return float(8 * d.size * np.mean(g) ** 2)
