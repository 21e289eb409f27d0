"""External endpoints: a recommendation for a server the workflow cannot restart.

Three endpoints the workflow only measures (engine external, no `speculative` configured, max_batch 0
as their launch records say): a baseline, its twin, and one that drafts k=4, paying 1.3x up to 4
running requests and losing 0.6x above (EXT_TRUTH). What must come out: a valid vLLM schedule that
follows the verdicts (drafting below the crossover, off above), marked not verifiable (nothing
restarts an external endpoint), and nothing for the twin, which drafts nothing.
"""
from __future__ import annotations

import re

import numpy as np

from ..deciding.analysis import analyse
from ..deciding.recommending.deployment import ServerInfo
from ..serving.engines.vllm import SCHEDULE, server_k, validate_schedule
from .grid import BASE, settings
from .ksweeps import K_NOISE, K_OUT_TOKENS, K_PROMPTS, calibrated
from .scenarios import run_to_run
from .tally import share
from .verification import bands
from .workload import Workload, simulate_cells


EXT_TRUTH = ((1, 1.30), (16, 0.60))   # 1.3x up to 4 running requests, 0.6x above (c=4 runs at 1.3x too)
EXT_CONCURRENCIES = (1, 4, 16)


def external_task(a: dict) -> dict:
    """`experiments` runs of three external endpoints (engine external, flavor vllm, no `speculative`
    configured, max_batch 0 as their launch records say): the baseline `base`, its twin `twin`, and
    `spec`, drafting k=4 at 1.3x up to 4 running requests and 0.6x above (EXT_TRUTH), at c = 1, 4,
    16 with `repeats` fixed repeats and K_NOISE[`noise`] run to run (default quiet: scripted endpoints
    are steady), analysed by analysis.analyse with the recommendation suite.
    Per run: whether the twin got a recommendation, and spec's action, schedule (valid by vLLM's rules
    or the error), k per batch size 1..16 as vLLM would run it, crossover and verification outcome."""
    n = a["experiments"]
    rng = np.random.default_rng(a["seed"])
    R = a.get("repeats", 3)
    s = settings(a.get("bootstrap", 250), repeats=R)
    engines = {"base": BASE, "twin": BASE, "spec": calibrated(4, EXT_TRUTH, step_at=4)}
    infos = {x: ServerInfo(x, "external", "vllm", None, a.get("max_batch", 0)) for x in ("twin", "spec")}
    work = [Workload.draw(rng, ("s",), K_PROMPTS, out_tokens=K_OUT_TOKENS) for _ in range(n)]
    eff = [run_to_run(rng, K_NOISE[a.get("noise", "quiet")], list(engines), ("s",), EXT_CONCURRENCIES, R)
           for _ in range(n)]
    cells = simulate_cells(rng, work, engines, eff, R, EXT_CONCURRENCIES, K_OUT_TOKENS)
    rows = []
    for e in range(n):
        an = analyse(cells[e], "base", s, infos, ["s"])
        recs = {r.server: r for r in an.recommendations}
        r = recs.get("spec")
        row = {"twin": "twin" in recs, "action": r.action if r else None, "schedule": bands(r),
               "crossover": r.crossover.point if r and r.crossover else None, "text": r.text if r else "",
               "verified": r.verified.outcome.value if r and r.verified else None, "valid": None, "k": None,
               "verdicts": {c: v.verdict.value for c in EXT_CONCURRENCIES
                            for v in [an.verdict("spec", "s", c, s.recommend_metric)] if v is not None}}
        if bands(r):
            try:
                validate_schedule(bands(r))
                row["valid"] = True
            except ValueError as err:
                row["valid"] = str(err)
            spec = {**(an.infos["spec"].speculative or {}), SCHEDULE: bands(r)}
            row["k"] = [server_k(spec, b) for b in range(1, 17)]
        rows.append(row)
    return {"rows": rows}


def external_rates(rows: list) -> dict:
    """(share, Monte-Carlo se, n) of: a recommendation for the twin (configured with no speculation,
    drafting nothing: should be none); a valid vLLM schedule for spec (`schedule`); a schedule that
    follows the verdicts (`follows`: drafting at each measured concurrency where speculation pays and off
    where it does not, in one block from batch 1: drafts below the switch, off above it; share of the
    runs with a schedule); the issue's verdicts, pays at c=1 and 4 and loses at 16 (`pattern`), and among
    those a schedule that drafts at batch 1-4 and is off from the crossover on, at 16 included (`right`);
    a schedule's verification NOT_VERIFIABLE (nothing restarts an external endpoint; share of the
    schedules); a text with an empty list ("pays at " followed by nothing)."""
    sched = [r for r in rows if r["valid"] is True]

    def follows(r) -> bool:
        on = [k > 0 for k in r["k"]]
        block = on == sorted(on, reverse=True)
        return block and all(on[c - 1] == (r["verdicts"].get(c) == "pays") for c in EXT_CONCURRENCIES)
    pattern = [r for r in rows if [r["verdicts"].get(c) for c in EXT_CONCURRENCIES] == ["pays", "pays", "loses"]]
    return {"n": len(rows), "twin": share([r["twin"] for r in rows]), "schedule": share([bool(r["k"]) for r in sched]
                                                                                      + [False] * (len(rows) - len(sched))),
            "follows": share([follows(r) for r in sched]), "pattern": share([r in pattern for r in rows]),
            "right": share([r["valid"] is True and all(k > 0 for k in r["k"][:4]) and r["k"][15] == 0
                            and follows(r) for r in pattern]),
            "not_verifiable": share([r["verified"] == "not verifiable" for r in sched]),
            "empty_list": share([re.search(r"\bat\s*(?:$|[;,.()])", r["text"]) is not None for r in rows]),
            "switch": [next((b for b, k in enumerate(r["k"], 1) if k == 0), None) for r in sched],
            "actions": {x: share([r["action"] == x for r in rows]) for x in sorted({str(r["action"]) for r in rows})}}
