"""Issue 34, item 5: does a round's decision stay decided?

Experiments of the calibration harness (the discrete-event server, 3 suites x c = 1, 4, 16, plain run
to run) with a baseline and three servers (identical, 10% faster, the harness's speculative server that
pays at c=1 and loses at c=16) under the sequential design repeats {min: 2, max: 3}, run as the
workflow runs it: round 2 plans (rounds.plan), repeat 3 measures the cells it names, and the summary
analyses everything. Counted: configurations round 2 stopped (decided, or unlikely to be decided)
whose summary verdict differs from the round's, without the round plans (as the summary once did)
and with them (analysis.frozen_verdicts).

    nice -n 19 python bench/round_flips.py --experiments 60 --workers 2
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.environ.get("SPECMATCH_SRC", str(Path(__file__).resolve().parents[1] / "workflow")))

from specmatch.calibration import grid, pool, scenarios, workload  # noqa: E402

SERVERS = {"baseline": grid.BASE, "same": grid.BASE, "fast": grid.BASE.faster(1.10), "spec": grid.SPEC}


def task(a: dict) -> list:
    from specmatch.deciding.analysis import analyse
    from specmatch.deciding.rounds import plan
    from specmatch.deciding.reading.sequential import Design

    frozen_of = getattr(__import__("specmatch.deciding.analysis", fromlist=["x"]), "frozen_verdicts", None)
    rng = np.random.default_rng(a["seed"])
    s = grid.settings(a["bootstrap"], slo={}, repeats={"min": 2, "max": 3})   # designs off: not measured here
    d = Design(2, 3)
    rows = []   # (experiment, stopped, flipped without the plans, flipped with them, interval moved without)
    for e in range(a["experiments"]):
        work = [workload.Workload.draw(rng)]
        eff = [scenarios.run_to_run(rng, scenarios.SCENARIOS["plain"], list(SERVERS), grid.SUITES, grid.CONCURRENCIES, 3)]
        cells = workload.simulate_cells(rng, work, SERVERS, eff, 3)[0]
        an2 = analyse([x for x in cells if x[0].repeat <= 2], "baseline", s)
        p2 = plan(an2, d, 2)
        nxt = {(c.server, c.suite, c.concurrency) for c in p2.next}
        final = [x for x in cells if x[0].repeat <= 2 or (x[0].server, x[0].suite, x[0].concurrency) in nxt]
        old = analyse(final, "baseline", s)
        new = analyse(final, "baseline", s, frozen=frozen_of([p2], "baseline")) if frozen_of else old
        for x in p2.decisions:
            if x.action.value == "continue" or x.against:
                continue
            vo, vn = (an.verdict(x.server, x.suite, x.concurrency) for an in (old, new))
            rows.append((a["offset"] + e, 1, vo.verdict != x.verdict, vn.verdict != x.verdict,
                         abs(math.log(vo.hi / vo.lo) - math.log(x.hi / x.lo)) > 1e-9,
                         x.action.value == "decided"))
    return rows


def share(rows: np.ndarray, col: int) -> tuple[float, float]:
    ids = np.unique(rows[:, 0], return_inverse=True)[1]
    k = np.bincount(ids, rows[:, col])
    m = np.bincount(ids).astype(float)
    p = k.sum() / m.sum()
    E = len(m)
    return p, math.sqrt(E / max(E - 1, 1) * float(((k - p * m) ** 2).sum())) / m.sum()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiments", type=int, default=60)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--chunk", type=int, default=5)
    p.add_argument("--bootstrap", type=int, default=200)
    p.add_argument("--seed", type=int, default=34)
    a = p.parse_args(argv)
    t0 = time.time()
    jobs = [(task, {"experiments": min(a.chunk, a.experiments - i), "offset": i, "bootstrap": a.bootstrap,
                    "seed": pool.seed_of(a.seed, "flips", i)}) for i in range(0, a.experiments, a.chunk)]
    rows = np.array([r for rr in pool.run_tasks(jobs, a.workers) for r in rr], float)
    decided = rows[rows[:, 5] == 1]
    print(f"{a.experiments} experiments, repeats {{min: 2, max: 3}}; configurations round 2 stopped: {len(rows)} "
          f"({len(decided)} decided)")
    for name, sel in (("stopped", rows), ("decided", decided)):
        for col, what in ((2, "verdict changed in the summary, without the plans"),
                          (3, "verdict changed in the summary, with the plans"),
                          (4, "interval moved, without the plans")):
            p_, se = share(sel, col)
            print(f"  {name}: {what}: {p_:.1%} ± {se:.1%}")
    print(f"({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
