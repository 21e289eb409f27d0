"""Which k at which load, part four: the recommendation for one k sweep on one suite (recommend: the best
k per concurrency from kchoice, the bands from kbands), the deployment that runs it, its text, the
references its measured check is made against, and the derived server's config. The record is
kmodel.KRecommendation.

**The deployment** (deploy). vLLM: `num_speculative_tokens_per_batch_size` with one inclusive
[lo, hi, k] range per band (k = 0: off), covering 1..max_batch, the speculative config's own
`num_speculative_tokens` set to the largest k it uses (vLLM clamps every range's k by it). One k
everywhere ("keep") is a recommendation like any other: derived_config gives its config, which is the
sweep member of that k as configured, so that member IS its measurement (recommend.derived_k_servers
finds it as the deployment's twin) and its verification is against the references like a schedule's;
k = 0 everywhere ("off") is the baseline, likewise. SGLang
(where the release has `--speculative-adaptive`, engines/sglang.adaptive_support): an adaptive config
with one slot per band whose only candidate is the band's k (a slot with one candidate never moves),
num_steps the largest k, eagle_topk 1.
"""
from __future__ import annotations

import copy

from .deployment import Reference, ServerInfo, server_k, validate_schedule
from .kbands import bands, runs
from .kchoice import best_k
from .kmodel import KBand, KChoice, KPoint, KRecommendation, predict
from .measurements import Measurements, Settings
from .noise import RunToRun
from ..sweep import members


# -- the deployment ---------------------------------------------------------------------------------
def vllm_ranges(bands_: list[KBand]) -> list[list[int]]:
    """Inclusive [lo, hi, k] ranges of the bands, neighbours with the same k merged."""
    out: list[list[int]] = []
    for band in bands_:
        if out and out[-1][2] == band.k and out[-1][1] == band.lo - 1:
            out[-1][1] = band.hi
        else:
            out.append([band.lo, band.hi, band.k])
    return out


def vllm_deployment(spec: dict, bands_: list[KBand], max_batch: int) -> tuple[list[list[int]], dict]:
    """The schedule and the speculative config that runs it: the sweep's config with
    num_speculative_tokens the largest k the schedule uses and the schedule as
    num_speculative_tokens_per_batch_size. Checked against vLLM's rules (deployment.validate_schedule)
    and its carry-forward and clamping (deployment.server_k: every batch size gets its band's k)."""
    ranges = vllm_ranges(bands_)
    validate_schedule(ranges)
    if ranges[-1][1] != max_batch:
        raise ValueError(f"schedule {ranges}: must cover 1..{max_batch}")
    top = max(k for _, _, k in ranges)
    if top < 1:
        raise ValueError(f"schedule {ranges}: speculates nowhere (deploy the baseline)")
    out = copy.deepcopy(spec)
    out["num_speculative_tokens"] = top
    out["num_speculative_tokens_per_batch_size"] = ranges
    for band in bands_:
        for b in (band.lo, band.hi):
            if server_k(out, b) != band.k:
                raise ValueError(f"schedule {ranges}: batch {b} would run k={server_k(out, b)}, not {band.k}")
    return ranges, out


def sglang_deployment(info: ServerInfo, bands_: list[KBand]) -> dict:
    """SGLang's adaptive candidate steps: one slot per band (keyed by its first batch size) whose only
    candidate is the band's k, num_steps the largest k; or why the installed release cannot."""
    spec = info.speculative or {}
    if not info.sglang_adaptive:
        return {"mechanism": None,
                "why": f"SGLang {info.version or '(version unknown)'} has no --speculative-adaptive (it came with "
                       "0.5.18): run one member per batch band and route traffic by load instead"}
    if spec.get("method") not in ("eagle", "eagle3", "mtp"):
        return {"mechanism": None, "why": f"SGLang adapts EAGLE/EAGLE3 only, not {spec.get('method')}"}
    if spec.get("eagle_topk", 1) != 1:
        return {"mechanism": None, "why": "SGLang adapts only with eagle_topk 1"}
    ranges = vllm_ranges(bands_)
    top = max(k for _, _, k in ranges)
    config = {str(lo): {"candidate_steps": [k]} for lo, _, k in ranges}
    speculative = {**copy.deepcopy(spec), "num_steps": top, "eagle_topk": 1, "num_draft_tokens": top + 1,
                   "adaptive": True}
    return {"mechanism": "speculative-adaptive", **info.sglang_adaptive, "config": config,
            "speculative": speculative,
            "why": "--speculative-adaptive with --speculative-adaptive-config holding this config (write it to a "
                   "file): each batch band a slot with one candidate step count, so SGLang never moves off it; "
                   "SGLang routes a batch to the slot of the largest key <= its CUDA-graph-padded batch size, so a "
                   "band boundary between two captured batch sizes moves up to the next captured one"}


