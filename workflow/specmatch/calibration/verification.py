"""Verification of the recommended deployment, measured as the workflow measures it.

A recommendation that is a vLLM schedule is deployed in the same simulated server and measured after
the primary repeats, in its own sessions; records.Verification states its error rates (a right
schedule failed, a costly one verified, each at most alpha), and these tasks measure them: once with a
switch that costs nothing (the schedule is right) and once with one whose switched-off steps cost
SWITCH_COST more (it is not).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..deciding import analysis
from ..deciding.analysis import analyse
from ..deciding.recommending.deployment import ServerInfo
from ..serving.engines.vllm import SCHEDULE, server_k
from .grid import BASE, CONCURRENCIES, SPEC, SPEC_INFO, SUITES, settings
from .scenarios import SCENARIOS, run_to_run
from .workload import Workload, simulate_cells

SWITCH_COST = 0.15
VERIFY_OUTCOMES = ("verified", "failed", "undecided", "not derived")


def bands(rec) -> list | None:
    """A recommendation to deploy a schedule: its inclusive bands [lo, hi, k] (vLLM's per-batch-size
    list); None for any other action (keep, off: the server as configured or the baseline)."""
    ok = rec is not None and rec.action == "schedule" and rec.schedule is not None
    return rec.schedule.bands if ok and rec.schedule.bands else None


def verification_outcome(an, rec, name: str) -> str:
    """verified | failed | undecided from the recommendation's typed verification (records.Verification,
    filled by analyse() when the derived server's cells are there); "not measured" and the like
    count as undecided; a recommendation whose verification was not filled in is verified here
    (analysis.verify)."""
    v = getattr(rec, "verified", None)
    if v is None:
        rec.derived_server = rec.derived_server or name
        v = analysis.verify(an, rec, name)
    get = (lambda k: v.get(k)) if isinstance(v, dict) else (lambda k: getattr(v, k, None))
    x = get("outcome")
    x = getattr(x, "value", x)
    if isinstance(x, str):
        return x if x in VERIFY_OUTCOMES[:3] else "undecided"
    m = get("matches_best")
    return "verified" if m is True else "failed" if m is False else "undecided"


def verify_task(a: dict) -> dict:
    """Verification of the recommended deployment as the workflow runs it: the primary grid (three
    suites, R repeats; the recommendation made on the first) of a baseline and a speculative server
    that pays 1.4x at c=1, breaks even at c=4 and loses 0.6x at c=16 (SPEC_TRUTH); its
    recommendation, when it is a vLLM schedule, deployed in the same simulated server as
    `spec__recommended` and measured on the grid after the primary repeats (its own sessions), once
    with a switch that costs nothing and once with one whose switched-off steps cost 15% more.
    Counts of each outcome per variant; `not derived` where the verdicts gave no schedule to measure."""
    n, repeats = a["experiments"], a.get("repeats", 2)
    rng = np.random.default_rng(a["seed"])
    sc = SCENARIOS[a.get("name", "plain")]
    s = settings(a.get("bootstrap", 250))
    suites = [SUITES[0]]                   # the recommendation's suite; the primary grid has all three
    infos = {"spec": ServerInfo("spec", "vllm", "vllm", SPEC_INFO, 256)}
    work = [Workload.draw(rng) for _ in range(n)]
    servers = ["baseline", "spec", "spec__recommended"]
    eff = []
    for _ in range(n):
        x = run_to_run(rng, sc, servers[:2], SUITES, CONCURRENCIES, repeats, total_sessions=3 * repeats)
        y = run_to_run(rng, sc, servers[2:], suites, CONCURRENCIES, repeats, 2 * repeats, 3 * repeats)
        eff.append(x | y)
    primary = simulate_cells(rng, work, {"baseline": BASE, "spec": SPEC}, eff, repeats)
    recs = []
    for e in range(n):
        an = analyse(primary[e], "baseline", s, infos, suites, primary=servers[:2])
        rec = an.recommendations[0] if an.recommendations else None
        recs.append(rec if rec is not None and rec.action == "schedule" and bands(rec) else None)
    todo = [e for e, r in enumerate(recs) if r is not None]
    out = {"correct": dict.fromkeys(VERIFY_OUTCOMES, 0), "costly": dict.fromkeys(VERIFY_OUTCOMES, 0),
           "schedules": [bands(r) for r in recs if r is not None]}
    for v in ("correct", "costly"):
        out[v]["not derived"] = n - len(todo)
    if not todo:
        return out
    for variant, cost in (("correct", 1.0), ("costly", 1 + SWITCH_COST)):
        engines = []
        for e in todo:
            spec = {**SPEC_INFO, SCHEDULE: bands(recs[e])}
            on = tuple(server_k(spec, b) > 0 for b in range(0, 257))
            engines.append(replace(SPEC, on=on.__getitem__, off_cost=cost))
        one = [work[e].only(suites) for e in todo]
        derived = simulate_cells(rng, one, {"spec__recommended": engines}, [eff[e] for e in todo], repeats)
        for i, e in enumerate(todo):
            info_d = replace(infos["spec"], name="spec__recommended",
                             speculative={**SPEC_INFO, SCHEDULE: bands(recs[e])})
            an = analyse(primary[e] + derived[i], "baseline", s, infos | {"spec__recommended": info_d}, suites,
                         primary=servers[:2])
            rec = next((r for r in an.recommendations if r.server == "spec"), None)
            out[variant][verification_outcome(an, rec, "spec__recommended") if rec else "undecided"] += 1
    return out



def verified_shares(counts: dict) -> dict:
    """Share of each outcome among the experiments whose recommendation was measured."""
    n = sum(counts[k] for k in VERIFY_OUTCOMES[:3])
    return {k: counts[k] / n if n else float("nan") for k in VERIFY_OUTCOMES[:3]} | {"derived": n}
