"""Which k at which load, part four: the recommendation for one k sweep on one suite (recommend: the best
k per concurrency from kchoice, the bands from kbands), the deployment that runs it, its text, the
references its measured check is made against, and the derived server's config. The record is
kmodel.KRecommendation.

**The deployment.** The bands are an engine-neutral records.Schedule (one inclusive [lo, hi, k] per
band, neighbours with the same k merged, covering 1..max_batch; k = 0: off), which the sweep's engine
adapter renders (Engine.render, a records.Deployment: e.g. vLLM's per-batch-size schedule, SGLang's
adaptive candidate steps, or why the engine cannot run it) from the sweep's speculative config less
the keys the sweep sets (the adapter's sweep_fields: the schedule sets k). One k everywhere ("keep")
is a recommendation like any other: derived_config gives its config, which is the sweep member of
that k as configured, so that member IS its measurement (recommend.derived_k_servers finds it as the
deployment's twin) and its verification is against the references like a schedule's; k = 0
everywhere ("off") is the baseline, likewise.
"""
from __future__ import annotations

import copy

from .deployment import Reference, ServerInfo, engine_of
from .kbands import bands, runs
from .kchoice import best_k
from .kmodel import KBand, KChoice, KPoint, KRecommendation, predict
from ..reading.measurements import Measurements, Settings
from ..verdicts.noise import RunToRun
from ...records import Schedule
from ...sweep import members


# -- the deployment ---------------------------------------------------------------------------------
def schedule_of(bands_: list[KBand], max_batch: int) -> Schedule:
    """The bands as an engine-neutral schedule, neighbours with the same k merged (ValueError where they
    do not cover 1..max_batch in order)."""
    out: list[list[int]] = []
    for band in bands_:
        if out and out[-1][2] == band.k and out[-1][1] == band.lo - 1:
            out[-1][1] = band.hi
        else:
            out.append([band.lo, band.hi, band.k])
    return Schedule(out, max_batch)


def deployment(rec: KRecommendation, info: ServerInfo) -> None:
    """rec's schedule from its bands and the sweep's engine's rendering of it, from the sweep's
    speculative config less the keys a sweep sets (the schedule sets k); the report's line for it only
    where it is a schedule (one k everywhere is a member as configured, off the baseline)."""
    engine = engine_of(info)
    rec.schedule = schedule_of(rec.bands, rec.max_batch)
    spec = {k: v for k, v in (info.speculative or {}).items() if k not in engine.sweep_fields}
    rec.deploy = engine.render(rec.schedule, spec, info.version, rec.action == "schedule")


def recommend(m: Measurements, rr: RunToRun, info: ServerInfo, parent: str, ks: dict[int, str], baseline: str,
              suite: str, s: Settings, concurrencies: list[int] | None = None, beyond: str = "extend"
              ) -> KRecommendation:
    """The best k per band for a sweep on one suite and its deployment (the docstrings of kchoice, kbands
    and this module). `info`: the sweep's server (any member's ServerInfo: engine, flavor, max_batch,
    speculative config, the engine's release)."""
    cs = sorted(concurrencies or {k[2] for k in m.cells if k[1] == suite})
    choices, cmps_by_c = [], {}
    for c in cs:
        if not m.repeats(baseline, suite, c):
            continue
        ch, cmps = best_k(m, rr, parent, ks, baseline, suite, c, s)
        choices.append(ch)
        cmps_by_c[c] = cmps
    return recommendation(choices, cmps_by_c, info, parent, ks, baseline, suite, s, beyond)


def _ks(xs) -> str:
    return ", ".join(map(str, xs))


def _level(ch: KChoice) -> str:
    return f"{ch.deploy_confidence:.0%}" if ch.deploy_confidence else "the level deploying speculation needs"


