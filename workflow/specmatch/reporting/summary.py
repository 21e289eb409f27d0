"""Render the decision: the analysis (specmatch.deciding.analysis) as the files a team reads and tools parse.

- `verdicts.json`: records.Verdict per (server, suite, concurrency, metric): pays / loses /
  equivalent / inconclusive with the speedup, its interval, the confidence and the repeats.
- `recommendations.json`: records.Recommendation per speculative server and recommendation suite:
  regions, the crossover with its interval, the vLLM schedule or SGLang mechanism, and the measured
  verification of the recommended deployment.
- `attribution.json`: records.Attribution per speculative server, suite and concurrency: why its TPOT
  differs (tokens per step x step cost, configured-off control, prompt length; specmatch.deciding.attribution).
- `cells.csv` / `cells.parquet`: one tidy row per cell (every repeat); `speedups.csv`: every verdict.
- `plots/*.png` and `summary.md`: the verdict first, then the evidence.

Nothing here decides anything: analysis returns typed results, this module only renders them.

    python -m specmatch summary --baseline NAME --cells c*.json --requests c*.requests.parquet
        --launches launch.json... --matches *.match.json --recommendations R --out-dir results/summary
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import polars as pl

from . import kreport
from .. import steps
from ..deciding.analysis import LABEL, Analysis, Settings, attribute, frozen_verdicts
from ..deciding.attribution import launch_differences, mixed_servers
from ..serving.controls import OFF, is_control, why_no_control
from ..serving.engines import definitions
from ..files import SpecmatchError, atomic_path, read_json, write_json, write_text
from ..provenance import Recorder
from ..records import (Acceptance, Attribution, Decision, DerivedServers, Direction, Effect, Outcome,
                      Recommendation, RoundPlan, SuiteMatch)
from ..deciding.recommend import SUFFIX, analysis_arguments, load, server_infos, verified_analysis

CELL_COLUMNS = ["server", "suite", "concurrency", "repeat", "engine", "completed", "failed", "duration",
                "output_throughput", "request_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms",
                "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms",
                "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms", "spec_decode_acceptance_rate",
                "spec_decode_acceptance_length", "spec_decode_num_drafts", "holdout_share", "server_session"]


def _fmt(v, spec=".2f"):
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def _ci(v) -> str:
    return f"{_fmt(v.speedup)}x [{_fmt(v.lo)}, {_fmt(v.hi)}]" if v and v.speedup is not None else "—"


def _cs(cs) -> str:
    return ",".join(str(c) for c in cs)


# -- tables -----------------------------------------------------------------------------------
def cells_frame(an: Analysis) -> pl.DataFrame:
    rows = []
    for key, cell in sorted(an.measurements.cells.items()):
        j = cell.to_json()
        row = {k: j.get(k) for k in CELL_COLUMNS}
        if an.settings.slo:
            a = an.measurements.arrays[key]
            row["request_goodput"] = a.point("goodput", cell)
        rows.append(row)
    return pl.DataFrame(rows, infer_schema_length=None)


def verdicts_frame(an: Analysis) -> pl.DataFrame:
    if not an.verdicts:
        return pl.DataFrame({"server": []})
    rows = []
    for v in an.verdicts:
        j = {k: x for k, x in v.to_json().items() if k != "design"}
        d = v.design or {}
        rows.append({**j, "speedup": v.speedup, **{f"design_{k}": d.get(k) for k in ("repeats", "suite_scale",
                                                                                       "probability")}})
    return pl.DataFrame(rows, infer_schema_length=None)


# -- acceptance -------------------------------------------------------------------------------
def pooled_acceptance(an: Analysis, key: str) -> list[dict]:
    """Acceptance per (server, suite, group) pooled over cells and repeats by the engine's own
    definition (`key`: acceptance_by_source, or acceptance_by_holdout: held-out rows vs seen ones)."""
    parts: dict = {}
    flavor: dict = {}
    for (server, suite, _c, _r), cell in an.measurements.cells.items():
        for group, acc in (getattr(cell, key) or {}).items():
            parts.setdefault((server, suite, group), []).append(Acceptance.from_json(acc))
            flavor[server] = cell.flavor
    out = []
    for (server, suite, group), accs in sorted(parts.items()):
        a = definitions(flavor[server]).combine(accs)
        if a is not None:
            out.append({"server": server, "suite": suite, "group": group, **a.to_json()})
    return out


# -- markdown ---------------------------------------------------------------------------------
def headline(an: Analysis, training: list[str], control: list[str], attrs: list[Attribution] | None = None
             ) -> list[str]:
    """The distribution effect, first: acceptance per suite and what a benchmark on the control
    prompts would have concluded against what the training mix says."""
    lines = []
    attrs = attrs or []
    for server in [s for s in an.servers if s != an.baseline and not s.endswith(SUFFIX) and not is_control(s)]:
        acc = {a.suite: a for a in an.acceptance if a.server == server}
        if not acc:
            continue
        parts = [f"{_fmt(a.length)} [{_fmt(a.lo)}, {_fmt(a.hi)}] on `{u}`" for u, a in acc.items()]
        text = f"- **{server}** accepts " + ", ".join(parts) + " tokens per speculative step"
        tr = next((u for u in training if u in acc), None)
        ct = next((u for u in control if u in acc), None)
        if tr and ct:
            a, b = acc[tr], acc[ct]
            if a.lo is not None and b.hi is not None and a.lo > b.hi:
                text += f" (higher on the training mix than on `{ct}`: the intervals do not overlap)"
            elif a.hi is not None and b.lo is not None and a.hi < b.lo:
                text += f" (lower on the training mix than on `{ct}`)"
            else:
                text += f" (the intervals of `{tr}` and `{ct}` overlap)"
            on_ct = shape(an, server, ct) + cause_note(attrs, an, server, ct)
            on_tr = shape(an, server, tr) + cause_note(attrs, an, server, tr)
            text += (f"; a benchmark on `{ct}` prompts would conclude: {on_ct}" +
                     ("" if on_ct == on_tr else f", where `{tr}` says: {on_tr}"))
        lines.append(text + ".")
    return lines


def shape(an: Analysis, server: str, suite: str, metric: str = "output_throughput") -> str:
    """The headline for one server and suite, read off the typed verdicts (never off prose), so it
    can never claim "pays" where the verdict table says inconclusive."""
    vs = sorted((v for v in an.verdicts if (v.server, v.suite, v.metric) == (server, suite, metric)),
                key=lambda v: v.concurrency)
    if not vs:
        return "not measured"
    groups: dict = {}
    for v in vs:
        groups.setdefault(v.verdict, []).append(v.concurrency)
    order = [Decision.PAYS, Decision.EQUIVALENT, Decision.LOSES, Decision.INCONCLUSIVE]
    return "; ".join(f"{d.value} at c={_cs(groups[d])}" for d in order if d in groups)


def not_drafting(attrs: list[Attribution], an: Analysis, server: str, suite: str) -> dict[str, list[int]]:
    """Concurrencies where the server's throughput verdict is 'pays' but the gain is not the drafter's:
    `cheaper` where its speculative step was decisively cheaper than a plain decode step (rho < 1),
    `configured` where the configured-off control alone pays and drafting on top of it does not."""
    out: dict[str, list[int]] = {"cheaper": [], "configured": []}
    for a in sorted((a for a in attrs if (a.server, a.suite) == (server, suite)), key=lambda a: a.concurrency):
        v = an.verdict(server, suite, a.concurrency)
        if v is None or v.verdict != Decision.PAYS:
            continue
        if a.explained_by_drafting is False:
            out["cheaper"].append(a.concurrency)
        if (a.configured_off and a.configured_off.verdict == Decision.PAYS and a.drafting_effect
                and a.drafting_effect.verdict != Decision.PAYS):
            out["configured"].append(a.concurrency)
    return out


def cause_note(attrs: list[Attribution], an: Analysis, server: str, suite: str) -> str:
    cs = not_drafting(attrs, an, server, suite)
    parts = []
    if cs["cheaper"]:
        parts.append(f"at c={_cs(cs['cheaper'])} its speculative steps cost less than a plain decode step "
                     "(of the baseline, or of its configured-off control)")
    if cs["configured"]:
        parts.append(f"at c={_cs(cs['configured'])} configured but drafting nothing (`{server}{OFF}`) pays as much")
    if not parts:
        return ""
    return " — not the drafter's doing: " + "; ".join(parts) + " (see \"Why it pays\")"


DIRECTION = {Direction.STOPS_PAYING: "stops paying", Direction.STARTS_PAYING: "starts paying"}


def crossover_text(x) -> str:
    """One crossover, as the records.Crossover says it: where, its interval and the bracket of
    measured concurrencies whose verdicts decide it."""
    return (f"it {DIRECTION[x.direction]} at c≈{x.point:.1f} [{_fmt(x.lo, '.1f')}, {_fmt(x.hi, '.1f')}] "
            f"(between c={x.below} and c={x.above}, whose verdicts decide it)")


def verdict_lines(an: Analysis, recs: list[Recommendation], attrs: list[Attribution] | None = None) -> list[str]:
    lines = []
    attrs = attrs or []
    for server in an.servers:
        if server == an.baseline:
            continue
        for suite in an.suites:
            if not any((v.server, v.suite) == (server, suite) for v in an.verdicts):
                continue
            text = f"- **{server}** on `{suite}`: {shape(an, server, suite)}"
            if is_control(server):
                text += f" (the configured-off control of `{server[:-len(OFF)]}`: configured, drafting nothing)"
            for x in an.crossovers.get((server, suite, "output_throughput"), []):
                text += "; " + crossover_text(x)
            best = max((v for v in an.verdicts if (v.server, v.suite, v.metric) == (server, suite, "output_throughput")
                        and v.speedup is not None), key=lambda v: v.speedup, default=None)
            if best:
                text += f" (best {best.speedup:.2f}x at c={best.concurrency})"
            lines.append(text + cause_note(attrs, an, server, suite) + ".")
    return lines


def noise_lines(an: Analysis) -> list[str]:
    rr, s = an.run_to_run, an.settings
    if not rr.tau2:
        return [f"**These intervals exclude run-to-run variation.** Each cell was measured once (repeats: 1), so "
                "the intervals show only how much the result moves between prompts and requests, not between "
                "server sessions, which is usually larger (vLLM reports 1.5-3.7% on GPUs). A verdict therefore needs "
                f"an effect beyond ±{s.min_effect:.0%}, and 'equivalent' is never called. Set `repeats: 2` or more to "
                "measure it."]
    parts = []
    for m, t in rr.tau2.items():
        levels = rr.levels.get(m, {})
        by_c = ", ".join(f"c={c} ±{math.exp(math.sqrt(v.total)) - 1:.1%}" for c, v in sorted(levels.items()))
        parts.append(f"{LABEL[m]} ±{math.exp(math.sqrt(t)) - 1:.1%}" + (f" ({by_c})" if len(levels) > 1 else ""))
    return [f"**Run-to-run variation, measured:** between fresh server sessions a configuration's figures move by "
            + "; ".join(parts) + f" (one standard deviation; pooled by a median fit over {rr.configurations} "
            f"configurations measured in {rr.repeats} repeats, so one outlying cell cannot set it; by concurrency in "
            "brackets). Each interval below uses its own server's and concurrency's, shrunk toward the pooled level "
            "where their data are thin (empirical Bayes), beside the prompt sample's variation from a paired "
            "bootstrap by prompt; request-to-request noise is counted once, in the run-to-run part."]


def sequential_lines(an: Analysis, plans: list[RoundPlan]) -> list[str]:
    """The sequential design's account: what each round decided, the cells it measured against a fixed
    design of `max` repeats, and the levels the verdicts were taken at."""
    d, s = an.settings.design, an.settings
    primary = [k for k in an.measurements.cells if not k[0].endswith(SUFFIX)]
    configs = {k[:3] for k in primary}
    fixed = len(configs) * d.max
    rounds = []
    for p in plans:
        rounds.append(f"after round {p.round}: " + ", ".join(f"{v} {a.value}" for a, v in p.counts().items() if v)
                      + (f"; repeat {p.round + 1} measured {len(p.next)} cells" if p.next else "; nothing continued"))
    levels = sorted({round(v.confidence, 3) for v in an.verdicts if v.metric == s.recommend_metric
                     and v.run_to_run and not v.server.endswith(SUFFIX)})
    return [f"**Sequential design (repeats {d.min}–{d.max}):** every cell was measured {d.min} times; then, round "
            f"by round, only the configurations whose {LABEL[s.recommend_metric]} verdict was still inconclusive "
            "(and a k sweep's undecided choices: the best k against each candidate it could not be told from), "
            f"and that the remaining repeats would decide with probability at least {d.min_probability:.0%} "
            "(predicted from the data so far), were measured again (the baseline, or the other k, beside them): "
            + ("; ".join(rounds) if rounds else "no round ran") + f". {len(primary)} cells measured against "
            f"{fixed} for a fixed design of {d.max} repeats ({1 - len(primary) / fixed:.0%} saved). Stopping when a "
            f"verdict is decided is optional stopping, so each look's verdict is taken at a stricter level "
            f"(alpha spending over the looks, specmatch.deciding.sequential) that keeps the overall error at "
            f"{1 - s.confidence:.0%}: the verdicts here stand at "
            + ", ".join(f"{x:.1%}" for x in levels) + " confidence (verdicts.json, `confidence`)."]


def off_lines(an: Analysis) -> list[str]:
    """Cells of configured servers whose own schedule drafted nothing (the configured-off controls
    are rendered in "Why it pays", beside the server they control)."""
    offs = [v for v in an.off_cost if not is_control(v.server)]
    if not offs:
        return ["No measured cell had speculation configured but switched off"
                + (" besides the configured-off controls (see \"Why it pays\")." if an.off_cost else ".")]
    lines = []
    for v in sorted(offs, key=lambda v: (v.server, v.suite, v.concurrency)):
        if v.verdict == Decision.LOSES:
            what = f"costs {1 - v.speedup:.0%} of the baseline's throughput"
        elif v.verdict == Decision.PAYS:
            what = f"runs {v.speedup - 1:.0%} faster than the baseline"
        elif v.verdict == Decision.EQUIVALENT:
            what = "costs nothing measurable"
        else:
            what = "has an undecided cost"
        if v.verdict in (Decision.LOSES, Decision.PAYS):
            why = ("being configured changes more than drafting (a schedule's switch, the drafter's memory, other "
                   "CUDA-graph sizes, scheduler settings the engine changes for speculation): a finding, not noise")
        else:
            why = "no cost of being configured is established"
        lines.append(f"- **{v.server}** drafted nothing at c={v.concurrency} on `{v.suite}` and {what}: "
                     f"{_ci(v)} ({v.verdict.value}); {why}.")
    for server in sorted({v.server for v in offs}):
        extra = warnings_beside(an, server)
        if extra:
            lines.append(f"- What the engine warned of for **{server}** at start-up and not for `{an.baseline}`: "
                         + "; ".join(f"\"{w}\"" for w in extra))
    return lines


def warnings_beside(an: Analysis, server: str) -> list[str]:
    """The engine's start-up warnings for `server` that the baseline's session did not log: what the
    engine itself changed because speculation is configured."""
    own, base = an.infos.get(server), an.infos.get(an.baseline)
    if own is None or base is None:
        return []
    return [w for w in own.engine_warnings if w not in set(base.engine_warnings)]


def _iv(x, spec=".2f") -> str:
    """`v [lo, hi]` of an Interval-like record (value or speedup, lo, hi)."""
    if x is None:
        return "—"
    v = x.speedup if isinstance(x, Effect) else x.value
    return f"{_fmt(v, spec)} [{_fmt(x.lo, spec)}, {_fmt(x.hi, spec)}]"


def why_lines(an: Analysis, attrs: list[Attribution], no_control: dict[str, str] | None = None) -> list[str]:
    """Why each speedup happens: tokens per step x step cost, the configured-off split and prompt
    length (specmatch.deciding.attribution). Renders the records; decides nothing."""
    if not attrs:
        return []
    s = an.settings
    ref = next((a.length_adjusted_speedup.reference_suite for a in attrs if a.length_adjusted_speedup), None)
    ref_tokens = next((a.length_adjusted_speedup.reference_prompt_tokens for a in attrs
                       if a.length_adjusted_speedup), None)
    lines = ["## Why it pays: tokens per step × step cost", "",
             f"A speculative step yields τ tokens (the engine's acceptance length) and costs ρ plain decode steps of "
             f"`{an.baseline}` at the same suite and concurrency, so the TPOT speedup is τ / ρ. Drafting predicts "
             "ρ ≥ 1 (a draft plus a verify of k+1 tokens costs at least one plain step) and a ρ that grows with the "
             "batch, which is usually why speculation stops paying at high load. **ρ < 1 means the speculative "
             "server's step was cheaper than a plain decode step: that gain is the engine's path (kernels, scheduler "
             "settings it changes when speculation is configured), not the drafter's.** "
             f"{s.confidence:.0%} intervals, paired by prompt, with run-to-run variation where repeats measured it.",
             ""]
    if ref:
        lines += [f"The last column is each TPOT speedup at `{ref}`'s median prompt length ({ref_tokens:.0f} tokens): "
                  "per-prompt log speedups regressed on log prompt length and log τ, one intercept per suite (a plain "
                  "decode step costs more over a longer context, so suites of different lengths differ for reasons "
                  "that have nothing to do with acceptance); * marks an extrapolation beyond the suite's own "
                  "prompt lengths.", ""]
    lines += ["| server | suite | c | TPOT speedup | τ tokens/step | ρ step cost | drafting explains it | "
              "configured off vs baseline | drafting vs configured off | TPOT speedup at matched length |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    word = {True: "yes", False: "**no** (ρ < 1)", None: "undecided"}
    for a in attrs:
        if a.tokens_per_step is None and not is_control(a.server):
            expl = a.note or "—"
        elif a.tokens_per_step is None:
            expl = "drafts nothing"
        else:
            expl = word[a.explained_by_drafting]
        off = (f"{_iv(a.configured_off)} {a.configured_off.verdict.value}" if a.configured_off else "—")
        dr = (f"{_iv(a.drafting_effect)} {a.drafting_effect.verdict.value}" if a.drafting_effect else "—")
        la = a.length_adjusted_speedup
        lat = (_iv(la) + ("*" if la.extrapolated else "")) if la else "—"
        lines.append(f"| {a.server} | {a.suite} | {a.concurrency} | {_iv(a.tpot_speedup)} | {_iv(a.tokens_per_step)} | "
                     f"{_iv(a.step_cost_ratio)} | {expl} | {off} | {dr} | {lat} |")
    lines += ["", "Configured off and drafting are throughput ratios (the verdicts' metric); their product is the "
                  "server's throughput speedup over the baseline.", ""]
    scheduled = list(dict.fromkeys(a.server for a in attrs if "decode step" in (a.acceptance_source or "")))
    if scheduled:
        lines += [f"{', '.join(f'`{x}`' for x in scheduled)}: a batch-size schedule that runs plain steps at some "
                  "batch sizes, so its τ is the tokens per decode step, plain steps included (a plain step yields 1). "
                  "The engine's acceptance length, elsewhere in this file, counts only its speculative steps: those "
                  "taken while the batch was small enough, a selection (at a concurrency above the speculative "
                  "bands, only as the batch drains).", ""]
    findings = []
    for server in dict.fromkeys(a.server for a in attrs):
        bad = [a for a in attrs if a.server == server and a.explained_by_drafting is False]
        if not bad:
            continue
        where = "; ".join(f"`{a.suite}` c={a.concurrency}: TPOT {_fmt(a.tpot_speedup.value)}x with τ "
                          f"{_fmt(a.tokens_per_step.value)}, ρ {_iv(a.step_cost_ratio)}"
                          + (f" (against its configured-off control's plain step: {_iv(a.step_cost_vs_configured_off)})"
                             if a.step_cost_vs_configured_off else "") for a in bad)
        text = (f"- **{server}: drafting cannot explain its gain** ({where}). A speculative step that yields τ tokens "
                "and costs at least one plain step improves TPOT by at most τ; these steps cost less than the "
                f"baseline's plain decode step, so the engine took another path.")
        own, base = an.infos.get(server), an.infos.get(an.baseline)
        if own is not None and base is not None:
            diff = launch_differences(own.argv, base.argv)
            if diff:
                text += " Its launch differs from the baseline's in: " + "; ".join(f"`{d}`" for d in diff) + "."
            warn = warnings_beside(an, server)
            if warn:
                text += " The engine warned at start-up (not for the baseline): " + "; ".join(f"\"{w}\"" for w in warn) + "."
        findings.append(text)
    split: dict = {}
    for a in attrs:
        if a.configured_off and a.drafting_effect:
            split.setdefault((a.server, a.suite, a.configured_off.server), []).append(a)
    for (server, suite, off), rows in split.items():
        findings.append(
            f"- **{server}** on `{suite}`, configuration × drafting (throughput; `{off}` is configured but drafts "
            "nothing): " + "; ".join(
                f"c={a.concurrency}: {_fmt(a.configured_off.speedup)}x ({a.configured_off.verdict.value}) × "
                f"{_fmt(a.drafting_effect.speedup)}x ({a.drafting_effect.verdict.value})"
                + (f", a speculative step costing {_iv(a.step_cost_vs_configured_off)} of the control's plain steps "
                   f"for τ {_fmt(a.tokens_per_step.value)}" if a.step_cost_vs_configured_off and a.tokens_per_step
                   else "") for a in rows) + ".")
    for server, why in (no_control or {}).items():
        findings.append(f"- **{server}**: no configured-off control ({why}).")
    contrasts = [a for a in attrs if a.contrast and a.contrast.raw and a.contrast.length_adjusted
                 and not is_control(a.server)]
    if contrasts:
        findings.append("")
        findings.append(f"Same server, different prompts, at matched prompt length (each suite's TPOT speedup over "
                        f"its speedup on `{ref}`; per-prompt geometric means):")
        findings.append("")
        for a in contrasts:
            raw, adj = a.contrast.raw, a.contrast.length_adjusted
            raw_dec = raw.lo > 1 or raw.hi < 1
            adj_dec = adj.lo > 1 or adj.hi < 1
            if raw_dec and not adj_dec:
                why = ("decisive raw, not at matched length: prompt length explains it" if adj.lo <= 1 <= adj.hi
                       and abs(math.log(adj.value)) < abs(math.log(raw.value)) / 2 else
                       "decisive raw, undecided at matched length: prompt length explains part of it")
            elif adj_dec:
                why = "the contrast survives at matched length"
            else:
                why = "no contrast is established either way"
            base_tau = next((b.tokens_per_step for b in attrs if (b.server, b.suite, b.concurrency) ==
                             (a.server, ref, a.concurrency)), None)
            taus = (f" (τ {_iv(a.tokens_per_step)} against {_iv(base_tau)})" if a.tokens_per_step and base_tau else "")
            findings.append(f"- **{a.server}** on `{a.suite}` at c={a.concurrency}: {_iv(raw)}x raw, {_iv(adj)}x at "
                            f"{a.length_adjusted_speedup.reference_prompt_tokens:.0f}-token prompts"
                            + ("*" if a.length_adjusted_speedup.extrapolated else "") + f"{taus}: {why}.")
    return lines + findings


def verification_text(an: Analysis, r: Recommendation) -> str:
    """The records.Verification of a recommendation, rendered; decides nothing."""
    v = r.verified
    if v is None:
        return ""
    rows = v.per_concurrency
    one_sided = (1 + v.equivalence_confidence) / 2 if v.equivalence_confidence is not None else None
    level = (f" ({LABEL.get(v.metric, v.metric)}; verified: at every concurrency no more than {v.min_effect:.0%} "
             f"worse than its reference, each at {_fmt(one_sided, '.0%')} one-sided (non-inferiority); "
             f"failed: a cost at {_fmt(v.per_test_confidence, '.1%')} per concurrency; P(verified if a concurrency "
             "costs more) ≤ "
             f"{v.error_rates.get('verified_if_costly', 1 - v.confidence):.0%}, P(failed if it matches) ≤ "
             f"{v.error_rates.get('failed_if_correct', 1 - v.confidence):.0%})") if rows else ""
    why = f" ({v.reason})" if v.reason else ""
    if v.outcome == Outcome.VERIFIED:
        return (f" **Verified:** `{v.server}` matched the server its schedule runs at " + ", ".join(
            f"c={x.concurrency} (`{x.against}`: {_fmt(x.speedup)}x [{_fmt(x.lo)}, {_fmt(x.hi)}])"
            for x in rows) + level + why + ".")
    if v.outcome == Outcome.FAILED:
        costs = [x for x in rows if x.verdict == Decision.LOSES]
        return (f" **Verification failed:** `{v.server}` " + "; ".join(
            f"ran at {_fmt(x.speedup)}x [{_fmt(x.lo)}, {_fmt(x.hi)}] of `{x.against}` at "
            f"c={x.concurrency}" for x in costs) + ": the schedule's switch costs throughput" + level + why + ".")
    if v.outcome == Outcome.UNDECIDED:
        return (f" **Verification undecided:** `{v.server}` against the server its schedule runs at each concurrency: "
                + ", ".join(f"c={x.concurrency} {x.verdict.value} vs `{x.against}` ({_fmt(x.speedup)}x)"
                            for x in rows) + level + why + ".")
    if v.outcome == Outcome.NOT_VERIFIABLE:
        return f" **Not verified:** {v.reason}."
    return f" **Not verified yet:** {v.reason or 'not measured'}."


def recommendation_lines(an: Analysis, recs: list[Recommendation], verified: dict | None = None,
                         attrs: list[Attribution] | None = None) -> list[str]:
    lines = []
    for r in recs:
        text = f"- **{r.server}** (`{r.suite}`): {r.text}"
        if r.vllm_schedule:
            own = an.infos[r.server].speculative if r.server in an.infos else {}
            spec = {**({k: v for k, v in (own or {}).items() if k != "num_speculative_tokens_per_batch_size"}),
                    "num_speculative_tokens_per_batch_size": r.vllm_schedule}
            text += f". vLLM: `--speculative-config '{json.dumps(spec, sort_keys=True)}'`"
        if r.sglang and r.sglang.get("mechanism"):
            text += f". SGLang: {r.sglang['mechanism']}" + (f" ({r.sglang['why']})" if r.sglang.get("why") else "")
        elif r.sglang:
            text += f". SGLang: {r.sglang.get('why')}"
        text += f" — evidence: {r.evidence}."
        if r.measured_by and r.verified is not None and r.verified.per_concurrency:
            text += f" The recommended deployment is `{r.measured_by}`'s configuration, measured on the same grid."
        if r.verified is not None:
            text += verification_text(an, r)
        elif r.as_configured:
            text += f" The recommended deployment is one already measured (`{r.server}` as configured)."
        elif r.action == "off":
            text += f" The recommended deployment is one already measured (the baseline `{an.baseline}`)."
        cause = not_drafting(attrs or [], an, r.server, r.suite)
        if cause["configured"]:
            text += (f" At c={_cs(cause['configured'])} its configured-off control `{r.server}{OFF}` pays as much: the "
                     "gain comes with the configuration, not from drafting (see \"Why it pays\").")
        lines.append(text)
    return lines


def markdown(an: Analysis, recs: list[Recommendation], verified: dict, matches: list[SuiteMatch], training: list[str],
             control: list[str], attrs: list[Attribution] | None = None, no_control: dict | None = None,
             plans: list[RoundPlan] | None = None) -> str:
    s = an.settings
    attrs = attrs or []
    mixed = mixed_servers(an.infos)
    reps = max((v.repeats for v in an.verdicts), default=1)
    design = s.design
    reps_text = (f"{design.min}–{design.max} repeats, sequential" if design.sequential
                 else f"{reps} repeat{'s' if reps != 1 else ''}")
    lines = ["# specmatch: does speculation pay off here?", ""]
    head = headline(an, training, control, attrs)
    if head:
        lines += ["## The distribution effect", ""] + head + [""]
    lines += [f"## Verdicts (throughput; {s.confidence:.0%} confidence, ±{s.min_effect:.0%} counts as no difference, "
              f"{reps_text})", ""]
    lines += verdict_lines(an, recs, attrs) or [f"Only the baseline `{an.baseline}` was measured: nothing to compare."]
    lines += ["", "pays / loses: the interval lies above / below 1 (and not within the ±min_effect band); equivalent: "
                  "the whole interval lies within it, a decisive 'no difference'; inconclusive: neither (the table "
                  "says what would decide it).", ""]
    lines += noise_lines(an)
    if design.sequential:
        lines += [""] + sequential_lines(an, plans or [])
    why = why_lines(an, attrs, no_control)
    if why:
        lines += [""] + why
    if recs:
        lines += ["", "## Recommendation", ""] + recommendation_lines(an, recs, verified, attrs)
    seen = {m.suite for m in matches if m.kind == "training" and m.holdout_share == 0}
    ksweep = kreport.lines(an, verification_text, seen)
    if ksweep:
        lines += [""] + ksweep
    lines += ["", "## Speculation configured but off", ""] + off_lines(an)
    if an.verdicts:
        lines += ["", f"## Speedup over `{an.baseline}` ({s.confidence:.0%} intervals)", "",
                  "| server | suite | c | tok/s | baseline tok/s | throughput | TPOT | e2e latency |"
                  + (" goodput |" if s.slo else "") + " acceptance length | verdict | what would decide it |",
                  "|---|---|---|---|---|---|---|---|" + ("---|" if s.slo else "") + "---|---|---|"]
        for server in an.servers:
            for suite in an.suites:
                for c in an.concurrencies:
                    t = an.verdict(server, suite, c)
                    if t is None:
                        continue
                    thr = [an.measurements.cells[(server, suite, c, r)].output_throughput
                           for r in an.measurements.repeats(server, suite, c)]
                    base = [an.measurements.cells[(an.baseline, suite, c, r)].output_throughput
                            for r in an.measurements.repeats(an.baseline, suite, c)]
                    acc = [an.measurements.cells[(server, suite, c, r)] for r in an.measurements.repeats(server, suite, c)]
                    length = [x.spec_decode_acceptance_length for x in acc if x.spec_decode_acceptance_length]
                    drafts = [x.spec_decode_num_drafts for x in acc]
                    acc_txt = "off (0 drafts)" if drafts and all(d == 0 for d in drafts) else _fmt(
                        float(np.mean(length)) if length else None)
                    if server in mixed and length:   # a schedule with plain steps: its speculative steps only
                        acc_txt += f" over {sum(d or 0 for d in drafts)} speculative steps"
                    cols = [_ci(an.verdict(server, suite, c, m)) for m in ("output_throughput", "tpot", "e2el")]
                    if s.slo:
                        cols.append(_ci(an.verdict(server, suite, c, "goodput")))
                    lines.append(f"| {server} | {suite} | {c} | {_fmt(np.mean([x for x in thr if x]), '.1f')} | "
                                 f"{_fmt(np.mean([x for x in base if x]), '.1f')} | " + " | ".join(cols) +
                                 f" | {acc_txt} | {t.verdict.value} | {t.decide or ''} |")
        if any(a.closed for a in an.measurements.arrays.values()):
            lines += ["", "Throughput speedups compare the rate at the load: C × output tokens / the sum of the "
                          "requests' latencies (Little's law: what a stream of requests at concurrency C gets), not the "
                          "tok/s columns (vLLM's tokens / the cell's duration, whose end is its slowest request's). "
                          "They differ most where a cell is one burst (C at least its requests)."]
        if s.slo:
            lines += ["", "Goodput follows vLLM's `--goodput`: requests meeting every SLO (" + ", ".join(
                f"{k} ≤ {v:g}" for k, v in s.slo.items()) + ") per second. Its verdicts: " + "; ".join(
                f"**{sv}** on `{u}`: {shape(an, sv, u, 'goodput')}" for sv in an.servers if sv != an.baseline
                for u in an.suites) + "."]
    if len(an.suites) > 1 and an.verdicts:
        lines += ["", "## Same server, different prompts", "", "| server | c | " + " | ".join(
            f"`{u}`" for u in an.suites) + " |", "|---|---|" + "---|" * len(an.suites)]
        for server in an.servers:
            for c in an.concurrencies:
                vals = [an.verdict(server, u, c) for u in an.suites]
                if any(vals):
                    lines.append(f"| {server} | {c} | " + " | ".join(
                        f"{_ci(v)} {v.verdict.value}" if v else "—" for v in vals) + " |")
    if matches:
        lines += ["", "## Prompt suites", "", "| suite | prompts | median prompt tokens | held-out share | source TVD vs "
                                             "training | prompt-length KS (critical) | verdict |",
                  "|---|---|---|---|---|---|---|"]
        flags = length_flags(matches, training)
        for m in matches:
            med = (m.prompt_tokens or {}).get("p50")
            lines.append(f"| {m.suite} | {m.prompts} | {_fmt(med, '.0f')} | {_fmt(m.holdout_share, '.0%')} | "
                         f"{_fmt(m.source_tvd_vs_training_mix, '.3f')} | {_fmt(m.prompt_length_ks, '.3f')} "
                         f"({_fmt(m.prompt_length_ks_critical_5pct, '.3f')}) | {m.verdict}"
                         + (f"; **{flags[m.suite]}**" if m.suite in flags else "") + " |")
    by_src = pooled_acceptance(an, "acceptance_by_source")
    if by_src:
        lines += ["", "## Acceptance by training source (pooled over concurrencies and repeats)", "",
                  "| server | suite | source | requests | acceptance rate | acceptance length |", "|---|---|---|---|---|---|"]
        lines += [f"| {a['server']} | {a['suite']} | {a['group']} | {a['requests']} | {_fmt(a['acceptance_rate'], '.3f')} | "
                  f"{_fmt(a['acceptance_length'])} |" for a in by_src]
    hold = [a for a in pooled_acceptance(an, "acceptance_by_holdout")]
    mixed = {(a["server"], a["suite"]) for a in hold if a["group"] == "held_out"} & \
        {(a["server"], a["suite"]) for a in hold if a["group"] == "seen"}
    if mixed:
        lines += ["", "## Held-out vs seen training prompts", "",
                  "Acceptance on rows the drafter was trained on overstates what unseen traffic gets.", "",
                  "| server | suite | rows | requests | acceptance rate | acceptance length |", "|---|---|---|---|---|---|"]
        lines += [f"| {a['server']} | {a['suite']} | {a['group'].replace('_', '-')} | {a['requests']} | "
                  f"{_fmt(a['acceptance_rate'], '.3f')} | {_fmt(a['acceptance_length'])} |"
                  for a in hold if (a["server"], a["suite"]) in mixed]
    k_plot, k_json = (", `plots/k_sweep.png`", ", `k_sweeps.json`") if an.k_recommendations else ("", "")
    lines += ["", "## All cells", "",
              "| server | suite | c | repeat | ok | failed | tok/s | TTFT p50 ms | TPOT p50 ms | ITL p99 ms | e2e p50 ms | "
              "acceptance length | held-out share |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (server, suite, c, r), x in sorted(an.measurements.cells.items()):
        lines.append(f"| {server} | {suite} | {c} | {r} | {x.completed} | {x.failed} | {_fmt(x.output_throughput, '.1f')} | "
                     f"{_fmt(x.median_ttft_ms, '.0f')} | {_fmt(x.median_tpot_ms, '.1f')} | {_fmt(x.p99_itl_ms, '.1f')} | "
                     f"{_fmt(x.median_e2el_ms, '.0f')} | " + ("off (0 drafts)" if x.spec_decode_num_drafts == 0 else
                                                            _fmt(x.spec_decode_acceptance_length)
                                                            + (f" over {x.spec_decode_num_drafts} speculative steps"
                                                               if server in mixed and x.spec_decode_num_drafts else "")) +
                     f" | {_fmt(x.holdout_share, '.0%')} |")
    lines += load_generator_lines(list(an.measurements.cells.values()))
    lines += ["", "Definitions (every cell's `definitions` field): TTFT is the first stream chunk carrying choices, "
                  "end-to-end latency the last one, TPOT (e2e - TTFT) / (output tokens - 1) with output tokens from the "
                  "server's usage: vLLM bench serve's definitions. Acceptance follows each engine's own definition.",
              "", "Plots: `plots/throughput.png`, `plots/speedup.png`, `plots/latency_throughput.png`, "
                  f"`plots/acceptance_by_source.png`, `plots/attribution.png`{k_plot}. Machine-readable: "
                  f"`verdicts.json`, `recommendations.json`, `attribution.json`{k_json}. "
                  "Every file has a `.prov.json` beside it: `specmatch provenance results/summary/summary.md`."]
    return "\n".join(lines) + "\n"


def length_flags(matches: list[SuiteMatch], training: list[str]) -> dict[str, str]:
    """Suites whose prompts are much shorter (or longer) than the training mix's: per-token costs
    differ there for reasons that have nothing to do with acceptance."""
    med = {m.suite: (m.prompt_tokens or {}).get("p50") for m in matches}
    ref = next((u for u in training if med.get(u)), None)
    if ref is None:
        return {}
    out = {}
    for u, v in med.items():
        if u in training or not v:
            continue
        ratio = v / med[ref]
        if ratio < 0.5 or ratio > 2:
            out[u] = (f"{'much shorter' if ratio < 0.5 else 'much longer'} than the training mix (median {v:.0f} vs "
                      f"{med[ref]:.0f} tokens on `{ref}`): a plain decode step costs "
                      f"{'less' if ratio < 0.5 else 'more'} over its contexts, so its speedups differ for reasons "
                      "that are not acceptance (see \"Why it pays\")")
    return out


def load_generator_lines(cells: list) -> list[str]:
    """How the latencies were measured, and every cell whose measurement needs a caveat."""
    if not cells:
        return []
    clocks = {x for c in cells for x in (c.arrival_clock or "unrecorded").split(",")}
    how = {"kernel": "by the kernel as they reached the socket (SO_TIMESTAMPNS), so the client's own parsing "
                     "and read order do not enter TTFT, ITL or end-to-end latency",
           "read": "by the client's clock when it read each socket (no kernel receive timestamps here)",
           "unrecorded": "by a client that did not record its clock (cells from an older specmatch)"}
    lags = [c.p99_client_read_lag_ms for c in cells if c.p99_client_read_lag_ms is not None]
    coalesced = sum(c.coalesced_token_events or 0 for c in cells)
    lines = ["", "## Load generator", "",
             "Token arrivals were stamped " + "; and ".join(how[k] for k in sorted(clocks)) + "."
             + (f" The client read each response within {max(lags):.1f} ms of its arrival (worst cell's p99)"
                if lags else "")
             + f"; {coalesced} token event(s) reached it in one read with their stream's previous token."]
    by_text: dict[str, list[str]] = {}  # one line per distinct warning, naming every cell that gave it
    for c in cells:
        for w in c.warnings or []:
            by_text.setdefault(w, []).append(f"{c.server} / {c.suite} / r{c.repeat} / c={c.concurrency}")
    for w, where in by_text.items():
        lines.append(f"- warning, {where[0]}: {w}" if len(where) == 1 else
                     f"- warning, {len(where)} cells ({'; '.join(where)}): {w}")
    return lines


# -- plots ------------------------------------------------------------------------------------
def server_styles(servers: list[str]) -> dict[str, dict]:
    """One colour per server in every plot, from the order servers appear (the config's order, the
    baseline first): a control (`x__off`) and a recommended server (`x__recommended`) take their
    parent's colour with a dashed or dotted line, so a reader links them at a glance."""
    palette = ["#4d4d4d", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
               "#bcbd22"]
    parents = list(dict.fromkeys(x[:-len(OFF)] if is_control(x) else x[:-len(SUFFIX)] if x.endswith(SUFFIX) else x
                                 for x in servers))
    colour = {p: palette[i % len(palette)] for i, p in enumerate(parents)}
    out = {}
    for x in servers:
        if is_control(x):
            out[x] = {"color": colour[x[:-len(OFF)]], "linestyle": "--"}
        elif x.endswith(SUFFIX):
            out[x] = {"color": colour[x[:-len(SUFFIX)]], "linestyle": ":"}
        else:
            out[x] = {"color": colour[x], "linestyle": "-"}
    return out


