"""Deployment: what to deploy from the verdicts (an engine-neutral records.Schedule: the server's own k
where speculation pays, none where it does not), rendered by the server's engine adapter
(serving/engines: Engine.render, a records.Deployment), and the measured check of it against a
reference the schedule fixes in advance (verification). This module names no engine's flags or keys:
what a server's `speculative` block drafts at a batch size is its adapter's answer (server_k).

Concurrency stands in for batch size (a closed loop of C workers keeps about C requests running).
Where a step-cost map predicts the concurrencies the verdict grid lacks (specmatch.deciding.predicting.stepcost,
and its checks agree with the cells), its predicted verdicts decide them, marked as predicted
(`Recommendation.predicted`). Above the map's fitted batches its predictions are an extrapolation of its
form, with intervals wider than inside the fit (their coverage: docs/methods/step-cost.md): where an
interval decides, it decides the batch sizes there (`Recommendation.beyond_map`); where none does, those
batch sizes are not known, speculation is off there (nothing shows it pays) and the text names the map
cells that would tell (`not_known`, `measure_there`). Without a checked map, batch sizes above the largest
measured concurrency only extend the verdict there: the record flags them
(`Recommendation.extrapolated_above`), and the text says so and names the map cells. A server whose largest batch is not
known (an external endpoint, launched by no one here, without a configured `max_batch`) is
recommended over the measured concurrencies, and the text says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, TypeVar
from ..verdicts.comparison import Comparison, compare, crossovers, decision, regions
from ..reading.measurements import Settings
from ...records import (REACH, Decision, KvPool, Outcome, Recommendation, Schedule, StepCostPrediction, Verdict,
                         Verification, VerificationRow)
from ...serving.engines import Engine, adapters, get_engine
from ...stats import t_ppf

RECOMMENDED = "__recommended"   # the suffix of a derived server that deploys a recommendation
T = TypeVar("T")


def decisions(verdicts: list[Verdict]) -> dict[int, bool | None]:
    """On (True), off (False) or undecided (None) per measured concurrency: pays -> on; loses or
    equivalent -> off (speculation that makes no difference only costs the drafter's work)."""
    return {v.concurrency: True if v.verdict == Decision.PAYS else
            None if v.verdict == Decision.INCONCLUSIVE else False for v in verdicts}


def on_per_batch(dec: dict[int, bool | None], cross_points: dict[tuple[int, int], float], max_batch: int
                 ) -> list[bool] | None:
    """Speculation on/off for every batch size 1..max_batch; None where no concurrency is decided.

    Every measured concurrency runs by its own verdict: on where speculation pays there, off where it
    loses or makes no difference, and off where it is undecided (not shown to pay there: a neighbour's
    "on" never spreads over it, and off spreads over no concurrency where it pays, which is decided on).
    Between two measured concurrencies that differ, the switch sits where the measured speedup crosses 1
    (interpolated on log concurrency, within that bracket; else the geometric mean). Below the smallest
    measured concurrency its decision holds; above the largest, a decided one's decision extends (an
    extrapolation, which the recommendation flags), an undecided one's is off (nothing measured shows
    that speculation pays at or above it, and speculation costs more per step as the batch grows). The rule
    is per_batch_schedule's, the one the k bands follow too (kbands)."""
    if not any(d is not None for d in dec.values()):
        return None
    runs = {c: bool(d) for c, d in dec.items()}
    top = max(runs)

    def switch_at(lo: int, hi: int) -> float:
        inside = sorted((a, x) for (a, z), x in cross_points.items() if lo <= a and z <= hi)
        return inside[0][1] if inside else math.sqrt(lo * hi)

    return per_batch_schedule(runs, switch_at, max_batch, runs[top] if dec[top] is not None else False)


def per_batch_schedule(runs: dict[int, T], switch_at: Callable[[int, int], float], max_batch: int, above: T
                       ) -> list[T]:
    """The setting that runs at every batch size 1..max_batch, from the setting each measured concurrency
    runs by its own data (`runs`: c -> setting; on/off for on_per_batch, a k for kbands.bands): the one
    rule both schedules follow. At and below the smallest measured concurrency its setting holds; at each
    measured concurrency its own; between two neighbouring measured concurrencies whose settings differ,
    the lower one's below the switch point `switch_at(lo, hi)` and the upper one's from it on; above the
    largest, `above` (the caller decides: the largest one's setting extended, or off)."""
    known = sorted(runs)
    out = []
    for b in range(1, max_batch + 1):
        if b > known[-1]:
            out.append(above)
        elif b <= known[0]:
            out.append(runs[known[0]])
        else:
            lo = max(c for c in known if c <= b)
            hi = min(c for c in known if c >= b)
            out.append(runs[lo] if runs[lo] == runs[hi] or b < switch_at(lo, hi) else runs[hi])
    return out


def onoff_schedule(engine: Engine, spec: dict, on: list[bool]) -> Schedule:
    """The k at every batch size 1..len(on): the server's own where speculation stays on, 0 where it
    goes off. Where the server's own schedule had switched speculation off and the verdicts say on, the
    k it speculates with elsewhere (Engine.own_k: `server_k(...) or 0` would switch it off there)."""
    own = engine.own_k(spec)
    return Schedule.of([(engine.server_k(spec, b) or own) if on[b - 1] else 0 for b in range(1, len(on) + 1)])


def own_k(spec: dict) -> int:
    """The k a `speculative` block names, by whichever registered engine reads its keys (0: none names
    one; no engine's default is assumed), for a caller that does not name the engine; one that does
    asks that engine's adapter (engine_of(info).own_k)."""
    return max((a.named_k(spec) for a in adapters()), default=0)


def engine_of(info: "ServerInfo") -> Engine:
    """The server's engine adapter (an external endpoint's answers for the engine behind it, its flavor)."""
    return get_engine({"engine": info.engine, "flavor": info.flavor})


def _pairs_crossing(cmps: list[Comparison]) -> dict[tuple[int, int], float]:
    """Interpolated crossing (on log concurrency) between consecutive measured concurrencies."""
    pts = sorted((c.concurrency, c.estimate) for c in cmps if c.estimate is not None)
    out = {}
    for (c0, y0), (c1, y1) in zip(pts, pts[1:]):
        if (y0 > 0) != (y1 > 0) and y1 != y0:
            x = math.log(c0) + (0 - y0) * (math.log(c1) - math.log(c0)) / (y1 - y0)
            out[(c0, c1)] = math.exp(x)
    return out


@dataclass
class ServerInfo:
    """What the recommendation needs to know of a server (from its launch record)."""
    name: str
    engine: str                  # its engine adapter's name (serving/engines: ENGINES)
    flavor: str
    speculative: dict | None
    max_batch: int               # the server's largest batch (vLLM's max_num_seqs, SGLang's running-request cap)
    version: str | None = None   # the engine release it ran, where a deployment depends on it
    engine_warnings: tuple = ()  # what the engine warned of at start-up (see launch.engine_warnings)
    argv: tuple = ()             # the launch command (secrets redacted), to say what differs from the baseline's
    k_source: str | None = None  # where `speculative`'s k came from when not from the config (an external endpoint's
                                 # draft counters: analysis.analyse)
    kv_pool: KvPool | None = None  # the KV cache its engine said it admits (launch record; None: no record)




@dataclass
class MapBeyond:
    """What a checked step-cost map predicts above its fitted batches (analysis.map_beyond): each
    concurrency's prediction, and the map's cells (the fitted concurrencies and the checks), from which the
    config line that extends it is written (map_cells_line). It decides up to
    `reach` (REACH times the largest fitted batch); above that, nothing it predicts decides."""
    predictions: dict[int, StepCostPrediction]
    fit: list[int]
    checks: list[int]

    @property
    def reach(self) -> int:
        return REACH * max(self.fit)


def map_cells_line(fit: list[int], checks: list[int], at: int, max_batch: int) -> str:
    """The `step_cost` setting that maps above a map's cells (`fit`, `checks`; none where there is no map):
    map cells at `at` and at twice it (within the server's batches), `at` held out to check them (the
    verdict grid's concurrencies among `concurrency` add nothing: config.schema)."""
    at = min(at, max_batch)
    new = {at} | ({2 * at} if 2 * at <= max_batch else set())
    cs = sorted(set(fit) | set(checks) | new)
    check = sorted(set(checks) | ({at} if len(new) > 1 else set()))
    return (f"step_cost: {{concurrency: [{', '.join(map(str, cs))}]"
            + (f", check: [{', '.join(map(str, check))}]}}" if check else "}"))


def recommend(info: ServerInfo, suite: str, verdicts: list[Verdict], cmps: list[Comparison],
              s: Settings, predicted: dict[int, Decision] | None = None, map_note: str | None = None,
              beyond: MapBeyond | None = None) -> Recommendation:
    """What to deploy, built only from verdicts (never from point estimates alone). The batch range is
    the server's (`info.max_batch`), else, for a server whose largest batch is not known (an external
    endpoint without a configured `max_batch`), the measured concurrencies' (nothing is extrapolated
    and the text says so): an external endpoint's recommendation follows its verdicts like any server's."""
    regs = regions(verdicts)
    cross = crossovers(verdicts, cmps, s)
    dec = decisions(verdicts)
    max_batch = info.max_batch or max(dec, default=0)
    # the map's predictions where the verdict grid has no cell, within the server's batches (a measured
    # verdict always decides its own concurrency)
    predicted = {c: d for c, d in (predicted or {}).items() if c not in dec and c <= max_batch and dec}
    if predicted:
        dec = dict(sorted({**dec, **{c: True if d == Decision.PAYS else None if d == Decision.INCONCLUSIVE
                                     else False for c, d in predicted.items()}}.items()))
    # above everything measured or predicted within the fit: the map's extrapolation, where it decides
    above = {c: p for c, p in (beyond.predictions if beyond and dec else {}).items() if max(dec) < c <= max_batch}
    rec = Recommendation(info.name, suite, regs, cross[0] if cross else None, "undecided", crossovers=cross,
                         max_batch=max_batch, predicted={c: d.value for c, d in predicted.items()},
                         map_note=map_note if predicted else None)
    decided = {c: d for c, d in dec.items() if d is not None and c not in predicted}
    undecided = sorted(c for c, d in dec.items() if d is None and c not in predicted)
    if not decided:
        why = "; ".join(dict.fromkeys(v.decide for v in verdicts if v.decide))
        rec.text = "no recommendation: no concurrency is decided" + (f" ({why})" if why else "")
        rec.evidence = "every verdict is inconclusive"
        return rec
    known_top = max(dec)   # the largest concurrency measured or predicted within the map's fitted batches
    if above:
        rec.beyond_map = {str(c): p for c, p in sorted(above.items())}
        # from the first batch size the extrapolation cannot decide (or may not: beyond its reach) up, nothing
        # is known: a decision above it would rest on the farther, less reliable extrapolation
        first = next((c for c, p in sorted(above.items())
                      if p.decision == Decision.INCONCLUSIVE or c > beyond.reach), None)
        rec.not_known = [c for c in sorted(above) if first is not None and c >= first]
        dec = dict(sorted({**dec, **{c: None if c in rec.not_known else p.decision == Decision.PAYS
                                     for c, p in above.items()}}.items()))
    on = on_per_batch(dec, _pairs_crossing(cmps), max_batch)
    measured = {c: d for c, d in dec.items() if c not in predicted}
    pays, loses = _list(measured, True, verdicts, Decision.PAYS), _list(measured, False, verdicts, Decision.LOSES)
    same = _list(measured, False, verdicts, Decision.EQUIVALENT)
    undecided_note = (f" (undecided at c={','.join(map(str, undecided))}: off there, not shown to pay)" if undecided
                      else "")
    found = _phrases(("it pays at", pays), ("loses at", loses), ("makes no difference at", same))
    if all(on):
        rec.action = "keep"
        rec.text = "keep speculation on at every batch size" + (f": {found}" if found else "") + undecided_note
    elif not any(on):
        rec.action = "off"
        why = _phrases(("it loses at", loses), ("makes no difference at", same))
        rec.text = "turn speculation off: " + (f"{why}, and " if why else "") + "it pays nowhere" + undecided_note
    else:
        rec.action = "schedule"
        spans = _spans(on)
        rec.text = ("speculate only at batch sizes " + ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)
                    + (f": {found}" if found else "") + undecided_note)
    rec.evidence = "; ".join(f"{r.verdict.value} at c={r.first}" + (f"-{r.last}" if r.last != r.first else "")
                             for r in regs)
    if predicted:
        rec.text += "; " + predicted_text(predicted, map_note)
    if above:
        rec.text += "; " + beyond_text(rec, known_top, beyond)
    top = max(dec)
    if max_batch > top:
        rec.extrapolated_above = top
        what = "predicted" if top in predicted or top in above else "measured"
        rec.text += (f"; batch sizes {top + 1}-{max_batch} were not measured (the largest {what} concurrency is "
                     + (f"{top}): there it extends the verdict at c={top}, an extrapolation" if dec[top] is not None else
                        f"{top}, undecided): speculation is off there (nothing shows it pays at or above "
                        f"c={top}; no verdict is extrapolated)"))
        if not above and info.max_batch:
            rec.text += (" (no step-cost map that holds at its check predicts there: map cells above "
                         f"c={top} and one held out to check them would, e.g. "
                         f"`{map_cells_line([], [], _pow2_above(top), max_batch)}`)")
    if not info.max_batch:
        rec.text += (f"; the server's largest batch is not known (an external endpoint: set `max_batch` on it), so the "
                     f"deployment covers the measured concurrencies, 1-{max_batch}")
    spec = info.speculative or {}
    engine = engine_of(info)
    k = engine.own_k(spec)
    if engine.label and rec.action in ("schedule", "keep") and not k:
        rec.text += ("; the k it drafts is not known (no `speculative` configured and no draft counters), so no "
                     f"{engine.label} schedule can be written")
    elif engine.label and rec.action in ("schedule", "keep"):
        rec.schedule = onoff_schedule(engine, spec, on)
        rec.as_configured = rec.schedule.ks() == [engine.server_k(spec, b) for b in range(1, max_batch + 1)]
        # a schedule, or "always on" for a server whose own schedule switches speculation off somewhere:
        # unless it is the server's own, a deployment nobody has measured yet, so its rendering says what to set
        rec.deploy = engine.render(rec.schedule, spec, info.version, rec.action == "schedule" or not rec.as_configured)
        if rec.action == "keep" and not rec.as_configured:
            rec.text += "; its configured schedule switches speculation off where the verdicts say on"
    elif rec.action in ("keep", "off"):
        rec.as_configured = rec.action == "keep"
        if rec.action == "off":
            rec.schedule = Schedule.of([0] * max_batch)
            rec.deploy = engine.render(rec.schedule, spec, info.version)
    if info.k_source and rec.action in ("schedule", "keep"):
        rec.text += f" (k={k}: {info.k_source})"
    if not engine.launches:
        # the deployment is still stated for the engine behind it; nothing here restarts it to measure it
        how = engine.deployment_noun
        rec.text += (" (an external endpoint: nothing here restarts it, so the recommended deployment is not measured"
                     + (f"; deploy {how} on it and measure it as a configured server" if how and not rec.as_configured
                        and rec.action in ("schedule", "keep") else "") + ")")
        if rec.action != "off" and not rec.as_configured:
            rec.verified = Verification(None, Outcome.NOT_VERIFIABLE, s.recommend_metric, s.confidence,
                                        min_effect=s.min_effect,
                                        reason="an external endpoint: nothing here restarts it with the recommended "
                                               "configuration, so it is not measured")
    return rec


