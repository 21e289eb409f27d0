"""Run to run pooled over suites whose cells differ in size: are the intervals right for each suite?

A group's run-to-run variance (server, concurrency) is pooled over its suites (verdicts.noise). Part of it
is the requests' own noise, which a cell of 96 requests averages six times better than one of 16; pooled
as it is, the big suite's intervals come out too wide and the small ones' beside it too narrow.
noise.cell_size_scales takes each configuration's part at its own cell's size where the sizes differ by
1.5x or more.

Experiments of the calibration harness (the discrete-event server, identical servers, plain run to run,
c = 1, 4, 16, R = 2), with one suite of 96 prompts beside two of 16 (`one-big`) or two of 96 beside one
of 16 (`two-big`). Printed per case, suite size and concurrency, on throughput: E[est^2] / E[se^2] (1
where the intervals are right), and the false-call rate (identical servers called pays or loses; nominal
10%) with its Monte-Carlo error (a ratio estimator over experiments).

    nice -n 19 python bench/cell_sizes.py --experiments 150 --workers 2
    SPECMATCH_SRC=/tmp/before/workflow python bench/cell_sizes.py ...   # the code before, side by side
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.environ.get("SPECMATCH_SRC", str(Path(__file__).resolve().parents[1] / "workflow")))

from specmatch.calibration import pool  # noqa: E402

CASES = {"one-big": {"big": 96, "s1": 16, "s2": 16}, "two-big": {"big1": 96, "big2": 96, "small": 16}}
CONCURRENCIES = (1, 4, 16)


def task(a: dict) -> list:
    """Rows (experiment, suite size, c, est, se, decided) of `experiments` experiments of a case."""
    from specmatch.calibration import grid, scenarios, workload
    from specmatch.deciding.analysis import analyse
    from specmatch.deciding.reading.measurements import Settings

    rng = np.random.default_rng(a["seed"])
    sizes = CASES[a["case"]]
    s = Settings.of(vars(grid.settings(a["bootstrap"], slo={})) | {"repeats": 2})
    rows = []
    for e in range(a["experiments"]):
        eng = {"baseline": grid.BASE, "spec": grid.BASE}
        eff = scenarios.run_to_run(rng, scenarios.SCENARIOS["plain"], list(eng), tuple(sizes), CONCURRENCIES, 2)
        cells = []   # the DES serves cells of one size at once: a run per suite
        for u, n in sizes.items():
            work = workload.Workload.draw(rng, suites=(u,), prompts=n)
            cells += workload.simulate_cells(rng, [work], eng, [eff], 2, concurrencies=CONCURRENCIES)[0]
        an = analyse(cells, "baseline", s)
        for (server, suite, metric), row in an.comparisons.items():
            if server != "spec" or metric != "output_throughput":
                continue
            for cmp in row:
                v = an.verdict("spec", suite, cmp.concurrency, metric)
                rows.append(((a["seed"], e), sizes[suite], cmp.concurrency, cmp.estimate, cmp.se,
                             v.verdict.value in ("pays", "loses")))
    return rows


def main(argv=None) -> int:
    from specmatch.calibration.tally import ratio_rate

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiments", type=int, default=150, help="per case")
    p.add_argument("--cases", nargs="+", default=list(CASES))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--chunk", type=int, default=10)
    p.add_argument("--bootstrap", type=int, default=250)
    p.add_argument("--seed", type=int, default=96)
    a = p.parse_args(argv)
    t0 = time.time()
    jobs, owner = [], []
    for case in a.cases:
        for i in range(0, a.experiments, a.chunk):
            jobs.append((task, {"case": case, "experiments": min(a.chunk, a.experiments - i), "bootstrap": a.bootstrap,
                                "seed": pool.seed_of(a.seed, case, i)}))
            owner.append(case)
    res = pool.run_tasks(jobs, a.workers)
    print(f"identical servers, throughput, R = 2, {a.experiments} experiments per case: E[est^2] / E[se^2]; "
          "false calls ± MC se (verdicts)")
    for case in a.cases:
        rows = [r for x, o in zip(res, owner) if o == case for r in x]
        for n in sorted({r[1] for r in rows}, reverse=True):
            parts = []
            for c in CONCURRENCIES:
                sel = [r for r in rows if r[1] == n and r[2] == c]
                ratio = np.mean([r[3] ** 2 for r in sel]) / np.mean([r[4] ** 2 for r in sel])
                ids: dict = {}
                ex = np.array([ids.setdefault(r[0], len(ids)) for r in sel])
                rate, se = ratio_rate(np.bincount(ex, [float(r[5]) for r in sel]), np.bincount(ex).astype(float))
                parts.append(f"c={c}: {ratio:.2f}, {rate:.1%} ± {se:.1%} ({len(sel)})")
            print(f"  {case}, suites of {n}: " + "; ".join(parts))
    print(f"({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
