"""Issue 34, item 3: the prompt sample's variance of a closed loop's throughput, by estimator.

Experiments of the calibration harness (specmatch.calibration: the discrete-event server, 3
suites of 16 prompts, c = 1, 4, 16, plain run-to-run noise) in which the two servers are identical on
average but their speedup varies by prompt (Scenario.prompt_sd: each server's pace per prompt drawn
independently, so the servers are exchangeable and every estimand's truth is exactly 1). Each
experiment is analysed (throughput only) with every estimator below, at R = 2 and 3:

- makespan/bootstrap: the cell's tokens over the closed loop's makespan, a paired bootstrap by prompt
  (what the analysis once did);
- makespan/jackknife: the same statistic, a delete-one-prompt jackknife;
- little/bootstrap: the rate at the load, C x tokens / sum of latencies (Little's law), bootstrapped;
- little/jackknife: the same statistic, jackknifed;
- package: whatever specmatch.deciding does now (the "after").

Printed per estimator, scenario and concurrency: the false-call rate (pays or loses) with its
Monte-Carlo error (a ratio estimator over experiments) and the variance ratio E[estimate^2] /
E[stated se^2] (1 when the stated variance is right; the truth is 0).

    nice -n 19 python bench/burst_variance.py --experiments 60 --workers 2
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

# SPECMATCH_SRC: another copy of the package (e.g. `git archive` of the commit before a change: the "before")
sys.path.insert(0, os.environ.get("SPECMATCH_SRC", str(Path(__file__).resolve().parents[1] / "workflow")))

from specmatch.calibration import grid, pool, scenarios, workload  # noqa: E402

ORIGINAL: dict = {}
VARIANTS = ("makespan/bootstrap", "makespan/jackknife", "little/bootstrap", "little/jackknife", "package")
SCENARIOS = (0.0, 0.15, 0.30)


def closed_loop_makespan(e2e: np.ndarray, c: int) -> np.ndarray:
    """How long C workers take to serve requests of these latencies in this order, each worker taking
    the next request when it is free (the cell's closed loop), for every row of resamples at once.

    The estimator this bench compares the rate at the load against (specmatch.metrics): at C >= requests
    the makespan is the slowest request, whose variance a bootstrap understates."""
    e2e = np.atleast_2d(e2e)
    rows, n = e2e.shape
    if c >= n:
        return e2e.max(-1)
    free = np.zeros((rows, c))
    r = np.arange(rows)
    for i in range(n):
        j = free.argmin(-1)
        free[r, j] += e2e[:, i]
    return free.max(-1)


def _makespan_stat(self, metric, idx):
    if metric in ("output_throughput", "goodput"):
        num = (self.out if metric == "output_throughput" else self.good.astype(float))[idx].sum(-1)
        if self.closed:
            return num / closed_loop_makespan(self.e2e[idx], self.concurrency)
        return num / self.duration * (len(self.out) / idx.shape[-1])
    vals = (self.tpot if metric == "tpot" else self.e2e)[idx]
    with np.errstate(invalid="ignore"):
        return np.nanmean(vals, axis=-1)


def _makespan_point(self, metric, cell):
    if metric == "output_throughput":
        return cell.output_throughput
    if metric == "goodput":
        return float(self.good.sum()) / cell.duration if cell.duration else None
    vals = self.tpot if metric == "tpot" else self.e2e
    vals = vals[~np.isnan(vals)]
    return float(vals.mean()) if vals.size else None


def _little_stat(self, metric, idx):
    if metric in ("output_throughput", "goodput") and self.closed:
        num = (self.out if metric == "output_throughput" else self.good.astype(float))[idx].sum(-1)
        return min(self.concurrency, idx.shape[-1]) * num / self.e2e[idx].sum(-1)
    return _makespan_stat(self, metric, idx)


def _little_point(self, metric, cell):
    if metric in ("output_throughput", "goodput") and self.closed and len(self.out):
        return float(_little_stat(self, metric, np.arange(len(self.out))[None, :])[0])
    return _makespan_point(self, metric, cell)


def patch(variant: str):
    """Install one estimator in the analysis (in this process)."""
    from specmatch.deciding.reading import measurements
    from specmatch.deciding.verdicts import comparison

    # a worker process runs many tasks: every variant starts from the package as it is
    keep = ORIGINAL.setdefault("x", (measurements.Arrays.stat, measurements.Arrays.point, comparison._bootstrap))
    measurements.Arrays.stat, measurements.Arrays.point, comparison._bootstrap = keep
    if variant == "package":
        return
    kind, var = variant.split("/")
    measurements.Arrays.stat = _makespan_stat if kind == "makespan" else _little_stat
    measurements.Arrays.point = _makespan_point if kind == "makespan" else _little_point
    original = keep[2]
    if var == "bootstrap":
        return

    def jackknife(m, pairs, prompts, common, metric, sign, draw):
        n = len(prompts)
        delete = np.array([[j for j in range(n) if j != i] for i in range(n)])
        x = original(m, pairs, prompts, common, metric, sign, delete)
        mid = x.mean(1, keepdims=True)
        return mid + (x - mid) * ((n - 1) / math.sqrt(n))   # var(ddof=1) of these = the jackknife's variance

    comparison._bootstrap = jackknife


def task(a: dict) -> dict:
    from specmatch.deciding.analysis import analyse
    from specmatch.deciding.reading import measurements

    metrics = tuple(a.get("metrics", ("output_throughput",)))
    measurements.Settings.metrics = property(lambda self: metrics)
    rng = np.random.default_rng(a["seed"])
    n = a["experiments"]
    sc = scenarios.SCENARIOS["plain"]
    work = [workload.Workload.draw(rng, prompt_sd=a["prompt_sd"]) for _ in range(n)]
    eff = [scenarios.run_to_run(rng, sc, ["baseline", "spec"], grid.SUITES, grid.CONCURRENCIES, 3) for _ in range(n)]
    cells = workload.simulate_cells(rng, work, {"baseline": grid.BASE, "spec": grid.BASE}, eff, 3)
    s = grid.settings(a.get("bootstrap", 250), slo={})
    out = {}
    for variant in a["variants"]:
        patch(variant)
        rows = []   # (experiment, R, c, estimate, se, decided, metric)
        for e, cs in enumerate(cells):
            for R in (2, 3):
                an = analyse([x for x in cs if x[0].repeat <= R], "baseline", s)
                for (server, suite, metric), cmps in an.comparisons.items():
                    for cmp in cmps:
                        v = an.verdict(server, suite, cmp.concurrency, metric)
                        if cmp.estimate is None:
                            continue
                        rows.append((e, R, cmp.concurrency, cmp.estimate, cmp.se,
                                     v.verdict.value in ("pays", "loses"), metrics.index(metric)))
        out[variant] = np.array(rows)
    return out


def ratio_rate(x: np.ndarray, n_exp: int) -> tuple[float, float]:
    """Share of rows with x[:, 5] (a false call) and its ratio-estimator error over experiments."""
    k = np.bincount(x[:, 0].astype(int), x[:, 5], minlength=n_exp)
    m = np.bincount(x[:, 0].astype(int), minlength=n_exp).astype(float)
    p = k.sum() / m.sum()
    E = (m > 0).sum()
    se = math.sqrt(E / max(E - 1, 1) * float(((k - p * m) ** 2).sum())) / m.sum()
    return p, se


def _cells(x: np.ndarray) -> list[str]:
    """Per (R, c): the false-call rate ± its MC error and the variance ratio."""
    cols = []
    for R in (2, 3):
        for c in grid.CONCURRENCIES:
            y = x[(x[:, 1] == R) & (x[:, 2] == c)]
            ids = np.unique(y[:, 0], return_inverse=True)[1]
            y = np.column_stack([ids, y[:, 1:]])
            rate, se = ratio_rate(y, int(ids.max()) + 1)
            vr = float(np.mean(y[:, 3] ** 2) / np.mean(y[:, 4] ** 2))
            cols.append(f"R={R} c={c:<2} {rate:5.1%}±{se:4.1%} | {vr:4.2f}")
    return cols


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiments", type=int, default=60, help="per scenario")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--chunk", type=int, default=10)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS))
    p.add_argument("--prompt-sd", nargs="+", type=float, default=list(SCENARIOS))
    p.add_argument("--seed", type=int, default=34)
    p.add_argument("--metrics", nargs="+", default=["output_throughput"],
                   help="verdict metrics to analyse (output_throughput, tpot, e2el, goodput)")
    a = p.parse_args(argv)
    t0 = time.time()
    jobs, owner = [], []
    for sd in a.prompt_sd:
        for i in range(0, a.experiments, a.chunk):
            jobs.append((task, {"prompt_sd": sd, "experiments": min(a.chunk, a.experiments - i),
                                "variants": a.variants, "metrics": a.metrics, "seed": pool.seed_of(a.seed, sd, i)}))
            owner.append((sd, i))
    res = pool.run_tasks(jobs, a.workers)
    print(f"{a.experiments} experiments per scenario (3 suites x c = 1, 4, 16, 16 prompts, plain run to run), "
          f"90% intervals; false calls ± MC se | E[est^2] / E[se^2]")
    for sd in a.prompt_sd:
        for mi, metric in enumerate(a.metrics):
            print(f"\nspeedup log-sd by prompt {sd:.2f}, {metric}:")
            for variant in a.variants:
                x = [r[variant] for r, o in zip(res, owner) if o[0] == sd]
                x = np.concatenate([np.column_stack([xi[:, 0] + 1000 * j, xi[:, 1:]]) for j, xi in enumerate(x)])
                print(f"  {variant}:\n    " + "\n    ".join(_cells(x[x[:, 6] == mi])))
    print(f"\n({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