def recommendation(choices: list[KChoice], cmps_by_c: dict, info: ServerInfo, parent: str, ks: dict[int, str],
                   baseline: str, suite: str, s: Settings, beyond: str = "extend") -> KRecommendation:
    """recommend's second half: the bands, the deployment and the text from each concurrency's choice
    (`cmps_by_c`: c -> k -> the Comparison against the baseline, for the switches). The batch range is
    the server's (`info.max_batch`), else, for a server whose largest batch is not known (an external
    endpoint), the measured concurrencies'."""
    own = {ch.concurrency: runs(ch) for ch in choices}
    measured = sorted(c for c, k in own.items() if k is not None)
    max_batch = info.max_batch or (max(measured) if measured else 0)
    rec = KRecommendation(parent, suite, s.recommend_metric, "undecided", choices, max_batch=max_batch)
    if not choices:
        rec.text = "no concurrency measured with the baseline"
        return rec
    if not measured:
        rec.text = "no recommendation: no member of the sweep has a figure at any concurrency measured with the baseline"
        return rec
    alpha = 1 - s.confidence
    rec.error_rates = {"false_speculate_per_concurrency": alpha / 2,
                       "false_speculate_over_schedule": min(1.0, len(measured) * alpha / 2)}
    bs = bands(choices, cmps_by_c, max_batch, beyond)
    rec.bands = bs
    top, bottom = measured[-1], measured[0]
    if max_batch > top:
        rec.extrapolated_above = top
    if bottom > 1:
        rec.extrapolated_below = bottom
    undecided = [ch for ch in choices if ch.k is None and own[ch.concurrency] is not None]
    if not bs:
        und = "; ".join(f"undecided at c={ch.concurrency}" + (f" between k={_ks(ch.candidates)}" if ch.candidates else "")
                        for ch in undecided)
        rec.text = "no recommendation: no concurrency is decided" + (f" ({und})" if und else "")
        return rec
    if top in {c for b in bs for c in b.pinned_at}:
        rec.undecided_top = top
    pin_text = "; ".join(
        f"at c={ch.concurrency} (undecided" + (f" between k={_ks(ch.candidates)}" if ch.candidates else "") + ") "
        + (f"no k pays against off at {_level(ch)} (the level speculating needs with {len(ch.speedups) - 1} k "
           "measured), so it runs off, not a neighbour's k" if own[ch.concurrency] == 0 else
           f"k={own[ch.concurrency]} pays against off there at {_level(ch)}, so it runs k={own[ch.concurrency]}")
        for ch in undecided)
    part_text = "; ".join(f"at c={ch.concurrency} speculation pays (at {_level(ch)}) but k is undecided between "
                          f"k={_ks(ch.candidates)}: k={ch.k}, the best estimate among the k that pay, is deployed"
                          for ch in choices if ch.how == "pays, k open" and ch.concurrency <= max_batch)
    used = sorted({b.k for b in bs})
    parts = [(f"{b.lo}-{b.hi}" if b.hi != b.lo else f"{b.lo}") + f": k={b.k}"
             + (f" (extrapolated {b.extrapolated} the measured concurrencies)" if b.extrapolated else "") for b in bs]
    if used == [0]:
        rec.action, rec.k, rec.server = "off", 0, baseline
        rec.text = ("turn speculation off: the baseline is best (or as good) at every decided concurrency, and no k "
                    "was shown to pay at any other")
    elif len(used) == 1:
        rec.action, rec.k, rec.server = "keep", used[0], ks.get(used[0])
        rec.text = (f"run k={used[0]} at every batch size: it is the k chosen at every measured concurrency"
                    + (f"; that is `{rec.server}` as configured, so its cells are this recommendation's measurement"
                       if rec.server else ""))
    else:
        rec.action = "schedule"
        rec.text = "k per batch band: " + ", ".join(parts)
    deployment(rec, info)
    if part_text:
        rec.text += f"; {part_text}"
    if pin_text:
        rec.text += f"; {pin_text}"
    if rec.action in ("keep", "schedule"):
        e = rec.error_rates
        rec.text += (f"; speculation is deployed only where a k beat off at the level that allows for the k measured "
                     f"(alpha / K): where every k is as fast as off, a false \"speculate\" has probability at most "
                     f"{e['false_speculate_per_concurrency']:.0%} at each measured concurrency (one-sided) and at most "
                     f"{e['false_speculate_over_schedule']:.0%} over the {len(measured)} measured")
    if rec.extrapolated_above is not None:
        last = next(b for b in bs if b.extrapolated == "above")
        head = f"; batch sizes {top + 1}-{max_batch} were not measured"
        if rec.undecided_top is not None:
            rec.text += (f"{head} and c={top}, the largest measured concurrency, is undecided: speculation is off there "
                         f"(nothing measured shows it pays at or above c={top}; no k is extrapolated to heavier load)")
        elif beyond == "off":
            rec.text += f"{head} (the largest measured concurrency is {top}): speculation is off there (not measured)"
        else:
            rec.text += (f"{head} (the largest measured concurrency is {top}): k={last.k} there extends the choice "
                         f"decided at c={top}, an extrapolation")
    if rec.extrapolated_below is not None:
        first = bs[0]
        rec.text += (f"; batch sizes 1-{bottom - 1} were not measured (the smallest measured concurrency is {bottom}): "
                     + (f"k={first.k} there extends the choice decided at c={bottom}, an extrapolation"
                        if first.k or bottom not in {c for b in bs for c in b.pinned_at} else
                        f"speculation is off there, as at c={bottom} (undecided)"))
    if not info.max_batch:
        rec.text += (f"; the server's largest batch is not known (an external endpoint: set `max_batch` on it), so the "
                     f"deployment covers the measured concurrencies, 1-{max_batch}")
    return rec


