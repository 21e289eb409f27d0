"""How far stats.py's hand-written distributions were from SciPy, which replaced them.

The old module is read from git (the commit before the change); the reference is scipy.stats /
scipy.special, and specmatch.stats (SciPy behind the same names) is measured on the same points:

    git show bdf2933:workflow/specmatch/stats.py > /tmp/stats_old.py
    PYTHONPATH=workflow .venv/bin/python bench/stats_vs_scipy.py --old /tmp/stats_old.py

Per function: the largest relative error over the grid (dofs 1 .. 1e6 and inf, fractional ones
included; probabilities 1e-6 .. 1 - 1e-6) and where, for the old and the new code, and the time per
scalar call of each. For a distribution function the old error is also given on the smaller tail,
min(F, 1 - F), which is what an interval's level depends on. The t quantile is also reported within
+-1000 (the old bisection's range, which the new t_ppf keeps as its cap: stats.T_MAX).
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy import special, stats

from specmatch import stats as new

DOFS = [1, 1.5, 2, 2.5, 3, 4, 5, 7, 10, 15, 20, 30, 50, 100, 300, 1e3, 1e4, 1e5, 1e6, math.inf]
PROBS = [1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.975, 0.99,
         1 - 1e-3, 1 - 1e-4, 1 - 1e-5, 1 - 1e-6]


def load(path: Path):
    spec = importlib.util.spec_from_file_location("stats_old", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rel(a: float, b: float) -> float:
    """The relative error of a against b (the absolute one where b is 0: the t quantile at p = 1/2)."""
    if a == b:
        return 0.0
    e = abs(a - b) / abs(b) if b else abs(a - b)
    return e if math.isfinite(e) else math.inf


class Worst:
    """The largest error of one function over the grid, for the old and the new code."""

    def __init__(self, name: str, old_fn, new_fn, tail: bool = False):
        self.name, self.old_fn, self.new_fn, self.tail = name, old_fn, new_fn, tail
        self.err = {"old": 0.0, "new": 0.0}
        self.where = None
        self.tail_err = 0.0
        self.seconds = {"old": 0.0, "new": 0.0}
        self.calls = 0

    def add(self, args: tuple, want: float) -> None:
        self.calls += 1
        for which, fn in (("old", self.old_fn), ("new", self.new_fn)):
            t0 = time.perf_counter()
            got = fn(*args)
            self.seconds[which] += time.perf_counter() - t0
            e = rel(got, want)
            if which == "old" and e > self.err["old"]:
                self.where = (args, got, want)
            self.err[which] = max(self.err[which], e)
            if which == "old" and self.tail:
                self.tail_err = max(self.tail_err, rel(min(got, 1 - got), min(want, 1 - want)))

    def line(self) -> str:
        where = ""
        if self.where:
            args, got, want = self.where
            shown = ", ".join(f"{a:.6g}" if isinstance(a, float | int) else str(a) for a in args)
            where = f"  worst old at ({shown}): {got:.17g} vs {want:.17g}"
        tail = f" (smaller tail {self.tail_err:.1e})" if self.tail else ""
        us = {k: v / self.calls * 1e6 for k, v in self.seconds.items()}
        return (f"{self.name:<16} old {self.err['old']:.1e}{tail}  new {self.err['new']:.1e}  "
                f"{us['old']:8.1f} -> {us['new']:6.1f} us/call  ({self.calls} points){where}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", type=Path, required=True, help="the hand-written stats.py (from git)")
    old = load(p.parse_args().old)
    out = []

    w, inside = Worst("t_ppf", old.t_ppf, new.t_ppf), Worst("t_ppf |t|<1e3", old.t_ppf, new.t_ppf)
    for d in DOFS:
        for q in PROBS:
            want = float(stats.t.ppf(q, d))
            w.add((q, d), want)
            if abs(want) < 1e3:
                inside.add((q, d), want)
    out += [w, inside]

    w = Worst("t_cdf", old.t_cdf, new.t_cdf, tail=True)
    for d in DOFS:
        for q in PROBS:
            x = float(stats.t.ppf(q, d))
            w.add((x, d), float(stats.t.cdf(x, d)))
    out.append(w)

    w = Worst("chi2_ppf", old.chi2_ppf, new.chi2_ppf)
    for d in DOFS[:-1]:
        for q in PROBS:
            w.add((q, d), float(stats.chi2.ppf(q, d)))
    out.append(w)

    cdf, pdf = Worst("chi2_cdf", old.chi2_cdf, new.chi2_cdf, tail=True), Worst("chi2_pdf", old.chi2_pdf, new.chi2_pdf)
    for d in DOFS[:-1]:
        for q in PROBS:
            x = float(stats.chi2.ppf(q, d))
            cdf.add((x, d), float(stats.chi2.cdf(x, d)))
            pdf.add((x, d), float(stats.chi2.pdf(x, d)))
    out += [cdf, pdf]

    xs = np.logspace(-4, 6, 101)
    for name, ref in (("digamma", special.digamma), ("trigamma", lambda x: special.polygamma(1, x))):
        w = Worst(name, getattr(old, name), getattr(new, name))
        for x in xs:
            w.add((float(x),), float(ref(x)))
        out.append(w)

    w = Worst("trigamma_inverse", old.trigamma_inverse, new.trigamma_inverse)
    for x in np.logspace(-6, 6, 61):   # the reference: the x whose trigamma (SciPy's) is inverted
        w.add((float(special.polygamma(1, x)),), float(x))
    out.append(w)

    w = Worst("median_fit_dof", old.median_fit_dof, new.median_fit_dof)
    for dofs in ([1], [2], [3], [1, 2], [1, 1, 4], [10], [100], [1e3, 5], [1e4], [1e6]):
        d = np.asarray(dofs, float)
        m = stats.chi2.ppf(0.5, d)
        w.add((dofs,), float(8 * d.size * np.mean(stats.chi2.pdf(m, d) * m) ** 2))
    out.append(w)

    # the two incomplete functions the old module built the others on (SciPy's are called directly now)
    w = Worst("betainc", old.betainc, special.betainc)
    for a in (0.5, 1, 2.5, 10, 1e3, 5e5):
        for b in (0.5, 1, 3, 50):
            for x in (1e-6, 1e-3, 0.1, 0.5, 0.9, 0.999, 1 - 1e-6):
                w.add((a, b, x), float(stats.beta.cdf(x, a, b)))
    out.append(w)
    w = Worst("gammainc", old.gammainc, special.gammainc)
    for a in (0.5, 1, 2.5, 10, 1e3, 5e5):
        for q in PROBS:
            x = float(stats.gamma.ppf(q, a))
            w.add((a, x), float(stats.gamma.cdf(x, a)))
    out.append(w)

    for w in out:
        print(w.line())


if __name__ == "__main__":
    sys.exit(main())