def plots(an: Analysis, out: Path, attrs: list[Attribution] | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    made = []
    cs = an.concurrencies
    style = server_styles([an.baseline] + [x for x in an.servers if x != an.baseline])

    def legend(fig, axes):
        """Every drawn line in the legend, once, whichever panel drew it."""
        seen = {}
        for ax in axes:
            for h, label in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(label, h)
        if seen:
            fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=min(len(seen), 4), fontsize=8,
                       bbox_to_anchor=(0.5, 0.0))
        return len(seen)

    def save(fig, name, rows=1):
        path = out / f"{name}.png"
        with atomic_path(path, ".png") as tmp:
            fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        made.append(path)

    def figure(name, title, draw, panels, xlabel="concurrency", ylabel="", log_c=True, width=5.5):
        fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 4), squeeze=False)
        for ax, panel in zip(axes[0], panels):
            draw(ax, panel)
            if log_c:
                ax.set_xscale("log", base=2)
                ax.set_xticks(cs, [str(c) for c in cs])
                ax.minorticks_off()
            ax.set_title(f"suite {panel}")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        n = legend(fig, axes[0])
        fig.suptitle(title)
        fig.tight_layout(rect=(0, 0.08 + 0.04 * ((n - 1) // 4), 1, 1))
        save(fig, name)

    cells = an.measurements.cells

    def throughput(ax, suite):
        for server in an.servers:
            xs, ys = [], []
            for c in cs:
                vals = [cells[(server, suite, c, r)].output_throughput for r in an.measurements.repeats(server, suite, c)]
                vals = [v for v in vals if v]
                if vals:
                    ax.scatter([c] * len(vals), vals, s=10, alpha=0.5, color=style[server]["color"])
                    xs.append(c)
                    ys.append(float(np.mean(vals)))
            if xs:
                ax.plot(xs, ys, marker="o", label=server, **style[server])

    figure("throughput", "Output throughput vs concurrency (line: mean of repeats; dots: each repeat)", throughput,
           an.suites, ylabel="output tokens/s")

    def speedup(ax, suite):
        for server in an.servers:
            vs = sorted((v for v in an.verdicts if (v.server, v.suite, v.metric) == (server, suite, "output_throughput")
                         and v.speedup is not None), key=lambda v: v.concurrency)
            if not vs:
                continue
            x = [v.concurrency for v in vs]
            ax.plot(x, [v.speedup for v in vs], marker="o", label=server, **style[server])
            ax.fill_between(x, [v.lo for v in vs], [v.hi for v in vs], alpha=0.15, color=style[server]["color"])
        ax.axhline(1.0, color="black", lw=1, label="no difference (1x)")
        band = an.settings.min_effect
        ax.axhspan(1 / (1 + band), 1 + band, color="grey", alpha=0.1, label=f"±{band:.0%} (equivalent)")

    figure("speedup", f"Throughput speedup over the baseline (band: {an.settings.confidence:.0%} interval; grey: "
                      f"±{an.settings.min_effect:.0%})", speedup, an.suites, ylabel="speedup vs baseline")

    def latency(ax, suite):
        for server in an.servers:
            xs, ys, cc = [], [], []
            for c in cs:
                rows = [cells[(server, suite, c, r)] for r in an.measurements.repeats(server, suite, c)]
                if rows:
                    xs.append(float(np.mean([x.output_throughput or 0 for x in rows])))
                    ys.append(float(np.mean([x.median_tpot_ms or 0 for x in rows])))
                    cc.append(c)
            if not xs:
                continue
            ax.plot(xs, ys, marker="o", label=server, **style[server])
            for c, x, y in zip(cc, xs, ys):
                ax.annotate(f"c{c}", (x, y), fontsize=7, alpha=0.7)

    figure("latency_throughput", "Latency vs throughput (lower right is better)", latency, an.suites,
           xlabel="output tokens/s", ylabel="median TPOT (ms)", log_c=False)

    acc = pooled_acceptance(an, "acceptance_by_source")
    if acc:
        acc_suites = sorted({a["suite"] for a in acc})
        spec_servers = [s for s in an.servers if any(a["server"] == s for a in acc)]

        def acceptance(ax, suite):
            rows = [a for a in acc if a["suite"] == suite]
            sources = sorted({a["group"] for a in rows})
            width = 0.8 / max(1, len(spec_servers))
            for k, server in enumerate(spec_servers):
                vals = [next((a["acceptance_length"] or 0 for a in rows if a["server"] == server and a["group"] == g),
                             0) for g in sources]
                ax.bar(np.arange(len(sources)) + k * width, vals, width, label=server, color=style[server]["color"],
                       hatch="//" if style[server]["linestyle"] != "-" else None)
            ax.set_xticks(np.arange(len(sources)) + 0.4 - width / 2, sources, rotation=30, ha="right", fontsize=8)

        figure("acceptance_by_source", "Acceptance length by prompt source (tokens per speculative step)", acceptance,
               acc_suites, xlabel="", ylabel="acceptance length", log_c=False, width=6.5)

    decomposed = [a for a in attrs or [] if a.tokens_per_step is not None and a.step_cost_ratio is not None]
    if decomposed:
        suites = [u for u in an.suites if any(a.suite == u for a in decomposed)]
        fig, axes = plt.subplots(2, len(suites), figsize=(5.5 * len(suites), 7.5), squeeze=False, sharex=True)
        for j, suite in enumerate(suites):
            top, bottom = axes[0][j], axes[1][j]
            for server in an.servers:
                rows = sorted((a for a in decomposed if (a.server, a.suite) == (server, suite)),
                              key=lambda a: a.concurrency)
                if not rows:
                    continue
                x = [a.concurrency for a in rows]
                col = style[server]["color"]
                for key, mark, ls in (("tokens_per_step", "o", "-"), ("step_cost_ratio", "s", "--")):
                    iv = [getattr(a, key) for a in rows]
                    top.errorbar(x, [v.value for v in iv], yerr=[[v.value - v.lo for v in iv], [v.hi - v.value for v in iv]],
                                 marker=mark, linestyle=ls, color=col, capsize=3,
                                 alpha=0.6 if style[server]["linestyle"] != "-" else 1.0)
                sp = [a.tpot_speedup for a in rows]
                bottom.plot(x, [v.value for v in sp], marker="o", label=server, **style[server])
                bottom.fill_between(x, [v.lo for v in sp], [v.hi for v in sp], alpha=0.15, color=col)
                for a in rows:
                    if a.explained_by_drafting is False:
                        bottom.scatter([a.concurrency], [a.tpot_speedup.value], s=120, facecolors="none",
                                       edgecolors="red", zorder=5, label="ρ < 1: not the drafter's doing")
            top.axhline(1.0, color="black", lw=1, label="one plain decode step (ρ = 1)")
            bottom.axhline(1.0, color="black", lw=1, label="no speedup (ρ = τ)")
            top.set_title(f"suite {suite}")
            top.set_ylabel("τ (tokens/step) and ρ (plain steps/step)")
            bottom.set_ylabel("TPOT speedup = τ / ρ")
            bottom.set_xlabel("concurrency")
            for ax in (top, bottom):
                ax.set_xscale("log", base=2)
                ax.set_xticks(cs, [str(c) for c in cs])
                ax.minorticks_off()
                ax.grid(alpha=0.3)
        axes[0][0].plot([], [], color="grey", marker="o", linestyle="-", label="top: τ tokens per step (solid)")
        axes[0][0].plot([], [], color="grey", marker="s", linestyle="--", label="top: ρ step cost, in plain steps (dashed)")
        n = legend(fig, [ax for row in axes for ax in row])
        fig.suptitle("Why it pays: tokens per step τ against step cost ρ (speculation stops paying where ρ crosses τ)")
        fig.tight_layout(rect=(0, 0.01 + 0.03 * ((n + 3) // 4), 1, 1))
        save(fig, "attribution")
    kreport.heatmap(an, out, save)
    return made


def main(argv: list[str] | None = None) -> int:
    p = steps.parser("summary", __doc__)
    analysis_arguments(p)
    p.add_argument("--matches", nargs="*", type=Path, default=[])
    p.add_argument("--recommendations", type=Path, help="the recommend step's recommendations.json")
    p.add_argument("--derived", type=Path, help="the recommend step's servers.json")
    p.add_argument("--rounds", nargs="*", type=Path, default=[], help="the sequential design's round plans")
    p.add_argument("--out-dir", type=Path, required=True)
    a = p.parse_args(argv)
    settings, configs = Settings.of(json.loads(a.settings)), json.loads(a.servers)
    rec = Recorder("summary", a.cells + a.requests + a.launches + a.matches + a.rounds +
                   [x for x in (a.recommendations, a.derived) if x],
                   {"baseline": a.baseline, "summary": settings.__dict__})
    try:
        cells = load(a.cells, a.requests)
        infos = server_infos(a.launches, configs)
        derived = DerivedServers.from_json(read_json(a.derived)).servers if a.derived else {}
        recs = [Recommendation.from_json(r) for r in read_json(a.recommendations)] if a.recommendations else []
        plans = [RoundPlan.from_json(read_json(x)) for x in a.rounds]
        an = verified_analysis(cells, a.baseline, settings, configs, infos, a.suites, derived, recs,
                               frozen_verdicts(plans, a.baseline))
        recs = an.recommendations
        verified = {(r.server, r.suite): r.verified for r in recs if r.verified is not None}
        matches = [SuiteMatch.from_json(read_json(m)) for m in a.matches]
        training = [m.suite for m in matches if m.training]
        control = [m.suite for m in matches if m.suite not in training]
        reference = next((u for u in [*a.suites, *training] if u in an.suites), None)
        attrs = attribute(an, reference)
        no_control = uncontrolled(json.loads(a.settings), configs, a.baseline)
    except SpecmatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out = a.out_dir
    table = cells_frame(an)
    with atomic_path(out / "cells.csv") as tmp:
        table.write_csv(tmp)
    with atomic_path(out / "cells.parquet", ".parquet") as tmp:
        table.write_parquet(tmp)
    with atomic_path(out / "speedups.csv") as tmp:
        verdicts_frame(an).write_csv(tmp)
    write_json(out / "verdicts.json", [v.to_json() for v in an.verdicts])
    write_json(out / "recommendations.json", [_recommendation_record(r) for r in recs])
    write_json(out / "attribution.json", [x.to_json() for x in attrs])
    write_json(out / "k_sweeps.json", kreport.records(an))
    made = plots(an, out / "plots", attrs)
    md = markdown(an, recs, verified, matches, training, control, attrs, no_control, plans)
    write_text(out / "summary.md", md)
    rec.write([out / "summary.md", out / "cells.csv", out / "cells.parquet", out / "speedups.csv",
               out / "verdicts.json", out / "recommendations.json", out / "attribution.json", out / "k_sweeps.json",
               *made])
    print(md.split("\n## Speedup")[0])
    return 0


def uncontrolled(settings: dict, configs: dict, baseline: str) -> dict[str, str]:
    """Speculative servers whose configured-off control was asked for (summary.controls) but cannot be
    expressed for their engine, and why."""
    ctl = settings.get("controls") or {}
    if not ctl.get("configured_off"):
        return {}
    names = ctl.get("servers") or [n for n, c in configs.items() if c.get("speculative") and not is_control(n)
                                   and not n.endswith(SUFFIX) and n != baseline]
    out = {}
    for n in names:
        if n in configs and n + OFF not in configs:
            why = why_no_control(configs[n])
            if why:
                out[n] = why
    return out


def _recommendation_record(r: Recommendation) -> dict:
    """The recommendations.json contract: {server, suite, regions, crossover, vllm_schedule, sglang, verified}
    and the prose that explains it."""
    j = r.to_json()
    return {"server": j["server"], "suite": j["suite"], "regions": j["regions"], "crossover": j["crossover"],
            "crossovers": j["crossovers"], "vllm_schedule": j["vllm_schedule"], "sglang": j["sglang"],
            "verified": j["verified"], "action": j["action"], "text": j["text"], "evidence": j["evidence"],
            "derived_server": j["derived_server"], "measured_by": j["measured_by"], "as_configured": j["as_configured"],
            "extrapolated_above": j["extrapolated_above"], "max_batch": j["max_batch"]}


if __name__ == "__main__":
    sys.exit(main())
