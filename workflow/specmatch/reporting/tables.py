"""The report's tables: the tidy frames (`cells.csv`/`.parquet`, `speedups.csv`) and the markdown tables
of summary.md (speedups, suites side by side, prompt suites, acceptance, every cell)."""
from __future__ import annotations

import numpy as np
import polars as pl

from ..records import GroupAcceptance, SuiteMatch
from .decided import Decided
from .formats import number, speedup
from .verdicts import shape

CELL_COLUMNS = ["server", "suite", "concurrency", "repeat", "engine", "completed", "failed", "duration",
                "output_throughput", "request_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms",
                "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms",
                "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms", "spec_decode_acceptance_rate",
                "spec_decode_acceptance_length", "spec_decode_num_drafts", "holdout_share", "server_session"]


# -- frames ---------------------------------------------------------------------------------------
def cells_frame(d: Decided) -> pl.DataFrame:
    """One tidy row per cell (every repeat), with its goodput where an SLO is set."""
    rows = []
    for key, cell in sorted(d.cells.items()):
        j = cell.to_json()
        row = {k: j.get(k) for k in CELL_COLUMNS}
        if d.settings.slo:
            row["request_goodput"] = d.goodput(key)
        rows.append(row)
    return pl.DataFrame(rows, infer_schema_length=None)


def verdicts_frame(d: Decided) -> pl.DataFrame:
    """Every verdict, its designs (what would decide an inconclusive one) flattened into columns: the effect
    design's `effect_*` (repeats, suite scale, the bounds outside which it decides with 80%) and the
    equivalence design's `equivalence_*` (repeats, suite scale, probability if the speedup is 1.00)."""
    if not d.verdicts:
        return pl.DataFrame({"server": []})
    rows = []
    for v in d.verdicts:
        j = {k: x for k, x in v.to_json().items() if k != "design"}
        eff, eq = ((v.design or {}).get(k) or {} for k in ("effect", "equivalence"))
        rows.append({**j, "speedup": v.speedup,
                     **{f"effect_{k}": eff.get(k) for k in ("repeats", "suite_scale", "lo", "hi")},
                     **{f"equivalence_{k}": eq.get(k) for k in ("repeats", "suite_scale", "probability")}})
    return pl.DataFrame(rows, infer_schema_length=None)


# -- markdown -------------------------------------------------------------------------------------
def speedup_table(d: Decided) -> list[str]:
    """Every server, suite and concurrency against the baseline: throughput, TPOT, end-to-end latency
    (and goodput) with their intervals, acceptance, the verdict and what would decide it."""
    s = d.settings
    lines = [f"## Speedup over `{d.baseline}` ({s.confidence:.0%} intervals)", "",
             "| server | suite | c | tok/s | baseline tok/s | throughput | TPOT | e2e latency |"
             + (" goodput |" if s.slo else "") + " acceptance length | verdict | what would decide it |",
             "|---|---|---|---|---|---|---|---|" + ("---|" if s.slo else "") + "---|---|---|"]
    for server in d.servers:
        for suite in d.suites:
            for c in d.concurrencies:
                t = d.verdict(server, suite, c)
                if t is None:
                    continue
                thr = [d.cells[(server, suite, c, r)].output_throughput for r in d.repeats(server, suite, c)]
                base = [d.cells[(d.baseline, suite, c, r)].output_throughput for r in d.repeats(d.baseline, suite, c)]
                acc = [d.cells[(server, suite, c, r)] for r in d.repeats(server, suite, c)]
                length = [x.spec_decode_acceptance_length for x in acc if x.spec_decode_acceptance_length]
                drafts = [x.spec_decode_num_drafts for x in acc]
                acc_txt = "off (0 drafts)" if drafts and all(n == 0 for n in drafts) else number(
                    float(np.mean(length)) if length else None)
                if server in d.mixed and length:   # a schedule with plain steps: its speculative steps only
                    acc_txt += f" over {sum(n or 0 for n in drafts)} speculative steps"
                cols = [speedup(d.verdict(server, suite, c, m)) for m in ("output_throughput", "tpot", "e2el")]
                if s.slo:
                    cols.append(speedup(d.verdict(server, suite, c, "goodput")))
                lines.append(f"| {server} | {suite} | {c} | {number(np.mean([x for x in thr if x]), '.1f')} | "
                             f"{number(np.mean([x for x in base if x]), '.1f')} | " + " | ".join(cols) +
                             f" | {acc_txt} | {t.verdict.value} | {t.decide or ''} |")
    if d.decisions.analysis.closed_loop:
        lines += ["", "Throughput speedups compare the rate at the load: C × output tokens / the sum of the "
                      "requests' latencies (Little's law: what a stream of requests at concurrency C gets), not the "
                      "tok/s columns (vLLM's tokens / the cell's duration, whose end is its slowest request's). "
                      "They differ most where a cell is one burst (C at least its requests)."]
    if s.slo:
        lines += ["", "Goodput follows vLLM's `--goodput`: requests meeting every SLO (" + ", ".join(
            f"{k} ≤ {v:g}" for k, v in s.slo.items()) + ") per second. Its verdicts: " + "; ".join(
            f"**{sv}** on `{u}`: {shape(d, sv, u, 'goodput')}" for sv in d.servers if sv != d.baseline
            for u in d.suites) + "."]
    return lines