def beyond_text(rec: Recommendation, known_top: int, beyond: MapBeyond) -> str:
    """What the map's extrapolation decided above `known_top`, with its intervals, and what it leaves
    unknown, with the config line whose map cells would tell."""
    word = {Decision.PAYS: "pays", Decision.LOSES: "loses", Decision.EQUIVALENT: "makes no difference"}
    decided = [(int(c), p) for c, p in rec.beyond_map.items() if int(c) not in rec.not_known]
    what = (f"the step-cost map's extrapolation beyond its fitted batches (c={','.join(map(str, beyond.fit))}; its "
            "form assumed there, so a knee in the step cost above them is invisible to it)")
    parts = []
    if decided:
        parts.append(f"above c={known_top} {what} decides (predicted, not measured): " + ", ".join(
            f"{word[p.decision]} at c={c} ({_bound(p.predicted.value)} [{_bound(p.predicted.lo, '0')}, "
            f"{_bound(p.predicted.hi, '∞')}])" for c, p in decided))
    if rec.not_known:
        rec.measure_there = map_cells_line(beyond.fit, beyond.checks, rec.not_known[0],
                                           rec.max_batch or max(rec.not_known))
        own = {int(c): p.decision for c, p in rec.beyond_map.items()}
        wide = [c for c in rec.not_known if c <= beyond.reach and own[c] == Decision.INCONCLUSIVE]
        after = [c for c in rec.not_known if c <= beyond.reach and own[c] != Decision.INCONCLUSIVE]
        far = [c for c in rec.not_known if c > beyond.reach]
        why = []
        if wide:
            why.append(f"at c={','.join(map(str, wide))} the interval of " + ("its extrapolation" if decided else what)
                       + " is too wide to decide")
        if after:
            why.append(f"at c={','.join(map(str, after))}, above c={rec.not_known[0]}, its prediction is not taken: it "
                       "rests on a farther extrapolation than one that cannot decide")
        if far:
            why.append(f"above c={beyond.reach} ({REACH}x its largest fitted batch) "
                       + ("its extrapolation" if decided or wide else what) + " decides nothing: its intervals no "
                       "longer hold their level there")
        parts.append(f"not known at c={','.join(map(str, rec.not_known))} (" + "; ".join(why) + "), so speculation is "
                     f"off there; add map cells there: `{rec.measure_there}`")
    return "; ".join(parts)


