"""'What would decide it', carried out: does a named design decide as often as its power says?

An inconclusive verdict names two designs (verdicts.designs): one that decides an effect (pays or
loses) with probability 80% outside stated bounds, one that confirms no difference with a stated
probability if the speedup is 1.00. Each is a power statement: a probability at a named effect, given
today's data. It can be checked wherever the truth is known: the statement's own simulation evaluated at
the true effect (`designs.power`) states the probability that the design decides as the truth is, and the
design carried out on its experiment as the workflow would (more repeats add fresh sessions to today's
cells through the rounds; a larger suite reruns every cell with new prompts in fresh sessions) says
whether it did. On identical servers the equivalence design's stated probability is exactly that; on
effects near the stated bounds the effect design's is near 80%.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..deciding.analysis import analyse
from ..deciding.rounds import plan
from ..deciding.reading.measurements import Settings
from ..deciding.verdicts.designs import CONFIRM_DRAWS, decided_as_true, power
from ..records import Continuation
from .des import Engine
from .grid import BASE, CONCURRENCIES, PROMPTS, SUITES, decided, settings
from .scenarios import SCENARIOS, Scenario, run_to_run
from .tally import stated_gap
from .workload import Workload, simulate_cells

@dataclass
class Reading(Settings):
    """The analysis's settings, with the verdicts computed for `only` these metrics (every metric where
    empty). Every metric is analysed on its own (its run-to-run variance, its bootstrap), so a verdict
    is the one the full analysis gives; test_calibration checks it on a simulated experiment."""
    only: tuple = ()

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(m for m in Settings.metrics.fget(self) if not self.only or m in self.only)


STALLED = Engine(hiccup_p=0.01, hiccup_s=0.1)   # 1% of steps stall, 100 ms on average (5-8 steps at c=16)

# name -> (run-to-run scenario, what it is, the true log speedup: a number or (lo, hi) drawn per experiment,
# the servers' engine)
HINT_POPULATIONS = {
    "aa": ("plain", "identical servers", 0.0, BASE),
    "near": ("plain", "a speedup of 1.06-1.10x (log-uniform), near the effect design's bounds",
             (math.log(1.06), math.log(1.10)), BASE),
    "spread": ("plain", "a speedup log-uniform within ±20%", (-0.2, 0.2), BASE),
    "t3": ("t3", "identical servers, Student-t(3) session and cell effects", 0.0, BASE),
    "t3near": ("t3", "a speedup of 1.06-1.10x, Student-t(3) session and cell effects",
               (math.log(1.06), math.log(1.10)), BASE),
    "stalls": ("plain", "identical servers, 1% of engine steps stalled (100 ms)", 0.0, STALLED),
}


def servers(population: str, rng: np.random.Generator) -> tuple[dict, float]:
    """The baseline and `spec` of a population, and the true log speedup (throughput's exactly: des.Engine.faster)."""
    _, _, truth, engine = HINT_POPULATIONS[population]
    theta = float(rng.uniform(*truth)) if isinstance(truth, tuple) else float(truth)
    return {"baseline": engine, "spec": engine.faster(math.exp(theta))}, theta


def carry_out(rng: np.random.Generator, sc: Scenario, eng: dict, work: Workload, eff: dict, cells: list, design: dict,
              today: int, s, metrics=("output_throughput",), wanted: set | None = None,
              outcomes: dict | None = None, plan_shares: list | None = None) -> dict:
    """A verdict's named design (Verdict.design) carried out on its experiment as the workflow would:
    more repeats of today's suite (suite_scale 1) add fresh sessions' cells to today's; a larger suite
    reruns every cell with ceil(PROMPTS x g) new prompts in fresh sessions (today's data are not part
    of it). Analysed under `s`'s design with the named repeats (fixed: one look at R'; sequential:
    repeats {min, max: R'}, every look from min on, each later repeat measuring only the cells the
    round's plan names (deciding.rounds.plan), decided at the first look that decides, and a
    configuration the rounds stop as unlikely to be decided never decided). Returns
    {(suite, concurrency, metric): decided} of the second server; with `wanted` (such keys), the looks end
    once each of them is decided or stopped. `outcomes`, where given, gets (outcome, look) per key, the
    outcome one of designs.OUTCOMES (what designs.power predicts); `plan_shares`, where
    given, the share of run-to-run dof each round's plan measured again (RoundPlan.share), look by look."""
    Rn, g = int(design["repeats"]), float(design["suite_scale"])
    servers = list(eng)
    if g == 1:
        new = run_to_run(rng, sc, servers, SUITES, CONCURRENCIES, Rn)
        new = {k: (eff[k] if k[3] <= today else v) for k, v in new.items()}
        data = cells + (simulate_cells(rng, [work], eng, [new], range(today + 1, Rn + 1))[0] if Rn > today else [])
        # today's look too: the rounds may stop a configuration there under the design's levels
        first = today
    else:
        big = Workload.draw(rng, prompts=int(math.ceil(PROMPTS * g)))
        data = simulate_cells(rng, [big], eng, [run_to_run(rng, sc, servers, SUITES, CONCURRENCIES, Rn)], Rn)[0]
        first = 1
    seq = s.design.sequential and Rn > s.design.min
    # every look of a sequential design's rounds (deciding.rounds.plan): a configuration they stop as unlikely
    # to be decided is never measured again
    looks = list(range(max(first, s.design.min), Rn + 1)) if seq else [Rn]
    # the carried-out verdicts' own hints are not asked for, and only `metrics` are read
    at = Reading.of(vars(s) | {"repeats": {"min": s.design.min, "max": Rn} if seq else Rn, "designs": False,
                               "only": tuple(metrics)})
    out: dict = {}
    # as the workflow measures: every cell up to the first look, then each round's plan names the cells
    # of the next repeat (the configurations it continues and their baseline cells), no others
    measured = [x for x in data if x[0].repeat <= looks[0]]
    for R in looks:
        an = analyse(measured, "baseline", at)
        for v in an.verdicts:
            if v.server == "spec" and v.metric in metrics:
                key = (v.suite, v.concurrency, v.metric)
                if key not in out and decided(v):
                    out[key] = True
                    if outcomes is not None:
                        outcomes[key] = (v.verdict.value, R)
        if seq and R < Rn:
            p = plan(an, at.design, R)
            if plan_shares is not None:
                plan_shares.append(p.share)
            for d in p.decisions:
                if d.server == "spec" and d.action == Continuation.UNLIKELY:
                    key = (d.suite, d.concurrency, an.settings.recommend_metric)
                    if key not in out and outcomes is not None:
                        outcomes[key] = ("futile", R)
                    out.setdefault(key, False)
            again = {(c.server, c.suite, c.concurrency) for c in p.next}
            measured += [x for x in data if x[0].repeat == R + 1
                         and (x[0].server, x[0].suite, x[0].concurrency) in again]
        if wanted is not None and wanted <= set(out):
            break
    if outcomes is not None:
        for key in set(wanted or ()) - set(out):
            outcomes[key] = ("open", looks[-1])
    return out


TRUTH_OUTCOME = {0: "equivalent", 1: "pays", -1: "loses"}


def hint_task(a: dict) -> dict:
    """'What would decide it', checked by carrying it out: `experiments` experiments of
    HINT_POPULATIONS[`name`], analysed at R = 2 (fixed design, or `sequential`: repeats {min: 2, max: 3}),
    throughput only. For every inconclusive verdict, both named designs carried out on the same experiment
    (carry_out, once per distinct design) and the verdict read again. Returns {"rows": [(experiment,
    statement ("effect" or "equivalence"), probability at the truth (designs.power at the true effect:
    what the statement's simulation says of this truth), probability stated, decided as the truth is,
    repeats, suite scale, concurrency, reachable)]}, the experiment (seed, index) so that rows of every
    chunk keep their experiments apart. With `max_cost` (repeats x suite scale), only the designs that
    cost at most that are carried out: the short designs, where today's low run-to-run draw makes a
    statement optimistic, at a fraction of the CPU (a 61-repeat design is most of an experiment's)."""
    scenario, _, _, _ = HINT_POPULATIONS[a["name"]]
    sc = SCENARIOS[scenario]
    rng = np.random.default_rng(a["seed"])
    s = Reading.of(vars(settings(a.get("bootstrap", 250), slo={}, designs=True))
                   | {"repeats": {"min": 2, "max": 3} if a.get("sequential") else 2, "only": ("output_throughput",)})
    rows = []
    for e in range(a["experiments"]):
        work = Workload.draw(rng)
        eng, theta = servers(a["name"], rng)
        eff = run_to_run(rng, sc, list(eng), SUITES, CONCURRENCIES, 2)
        cells = simulate_cells(rng, [work], eng, [eff], 2)[0]
        an = analyse(cells, "baseline", s)
        named = [v for v in an.verdicts if v.server == "spec" and v.metric == "output_throughput"
                 and v.speedup is not None and not decided(v) and v.design]
        cap = a.get("max_cost", math.inf)
        todo = {}
        for v in named:
            for kind in ("effect", "equivalence"):
                d = v.design[kind]
                if d["repeats"] * d["suite_scale"] > cap:
                    continue
                todo.setdefault((d["repeats"], d["suite_scale"]), set()).add((v.suite, v.concurrency, v.metric))
        ends: dict = {}
        for (Rn, g), wanted in todo.items():
            outcomes: dict = {}
            carry_out(rng, sc, eng, work, eff, cells, {"repeats": Rn, "suite_scale": g}, 2, s, wanted=wanted,
                      outcomes=outcomes)
            ends[(Rn, g)] = outcomes
        truth = TRUTH_OUTCOME[int(np.sign(theta))]
        for v in named:
            cmp = next(x for x in an.comparisons[("spec", v.suite, "output_throughput")]
                       if x.concurrency == v.concurrency)
            for kind in ("effect", "equivalence"):
                d = v.design[kind]
                design = (d["repeats"], d["suite_scale"])
                if design not in ends:
                    continue
                at = power(cmp, s, [design], theta, np.random.default_rng([a["seed"], e, SUITES.index(v.suite), v.concurrency]), CONFIRM_DRAWS)
                got = ends[design][(v.suite, v.concurrency, v.metric)][0]
                rows.append(((a["seed"], e), kind, float(decided_as_true(at, theta)[0]), float(d["probability"]),
                             got == truth, d["repeats"], d["suite_scale"], v.concurrency, bool(d["reachable"])))
    return {"rows": rows}


def hint_gap(rows: list, kind: str | None = None, at_truth: bool = True, keep=None) -> tuple:
    """(mean probability at the truth (or as stated), share decided as the truth is, decided - stated and its
    Monte-Carlo error, n) of the carried-out statements of `kind` (both where None) that `keep(row)` keeps:
    tally.stated_gap, a ratio estimator's error over experiments (hints of one experiment share its
    sessions)."""
    sel = [r for r in rows if (kind is None or r[1] == kind) and (keep is None or keep(r))]
    return stated_gap(sel, 2 if at_truth else 3, 4)
