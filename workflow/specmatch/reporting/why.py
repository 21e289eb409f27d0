"""Why a speedup happens, and what being configured costs: the attribution records
(deciding.explaining.attribution: tokens per step x step cost, the configured-off split, prompt length) and the
cells where a configured server drafted nothing, rendered."""
from __future__ import annotations

import math

from ..controls import is_control
from ..records import Decision
from .decided import Decided
from .formats import number, of, speedup


def off_lines(d: Decided) -> list[str]:
    """Cells of configured servers whose own schedule drafted nothing (the configured-off controls
    are rendered in "Why it pays", beside the server they control)."""
    drafted_nothing = d.decisions.analysis.drafted_nothing
    offs = [v for v in drafted_nothing if not is_control(v.server)]
    if not offs:
        return ["No measured cell had speculation configured but switched off"
                + (" besides the configured-off controls (see \"Why it pays\")." if drafted_nothing else ".")]
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
                     f"{speedup(v)} ({v.verdict.value}); {why}.")
    for server in sorted({v.server for v in offs}):
        extra = d.warnings_beside(server)
        if extra:
            lines.append(f"- What the engine warned of for **{server}** at start-up and not for `{d.baseline}`: "
                         + "; ".join(f"\"{w}\"" for w in extra))
    return lines


def why_lines(d: Decided) -> list[str]:
    """Why each speedup happens: the table of tau, rho and the configured-off split, then the findings
    (what drafting cannot explain, configuration x drafting, prompt length). Renders the records."""
    attrs = d.attribution
    if not attrs:
        return []
    s = d.settings
    ref = next((a.length_adjusted_speedup.reference_suite for a in attrs if a.length_adjusted_speedup), None)
    ref_tokens = next((a.length_adjusted_speedup.reference_prompt_tokens for a in attrs
                       if a.length_adjusted_speedup), None)
    lines = ["## Why it pays: tokens per step × step cost", "",
             f"A speculative step yields τ tokens (the engine's acceptance length) and costs ρ plain decode steps of "
             f"`{d.baseline}` at the same suite and concurrency, so the TPOT speedup is τ / ρ. Drafting predicts "
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
    lines += table(attrs)
    lines += ["", "Configured off and drafting are throughput ratios (the verdicts' metric); their product is the "
                  "server's throughput speedup over the baseline.", ""]
    scheduled = list(dict.fromkeys(a.server for a in attrs if "decode step" in (a.acceptance_source or "")))
    if scheduled:
        lines += [f"{', '.join(f'`{x}`' for x in scheduled)}: a batch-size schedule that runs plain steps at some "
                  "batch sizes, so its τ is the tokens per decode step, plain steps included (a plain step yields 1). "
                  "The engine's acceptance length, elsewhere in this file, counts only its speculative steps: those "
                  "taken while the batch was small enough, a selection (at a concurrency above the speculative "
                  "bands, only as the batch drains).", ""]
    return lines + not_the_drafter(d) + configuration_by_drafting(d) + [
        f"- **{server}**: no configured-off control ({why})." for server, why in d.decisions.analysis.no_control.items()
    ] + [f"- **{server}**: no cache arm, the prefix-cache opt-out on sessions ({why})."
         for server, why in d.decisions.analysis.no_cache_arm.items()] + prompt_length(d, ref)


def table(attrs: list) -> list[str]:
    """Per server, suite and concurrency: TPOT speedup, tau, rho, whether drafting explains it, the
    configured-off split and the speedup at matched prompt length."""
    lines = ["| server | suite | c | TPOT speedup | τ tokens/step | ρ step cost | drafting explains it | "
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
        off = (f"{of(a.configured_off)} {a.configured_off.verdict.value}" if a.configured_off else "—")
        dr = (f"{of(a.drafting_effect)} {a.drafting_effect.verdict.value}" if a.drafting_effect else "—")
        la = a.length_adjusted_speedup
        lat = (of(la) + ("*" if la.extrapolated else "")) if la else "—"
        lines.append(f"| {a.server} | {a.suite} | {a.concurrency} | {of(a.tpot_speedup)} | {of(a.tokens_per_step)} | "
                     f"{of(a.step_cost_ratio)} | {expl} | {off} | {dr} | {lat} |")
    return lines


def not_the_drafter(d: Decided) -> list[str]:
    """Servers whose steps were decisively cheaper than a plain decode step somewhere, with what their
    launch did differently from the baseline's and what the engine warned of."""
    attrs, out = d.attribution, []
    for server in dict.fromkeys(a.server for a in attrs):
        bad = [a for a in attrs if a.server == server and a.explained_by_drafting is False]
        if not bad:
            continue
        where = "; ".join(f"`{a.suite}` c={a.concurrency}: TPOT {number(a.tpot_speedup.value)}x with τ "
                          f"{number(a.tokens_per_step.value)}, ρ {of(a.step_cost_ratio)}"
                          + (f" (against its configured-off control's plain step: {of(a.step_cost_vs_configured_off)})"
                             if a.step_cost_vs_configured_off else "") for a in bad)
        text = (f"- **{server}: drafting cannot explain its gain** ({where}). A speculative step that yields τ tokens "
                "and costs at least one plain step improves TPOT by at most τ; these steps cost less than the "
                f"baseline's plain decode step, so the engine took another path.")
        facts = d.facts(server)
        if facts is not None and facts.launch_differences is not None:   # both servers have a launch record
            if facts.launch_differences:
                text += " Its launch differs from the baseline's in: " + "; ".join(
                    f"`{x}`" for x in facts.launch_differences) + "."
            warn = d.warnings_beside(server)
            if warn:
                text += " The engine warned at start-up (not for the baseline): " + "; ".join(f"\"{w}\"" for w in warn) + "."
        out.append(text)
    return out


def configuration_by_drafting(d: Decided) -> list[str]:
    """Each server with a configured-off control: its speedup split into what being configured does and
    what drafting on top of it does."""
    split: dict = {}
    for a in d.attribution:
        if a.configured_off and a.drafting_effect:
            split.setdefault((a.server, a.suite, a.configured_off.server), []).append(a)
    return [f"- **{server}** on `{suite}`, configuration × drafting (throughput; `{off}` is configured but drafts "
            "nothing): " + "; ".join(
                f"c={a.concurrency}: {number(a.configured_off.speedup)}x ({a.configured_off.verdict.value}) × "
                f"{number(a.drafting_effect.speedup)}x ({a.drafting_effect.verdict.value})"
                + (f", a speculative step costing {of(a.step_cost_vs_configured_off)} of the control's plain steps "
                   f"for τ {number(a.tokens_per_step.value)}" if a.step_cost_vs_configured_off and a.tokens_per_step
                   else "") for a in rows) + "." for (server, suite, off), rows in split.items()]


def prompt_length(d: Decided, ref: str | None) -> list[str]:
    """Same server, different prompts, at matched prompt length: whether a suite's contrast with the
    reference suite survives once prompt length is accounted for."""
    attrs = d.attribution
    contrasts = [a for a in attrs if a.contrast and a.contrast.raw and a.contrast.length_adjusted
                 and not is_control(a.server)]
    if not contrasts:
        return []
    lines = ["", f"Same server, different prompts, at matched prompt length (each suite's TPOT speedup over "
                 f"its speedup on `{ref}`; per-prompt geometric means):", ""]
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
        taus = (f" (τ {of(a.tokens_per_step)} against {of(base_tau)})" if a.tokens_per_step and base_tau else "")
        lines.append(f"- **{a.server}** on `{a.suite}` at c={a.concurrency}: {of(raw)}x raw, {of(adj)}x at "
                     f"{a.length_adjusted_speedup.reference_prompt_tokens:.0f}-token prompts"
                     + ("*" if a.length_adjusted_speedup.extrapolated else "") + f"{taus}: {why}.")
    return lines