def _bound(x: float | None, unbounded: str = "—") -> str:
    """A speedup or an interval's bound, two decimals; `unbounded` where the map's error leaves it open."""
    return unbounded if x is None else f"{x:.2f}"


def _pow2_above(c: int) -> int:
    b = 1
    while b <= c:
        b *= 2
    return b


def predicted_text(predicted: dict[int, Decision], note: str | None) -> str:
    """What the map decided where the verdict grid has no cell (within the map's fitted batches)."""
    by: dict = {}
    for c, d in sorted(predicted.items()):
        by.setdefault(d, []).append(c)
    word = {Decision.PAYS: "pays", Decision.LOSES: "loses", Decision.EQUIVALENT: "makes no difference",
            Decision.INCONCLUSIVE: "undecided (off there)"}
    parts = [f"{word[d]} at c={','.join(map(str, cs))}" for d, cs in by.items()]
    return ("where the verdict grid has no cell, the step-cost map's prediction decides (predicted, not measured): "
            + ", ".join(parts) + (f" ({note})" if note else ""))


def rendered(rec: Recommendation, info: ServerInfo | None) -> Recommendation:
    """rec with its engine's rendering of its schedule (as recommend makes it) where the file it was read
    from names the schedule only (`vllm_schedule`, Recommendation.from_json)."""
    if rec.deploy is None and rec.schedule is not None and info is not None:
        engine = engine_of(info)
        if engine.label:
            rec.deploy = engine.render(rec.schedule, info.speculative or {}, info.version,
                                       rec.action == "schedule" or not rec.as_configured)
    return rec


