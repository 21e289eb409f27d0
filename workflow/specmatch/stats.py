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


# -- distributions (no scipy: the few functions the decision rules need, tested against tables) --
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b)."""
    import math

    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(ln) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, dof: float) -> float:
    """Student t distribution function."""
    if dof == float("inf"):
        from statistics import NormalDist

        return NormalDist().cdf(t)
    x = dof / (dof + t * t)
    tail = 0.5 * betainc(dof / 2.0, 0.5, x)
    return 1.0 - tail if t > 0 else tail


def t_ppf(p: float, dof: float) -> float:
    """Quantile of the Student t distribution (bisection on t_cdf; dof may be fractional or inf)."""
    from statistics import NormalDist

    if dof == float("inf") or dof > 1e6:
        return NormalDist().inv_cdf(p)
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, dof) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10:
            break
    return (lo + hi) / 2


def gammainc(a: float, x: float) -> float:
    """Regularized lower incomplete gamma function P(a, x)."""
    import math

    if x <= 0:
        return 0.0
    if x < a + 1.0:  # series
        term = total = 1.0 / a
        n = a
        for _ in range(1000):
            n += 1.0
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return total * math.exp(-x + a * math.log(x) - math.lgamma(a))
    tiny = 1e-300  # continued fraction for the upper tail
    b, c, d = x + 1.0 - a, 1.0 / tiny, 1.0 / (x + 1.0 - a)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return 1.0 - math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def chi2_cdf(x: float, dof: float) -> float:
    """Chi-square distribution function (for the robust run-to-run estimate), without scipy."""
    return gammainc(dof / 2.0, x / 2.0)


def chi2_pdf(x: float, dof: float) -> float:
    """Chi-square density."""
    import math

    if x <= 0:
        return 0.0
    k = dof / 2.0
    return math.exp((k - 1) * math.log(x) - x / 2 - k * math.log(2) - math.lgamma(k))


def chi2_ppf(p: float, dof: float) -> float:
    """Quantile of the chi-square distribution (bisection on chi2_cdf)."""
    lo, hi = 0.0, max(1.0, dof)
    while chi2_cdf(hi, dof) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_cdf(mid, dof) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


def digamma(x: float) -> float:
    """psi(x) = d log Gamma(x) / dx for x > 0 (recurrence up to 6, then the asymptotic series)."""
    import math

    r = 0.0
    while x < 6:
        r -= 1 / x
        x += 1
    f = 1 / (x * x)
    return r + math.log(x) - 0.5 / x - f * (1 / 12 - f * (1 / 120 - f / 252))


def trigamma(x: float) -> float:
    """psi'(x) for x > 0."""
    r = 0.0
    while x < 6:
        r += 1 / (x * x)
        x += 1
    f = 1 / (x * x)
    return r + 1 / x + f / 2 + f / x * (1 / 6 - f * (1 / 30 - f / 42))


def trigamma_inverse(y: float) -> float:
    """The x > 0 with psi'(x) = y (psi' is decreasing: bisection on a log scale)."""
    import math

    lo, hi = 1e-8, 1e8
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if trigamma(mid) > y else (lo, mid)
        if hi / lo < 1 + 1e-12:
            break
    return math.sqrt(lo * hi)


def median_fit_dof(dofs: list[float]) -> float:
    """Effective degrees of freedom of tau^2 fitted as the value at which the median over n
    configurations of P(chi2_{d_k} <= Q_k / tau^2) is one half (analysis.fit_tau2).

    It is an M-estimator with estimating function 1{F_d(Q/tau^2) <= 1/2} - 1/2, so (the asymptotics
    of a sample median: Serfling 1980, "Approximation Theorems of Mathematical Statistics", 2.3.3;
    van der Vaart 1998, "Asymptotic Statistics", 21.2) Var(log tau^2_hat) = 1 / (4 n g^2) with
    g = mean_k f_{d_k}(m_k) m_k, m_k the median of chi2_{d_k} and f its density. A variance estimate
    with nu degrees of freedom has Var(log s^2) = 2 / nu, so nu = 8 n g^2. For d = 1 (two repeats)
    that is 0.368 n: the efficiency of a median of chi2_1 against the mean is 0.37 (not the 2/pi of a
    median of normals); for d = 2, 0.48. tests/test_analysis.py checks it by simulation."""
    if not dofs:
        return 0.0
    g = [chi2_pdf(m, d) * m for d in dofs for m in (chi2_ppf(0.5, d),)]
    return 8 * len(dofs) * (sum(g) / len(g)) ** 2