def sglang_adaptive_config(bands_: list[KBand]) -> dict:
    """The --speculative-adaptive-config a k schedule is (sglang_deployment's `config`)."""
    return {str(lo): {"candidate_steps": [k]} for lo, _, k in vllm_ranges(bands_)}


def recommend(m: Measurements, rr: RunToRun, info: ServerInfo, parent: str, ks: dict[int, str], baseline: str,
              suite: str, s: Settings, concurrencies: list[int] | None = None, beyond: str = "extend"
              ) -> KRecommendation:
    """The best k per band for a sweep on one suite and its deployment (the docstrings of kchoice, kbands
    and this module). `info`: the sweep's server (any member's ServerInfo: engine, flavor, max_batch,
    speculative config, the SGLang release's adaptive support)."""
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
    spec = {k: v for k, v in (info.speculative or {}).items() if not isinstance(v, (list, tuple))
            or k == "num_speculative_tokens_per_batch_size"}
    if used == [0]:
        rec.action, rec.k, rec.server = "off", 0, baseline
        rec.text = ("turn speculation off: the baseline is best (or as good) at every decided concurrency, and no k "
                    "was shown to pay at any other")
        if info.flavor == "sglang":
            rec.sglang = {"mechanism": "baseline", "why": "serve without --speculative-algorithm"}
    elif len(used) == 1:
        rec.action, rec.k, rec.server = "keep", used[0], ks.get(used[0])
        rec.text = (f"run k={used[0]} at every batch size: it is the k chosen at every measured concurrency"
                    + (f"; that is `{rec.server}` as configured, so its cells are this recommendation's measurement"
                       if rec.server else ""))
        if info.flavor == "vllm":
            rec.speculative = {**spec, "num_speculative_tokens": used[0]}
            rec.speculative.pop("num_speculative_tokens_per_batch_size", None)
    else:
        rec.action = "schedule"
        rec.text = "k per batch band: " + ", ".join(parts)
        if info.flavor == "vllm":
            rec.vllm_schedule, rec.speculative = vllm_deployment(spec, bs, max_batch)
        elif info.flavor == "sglang":
            rec.sglang = sglang_deployment(info, bs)
            if rec.sglang.get("mechanism"):
                rec.speculative = rec.sglang["speculative"]
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
def derived_config(member_config: dict, rec: KRecommendation, adaptive_config_path: str | None = None
                   ) -> dict | None:
    """The server config that deploys the recommendation: a member's config with the recommended
    speculative config. A schedule's is `<parent>__recommended` (any member's config); one k everywhere
    (`keep`, `member_config` the member of rec.k) is that member as configured, which
    recommend.derived_k_servers then finds as the deployment's twin, so the member's cells are its
    measurement. None where no server config deploys it: `off` is the baseline, `undecided` nothing.
    SGLang's adaptive config is a file: write rec.sglang["config"] to `adaptive_config_path` and pass
    the path here."""
    if rec.action == "keep":
        cfg = copy.deepcopy({k: v for k, v in member_config.items() if k != "suites"})
        if rec.speculative is not None:
            cfg["speculative"] = copy.deepcopy(rec.speculative)
        return cfg
    if rec.action != "schedule" or rec.speculative is None:
        return None
    cfg = copy.deepcopy({k: v for k, v in member_config.items() if k != "suites"})
    spec = copy.deepcopy(rec.speculative)
    if spec.get("adaptive") is True:
        if not adaptive_config_path:
            raise ValueError("an SGLang schedule needs adaptive_config_path (its --speculative-adaptive-config file)")
        spec["adaptive"] = adaptive_config_path
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