def _phrases(*parts: tuple[str, str]) -> str:
    """'label list' for each part whose list is not empty, joined (never a label with nothing after it)."""
    return ", ".join(f"{label} {cs}" for label, cs in parts if cs)


def _spans(on: list[bool]) -> list[tuple[int, int]]:
    out, start = [], None
    for b, x in enumerate(on + [False], 1):
        if x and start is None:
            start = b
        elif not x and start is not None:
            out.append((start, b - 1))
            start = None
    return out


def _list(dec: dict, value, verdicts: list[Verdict], kind: Decision) -> str:
    cs = [v.concurrency for v in sorted(verdicts, key=lambda v: v.concurrency) if v.verdict == kind]
    return ("c=" + ",".join(map(str, cs))) if cs else ""


# -- verification: the recommendation, measured, against a reference fixed in advance --------------
def deployed_on(rec: Recommendation, c: int) -> bool | None:
    """Whether the recommended deployment speculates at batch size c (None: it does not say); above its
    schedule's largest batch, its last band's setting."""
    if rec.schedule is not None and rec.schedule.bands:
        k = rec.schedule.k_at(c)
        return (rec.schedule.bands[-1][2] if k is None else k) > 0
    return {"keep": True, "off": False}.get(rec.action)


def reference(rec: Recommendation, info: ServerInfo | None, baseline: str, c: int) -> tuple[str | None, str | None]:
    """The server the schedule says should run at concurrency c, fixed by the schedule before the
    recommended deployment's data are seen: the speculative server as configured where the schedule
    speculates, the baseline where it does not. (None, why) where no measured server is that."""
    on = deployed_on(rec, c)
    if on is None:
        return None, f"the recommendation does not say whether to speculate at c={c}"
    if not on:
        return baseline, None
    spec = (info.speculative if info else None) or {}
    engine = engine_of(info) if info else None
    if engine is not None and engine.own_k(spec) and engine.server_k(spec, c) == 0:
        return None, f"`{rec.server}` as configured does not speculate at c={c}, so no measured server is the reference"
    return rec.server, None


