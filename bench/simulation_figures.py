"""The simulations behind figures in docs/methods and in the slow tests' docstrings, at their documented
experiment counts.

The test suite gates each simulation at the fewest experiments (at a fixed seed) that still fail on the
defect it was built for; the figures themselves take minutes to an hour each on 2 cores, so they run
here. Each prints its numbers and whether they meet the threshold the documentation states (exit status
1 where one does not). The calibration's own figures run through `python -m specmatch traffic_coverage`
or `stepcost_coverage` (each entry shows the command); the others reuse the tests' own simulated worlds.

    nice -n 19 .venv/bin/python bench/simulation_figures.py --list
    nice -n 19 .venv/bin/python bench/simulation_figures.py session-wave traffic-superlinear
    nice -n 19 .venv/bin/python bench/simulation_figures.py kmodel-null --experiments 400
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("SPECMATCH_SRC", str(REPO / "workflow")))
sys.path.insert(0, str(REPO / "tests"))   # the tests' simulated worlds (builders and the test modules)


@dataclass
class Figure:
    where: str                                  # where the figure is documented
    experiments: int                            # its documented count
    run: Callable[[int], bool]                  # runs n experiments, prints, says whether it holds


def command(*args: str) -> Callable[[int], bool]:
    """A figure of a calibration command: `python -m specmatch ARGS --experiments N`, its output as is
    (the command prints the figure; reading it against the documentation's is left to the reader)."""
    def run(n: int) -> bool:
        argv = [sys.executable, "-m", "specmatch", *args, "--experiments", str(n)]
        print("$", " ".join(argv[1:]), flush=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "workflow"), os.environ.get("PYTHONPATH", "")])}
        return subprocess.run(argv, env=env).returncode == 0
    return run


# -- sessions (docs/methods/verdicts.md, docs/guides/sessions.md) ---------------------------------------
def session_verdicts(n: int) -> bool:
    from test_session_bootstrap import session_false_call_rates

    rate_s, rate_t, total = session_false_call_rates(n)
    print(f"false calls at nominal 10%: by session {rate_s:.3f}, by turn {rate_t:.3f} ({total} verdicts, {n} "
          "experiments); thresholds: by session within 0.10 +/- 2.3 Monte-Carlo se, by turn >= 0.20")
    return abs(rate_s - 0.10) <= 2.3 * math.sqrt(0.09 / n) and rate_t >= 0.20


def session_wave(n: int) -> bool:
    """16 sessions of 3 turns at c = 16 (one wave, the batch shrinking as sessions end) on the
    discrete-event server: the spread of the estimates over experiments against the stated se. The truth
    at c = 16 is not 1 (heterogeneous sessions change the wave), so calibration is judged by
    Var(estimate) / mean(se^2), within [0.75, 1.3] (its sampling error at 150 is about 0.12)."""
    from specmatch.deciding.analysis import analyse
    from test_session_bootstrap import SETTINGS, wave_cells

    est: dict = {}
    for seed in range(n):
        an = analyse(wave_cells(2000 + seed), "base", SETTINGS)
        for metric in ("output_throughput", "tpot"):
            x = next(x for x in an.comparisons[("spec", "sess", metric)] if x.concurrency == 16)
            est.setdefault(metric, []).append((x.estimate, x.se))
    ok = True
    for metric, got in est.items():
        e, s = np.array(got).T
        ratio = e.var(ddof=1) / (s ** 2).mean()
        print(f"{metric} at c=16, one session wave: Var/se^2 {ratio:.2f} ({n} experiments; within [0.75, 1.3])")
        ok &= 0.75 <= ratio <= 1.3
    return ok


