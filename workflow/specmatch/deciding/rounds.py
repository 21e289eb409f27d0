"""One round of the sequential design: which configurations get another repeat.

A Snakemake checkpoint per round (workflow/rules/rounds.smk). With `repeats: {min, max}` every cell
is measured `min` times; after round R (the cells of repeats 1..R), the configured servers are
analysed as the summary would (sequential levels, specmatch.deciding.reading.sequential) and each configuration
(server against the baseline at a suite and concurrency, on `summary.recommend_metric`) measured
in round R either stops (decided, at max, or unlikely to be decided by the remaining repeats) or
continues. The plan
(records.RoundPlan) lists the cells repeat R+1 measures; the workflow then launches only the servers
that have such cells, in fresh sessions, and never reruns a finished cell.

A configuration's verdict is final at the look where it stopped: the plan records all of it
(RoundDecision: verdict, speedup, interval, level, dof, what would decide it), and every later
analysis (the next rounds, the recommendation, the summary) reads the earlier plans and keeps it
(analysis.frozen_verdicts), although other configurations' repeats move the run-to-run estimate its
interval rests on. Re-deciding it would be another look at the same data, which the alpha spending
did not pay for, and the summary could contradict the round that stopped it.

A k sweep's members are planned by their question: on the suites the sweep's k is decided on
(`--suites`, the recommendation suites), the best k's comparisons with the candidates it could not
be told from (k_choices); elsewhere each member's own verdict, as any server's.

A budget of cells per round (`repeats.max_cells`): where the continuing configurations need more
cells than that, the likeliest to be decided (sequential.chance_decided) are measured first, as long
as their cells fit (a baseline cell several configurations share counts once), and the others stop
"over budget" with their verdict at this look. Any stopping rule leaves the error rate as the alpha
spending holds it; the budget only bounds what a round costs (the embedded default's time on 2 cores,
a GPU team's minutes).

    python -m specmatch rounds --round R --baseline B --settings JSON --servers JSON --cells c*.json
        --requests c*.requests.parquet --launches launch.json... --suites S... [--rounds r2.json ...]
        --out results/rounds/rR.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from .. import steps
from .analysis import Analysis, frozen_verdicts, primary_analysis
from .reading.measurements import Settings
from .verdicts.comparison import compare, frozen_for
from .verdicts.designs import chance_and_continues
from ..files import SpecmatchError, read_json, write_json
from ..provenance import Recorder
from ..records import Continuation, Decision, PlannedCell, RoundDecision, RoundPlan, Verdict
from .inputs import analysis_arguments, load, server_infos
from .reading.sequential import Design, dof_share as sequential_dof_share, settled_share
from ..sweep import members as sweep_members


def plan(an: Analysis, design: Design, round_: int) -> RoundPlan:
    """The decisions after round `round_` and the cells of the next repeat (module docstring).

    Whether a configuration is likely decided depends on the dof its final interval will have, and
    so on how much the remaining repeats add to the run-to-run estimate (sequential.final_dof's
    `share`), which is what the plan decides: the plan is made assuming every cell is measured again,
    then again with the share it measures, until the share it assumed is no more than the share it
    measures (the share only falls, so this ends). The plan records the share it used."""
    def step(share):
        decisions, nxt = _decisions(an, design, round_, share)
        return (decisions, nxt), dof_share(an, nxt, round_)

    share, (decisions, nxt) = settled_share(step)
    cells = [PlannedCell(s, u, c, round_ + 1) for s, u, c in sorted(nxt)]
    return RoundPlan(round_, design.to_json(), an.settings.recommend_metric, decisions, cells, share=round(share, 4))


def dof_share(an: Analysis, nxt: set, round_: int) -> float:
    """The share of sequential.final_dof that measuring `nxt` again gives (sequential.dof_share): the
    run-to-run estimate (verdicts.noise.run_to_run) reads every cell of the analysed servers with two
    repeats or more, configurations stopped in earlier rounds included, so from the second round on the
    stopped cells keep their dof and the share falls below the count's."""
    return sequential_dof_share(an.measurements.repeats_by_cell(an.servers), nxt, round_)