@dataclass
class Reference:
    """What the recommended deployment is checked against at one concurrency, fixed by its schedule
    before its own data are seen: `server` (None: no measured server is it, `why`), and `alternatives`,
    the servers the schedule's choice there was not decided against (where no verdict decided it, a cost
    must show against each of them too)."""
    server: str | None
    why: str | None = None
    alternatives: tuple = ()


def onoff_references(rec: Recommendation, info: ServerInfo | None, baseline: str, concurrencies: list[int],
                     undecided: set | None = None) -> dict[int, Reference]:
    """An on/off recommendation's references (reference()); at `undecided` concurrencies (the server's
    own verdict was inconclusive or equivalent, so the switch fell there by the point estimates) the
    other of the baseline and the server as configured is the alternative."""
    out = {}
    for c in concurrencies:
        ref, why = reference(rec, info, baseline, c)
        alt = (rec.server if ref == baseline else baseline,) if ref and c in (undecided or ()) else ()
        out[c] = Reference(ref, why, alt)
    return out


def verification(m, rr, rec: Recommendation, info: ServerInfo | None, baseline: str, derived: str,
                 concurrencies: list[int], s: Settings, undecided: set | None = None) -> Verification:
    """An on/off recommendation's deployment `derived`, measured, against onoff_references."""
    return verify_against(m, rr, rec.suite, derived,
                          onoff_references(rec, info, baseline, concurrencies, undecided), s)


