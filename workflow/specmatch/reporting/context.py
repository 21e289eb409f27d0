"""Render the context-length axis, natural stopping and sessions: the decide step's context.json,
context_trends.json and stopping.json (specmatch.deciding.explaining.context, specmatch.deciding.explaining.stopping), as
`plots/context.png` and the summary's "Context length", "Natural stopping" and "Sessions" sections.
Nothing here decides anything.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..deciding.explaining.context import ContextAxis
from ..deciding.explaining.ledger import SessionLedger
from ..deciding.explaining.stopping import StoppingReport
from ..controls import is_cache_arm, parent
from .formats import save_figure
from ..records import Decision, Interval
from .decided import Decided


@dataclass
class Report:
    axis: ContextAxis
    stopping: StoppingReport


def of(d: Decided) -> Report:
    return Report(ContextAxis(d.decisions.context, d.decisions.context_trends), d.decisions.stopping)


def plots(d: Decided, out: Path) -> list[Path]:
    """plots/context.png, where the axis has a row."""
    axis = of(d).axis
    return [plot(out / "context.png", axis)] if axis.rows else []


# -- markdown ---------------------------------------------------------------------------------------
def _iv(x, spec=".2f") -> str:
    if x is None or x.value is None:
        return "—"
    return f"{x.value:{spec}} [{x.lo:{spec}}, {x.hi:{spec}}]"


def _ctx(v: float) -> str:
    return f"{v:,.0f}"


def lines(d: Decided) -> list[str]:
    rep, an = of(d), d
    out = context_lines(rep, an)
    out += stopping_lines(rep, an)
    out += session_lines(rep, an)
    return out


def context_lines(rep: Report, an) -> list[str]:
    axis = rep.axis
    if not axis.rows:
        return []
    conf = an.settings.confidence
    out = ["## Context length", "",
           f"Acceptance τ, step cost ρ and the TPOT speedup τ/ρ by context length (the baseline's prompt tokens; "
           f"a session suite's turns by their own context), paired by prompt or turn, {conf:.0%} intervals from a "
           "bootstrap by prompt (a session suite: by session) plus run-to-run variation; each bin's verdict on the "
           "TPOT speedup at that level (not adjusted for the number of bins). `context.json`, `plots/context.png`.", ""]
    for t in axis.trends:
        text = f"- **{t.server}** on `{t.suite}` at c={t.concurrency}"
        if t.contexts:
            text += f" ({_ctx(t.contexts[0])}–{_ctx(t.contexts[1])} tokens of context, {t.bins} bin(s))"
        if t.acceptance == "falls":
            text += f": acceptance falls, ×{_iv(t.acceptance_per_doubling)} per doubling of the context"
        elif t.acceptance == "rises":
            text += f": acceptance rises, ×{_iv(t.acceptance_per_doubling)} per doubling of the context"
        elif t.acceptance == "no detectable trend":
            text += f": no detectable trend in acceptance (×{_iv(t.acceptance_per_doubling)} per doubling)"
        else:
            text += ": acceptance by context not measured (no per-request metrics, or no spread of context)"
        rows = sorted((r for r in axis.rows if (r.server, r.suite, r.concurrency) == (t.server, t.suite, t.concurrency)),
                      key=lambda r: r.bin.lo)
        groups: dict = {}
        for r in rows:
            if r.tpot_speedup is not None:
                groups.setdefault(r.verdict, []).append(f"{_ctx(r.bin.lo)}–{_ctx(r.bin.hi)}")
        order = [Decision.PAYS, Decision.EQUIVALENT, Decision.LOSES, Decision.INCONCLUSIVE]
        if groups:
            text += "; TPOT " + "; ".join(f"{d.value} at {', '.join(groups[d])} tokens" for d in order if d in groups)
        if t.called and t.bins > 1 and t.chance_any is not None:
            text += (f" ({t.called} of {t.bins} bins called; where the speedup does not move with context, chance "
                     f"alone calls some bin of {t.bins} in about {t.chance_any:.0%} of suites)")
        for x in t.crossovers:
            verb = "stops paying" if x.direction.value == "stops paying" else "starts paying"
            text += (f"; speculation {verb} from about {_ctx(x.point)} tokens of context [{_ctx(x.lo)}, {_ctx(x.hi)}] "
                     f"(between the bins around {_ctx(x.below)} and {_ctx(x.above)} tokens, whose verdicts decide it)")
        if t.note:
            text += f" ({t.note})"
        out.append(text + ".")
    out += ["", "| server | suite | c | context (tokens) | requests (units) | τ tokens/step | ρ step cost | TPOT speedup "
                "| verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(axis.rows, key=lambda r: (r.server, r.suite, r.concurrency, r.bin.lo)):
        out.append(f"| {r.server} | {r.suite} | {r.concurrency} | {_ctx(r.bin.lo)}–{_ctx(r.bin.hi)} (median "
                   f"{_ctx(r.median_context or 0)}) | {r.requests} ({r.units}) | {_iv(r.tokens_per_step)} | "
                   f"{_iv(r.step_cost_ratio)} | {_iv(r.tpot_speedup)} | "
                   f"{r.verdict.value if r.tpot_speedup is not None else 'not compared'} |")
    return out + [""]


def stopping_lines(rep: Report, an) -> list[str]:
    """Per (server, suite): its outputs against the baseline's (one line where every concurrency agrees,
    a line per concurrency where one diverges); per suite: the tokens decoded past the natural stop."""
    st = rep.stopping
    out = []
    groups: dict = {}
    for a in st.agreement:
        if a.compared:
            groups.setdefault((a.server, a.suite), []).append(a)
    for (server, suite), rows in groups.items():
        rows = sorted(rows, key=lambda a: a.concurrency)
        head = f"- **{server}** on `{suite}`"
        if all(a.same_work for a in rows):
            n = sum(a.compared for a in rows)
            cs = ",".join(str(a.concurrency) for a in rows)
            text = f"{head} at c={cs}: the same tokens as `{rows[0].against}` in all {n} requests compared"
            text += floor_text(rows)
            if all(a.ignore_eos is False for a in rows):
                text += "; both did the same work, so its throughput verdicts compare like with like"
            out.append(text + ".")
            continue
        for a in rows:
            out.append(divergence_text(a, an) + ".")
    by_suite: dict = {}
    for p in st.past_stop:
        by_suite.setdefault(p.suite, []).append(p)
    for suite, ps in by_suite.items():
        if all(not p.past_stop_tokens for p in ps) and all(p.ignore_eos is False for p in ps):
            continue
        base = next((p for p in ps if p.server == an.baseline), ps[0])
        text = (f"`{suite}`: {base.past_stop_tokens} of {base.output_tokens} output tokens ({base.share:.0%}) of "
                f"`{base.server}` were decoded after the model's own end-of-sequence token, in {base.requests_past} of "
                f"{base.requests} requests" + (" (requests.ignore_eos: true)" if base.ignore_eos else ""))
        others = [f"`{p.server}` {p.share:.0%}" for p in ps if p is not base and p.share is not None]
        if others:
            text += " (" + ", ".join(others) + ")"
        if any(p.warn for p in ps):
            text = ("- **warning**: " + text + f" — over {st.warning_share:.0%}: acceptance and step costs were partly "
                    "measured on text the model would not have written (`ignore_eos: false` stops where it stops)")
        else:
            text = "- " + text
        out.append(text + ".")
    return ["## Natural stopping", ""] + out + [""] if out else []


def floor_text(rows) -> str:
    got = [a.baseline_floor for a in rows if a.baseline_floor and a.baseline_floor["compared"]]
    if not got:
        return ""
    n, same = sum(f["compared"] for f in got), sum(f["identical"] for f in got)
    return f" (the baseline against its own first repeat: {same} of {n} identical)"


def divergence_text(a, an) -> str:
    where = ""
    if a.first_divergence:
        d = a.first_divergence
        where = f", first differing at token {d['min']:.0f}–{d['max']:.0f} (median {d['p50']:.0f})"
    text = (f"- **{a.server}** on `{a.suite}` at c={a.concurrency}: **outputs diverge from `{a.against}`'s in "
            f"{a.differ} of {a.compared} requests**{where}{floor_text([a])}")
    if a.ignore_eos is False:
        tpot = an.verdict(a.server, a.suite, a.concurrency, "tpot")
        text += ("; with natural stopping the two servers generated different amounts, so compare them per token: "
                 "TPOT " + (f"{tpot.speedup:.2f}x [{tpot.lo:.2f}, {tpot.hi:.2f}] {tpot.verdict.value}"
                            if tpot is not None and tpot.speedup else "not decided"))
    if a.not_compared:
        text += f" ({a.not_compared} not compared: no output recorded, or a session's later turns)"
    return text


def session_lines(rep: Report, an) -> list[str]:
    ss = rep.stopping.sessions
    if not ss:
        return []
    out = ["## Sessions", ""]
    leds = [x for x in rep.stopping.ledgers if x.decode is not None]
    if leds:
        out += ["**Where a session's time goes** (seconds per session against the other server's same sessions, "
                "prefill = time to first token, decoding at the other's answer lengths; sessions resampled whole):", ""]
        out += [f"- {ledger_text(x)}" for x in leds]
        out += ["", *ledger_flag_lines(rep, an), ""]
    out += ["Session suites replay whole conversations turn by turn (each turn the history so far; concurrency = "
           "sessions in flight; the prefix cache reset once before each cell). Session throughput: each session's "
           "output tokens over its wall time, against the baseline's same session.", "",
           "| server | suite | c | sessions (whole / cut short) | turns sent (failed, not sent) | prefix-cache hit | "
           "TTFT ms by turn | session throughput vs baseline | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for x in ss:
        cut = ", ".join(f"{n} {k}" for k, n in sorted(x.cut_short.items())) or "0"
        ttft = " / ".join(f"{v:.0f}" for _, v in sorted(x.ttft_ms_by_turn.items(), key=lambda kv: int(kv[0])))
        hit = f"{x.prefix_cache_hit_share:.0%}" if x.prefix_cache_hit_share is not None else "not reported"
        thr = (f"{_iv(x.session_throughput)} ({x.paired_sessions} sessions)" if x.session_throughput else
               ("—" if x.server == an.baseline else f"— ({x.paired_sessions} sessions whole on both)"))
        out.append(f"| {x.server} | {x.suite} | {x.concurrency} | {x.sessions} ({x.completed} / {cut}) | "
                   f"{x.turns_sent} ({x.turns_failed}, {x.turns_not_sent}) | {hit} | {ttft or '—'} | {thr} | "
                   f"{x.verdict.value if x.verdict else '—'} |")
    return out + [""]


def ledger_text(led: SessionLedger) -> str:
    """One sentence: 'eagle3 gains X s per session in decoding and loses Y s in prefill because the cache
    serves Z% less' (signs as measured, each with its interval)."""
    if led.decode is None or led.prefill is None:
        return f"`{led.server}` against `{led.against}` at c={led.concurrency}: {led.note or 'no ledger'}"

    def part(iv: Interval, what: str) -> str:
        verb = "loses" if iv.value > 0 else "gains"
        return f"{verb} {abs(iv.value):.2f} s [{-iv.hi if verb == 'gains' else iv.lo:.2f}, " \
               f"{-iv.lo if verb == 'gains' else iv.hi:.2f}] per session {what}"

    text = f"`{led.server}` against `{led.against}` at c={led.concurrency}: {part(led.decode, 'in decoding')} and " \
           f"{part(led.prefill, 'in prefill')}"
    if led.hit_share is not None and led.against_hit_share is not None:
        diff = led.against_hit_share - led.hit_share
        if round(abs(diff) * 100) == 0:
            text += f"; the prefix cache serves the same share of the prompt ({led.hit_share * 100:.0f}%)"
        else:
            text += (f"; the prefix cache serves {abs(diff) * 100:.0f} points {'less' if diff > 0 else 'more'} of the "
                     f"prompt ({led.hit_share * 100:.0f}% against {led.against_hit_share * 100:.0f}%)")
            cp = led.cache_part
            if cp is not None:
                what = "the extra tokens it prefills cost" if cp.value >= 0 else "the tokens it no longer prefills save"
                lo, hi = (cp.lo, cp.hi) if cp.value >= 0 else (-cp.hi, -cp.lo)
                text += (f": {what} about {abs(cp.value):.2f} s [{lo:.2f}, {hi:.2f}] per session at its "
                         f"{led.prefill_ms_per_token:.2f} ms per uncached token (fitted at c={led.prefill_cost_concurrency})")
    text += f" ({led.sessions} sessions x {led.repeats} repeat(s), {int(led.confidence * 100)}% intervals)"
    if len(led.by_turn) > 1:
        turns = led.by_turn
        ctx = " / ".join(f"{t.context:,.0f}" if t.context is not None else "?" for t in turns)
        text += (f"; by turn (median context {ctx} tokens): prefill "
                 + " / ".join(f"{t.prefill_s:+.2f}" for t in turns) + " s, decoding "
                 + " / ".join(f"{t.decode_s:+.2f}" for t in turns) + " s a turn")
    return text + "."


