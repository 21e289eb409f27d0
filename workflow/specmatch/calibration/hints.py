"""'What would decide it', carried out: does the design a verdict names decide as often as it says?

An inconclusive verdict names a design (more repeats, or a larger suite) and the probability it
decides. The only honest check is to run it: each named design is carried out on its own experiment
as the workflow would (more repeats add fresh sessions to today's cells; a larger suite reruns every
cell with new prompts in fresh sessions), the verdict read again, and the share decided compared with
the probability stated. Carried-out designs are the calibration's dearest part (they name up to 64
repeats of suites up to 32 times the default's), so only the throughput verdicts they were named for
are read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..deciding.analysis import analyse
from ..deciding.rounds import plan
from ..deciding.reading.measurements import Settings
from ..records import Continuation, Decision
from .grid import CONCURRENCIES, PROMPTS, SUITES, decided, settings, two_servers
from .scenarios import SCENARIOS, Scenario, run_to_run
from .tally import stated_and_decided
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


HINT_POPULATIONS = {
    "aa": ("plain", "identical servers"),
    "effects": ("plain", "a uniform speedup per experiment, log-uniform within ±12%"),
    "quiet": ("quiet", "identical servers on a quiet machine"),
    "t3": ("t3", "identical servers, Student-t(3) session and cell effects (heavy tails)"),
}


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
    outcome one of comparison.OUTCOMES (what decides_probability(split=True) predicts); `plan_shares`, where
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
                        outcomes[key] = ("equivalent" if v.verdict == Decision.EQUIVALENT else "effect", R)
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


def hint_task(a: dict) -> dict:
    """'What would decide it', checked by carrying it out: `experiments` experiments of
    HINT_POPULATIONS[`name`], analysed at R = 2 (fixed design, or `sequential`: repeats {min: 2, max: 3}),
    throughput only; for every inconclusive verdict, its named design carried out on the same
    experiment (carry_out) and the verdict read again. Returns {"rows": [(experiment, stated
    probability, reachable, decided, repeats, suite scale)]}, the experiment (seed, index) so that
    rows of every chunk keep their experiments apart."""
    scenario, _ = HINT_POPULATIONS[a["name"]]
    sc = SCENARIOS[scenario]
    rng = np.random.default_rng(a["seed"])
    s = Settings.of(vars(settings(a.get("bootstrap", 250), slo={}, designs=True))
                    | {"repeats": {"min": 2, "max": 3} if a.get("sequential") else 2})
    rows = []
    for e in range(a["experiments"]):
        work, eng = Workload.draw(rng), two_servers(a["name"], rng)
        eff = run_to_run(rng, sc, list(eng), SUITES, CONCURRENCIES, 2)
        cells = simulate_cells(rng, [work], eng, [eff], 2)[0]
        an = analyse(cells, "baseline", s)
        named = [v for v in an.verdicts if v.server == "spec" and v.metric == "output_throughput"
                 and v.speedup is not None and not decided(v) and v.design]
        done: dict = {}
        for v in named:
            d = v.design
            key = (d["repeats"], d["suite_scale"])
            if key not in done:
                wanted = {(x.suite, x.concurrency, x.metric) for x in named
                          if (x.design["repeats"], x.design["suite_scale"]) == key}
                done[key] = carry_out(rng, sc, eng, work, eff, cells, d, 2, s, wanted=wanted)
            rows.append(((a["seed"], e), float(d["probability"]), bool(d["reachable"]),
                         bool(done[key].get((v.suite, v.concurrency, v.metric))), d["repeats"], d["suite_scale"]))
    return {"rows": rows}


def hint_rates(rows: list, lo: float = 0.0, hi: float = 1.01, reachable: bool | None = None
               ) -> tuple[float, float, float, int]:
    """(mean stated probability, share decided, its Monte-Carlo error, n) of carried-out hints whose
    stated probability is in [lo, hi) (and reachable, where given). The error is a ratio estimator's
    over experiments (rows carry their experiment; hints of one experiment share its sessions)."""
    return stated_and_decided([r for r in rows if lo <= r[1] < hi and (reachable is None or r[2] == reachable)], 1, 3)