def verify_against(m, rr, suite: str, derived: str, refs: dict[int, Reference], s: Settings) -> Verification:
    """The recommended deployment `derived`, measured on the grid, against its reference at each
    concurrency (`refs`: onoff_references, or a k schedule's, krecommend.references) on
    `summary.recommend_metric`, as records.Verification describes.

    alpha = 1 - confidence. "Verified" asks, at every concurrency, that the deployment cost no more
    than min_effect against its reference: the one-sided 1 - alpha lower bound (`equivalence_lo`, the
    lower end of the 1 - 2 alpha interval) at or above 1 / (1 + min_effect), non-inferiority at level
    alpha (`not_worse` in its row; `verdict` says equivalent where TOST also bounds it above). Being
    faster than the reference is no failure of the schedule, so TOST's upper side is not asked for
    (it left a right schedule that ran its tail faster than the baseline undecided). All of them at
    once is an intersection-union test, so P(verified | some concurrency costs more than min_effect)
    <= alpha with no multiplicity correction (Berger 1982, Technometrics 24(4)): each concurrency at
    alpha, not alpha / K. "Failed" is a union (any concurrency), so it is corrected: a cost at a
    concurrency is the 1 - 2 alpha / K interval lying below 1 (Bonferroni over the K concurrencies
    with a reference), so P(failed | the deployment equals its references everywhere) <= alpha.

    Where the deployment is its reference (one k everywhere is that sweep member as configured, off
    everywhere the baseline), there is nothing to compare: its own cells are the measurement, and the
    row says so (`note`), equivalent and not worse by construction.

    The reference is fixed by the schedule, but where the schedule's choice was not decided by a
    verdict, the data that chose it favour it: there a cost must show against the reference and
    against each of its `alternatives` (Reference), so that choice cannot make a correct schedule
    fail. `rr` should include the deployment's own repeats."""
    metric = s.recommend_metric
    alpha = 1 - s.confidence
    base = dict(metric=metric, confidence=s.confidence, min_effect=s.min_effect)
    cs = [c for c in sorted(refs) if m.repeats(derived, suite, c)]
    if not cs:
        return Verification(derived, Outcome.NOT_MEASURED, reason=f"no cell of `{derived}` was measured", **base)
    tests, skipped = [], []
    for c in cs:
        ref, why = refs[c].server, refs[c].why
        if ref is not None and not m.repeats(ref, suite, c):
            ref, why = None, f"`{ref}` was not measured at c={c}"
        (tests.append((c, ref)) if ref is not None else skipped.append(why))
    if not tests:
        return Verification(derived, Outcome.UNDECIDED, reason="; ".join(skipped), **base)
    k = len(tests)
    band = math.log(1 + s.min_effect)
    rows, run, itself = [], True, []
    for c, ref in tests:
        if ref == derived:   # the deployment is its reference here, as measured: its own cells are the measurement
            rows.append(VerificationRow(c, ref, 1.0, 1.0, 1.0, Decision.EQUIVALENT, 1.0, 1.0, True,
                                        note="the deployment itself, as measured"))
            itself.append(c)
            continue
        cmp = compare(m, rr, derived, ref, suite, c, metric)
        if cmp.estimate is None:
            rows.append(VerificationRow(c, ref, None, None, None, Decision.INCONCLUSIVE, note=cmp.note))
            continue
        run = run and cmp.run_to_run
        t_cost, t_eq = t_ppf(1 - alpha / k, cmp.dof), t_ppf(1 - alpha, cmp.dof)
        lo, hi = cmp.estimate - t_cost * cmp.se, cmp.estimate + t_cost * cmp.se
        eq_lo, eq_hi = cmp.estimate - t_eq * cmp.se, cmp.estimate + t_eq * cmp.se
        # "verified" asks only that the deployment cost no more than min_effect here: the one-sided
        # 1 - alpha bound above -band (non-inferiority at alpha); being faster than its reference is no
        # failure of the schedule, so the upper bound (TOST's other side) is not asked for
        not_worse = cmp.run_to_run and eq_lo >= -band
        if cmp.run_to_run and -band <= eq_lo and eq_hi <= band:
            d = Decision.EQUIVALENT
        else:
            d = decision(lo, hi, band, cmp.run_to_run)
            d = Decision.INCONCLUSIVE if d == Decision.EQUIVALENT else d
        for other in refs[c].alternatives:  # the choices the data did not decide against
            if d != Decision.LOSES or not m.repeats(other, suite, c):
                continue
            alt = compare(m, rr, derived, other, suite, c, metric)
            if alt.estimate is not None and alt.estimate + t_ppf(1 - alpha / k, alt.dof) * alt.se >= 0:
                d = Decision.INCONCLUSIVE
        rows.append(VerificationRow(c, ref, math.exp(cmp.estimate), math.exp(lo), math.exp(hi), d, math.exp(eq_lo),
                                    math.exp(eq_hi), bool(not_worse)))
    if any(r.verdict == Decision.LOSES for r in rows):
        outcome = Outcome.FAILED
    elif all(r.not_worse or r.verdict == Decision.PAYS for r in rows):
        outcome = Outcome.VERIFIED
    else:
        outcome = Outcome.UNDECIDED
    notes = list(skipped)
    if itself:
        notes.append(f"`{derived}` is itself the reference at c={','.join(map(str, itself))}: its own cells are the "
                     "deployment's measurement there")
    if not run:
        notes.append("one repeat: the intervals exclude run-to-run variation, so equivalence is never called")
    return Verification(derived, outcome, per_test_confidence=1 - 2 * alpha / k, equivalence_confidence=1 - 2 * alpha,
                        per_concurrency=rows, error_rates={"verified_if_costly": alpha, "failed_if_correct": alpha},
                        reason="; ".join(notes) or None, **base)