# -- context (docs/methods/context.md) -------------------------------------------------------------------
def context_waves(n: int) -> bool:
    """Issue 48, finding 1: flat acceptance and servers equal on average on the discrete-event server (16
    sessions of 6 turns, a per-session pace of log-sd 0.3 on one server, 0.1 on both): comparing bins at
    c = 16 called 33% of them; at c = 1 the bins keep the nominal rate (2.3 Monte-Carlo errors, 1.5 times
    for the bins of one suite sharing its sessions), and nothing is compared at c = 16."""
    from specmatch.deciding.analysis import analyse
    from specmatch.deciding.explaining.context import context_report
    from specmatch.records import Decision
    from test_context import SETTINGS
    from test_session_bootstrap import wave_cells

    called, bins, at16 = 0, 0, 0
    for seed in range(n):
        an = analyse(wave_cells(7000 + seed, turns=6, step=150), "base", SETTINGS)
        axis = context_report(an, an.measurements.session_ids())
        one = [r for r in axis.rows if r.concurrency == 1]
        called += sum(r.verdict in (Decision.PAYS, Decision.LOSES) for r in one)
        bins += len(one)
        at16 += sum(r.tpot_speedup is not None for r in axis.rows if r.concurrency == 16)
    rate = called / bins
    print(f"session bins at c=1: called {rate:.1%} of {bins} ({n} experiments); compared at c=16: {at16}")
    return at16 == 0 and rate <= 0.10 + 2.3 * math.sqrt(0.09 / bins) * 1.5


# -- which k (tests/test_kmodel.py) ---------------------------------------------------------------------
def kmodel_null(n: int) -> bool:
    """The null: k=2 and k=4 as fast as the baseline at c=1 (step cost = tokens per step). The best of two
    k is a selection, so it must pay at alpha / 2 (Bonferroni): a false "speculate" then stays under
    alpha / 2 = 5% one-sided (at the plain level it was 6.5% of 400 in an independent audit)."""
    import statistics

    from builders import sweep_cells
    from specmatch.deciding.reading.measurements import Measurements, Settings
    from specmatch.deciding.recommending.kchoice import best_k
    from specmatch.deciding.verdicts.noise import run_to_run
    from specmatch.sweep import members
    from test_kmodel import SETTINGS

    rho = {2: {1: 1.92}, 4: {1: 2.24}}
    calls, speedups = 0, []
    for seed in range(100, 100 + n):
        cells = sweep_cells(seed, rho, concurrencies=(1,), repeats=2, session_sd=0.04, cell_sd=0.03)
        m = Measurements.of(cells, Settings(**SETTINGS))
        ch, _ = best_k(m, run_to_run(m), "spec", members("spec", m.servers()), "base", "s", 1, m.settings)
        calls += bool(ch.k)
        speedups += [x["speedup"] for k, x in ch.speedups.items() if k != "0"]
    mean = statistics.geometric_mean(speedups)
    print(f"false 'speculate' in {calls} of {n} sweeps ({calls / n:.1%}; at most 5% + 2.5 Monte-Carlo se); "
          f"the members' speedups average {mean:.3f} (the null: 0.95-1.02)")
    return 0.95 < mean < 1.02 and calls <= 0.05 * n + 2.5 * math.sqrt(0.05 * 0.95 * n)


FIGURES = {
    "kmodel-null": Figure("tests/test_kmodel.py (a false 'speculate' where every k is as good as off)", 100,
                          kmodel_null),
    "context-waves": Figure("docs/methods/context.md (session waves: 12.4% of 450 bins at c = 1)", 150,
                            context_waves),
    "session-verdicts": Figure("docs/methods/verdicts.md (sessions 11.4%, by turn 42%)", 400, session_verdicts),
    "session-wave": Figure("tests/test_session_bootstrap.py (a wave's drain: Var/se^2 1.12)", 150, session_wave),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("figures", nargs="*", help="which (--list names them)")
    p.add_argument("--list", action="store_true", help="name every figure, where it is documented and its count")
    p.add_argument("--experiments", type=int, help="instead of each figure's documented count")
    a = p.parse_args(argv)
    if a.list or not a.figures:
        for name, f in FIGURES.items():
            print(f"{name:<24} {f.experiments:>5}  {f.where}")
        return 0
    unknown = [f for f in a.figures if f not in FIGURES]
    if unknown:
        p.error(f"no figure {', '.join(unknown)} (--list)")
    ok = True
    for name in a.figures:
        print(f"== {name}: {FIGURES[name].where}", flush=True)
        ok &= bool(FIGURES[name].run(a.experiments or FIGURES[name].experiments))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
