"""The experiment's design as a reader needs it to trust the intervals: how much a configuration moves
between server sessions, and what the sequential design measured and at which levels it decided."""
from __future__ import annotations

import math

from ..metrics import LABEL
from ..deciding.recommending.deployment import RECOMMENDED
from ..records import Continuation, RoundPlan
from .decided import Decided


def noise_lines(d: Decided) -> list[str]:
    """The run-to-run variation the intervals include (deciding.verdicts.noise), or that they exclude it."""
    rr, s = d.decisions.analysis.run_to_run, d.settings
    if not rr.pooled:
        return [f"**These intervals exclude run-to-run variation.** Each cell was measured once (repeats: 1), so "
                "the intervals show only how much the result moves between prompts and requests, not between "
                "server sessions, which is usually larger (vLLM reports 1.5-3.7% on GPUs). A verdict therefore needs "
                f"an effect beyond ±{s.min_effect:.0%}, and 'equivalent' is never called. Set `repeats: 2` or more to "
                "measure it."]
    parts = []
    for f in rr.pooled:
        levels = sorted((x for x in rr.levels if x.metric == f.metric), key=lambda x: x.concurrency)
        by_c = ", ".join(f"c={x.concurrency} ±{math.exp(math.sqrt(x.tau2)) - 1:.1%}" for x in levels)
        parts.append(f"{LABEL[f.metric]} ±{math.exp(math.sqrt(f.tau2)) - 1:.1%}" + (f" ({by_c})" if len(levels) > 1
                                                                                    else ""))
    return ["**Run-to-run variation, measured:** between fresh server sessions a configuration's figures move by "
            + "; ".join(parts) + f" (one standard deviation; pooled by a median fit over {rr.configurations} "
            f"configurations measured in {rr.repeats} repeats, so one outlying cell cannot set it; by concurrency in "
            "brackets). Each interval below uses its own server's and concurrency's, shrunk toward the pooled level "
            "where their data are thin (empirical Bayes), beside the prompt sample's variation from a paired "
            "bootstrap by prompt; request-to-request noise is counted once, in the run-to-run part."
            + (f" {rr.left_out} cell(s) measured beside another job are left out of it (their verdicts say so)."
               if rr.left_out else "")
            + "".join(f" **On {LABEL.get(m, m)}, suite `{d[0]}` holds {d[1]:.0%} of the spread with {d[2]:.0%} of the "
                      "data**: its cells moved far more between sessions than the others', and it widens every "
                      "interval through the pooled level; measure it again on a quiet machine."
                      for m, d in sorted(rr.dominant.items()))]


def sequential_lines(d: Decided, plans: list[RoundPlan]) -> list[str]:
    """The sequential design's account: what each round decided, the cells it measured against a fixed
    design of `max` repeats, and the levels the verdicts were taken at."""
    s = d.settings
    design = s.design
    primary = [k for k in d.cells if not k[0].endswith(RECOMMENDED)]
    configs = {k[:3] for k in primary}
    fixed = len(configs) * design.max
    rounds = []
    for p in plans:
        rounds.append(f"after round {p.round}: " + ", ".join(f"{v} {a.value}" for a, v in p.counts().items() if v)
                      + _chances(p)
                      + (f"; repeat {p.round + 1} measured {len(p.next)} cells" if p.next else "; nothing continued"))
    levels = sorted({round(v.confidence, 3) for v in d.verdicts if v.metric == s.recommend_metric
                     and v.run_to_run and not v.server.endswith(RECOMMENDED)})
    return [f"**Sequential design (repeats {design.min}–{design.max}):** every cell was measured {design.min} times; "
            "then, round by round, only the configurations whose "
            f"{LABEL[s.recommend_metric]} verdict was still inconclusive "
            "(and a k sweep's undecided choices: the best k against each candidate it could not be told from), "
            f"and whose chance of being decided by the remaining repeats was at least {design.min_probability:.0%} "
            "(the rounds' chance: from the data so far under a flat prior on the effect, a ranking and a futility bar, "
            "not a forecast at any one effect), were measured again (the baseline, or the other k, beside them)"
            + (f", at most {design.max_cells} cells a round, the likeliest to be decided first (the others stop "
               "*over budget*, with the verdict they had; `repeats.max_cells`)" if design.max_cells else "") + ": "
            + ("; ".join(rounds) if rounds else "no round ran") + f". {len(primary)} cells measured against "
            f"{fixed} for a fixed design of {design.max} repeats ({1 - len(primary) / fixed:.0%} saved). Stopping "
            f"when a verdict is decided is optional stopping, so each look's verdict is taken at a stricter level "
            f"(alpha spending over the looks, specmatch.deciding.reading.sequential) that keeps the overall error at "
            f"{1 - s.confidence:.0%}: the verdicts here stand at "
            + ", ".join(f"{x:.1%}" for x in levels) + " confidence (verdicts.json, `confidence`)."]


def _chances(p: RoundPlan) -> str:
    """The chances the round decided by (RoundDecision.chance): each continued configuration's, and the
    highest of those it stopped as unlikely or over budget."""
    go = sorted((d.chance for d in p.decisions if d.chance is not None and d.action == Continuation.CONTINUE),
                reverse=True)
    stop = [d.chance for d in p.decisions if d.chance is not None and d.action != Continuation.CONTINUE]
    parts = ([f"continued at {', '.join(f'{x:.0%}' for x in go)}"] if go else []) + (
        [f"the others at most {max(stop):.0%}"] if stop else [])
    return f" (the rounds' chance: {'; '.join(parts)})" if parts else ""