def flag_keys(d: Decided, arm: str, server: str) -> str:
    """The keys of the arm's speculative block that differ from its server's (the flag), as `key: value`."""
    mine, theirs = d.facts(arm), d.facts(server)
    flag, own = (mine.speculative if mine else None) or {}, (theirs.speculative if theirs else None) or {}
    return ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in flag.items() if own.get(k) != v)


def answers_kept(d: Decided, arm: str, server: str, suite: str, c: int) -> bool | None:
    """Whether the arm's answers match the baseline's no less than its server's do (within 10 points);
    None where either was not compared (no evidence either way)."""
    agree = {(a.server, a.suite, a.concurrency): a for a in d.decisions.stopping.agreement}
    a, o = agree.get((arm, suite, c)), agree.get((server, suite, c))
    if a is None or o is None or not a.compared or not o.compared:
        return None
    return a.identical / a.compared >= o.identical / o.compared - 0.1


def ledger_flag_lines(rep: Report, an) -> list[str]:
    """Whether each cache arm's flag pays on the sessions (its ledger against the server it is the arm of)
    and whether it changes answers (its outputs against the baseline's, beside the original's)."""
    out = []
    agree = {(a.server, a.suite, a.concurrency): a for a in rep.stopping.agreement}
    for x in rep.stopping.ledgers:
        if not is_cache_arm(x.server) or x.against != parent(x.server) or x.speedup is None:
            continue
        pays = {"pays": "pays", "loses": "costs", "equivalent": "changes nothing that matters"}.get(
            x.verdict.value if x.verdict else "", "is not decided")
        text = (f"- **The flag** ({flag_keys(an, x.server, x.against) or 'the engine opt-out'}) on `{x.against}` at "
                f"c={x.concurrency}: it {pays} on these sessions (session throughput {_iv(x.speedup)} of "
                f"`{x.against}`'s)")
        acc = {a.server: a for a in an.decisions.analysis.acceptance if a.suite == x.suite}
        if x.server in acc and x.against in acc and acc[x.server].length and acc[x.against].length:
            text += (f"; {acc[x.server].length:.2f} tokens per speculative step with it, {acc[x.against].length:.2f} "
                     "without (vLLM marks the flag as one that may move acceptance)")
        a, o = agree.get((x.server, x.suite, x.concurrency)), agree.get((x.against, x.suite, x.concurrency))
        if a is not None and a.compared:
            text += (f"; its answers match the baseline's in {a.identical}/{a.compared} turns"
                     + (f" (without the flag {o.identical}/{o.compared})" if o is not None and o.compared else ""))
            if answers_kept(an, x.server, x.against, x.suite, x.concurrency) is False:
                text += ": **the flag changes answers**"
        out.append(text + ".")
    return out