# -- verification ---------------------------------------------------------------------------------------
def references(rec: KRecommendation, ks: dict[int, str], baseline: str, concurrencies: list[int]
               ) -> dict:
    """What `<parent>__recommended` is checked against at each measured concurrency, fixed by the
    schedule before its cells are seen (deployment.Reference): the member that runs the band's k there
    as measured (the baseline for k = 0). Where the choice at c was not decided (undecided at c, so the
    band's k there follows the neighbouring decided concurrencies; or "pays, k open", where k was not
    decided), the other candidates the data could not tell apart are alternatives: a cost must show
    against each of them too before the verification calls it one."""
    choices = {ch.concurrency: ch for ch in rec.choices}
    out = {}
    for c in concurrencies:
        k = rec.k_at(c)
        if k is None:
            out[c] = Reference(None, f"the schedule does not cover batch size {c}")
            continue
        server = baseline if k == 0 else ks.get(k)
        if server is None:
            out[c] = Reference(None, f"k={k} was not measured")
            continue
        ch = choices.get(c)
        alts = ()
        if ch is not None and ch.candidates:
            alts = tuple(n for n in ((baseline if j == 0 else ks.get(j)) for j in ch.candidates) if n and n != server)
        out[c] = Reference(server, None, alts)
    return out


# -- the derived server and the report ------------------------------------------------------------------
def derived_config(member_config: dict, rec: KRecommendation, paths: dict[str, str] | None = None) -> dict | None:
    """The server config that deploys the recommendation: a member's config with the rendered
    deployment's speculative config. A schedule's is `<parent>__recommended` (any member's config); one k
    everywhere (`keep`, `member_config` the member of rec.k) is that member as configured, which
    recommend.derived_k_servers then finds as the deployment's twin, so the member's cells are its
    measurement. None where no server config deploys it: `off` is the baseline, `undecided` nothing, a
    schedule the engine cannot run nothing. Where the engine reads part of it from a file
    (Deployment.files), write each file and pass `paths` (key -> the file's path)."""
    cfg = copy.deepcopy({k: v for k, v in member_config.items() if k != "suites"})
    if rec.action == "keep":
        if rec.deploy is not None and rec.deploy.speculative is not None:
            cfg["speculative"] = copy.deepcopy(rec.deploy.speculative)
        return cfg
    if rec.action != "schedule" or rec.deploy is None or rec.deploy.speculative is None:
        return None
    spec = copy.deepcopy(rec.deploy.speculative)
    for key in rec.deploy.files:
        if not (paths or {}).get(key):
            raise ValueError(f"the deployment's `speculative.{key}` is a file: pass its path (paths)")
        spec[key] = paths[key]
    cfg["speculative"] = spec
    return cfg


def sweep_report(an, parent: str, info: ServerInfo, suite: str, beyond: str = "extend"
                 ) -> tuple[KRecommendation, list[KPoint]]:
    """recommend and predict for one sweep on one suite of an analysis.Analysis (its measurements,
    run-to-run variance, baseline, settings and concurrencies)."""
    ks = members(parent, an.servers)
    rec = recommend(an.measurements, an.run_to_run, info, parent, ks, an.baseline, suite, an.settings,
                    an.concurrencies, beyond)
    pts = predict(an.measurements, an.run_to_run, parent, ks, an.baseline, suite, an.concurrencies)
    return rec, pts