def across_suites_table(d: Decided) -> list[str]:
    """The same server at the same concurrency on every suite: its throughput verdict side by side."""
    lines = ["## Same server, different prompts", "", "| server | c | " + " | ".join(
        f"`{u}`" for u in d.suites) + " |", "|---|---|" + "---|" * len(d.suites)]
    for server in d.servers:
        for c in d.concurrencies:
            vals = [d.verdict(server, u, c) for u in d.suites]
            if any(vals):
                lines.append(f"| {server} | {c} | " + " | ".join(
                    f"{speedup(v)} {v.verdict.value}" if v else "—" for v in vals) + " |")
    return lines


def suites_table(matches: list[SuiteMatch], training: list[str]) -> list[str]:
    """Each prompt suite against the training mix (its match report), flagged where its prompts are
    much shorter or longer than the training mix's."""
    lines = ["## Prompt suites", "", "| suite | prompts | median prompt tokens | held-out share | source TVD vs "
                                     "training | prompt-length KS (critical) | verdict |",
             "|---|---|---|---|---|---|---|"]
    flags = length_flags(matches, training)
    for m in matches:
        med = (m.prompt_tokens or {}).get("p50")
        lines.append(f"| {m.suite} | {m.prompts} | {number(med, '.0f')} | {number(m.holdout_share, '.0%')} | "
                     f"{number(m.source_tvd_vs_training_mix, '.3f')} | {number(m.prompt_length_ks, '.3f')} "
                     f"({number(m.prompt_length_ks_critical_5pct, '.3f')}) | {m.verdict}"
                     + (f"; **{flags[m.suite]}**" if m.suite in flags else "") + " |")
    return lines


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


def _acceptance_row(a: GroupAcceptance, group: str) -> str:
    x = a.acceptance
    return (f"| {a.server} | {a.suite} | {group} | {x.requests} | {number(x.acceptance_rate, '.3f')} | "
            f"{number(x.acceptance_length)} |")


def acceptance_tables(d: Decided) -> list[str]:
    """Acceptance pooled by training source, and held-out against seen rows where a suite has both."""
    lines = []
    by_src = d.decisions.analysis.acceptance_by_source
    if by_src:
        lines += ["", "## Acceptance by training source (pooled over concurrencies and repeats)", "",
                  "| server | suite | source | requests | acceptance rate | acceptance length |", "|---|---|---|---|---|---|"]
        lines += [_acceptance_row(a, a.group) for a in by_src]
    hold = d.decisions.analysis.acceptance_by_holdout
    both = ({(a.server, a.suite) for a in hold if a.group == "held_out"}
            & {(a.server, a.suite) for a in hold if a.group == "seen"})
    if both:
        lines += ["", "## Held-out vs seen training prompts", "",
                  "Acceptance on rows the drafter was trained on overstates what unseen traffic gets.", "",
                  "| server | suite | rows | requests | acceptance rate | acceptance length |", "|---|---|---|---|---|---|"]
        lines += [_acceptance_row(a, a.group.replace("_", "-")) for a in hold if (a.server, a.suite) in both]
    return lines


def cells_table(d: Decided) -> list[str]:
    """Every cell, every repeat."""
    lines = ["## All cells", "",
             "| server | suite | c | repeat | ok | failed | tok/s | TTFT p50 ms | TPOT p50 ms | ITL p99 ms | e2e p50 ms | "
             "acceptance length | held-out share |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (server, suite, c, r), x in sorted(d.cells.items()):
        lines.append(f"| {server} | {suite} | {c} | {r} | {x.completed} | {x.failed} | {number(x.output_throughput, '.1f')} | "
                     f"{number(x.median_ttft_ms, '.0f')} | {number(x.median_tpot_ms, '.1f')} | "
                     f"{number(x.p99_itl_ms, '.1f')} | {number(x.median_e2el_ms, '.0f')} | "
                     + ("off (0 drafts)" if x.spec_decode_num_drafts == 0 else
                        number(x.spec_decode_acceptance_length)
                        + (f" over {x.spec_decode_num_drafts} speculative steps"   # a schedule with plain steps
                           if server in d.mixed and x.spec_decode_num_drafts and x.spec_decode_acceptance_length
                           else "")) +
                     f" | {number(x.holdout_share, '.0%')} |")
    return lines