def _decisions(an: Analysis, design: Design, round_: int, share: float) -> tuple[list[RoundDecision], set]:
    """Every configuration's decision at this look and the cells of those that continue, with `share`
    of the pooled cells assumed measured again."""
    metric = an.settings.recommend_metric
    decisions, wants = [], []   # wants: (chance, index into decisions, the cells it continues with)
    # a k sweep's member on a suite its k is decided on: its question there is the k choice (k_choices),
    # not its own verdict against the baseline
    k_asked = {(name, rec.suite) for rec in an.k_recommendations
               for name in sweep_members(rec.parent, an.servers).values()}
    for (server, suite, m), cmps in sorted(an.comparisons.items()):
        if m != metric or server == an.baseline or (server, suite) in k_asked:
            continue
        for cmp in cmps:
            if cmp.repeats != round_:
                continue   # stopped in an earlier round: its verdict stands
            v = an.verdict(server, suite, cmp.concurrency, metric)
            if v is None or v.speedup is None:
                continue   # nothing measured to decide (failed cells say why in the summary)
            p = None
            if v.verdict != Decision.INCONCLUSIVE:
                action = Continuation.DECIDED
            elif round_ >= design.max:
                action = Continuation.AT_MAX
            else:
                p, go = chance_and_continues(cmp, design, an.settings, share)
                action = Continuation.CONTINUE if go else Continuation.UNLIKELY
            decisions.append(recorded(v, action, against=None, chance=p))
            if action == Continuation.CONTINUE:
                wants.append((p, len(decisions) - 1, {(who, suite, cmp.concurrency) for who in (server, an.baseline)}))
    for d, p in _k_choices(an, design, round_, share):
        decisions.append(d)
        if d.action == Continuation.CONTINUE:
            wants.append((p, len(decisions) - 1, {(who, d.suite, d.concurrency) for who in (d.server, d.against)}))
    return decisions, within_budget(wants, design.max_cells, decisions)


def within_budget(wants: list[tuple[float, int, set]], max_cells: int | None, decisions: list[RoundDecision]) -> set:
    """The cells of the continuing configurations, the likeliest to be decided first while they fit in
    `max_cells` (None: all); a configuration that does not fit is marked over budget in `decisions`.
    Ties keep the plan's order (configurations sorted by server, suite and concurrency)."""
    nxt: set = set()
    for p, i, cells in sorted(wants, key=lambda x: (-x[0], x[1])):
        if max_cells is None or len(nxt | cells) <= max_cells:
            nxt |= cells
        else:
            decisions[i].action = Continuation.BUDGET
    return nxt


def k_choices(an: Analysis, design: Design, round_: int) -> list[RoundDecision]:
    """The k sweeps' choices (kchoice.best_k) at round `round_`: the best k's comparison with every other
    candidate. One still open (inconclusive, or contradicting the estimates' order) while k is not
    decided, "pays, k open" included, continues (both servers get another repeat at that suite and
    concurrency) where the remaining repeats likely decide it, by the same rule and levels as every
    configuration; a decided one is recorded as decided. A pair is looked at while either side was
    measured in this round: the best k can change between rounds, and its new pair must not stop
    for the one repeat its other side was not measured in."""
    return [d for d, _ in _k_choices(an, design, round_)]


