"""The rounds' chance, carried out: does a configuration the rounds continue end decided as often as
they say?

After each round (deciding.rounds.plan) an inconclusive configuration continues where the remaining
repeats decide it with probability at least the design's min_probability (sequential.chance_decided,
recorded as RoundDecision.chance), and a cell budget measures the likeliest first. That probability is
a prediction about data not yet measured; the only honest check is to measure them: each experiment
is simulated to the design's last repeat, analysed after round 2 as the workflow would, its plan's
cells of repeat 3 added (and no others), and the verdict read again. The configurations the plan
stops as unlikely are carried out too, on a second analysis that measures them again, to see what
the stop gave up. Throughput only (the rounds' metric).
"""
from __future__ import annotations

import numpy as np

from ..deciding.analysis import analyse, frozen_verdicts
from ..deciding.rounds import plan
from ..records import Continuation
from .grid import CONCURRENCIES, SUITES, decided, settings, two_servers
from .hints import Reading
from .scenarios import SCENARIOS, run_to_run
from .tally import stated_and_decided
from .workload import Workload, simulate_cells

METRIC = "output_throughput"
CHANCE_POPULATIONS = {
    "aa": ("plain", "identical servers"),
    "near": ("plain", "a uniform speedup per experiment, log-uniform in 1.06-1.10x (near the band's edge)"),
    "s115": ("plain", "a speedup of 1.15x"),
    "spread": ("plain", "a uniform speedup per experiment, log-uniform within ±20%"),
    "t3": ("t3", "identical servers, Student-t(3) session and cell effects (heavy tails)"),
}


def chance_task(a: dict) -> dict:
    """`experiments` experiments of CHANCE_POPULATIONS[`name`] under repeats {min: 2, max: 3} (the
    default's design): the plan after round 2, then round 3 as planned. Returns {"rows": [(experiment,
    chance stated, continued, decided at repeat 3)]} for every configuration of `spec` the plan
    continues or stops as unlikely (the latter measured again on their own to see whether it would have
    decided: every such configuration at once, so their run to run gains a little more dof than the
    plan assumed, and the share errs high)."""
    scenario, _ = CHANCE_POPULATIONS[a["name"]]
    sc = SCENARIOS[scenario]
    rng = np.random.default_rng(a["seed"])
    s = Reading.of(vars(settings(a.get("bootstrap", 150), slo={}, designs=False))
                   | {"repeats": {"min": 2, "max": 3}, "only": (METRIC,)})
    key = lambda x: (x[0].server, x[0].suite, x[0].concurrency)   # noqa: E731
    rows = []
    for e in range(a["experiments"]):
        work, eng = Workload.draw(rng), two_servers(a["name"], rng)
        eff = run_to_run(rng, sc, list(eng), SUITES, CONCURRENCIES, 3)
        cells = simulate_cells(rng, [work], eng, [eff], 3)[0]
        first = [x for x in cells if x[0].repeat <= 2]
        p = plan(analyse(first, "baseline", s), s.design, 2)
        asked = [d for d in p.decisions if d.server == "spec"
                 and d.action in (Continuation.CONTINUE, Continuation.UNLIKELY)]
        frozen = frozen_verdicts([p], "baseline")
        planned = {(c.server, c.suite, c.concurrency) for c in p.next}
        stopped = {(who, d.suite, d.concurrency) for d in asked if d.action == Continuation.UNLIKELY
                   for who in ("spec", "baseline")}
        third = {}
        for again, which in ((planned, Continuation.CONTINUE), (stopped, Continuation.UNLIKELY)):
            if not again:
                continue
            keep = {k: v for k, v in frozen.items() if (k[0], k[2], k[3]) not in again}
            an3 = analyse(first + [x for x in cells if x[0].repeat == 3 and key(x) in again], "baseline", s,
                          frozen=keep)
            for d in asked:
                if d.action == which:
                    third[(d.suite, d.concurrency)] = decided(an3.verdict("spec", d.suite, d.concurrency, METRIC))
        rows += [((a["seed"], e), float(d.chance), d.action == Continuation.CONTINUE,
                  bool(third[(d.suite, d.concurrency)])) for d in asked]
    return {"rows": rows}


def chance_rates(rows: list, continued: bool) -> tuple[float, float, float, int]:
    """(mean chance stated, share decided at repeat 3, its Monte-Carlo error, n) of the configurations
    the plan continued (or stopped as unlikely). The error is a ratio estimator's over experiments (an
    experiment's configurations share its sessions)."""
    return stated_and_decided([r for r in rows if r[2] == continued], 1, 3)
