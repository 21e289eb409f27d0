"""Render the decision: the analysis (specmatch.analysis) as the files a team reads and tools parse.

- `verdicts.json`: records.Verdict per (server, suite, concurrency, metric): pays / loses /
  equivalent / inconclusive with the speedup, its interval, the confidence and the repeats.
- `recommendations.json`: records.Recommendation per speculative server and recommendation suite:
  regions, the crossover with its interval, the vLLM schedule or SGLang mechanism, and the measured
  verification of the recommended deployment.
- `cells.csv` / `cells.parquet`: one tidy row per cell (every repeat); `speedups.csv`: every verdict.
- `plots/*.png` and `summary.md`: the verdict first, then the evidence.

Nothing here decides anything: analysis returns typed results, this module only renders them.

    python -m specmatch.summary --baseline NAME --cells c*.json --requests c*.requests.parquet
        --launches launch.json... --matches *.match.json --recommendations R --out-dir results/summary
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import polars as pl

from .analysis import LABEL, Analysis, Settings, verify
from .engines import definitions
from .files import SpecmatchError, atomic_path, read_json, write_json, write_text
from .provenance import Recorder
from .records import Decision, Recommendation
from .recommend import SUFFIX, analysis_arguments, load, primary_analysis, server_infos

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
    return pl.DataFrame([{**v.to_json(), "speedup": v.speedup} for v in an.verdicts], infer_schema_length=None)


# -- acceptance -------------------------------------------------------------------------------
def pooled_acceptance(an: Analysis, key: str) -> list[dict]:
    """Acceptance per (server, suite, group) pooled over cells and repeats by the engine's own
    definition (`key`: acceptance_by_source, or acceptance_by_holdout: held-out rows vs seen ones)."""
    from .records import Acceptance

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
def headline(an: Analysis, training: list[str], control: list[str]) -> list[str]:
    """The distribution effect, first: acceptance per suite and what a benchmark on the control
    prompts would have concluded against what the training mix says."""
    lines = []
    for server in [s for s in an.servers if s != an.baseline and not s.endswith(SUFFIX)]:
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
            on_ct, on_tr = shape(an, server, ct), shape(an, server, tr)
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


def verdict_lines(an: Analysis, recs: list[Recommendation]) -> list[str]:
    lines = []
    cross = {(r.server, r.suite): r.crossover for r in recs}
    for server in an.servers:
        if server == an.baseline:
            continue
        for suite in an.suites:
            if not any((v.server, v.suite) == (server, suite) for v in an.verdicts):
                continue
            text = f"- **{server}** on `{suite}`: {shape(an, server, suite)}"
            x = cross.get((server, suite))
            if x is None:
                from .analysis import crossover

                x = crossover(an.comparisons.get((server, suite, "output_throughput"), []), an.settings)
            if x is not None:
                text += (f"; it {x.direction} at c≈{x.point:.1f} [{_fmt(x.lo, '.1f') if x.lo else 'below the range'}, "
                         f"{_fmt(x.hi, '.1f') if x.hi else 'beyond the range'}]")
            best = max((v for v in an.verdicts if (v.server, v.suite, v.metric) == (server, suite, "output_throughput")
                        and v.speedup is not None), key=lambda v: v.speedup, default=None)
            if best:
                text += f" (best {best.speedup:.2f}x at c={best.concurrency})"
            lines.append(text + ".")
    return lines


def noise_lines(an: Analysis) -> list[str]:
    rr, s = an.run_to_run, an.settings
    if not rr.tau2:
        return [f"**These intervals exclude run-to-run variation.** Each cell was measured once (repeats: 1), so "
                "the intervals show only how much the result moves between prompts and requests, not between "
                "server sessions, which is usually larger (vLLM reports 1.5-3.7% on GPUs). A verdict therefore needs "
                f"an effect beyond ±{s.min_effect:.0%}, and 'equivalent' is never called. Set `repeats: 2` or more to "
                "measure it."]
    parts = [f"{LABEL[m]} ±{math.exp(math.sqrt(t)) - 1:.1%}" for m, t in rr.tau2.items()]
    return [f"**Run-to-run variation, measured:** between fresh server sessions a configuration's figures move by "
            + ", ".join(parts) + f" (one standard deviation), estimated from {rr.configurations} configurations "
            f"measured in {rr.repeats} repeats (a median fit: one outlying cell cannot set it). Every interval below "
            "includes it, beside the request-to-request variation of a paired bootstrap by prompt."]


def off_lines(an: Analysis) -> list[str]:
    if not an.off_cost:
        return ["No measured cell had speculation configured but switched off."]
    lines = []
    for v in sorted(an.off_cost, key=lambda v: (v.server, v.suite, v.concurrency)):
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
    for server in sorted({v.server for v in an.off_cost}):
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


def recommendation_lines(an: Analysis, recs: list[Recommendation], verified: dict) -> list[str]:
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
        v = verified.get((r.server, r.suite))
        if v and v.get("measured"):
            rows = v["per_concurrency"]
            if r.measured_by:
                text += f" The recommended deployment is `{r.measured_by}`'s configuration, measured on the same grid."
            if v["matches_best"] is True:
                text += (f" **Verified:** `{v['server']}` matched the best of `{an.baseline}` and `{r.server}` at "
                         f"c={_cs(x['concurrency'] for x in rows)} within noise.")
            elif v["matches_best"] is False:
                text += (f" **Verification failed:** `{v['server']}` " + "; ".join(
                    f"ran at {_fmt(x['speedup'])}x [{_fmt(x['lo'])}, {_fmt(x['hi'])}] of `{x['against']}` at "
                    f"c={x['concurrency']}" for x in v["costs"]) + ": the schedule's switch costs throughput.")
            else:
                text += (f" **Verification undecided:** `{v['server']}` vs the best at each concurrency: " + ", ".join(
                    f"c={x['concurrency']} {x['verdict']} ({_fmt(x['speedup'])}x)" for x in rows) + ".")
        elif r.as_configured:
            text += f" The recommended deployment is one already measured (`{r.server}` as configured)."
        elif r.action == "off":
            text += f" The recommended deployment is one already measured (the baseline `{an.baseline}`)."
        lines.append(text)
    return lines


def markdown(an: Analysis, recs: list[Recommendation], verified: dict, matches: list[dict], training: list[str],
             control: list[str]) -> str:
    s = an.settings
    reps = max((v.repeats for v in an.verdicts), default=1)
    lines = ["# specmatch: does speculation pay off here?", ""]
    head = headline(an, training, control)
    if head:
        lines += ["## The distribution effect", ""] + head + [""]
    lines += [f"## Verdicts (throughput; {s.confidence:.0%} confidence, ±{s.min_effect:.0%} counts as no difference, "
              f"{reps} repeat{'s' if reps != 1 else ''})", ""]
    lines += verdict_lines(an, recs) or [f"Only the baseline `{an.baseline}` was measured: nothing to compare."]
    lines += ["", "pays / loses: the interval lies above / below 1 (and not within the ±min_effect band); equivalent: "
                  "the whole interval lies within it, a decisive 'no difference'; inconclusive: neither (the table "
                  "says what would decide it).", ""]
    lines += noise_lines(an)
    if recs:
        lines += ["", "## Recommendation", ""] + recommendation_lines(an, recs, verified)
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
                    cols = [_ci(an.verdict(server, suite, c, m)) for m in ("output_throughput", "tpot", "e2el")]
                    if s.slo:
                        cols.append(_ci(an.verdict(server, suite, c, "goodput")))
                    lines.append(f"| {server} | {suite} | {c} | {_fmt(np.mean([x for x in thr if x]), '.1f')} | "
                                 f"{_fmt(np.mean([x for x in base if x]), '.1f')} | " + " | ".join(cols) +
                                 f" | {acc_txt} | {t.verdict.value} | {t.decide or ''} |")
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
        lines += ["", "## Prompt suites", "", "| suite | prompts | held-out share | source TVD vs training | "
                                             "prompt-length KS (critical) | verdict |", "|---|---|---|---|---|---|"]
        for m in matches:
            lines.append(f"| {m['suite']} | {m['prompts']} | {_fmt(m.get('holdout_share'), '.0%')} | "
                         f"{_fmt(m.get('source_tvd_vs_training_mix'), '.3f')} | {_fmt(m.get('prompt_length_ks'), '.3f')} "
                         f"({_fmt(m.get('prompt_length_ks_critical_5pct'), '.3f')}) | {m['verdict']} |")
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
    lines += ["", "## All cells", "",
              "| server | suite | c | repeat | ok | failed | tok/s | TTFT p50 ms | TPOT p50 ms | ITL p99 ms | e2e p50 ms | "
              "acceptance length | held-out share |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (server, suite, c, r), x in sorted(an.measurements.cells.items()):
        lines.append(f"| {server} | {suite} | {c} | {r} | {x.completed} | {x.failed} | {_fmt(x.output_throughput, '.1f')} | "
                     f"{_fmt(x.median_ttft_ms, '.0f')} | {_fmt(x.median_tpot_ms, '.1f')} | {_fmt(x.p99_itl_ms, '.1f')} | "
                     f"{_fmt(x.median_e2el_ms, '.0f')} | " + ("off (0 drafts)" if x.spec_decode_num_drafts == 0 else
                                                            _fmt(x.spec_decode_acceptance_length)) +
                     f" | {_fmt(x.holdout_share, '.0%')} |")
    lines += load_generator_lines(list(an.measurements.cells.values()))
    lines += ["", "Definitions (every cell's `definitions` field): TTFT is the first stream chunk carrying choices, "
                  "end-to-end latency the last one, TPOT (e2e - TTFT) / (output tokens - 1) with output tokens from the "
                  "server's usage: vLLM bench serve's definitions. Acceptance follows each engine's own definition.",
              "", "Plots: `plots/throughput.png`, `plots/speedup.png`, `plots/latency_throughput.png`, "
                  "`plots/acceptance_by_source.png`. Machine-readable: `verdicts.json`, `recommendations.json`. "
                  "Every file has a `.prov.json` beside it: `specmatch provenance results/summary/summary.md`."]
    return "\n".join(lines) + "\n"


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
def plots(an: Analysis, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    made = []
    cs = an.concurrencies

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
        handles, labels = axes[0][0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8,
                       bbox_to_anchor=(0.5, -0.02))
        fig.suptitle(title)
        fig.tight_layout(rect=(0, 0.08, 1, 1))
        path = out / f"{name}.png"
        with atomic_path(path, ".png") as tmp:
            fig.savefig(tmp, format="png", dpi=110)
        plt.close(fig)
        made.append(path)

    cells = an.measurements.cells

    def throughput(ax, suite):
        for server in an.servers:
            xs, ys = [], []
            for c in cs:
                vals = [cells[(server, suite, c, r)].output_throughput for r in an.measurements.repeats(server, suite, c)]
                vals = [v for v in vals if v]
                if vals:
                    ax.scatter([c] * len(vals), vals, s=10, alpha=0.5)
                    xs.append(c)
                    ys.append(float(np.mean(vals)))
            ax.plot(xs, ys, marker="o", label=server)

    figure("throughput", "Output throughput vs concurrency (line: mean of repeats; dots: each repeat)", throughput,
           an.suites, ylabel="output tokens/s")

    def speedup(ax, suite):
        for server in an.servers:
            vs = sorted((v for v in an.verdicts if (v.server, v.suite, v.metric) == (server, suite, "output_throughput")
                         and v.speedup is not None), key=lambda v: v.concurrency)
            if not vs:
                ax.plot([], [])  # keep each server's colour the same across plots
                continue
            x = [v.concurrency for v in vs]
            line = ax.plot(x, [v.speedup for v in vs], marker="o", label=server)[0]
            ax.fill_between(x, [v.lo for v in vs], [v.hi for v in vs], alpha=0.2, color=line.get_color())
        ax.axhline(1.0, color="black", lw=1)
        band = an.settings.min_effect
        ax.axhspan(1 / (1 + band), 1 + band, color="grey", alpha=0.1)

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
            ax.plot(xs, ys, marker="o", label=server)
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
                ax.bar(np.arange(len(sources)) + k * width, vals, width, label=server)
            ax.set_xticks(np.arange(len(sources)) + 0.4 - width / 2, sources, rotation=30, ha="right", fontsize=8)

        figure("acceptance_by_source", "Acceptance length by prompt source (tokens per speculative step)", acceptance,
               acc_suites, xlabel="", ylabel="acceptance length", log_c=False, width=6.5)
    return made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specmatch.summary", description=__doc__.split("\n\n")[0])
    analysis_arguments(p)
    p.add_argument("--matches", nargs="*", type=Path, default=[])
    p.add_argument("--recommendations", type=Path, help="the recommend step's recommendations.json")
    p.add_argument("--derived", type=Path, help="the recommend step's servers.json")
    p.add_argument("--out-dir", type=Path, required=True)
    a = p.parse_args(argv)
    settings, configs = Settings.of(json.loads(a.settings)), json.loads(a.servers)
    rec = Recorder("summary", a.cells + a.requests + a.launches + a.matches +
                   [x for x in (a.recommendations, a.derived) if x],
                   {"baseline": a.baseline, "summary": settings.__dict__})
    try:
        cells = load(a.cells, a.requests)
        infos = server_infos(a.launches, configs)
        derived = read_json(a.derived)["servers"] if a.derived else {}
        an = primary_analysis(cells, a.baseline, settings, configs, infos, a.suites)
        if derived:  # the recommended servers' cells join the tables; the decisions stay the primary grid's
            from .analysis import Measurements, server_verdicts

            full = Measurements.of(cells, settings)
            an.measurements = full
            an.servers = full.servers()
            for name in derived:
                vs, _, offs = server_verdicts(full, an.run_to_run, name, a.baseline, an.suites, an.concurrencies)
                an.verdicts += vs
                an.off_cost += offs
        recs = [Recommendation.from_json(r) for r in read_json(a.recommendations)] if a.recommendations else []
        recs = recs or an.recommendations
        verified = {}
        for r in recs:
            name = r.derived_server or r.measured_by or next((n for n, d in derived.items() if d["parent"] == r.server
                                             and d["suite"] == r.suite), None)
            if name and name in an.servers:
                r.verified = verify(an, r, name)
                verified[(r.server, r.suite)] = r.verified
        matches = [read_json(m) for m in a.matches]
        training = [m["suite"] for m in matches if "candidates" in m and m.get("prompt_length_ks") is not None]
        control = [m["suite"] for m in matches if m["suite"] not in training]
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
    made = plots(an, out / "plots")
    md = markdown(an, recs, verified, matches, training, control)
    write_text(out / "summary.md", md)
    rec.write([out / "summary.md", out / "cells.csv", out / "cells.parquet", out / "speedups.csv",
               out / "verdicts.json", out / "recommendations.json", *made])
    print(md.split("\n## Speedup")[0])
    return 0


def _recommendation_record(r: Recommendation) -> dict:
    """The recommendations.json contract: {server, suite, regions, crossover, vllm_schedule, sglang, verified}
    and the prose that explains it."""
    j = r.to_json()
    return {"server": j["server"], "suite": j["suite"], "regions": j["regions"], "crossover": j["crossover"],
            "vllm_schedule": j["vllm_schedule"], "sglang": j["sglang"], "verified": j["verified"],
            "action": j["action"], "text": j["text"], "evidence": j["evidence"], "derived_server": j["derived_server"],
            "measured_by": j["measured_by"], "as_configured": j["as_configured"]}


if __name__ == "__main__":
    sys.exit(main())