def _k_choices(an: Analysis, design: Design, round_: int, share: float = 1.0) -> list[tuple[RoundDecision, float]]:
    """k_choices, each with the chance that the remaining repeats decide it (what a cell budget ranks
    by; 1 for a pair that contradicts the estimates' order: settled first)."""
    metric = an.settings.recommend_metric
    m = an.measurements
    out = []
    for rec in an.k_recommendations:
        for ch in rec.choices:
            for v in ch.pairwise:
                if v.speedup is None or not any(round_ in m.repeats(x, rec.suite, ch.concurrency)
                                                for x in (v.server, v.against)):
                    continue   # nothing to decide, or neither side measured this round (it stopped earlier)
                if frozen_for(m, v.server, v.against, rec.suite, ch.concurrency, metric, v.repeats) is not None:
                    continue   # it stopped at an earlier look (one side measured again for another pair): final
                open_ = bool(ch.candidates) and v.verdict in (Decision.INCONCLUSIVE, Decision.LOSES)
                if not open_ and v.verdict == Decision.INCONCLUSIVE:
                    continue   # inconclusive against a k the choice does not hinge on
                p, stated = 0.0, None
                if not open_:
                    action = Continuation.DECIDED
                elif round_ >= design.max:
                    action = Continuation.AT_MAX
                elif v.verdict == Decision.LOSES:   # the paired comparison contradicts the estimates' order
                    action, p = Continuation.CONTINUE, 1.0
                else:
                    cmp = compare(m, an.run_to_run, v.server, v.against, rec.suite, ch.concurrency, metric)
                    stated, go = (chance_and_continues(cmp, design, an.settings, share) if cmp.estimate is not None
                                  else (None, False))
                    action = Continuation.CONTINUE if go else Continuation.UNLIKELY
                    p = stated if go else 0.0
                out.append((recorded(v, action, against=v.against, chance=stated), p))
    return out


def recorded(v: Verdict, action: Continuation, against: str | None, chance: float | None = None) -> RoundDecision:
    """A verdict at this look as the round records it: everything a configuration that stops here keeps
    (analysis.frozen_verdicts), and for an inconclusive one the chance the remaining repeats decide it."""
    return RoundDecision(v.server, v.suite, v.concurrency, v.repeats, v.verdict, v.confidence, action, v.speedup,
                         v.lo, v.hi, against=against, dof=v.dof, run_to_run=v.run_to_run, decide=v.decide,
                         design=v.design, chance=None if chance is None else float(chance))


def describe(p: RoundPlan) -> str:
    return (f"round {p.round} ({p.metric}): " + ", ".join(f"{n} {a.value}" for a, n in p.counts().items() if n)
            + f"; repeat {p.round + 1} measures {len(p.next)} cells")


def arguments(p: argparse.ArgumentParser) -> None:
    analysis_arguments(p)
    p.add_argument("--round", type=int, required=True, help="the repeats measured so far (R)")
    p.add_argument("--rounds", nargs="*", type=Path, default=[],
                   help="the earlier rounds' plans: the configurations they stopped keep their verdicts")
    p.add_argument("--out", required=True, type=Path)


def execute(a: argparse.Namespace) -> int:
    settings, configs = Settings.of(json.loads(a.settings)), json.loads(a.servers)
    rec = Recorder("sequential_round", a.cells + a.requests + a.launches + a.rounds,
                   {"baseline": a.baseline, "summary": settings.__dict__, "round": a.round,
                    "suites": a.suites})
    design = settings.design
    if not design.sequential:
        raise SpecmatchError("rounds: the configured repeats are a fixed design (no rounds to plan)")
    infos = server_infos(a.launches, configs)
    earlier = [RoundPlan.from_json(read_json(x)) for x in a.rounds]
    an = primary_analysis(load(a.cells, a.requests, settings), a.baseline, settings, configs, infos, a.suites,
                          frozen_verdicts(earlier, a.baseline))
    out = plan(an, design, a.round)
    write_json(a.out, out.to_json())
    rec.write([a.out])
    print(describe(out))
    for d in out.decisions:
        print(f"  {d.server}" + (f" vs {d.against}" if d.against else "") + f" {d.suite} c={d.concurrency}: "
              f"{d.verdict.value} at {d.confidence:.1%} "
              f"({d.repeats} repeats) -> {d.action.value}"
              + (f" (decided by the remaining repeats with probability {d.chance:.1%})" if d.chance is not None else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    return steps.main("rounds", __doc__, arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