# -- the plot -----------------------------------------------------------------------------------------
def plot(path: Path, axis: ContextAxis) -> Path:
    """tau and rho (top) and the TPOT speedup (bottom) against context length, one column per suite, one
    line per server and concurrency, each bin at its median context with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suites = list(dict.fromkeys(r.suite for r in axis.rows))
    fig, axes = plt.subplots(2, len(suites), figsize=(5.5 * len(suites), 7.5), squeeze=False, sharex="col")
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
    lines_ = list(dict.fromkeys((r.server, r.concurrency) for r in axis.rows))
    colour = {k: colours[i % len(colours)] for i, k in enumerate(lines_)}
    for j, suite in enumerate(suites):
        top, bottom = axes[0][j], axes[1][j]
        for key in lines_:
            rows = sorted((r for r in axis.rows if (r.server, r.concurrency) == key and r.suite == suite),
                          key=lambda r: r.median_context or 0)
            rows = [r for r in rows if r.median_context]
            if not rows:
                continue
            x = [r.median_context for r in rows]
            label = f"{key[0]} c={key[1]}"
            for attr, mark, ls in (("tokens_per_step", "o", "-"), ("step_cost_ratio", "s", "--")):
                pts = [(xx, getattr(r, attr)) for xx, r in zip(x, rows) if getattr(r, attr) is not None]
                if pts:
                    top.errorbar([p[0] for p in pts], [p[1].value for p in pts],
                                 yerr=[[p[1].value - p[1].lo for p in pts], [p[1].hi - p[1].value for p in pts]],
                                 marker=mark, linestyle=ls, color=colour[key], capsize=3)
            pts = [(xx, r.tpot_speedup) for xx, r in zip(x, rows) if r.tpot_speedup is not None]
            if pts:
                bottom.plot([p[0] for p in pts], [p[1].value for p in pts], marker="o", color=colour[key], label=label)
                bottom.fill_between([p[0] for p in pts], [p[1].lo for p in pts], [p[1].hi for p in pts],
                                    color=colour[key], alpha=0.15)
        top.axhline(1.0, color="black", lw=1)
        bottom.axhline(1.0, color="black", lw=1)
        top.set_title(f"suite {suite}")
        top.set_ylabel("τ tokens/step (solid), ρ plain steps/step (dashed)")
        bottom.set_ylabel("TPOT speedup τ / ρ")
        bottom.set_xlabel("context length (prompt tokens)")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
        bottom.legend(fontsize=8)
    fig.suptitle("Context length: acceptance τ and step cost ρ (top), TPOT speedup (bottom)")
    fig.tight_layout()
    return save_figure(fig, path)


__all__ = ["Report", "of", "plots", "lines", "plot"]
