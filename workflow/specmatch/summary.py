"""Aggregate every cell into the answer a team acts on.

- `cells.csv` / `cells.parquet`: one tidy row per (server, suite, concurrency).
- `speedups.csv`: each speculative server against the baseline on the same suite and concurrency,
  for output throughput, TPOT and end-to-end latency, with bootstrap intervals from the per-request
  records (throughput via Little's law, C x mean output tokens / mean latency, resampled per cell).
- the crossover concurrency where speculation stops paying, and a recommendation: for vLLM a
  `num_speculative_tokens_per_batch_size` schedule, for SGLang the batch size above which to fall back.
- acceptance per training source, and the distribution effect (training-mix vs control suites).
- plots and `summary.md` (the verdict first, then the tables).

    python -m specmatch.summary --baseline NAME --cells c*.json --matches *.match.json --out-dir results/summary
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import polars as pl

from .io import SpecmatchError, atomic_path, read_json, write_text
from .provenance import Recorder

CELL_COLUMNS = ["server", "suite", "concurrency", "engine", "completed", "failed", "duration", "output_throughput",
                "request_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
                "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms",
                "median_e2el_ms", "p99_e2el_ms", "spec_decode_acceptance_rate", "spec_decode_acceptance_length",
                "spec_decode_num_drafts", "holdout_share"]


def load_cells(paths: list[Path]) -> tuple[pl.DataFrame, dict]:
    rows, reqs = [], {}
    for p in paths:
        c = read_json(p)
        rows.append({k: c.get(k) for k in CELL_COLUMNS} | {"path": str(p)})
        rq = p.with_name(p.name.replace(".json", ".requests.parquet"))
        if not rq.exists():
            raise SpecmatchError(f"{rq}: per-request records missing for {p}")
        reqs[(c["server"], c["suite"], c["concurrency"])] = (pl.read_parquet(rq), c)
    if not rows:
        raise SpecmatchError("no cells to summarise")
    df = pl.DataFrame(rows, infer_schema_length=None).sort(["suite", "server", "concurrency"])
    return df, reqs


def _boot_stats(df: pl.DataFrame, concurrency: int, n: int, rng) -> dict[str, np.ndarray]:
    ok = df.filter(pl.col("ok"))
    out = ok["output_tokens"].to_numpy().astype(float)
    e2e = ok["e2e_s"].to_numpy().astype(float)
    ttft = ok["ttft_s"].fill_null(np.nan).to_numpy().astype(float)
    tpot = np.where(out > 1, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
    k = len(out)
    idx = rng.integers(0, k, size=(n, k))
    return {"thr": concurrency * out[idx].mean(axis=1) / e2e[idx].mean(axis=1),
            "tpot": np.nanmean(tpot[idx], axis=1), "e2e": e2e[idx].mean(axis=1)}


def speedups(df: pl.DataFrame, reqs: dict, baseline: str, n_boot: int, conf: float, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    lo_q, hi_q = (1 - conf) / 2 * 100, (1 + conf) / 2 * 100
    rows = []
    for (server, suite, c), (rq, cell) in sorted(reqs.items()):
        if server == baseline or (baseline, suite, c) not in reqs:
            continue
        brq, bcell = reqs[(baseline, suite, c)]
        if not cell.get("completed") or not bcell.get("completed"):
            continue
        s, b = _boot_stats(rq, c, n_boot, rng), _boot_stats(brq, c, n_boot, rng)
        row = {"server": server, "suite": suite, "concurrency": c,
               "throughput": cell["output_throughput"], "baseline_throughput": bcell["output_throughput"],
               "speedup_throughput": cell["output_throughput"] / bcell["output_throughput"]}
        ratio = s["thr"] / b["thr"]
        row["speedup_throughput_lo"], row["speedup_throughput_hi"] = (
            float(np.percentile(ratio, lo_q)) * row["speedup_throughput"] / float(np.median(ratio)),
            float(np.percentile(ratio, hi_q)) * row["speedup_throughput"] / float(np.median(ratio)))
        for key, name in (("tpot", "tpot"), ("e2e", "e2el")):
            r = b[key] / s[key]  # > 1: the speculative server is faster per request
            point = (bcell.get(f"mean_{name}_ms") or np.nan) / (cell.get(f"mean_{name}_ms") or np.nan)
            row[f"speedup_{name}"] = float(point)
            row[f"speedup_{name}_lo"] = float(np.nanpercentile(r, lo_q))
            row[f"speedup_{name}_hi"] = float(np.nanpercentile(r, hi_q))
        row["acceptance_rate"] = cell.get("spec_decode_acceptance_rate")
        row["num_drafts"] = cell.get("spec_decode_num_drafts")
        row["acceptance_length"] = cell.get("spec_decode_acceptance_length")
        rows.append(row)
    return apply_noise_margin(pl.DataFrame(rows, infer_schema_length=None), 0.0) if rows else pl.DataFrame()


def apply_noise_margin(sp: pl.DataFrame, margin: float) -> pl.DataFrame:
    """Judge each cell: 'pays'/'loses' when its interval clears 1 by `margin` (the measured run-to-run
    noise floor; 0 = the interval alone), 'inconclusive' otherwise. The one place verdicts are made."""
    if sp.is_empty():
        return sp
    return sp.with_columns(
        pl.when(pl.col("speedup_throughput_lo") > 1 + margin).then(pl.lit("pays"))
        .when(pl.col("speedup_throughput_hi") < 1 - margin).then(pl.lit("loses"))
        .otherwise(pl.lit("inconclusive")).alias("verdict"))


def crossover(sp: pl.DataFrame) -> list[dict]:
    """Per (server, suite): where speculation stops paying.

    By the point estimate (the recommendation's boundary), and by the intervals: `confident_pays`
    lists concurrencies whose whole interval is above 1, `confident_loses` those wholly below."""
    out = []
    if sp.is_empty():
        return out
    for (server, suite), g in sp.group_by(["server", "suite"], maintain_order=True):
        g = g.sort("concurrency")
        cs, sps = g["concurrency"].to_list(), g["speedup_throughput"].to_list()
        verdicts = g["verdict"].to_list()
        pays = [x > 1 for x in sps]
        if all(pays):
            text, last = "pays everywhere measured", cs[-1]
        elif not any(pays):
            text, last = "never pays", None
        else:
            first_loss = next(i for i, p in enumerate(pays) if not p)
            if first_loss > 0:
                last = cs[first_loss - 1]
                text = f"stops paying at c={cs[first_loss]} (pays up to c={last})"
            else:
                last = None
                text = "loses at low concurrency, pays higher up"
        out.append({"server": server, "suite": suite, "crossover": text, "pays_up_to": last,
                    "confident": all(v != "inconclusive" for v in verdicts),
                    "confident_pays": [int(c) for c, v in zip(cs, verdicts) if v == "pays"],
                    "confident_loses": [int(c) for c, v in zip(cs, verdicts) if v == "loses"],
                    "inconclusive": [int(c) for c, v in zip(cs, verdicts) if v == "inconclusive"],
                    "speedups": {int(c): round(float(s), 3) for c, s in zip(cs, sps)}})
    return out


def recommendation(cross: list[dict], launches: dict, training_suites: set[str]) -> list[dict]:
    recs = []
    for x in cross:
        if training_suites and x["suite"] not in training_suites:
            continue
        launch = launches.get(x["server"], {})
        engine, spec = launch.get("engine"), (launch.get("speculative") or {})
        k = spec.get("num_speculative_tokens", 4)
        flavor = launch.get("flavor", engine)
        if not x["confident_pays"] and not x["confident_loses"]:
            # every cell within noise: a schedule drawn from point estimates would be a coin toss
            text = ("no change: at every measured concurrency the difference from the baseline is within the "
                    "noise; longer cells (requests.per_worker, requests.min_per_cell) or repeated runs would be "
                    "needed to decide")
        elif x["pays_up_to"] is None:
            text = "turn speculation off: it never beat the baseline on this suite"
        elif x["crossover"] == "pays everywhere measured":
            text = ("keep this configuration, its batch-size schedule included" if
                    spec.get("num_speculative_tokens_per_batch_size") else
                    "keep speculation on at every measured concurrency")
        elif flavor == "vllm":
            sched = [[1, int(x["pays_up_to"]), int(k)], [int(x["pays_up_to"]) + 1, 1024, 0]]
            text = ("vLLM: --speculative-config '" + json.dumps({**{kk: vv for kk, vv in spec.items()
                    if kk != "num_speculative_tokens_per_batch_size"}, "num_speculative_tokens_per_batch_size": sched},
                    sort_keys=True) + "'")
        else:
            text = f"SGLang: route traffic to the baseline server above batch size {x['pays_up_to']}"
        recs.append({**x, "recommendation": text,
                     "evidence": "all intervals exclude 1" if x["confident"] else
                     "no interval clears the noise margin" if not (x["confident_pays"] or x["confident_loses"]) else
                     "some intervals include 1: treat the boundary as approximate"})
    return recs


def acceptance_by_source(paths: list[Path], key: str = "acceptance_by_source") -> pl.DataFrame:
    """Acceptance pooled over a server's cells per prompt source (or, with key acceptance_by_holdout,
    per held-out flag: training rows the drafter saw overstate what unseen traffic gets)."""
    rows = []
    for p in paths:
        c = read_json(p)
        for src, a in (c.get(key) or {}).items():
            rows.append({"server": c["server"], "suite": c["suite"], "concurrency": c["concurrency"], "source": src,
                         **{k: a.get(k) for k in ("requests", "acceptance_rate", "acceptance_length",
                                                  "num_accepted_tokens", "num_draft_tokens", "num_spec_steps")}})
    if not rows:
        return pl.DataFrame()
    df = pl.DataFrame(rows, infer_schema_length=None)
    return (df.group_by(["server", "suite", "source"]).agg(
        pl.col("requests").sum(), pl.col("num_accepted_tokens").sum(), pl.col("num_draft_tokens").sum(),
        pl.col("num_spec_steps").sum())
        .with_columns((pl.col("num_accepted_tokens") / pl.col("num_draft_tokens")).alias("acceptance_rate"),
                      (1 + pl.col("num_accepted_tokens") / pl.col("num_spec_steps")).alias("acceptance_length"))
        .sort(["server", "suite", "source"]))


def plots(df: pl.DataFrame, sp: pl.DataFrame, acc: pl.DataFrame, cross: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    suites = sorted(df["suite"].unique().to_list())
    servers = df["server"].unique(maintain_order=True).to_list()
    concurrencies = sorted(df["concurrency"].unique().to_list())
    made = []

    def figure(name, title, draw, xlabel="concurrency", ylabel="", log_c=True, width=5.5, panels=None):
        """One panel per suite; `draw(ax, suite)` fills a panel."""
        panels = panels or suites
        fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 4), squeeze=False)
        for ax, suite in zip(axes[0], panels):
            draw(ax, suite)
            if log_c:
                ax.set_xscale("log", base=2)
                ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
                ax.minorticks_off()
            ax.set_title(f"suite {suite}")
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

    def rows(frame, suite, server):
        return frame.filter((pl.col("suite") == suite) & (pl.col("server") == server)).sort("concurrency")

    def throughput(ax, suite):
        for s in servers:
            g = rows(df, suite, s)
            ax.plot(g["concurrency"], g["output_throughput"], marker="o", label=s)

    figure("throughput", "Output throughput vs concurrency", throughput, ylabel="output tokens/s")

    if not sp.is_empty():
        def speedup(ax, suite):
            for s in servers:
                g = rows(sp, suite, s) if s in sp["server"].to_list() else None
                if g is None or g.is_empty():
                    ax.plot([], [])  # keep each server's colour the same across plots
                    continue
                x = g["concurrency"].to_numpy()
                line = ax.plot(x, g["speedup_throughput"], marker="o", label=s)[0]
                ax.fill_between(x, g["speedup_throughput_lo"], g["speedup_throughput_hi"], alpha=0.2,
                                color=line.get_color())
                xo = next((c for c in cross if c["server"] == s and c["suite"] == suite), None)
                if xo and xo["pays_up_to"] is not None and xo["crossover"].startswith("stops"):
                    ax.axvline(xo["pays_up_to"], color=line.get_color(), ls=":", alpha=0.7)
            ax.axhline(1.0, color="black", lw=1)

        figure("speedup", "Speedup over the baseline (band: bootstrap interval; dotted: last concurrency that pays)",
               speedup, ylabel="throughput speedup vs baseline")

    def latency(ax, suite):
        for s in servers:
            g = rows(df, suite, s)
            ax.plot(g["output_throughput"], g["median_tpot_ms"], marker="o", label=s)
            for c, x, y in zip(g["concurrency"], g["output_throughput"], g["median_tpot_ms"]):
                if x is not None and y is not None:
                    ax.annotate(f"c{c}", (x, y), fontsize=7, alpha=0.7)

    figure("latency_throughput", "Latency vs throughput (lower right is better)", latency,
           xlabel="output tokens/s", ylabel="median TPOT (ms)", log_c=False)

    if not acc.is_empty():
        acc_suites = sorted(acc["suite"].unique().to_list())

        def acceptance(ax, suite):
            g = acc.filter(pl.col("suite") == suite)
            sources = sorted(g["source"].unique().to_list())
            spec_servers = [s for s in servers if s in g["server"].to_list()]
            width = 0.8 / max(1, len(spec_servers))
            for srv in servers:
                if srv not in spec_servers:
                    ax.bar([], [])
                    continue
                k = spec_servers.index(srv)
                vals = [g.filter((pl.col("server") == srv) & (pl.col("source") == src))["acceptance_rate"].to_list()
                        for src in sources]
                ax.bar(np.arange(len(sources)) + k * width, [v[0] if v and v[0] is not None else 0 for v in vals],
                       width, label=srv)
            ax.set_xticks(np.arange(len(sources)) + 0.4 - width / 2, sources, rotation=30, ha="right")

        figure("acceptance_by_source", "Draft acceptance rate by prompt source", acceptance,
               xlabel="prompt source", ylabel="draft acceptance rate", log_c=False, width=6.5, panels=acc_suites)
    return made


def _fmt(v, spec=".2f"):
    return "—" if v is None or (isinstance(v, float) and np.isnan(v)) else format(v, spec)


def _acc(v, drafts, spec):
    """Acceptance cell text: 'off' when the server speculates but drafted nothing (e.g. a batch-size schedule)."""
    if v is None and drafts == 0:
        return "off (0 drafts)"
    return _fmt(v, spec)


# Launch settings that do not change what the server computes (compared out of configurations).
_NOT_COMPUTE = ("idle_timeout_s", "startup_timeout_s", "host")


def effective_config(launch: dict | None, concurrency: int) -> str | None:
    """What a server computes at this concurrency, as a canonical string: its launch configuration
    with a batch-size schedule reduced to the number of speculative tokens at each batch size up to
    the concurrency (0 everywhere = no speculation). None when unknown."""
    cfg = dict((launch or {}).get("config") or {})
    if not cfg:
        return None
    for k in _NOT_COMPUTE:
        cfg.pop(k, None)
    spec = dict(cfg.pop("speculative", None) or {})
    sched = spec.pop("num_speculative_tokens_per_batch_size", None)
    if sched or "num_speculative_tokens" in spec:
        k = spec.pop("num_speculative_tokens", None)
        ks = [next((r[2] for r in sched if r[0] <= bs <= r[1]), None) if sched else k
              for bs in range(1, concurrency + 1)]
        if None in ks:
            return None
        spec = {**spec, "tokens_by_batch_size": ks} if any(ks) else {}
    cfg["speculative"] = spec or None
    return json.dumps(cfg, sort_keys=True)


def noise_floor(sp: pl.DataFrame, launches: dict | None = None, baseline: str | None = None) -> list[dict]:
    """Cells that measured the same computation twice: their throughput ratio is pure run-to-run
    variation, which the bootstrap intervals (request-to-request variation within a cell) do not
    capture. Two kinds: a speculative server that drafted nothing (its schedule switched speculation
    off, or its configuration equals the baseline's at that concurrency) against the baseline; and two
    servers whose configurations are identical at that concurrency (e.g. always-on n-gram and a
    schedule that only switches it off above it), against each other."""
    if sp.is_empty():
        return []
    launches = launches or {}
    base_cfg = {c: effective_config(launches.get(baseline), c) for c in sp["concurrency"].unique().to_list()}
    out, groups = [], {}
    for r in sp.iter_rows(named=True):
        eff = effective_config(launches.get(r["server"]), r["concurrency"])
        if r.get("num_drafts") == 0 or (eff is not None and eff == base_cfg[r["concurrency"]]):
            out.append({"server": r["server"], "suite": r["suite"], "concurrency": r["concurrency"],
                        "speedup": r["speedup_throughput"], "against": baseline})
        elif eff is not None:
            groups.setdefault((r["suite"], r["concurrency"], eff), []).append(r)
    for (suite, c, _eff), rows in groups.items():
        rows = sorted(rows, key=lambda r: r["throughput"])
        for lo, hi in zip(rows, rows[1:]):
            out.append({"server": hi["server"], "suite": suite, "concurrency": c,
                        "speedup": hi["throughput"] / lo["throughput"], "against": lo["server"]})
    return out


def noise_margin(floor: list[dict]) -> float:
    """The run-to-run variation a verdict must clear: the largest deviation among the floor's cells."""
    return max((abs(f["speedup"] - 1) for f in floor), default=0.0)


def load_generator_lines(cells: list[dict]) -> list[str]:
    """How the latencies were measured, and every cell whose measurement needs a caveat."""
    if not cells:
        return []
    clocks = {x for c in cells for x in (c.get("arrival_clock") or "unrecorded").split(",")}
    how = {"kernel": "by the kernel as they reached the socket (SO_TIMESTAMPNS), so the client's own parsing "
                     "and read order do not enter TTFT, ITL or end-to-end latency",
           "read": "by the client's clock when it read each socket (no kernel receive timestamps here)",
           "unrecorded": "by a client that did not record its clock (cells from an older specmatch)"}
    lags = [c["p99_client_read_lag_ms"] for c in cells if c.get("p99_client_read_lag_ms") is not None]
    coalesced = sum(c.get("coalesced_token_events") or 0 for c in cells)
    lines = ["", "## Load generator", "",
             "Token arrivals were stamped " + "; and ".join(how[k] for k in sorted(clocks)) + "."
             + (f" The client read each response within {max(lags):.1f} ms of its arrival (worst cell's p99)"
                if lags else "")
             + f"; {coalesced} token event(s) reached it in one read with their stream's previous token."]
    for c in cells:
        lines += [f"- warning, {c['server']} / {c['suite']} / c={c['concurrency']}: {w}" for w in c.get("warnings") or []]
    return lines


def markdown(df, sp, cross, recs, acc, matches, baseline, hold=None, floor=None, cells=None) -> str:
    lines = ["# specmatch: does speculation pay off here?", ""]
    floor = noise_floor(sp, None, baseline) if floor is None else floor
    if not cross:
        lines.append(f"Only the baseline `{baseline}` was measured: nothing to compare.")
    for x in cross:
        best = max(x["speedups"].items(), key=lambda kv: kv[1])
        detail = []
        if x["confident_pays"]:
            detail.append("clearly pays at c=" + ",".join(map(str, x["confident_pays"])))
        if x["confident_loses"]:
            detail.append("clearly loses at c=" + ",".join(map(str, x["confident_loses"])))
        if x["inconclusive"]:
            detail.append("within noise at c=" + ",".join(map(str, x["inconclusive"])))
        lines.append(f"- **{x['server']}** on `{x['suite']}`: {x['crossover']}; best {best[1]:.2f}x at c={best[0]}"
                     + (f" ({'; '.join(detail)})" if detail else "") + ".")
    if floor:
        dev = noise_margin(floor)
        off = [f for f in floor if f["against"] == baseline]
        same = [f for f in floor if f["against"] != baseline]
        parts = []
        if off:
            parts.append("where a server ran the baseline's work (a schedule switched speculation off, so it drafted "
                         "nothing, or its configuration is the baseline's) its 'speedup' was " + ", ".join(
                             f"{f['speedup']:.2f}x ({f['server']}, {f['suite']}, c={f['concurrency']})" for f in off))
        if same:
            parts.append("servers whose configurations are identical at that concurrency measured " + ", ".join(
                f"{f['speedup']:.2f}x apart ({f['server']} vs {f['against']}, {f['suite']}, c={f['concurrency']})"
                for f in same))
        lines += ["", f"**Noise floor:** {len(floor)} cell(s) measured the same computation twice: "
                      + "; ".join(parts)
                      + f". Differences within about ±{dev:.0%} are run-to-run variation, which the intervals "
                        "(request-to-request variation within a cell) do not include; a cell is called 'pays' or "
                        "'loses' only when its interval also clears this margin."]
    if recs:
        lines += ["", "## Recommendation (training-mix suites)", ""]
        lines += [f"- **{r['server']}** (`{r['suite']}`): {r['recommendation']} — {r['evidence']}." for r in recs]
    suites = sorted(df["suite"].unique().to_list())
    if len(suites) > 1 and not sp.is_empty():
        lines += ["", "## Distribution effect: same server, different prompts", "",
                  "| server | concurrency | " + " | ".join(f"speedup on {s}" for s in suites) + " |",
                  "|---|---|" + "---|" * len(suites)]
        for (server, c), g in sp.group_by(["server", "concurrency"], maintain_order=True):
            vals = {r["suite"]: r["speedup_throughput"] for r in g.iter_rows(named=True)}
            lines.append(f"| {server} | {c} | " + " | ".join(_fmt(vals.get(s)) + "x" if s in vals else "—"
                                                              for s in suites) + " |")
    if matches:
        lines += ["", "## Prompt suites", "", "| suite | prompts | source TVD vs training | prompt-length KS | verdict |",
                  "|---|---|---|---|---|"]
        for m in matches:
            lines.append(f"| {m['suite']} | {m['prompts']} | {_fmt(m.get('source_tvd_vs_training_mix'), '.3f')} | "
                         f"{_fmt(m.get('prompt_length_ks'), '.3f')} | {m['verdict']} |")
    if not sp.is_empty():
        lines += ["", f"## Speedup over `{baseline}` (interval: bootstrap)", "",
                  "| server | suite | c | tok/s | baseline tok/s | throughput speedup | TPOT speedup | e2e speedup | acceptance | verdict |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in sp.sort(["suite", "server", "concurrency"]).iter_rows(named=True):
            lines.append(
                f"| {r['server']} | {r['suite']} | {r['concurrency']} | {_fmt(r['throughput'], '.1f')} | "
                f"{_fmt(r['baseline_throughput'], '.1f')} | {_fmt(r['speedup_throughput'])}x "
                f"[{_fmt(r['speedup_throughput_lo'])}, {_fmt(r['speedup_throughput_hi'])}] | "
                f"{_fmt(r['speedup_tpot'])}x [{_fmt(r['speedup_tpot_lo'])}, {_fmt(r['speedup_tpot_hi'])}] | "
                f"{_fmt(r['speedup_e2el'])}x | {_acc(r['acceptance_rate'], r.get('num_drafts'), '.3f')} | {r['verdict']} |")
    lines += ["", "## All cells", "",
              "| server | suite | c | ok | failed | tok/s | req/s | TTFT p50 ms | TPOT p50 ms | ITL p99 ms | e2e p50 ms | acceptance rate | acceptance length | held-out share |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in df.iter_rows(named=True):
        lines.append(f"| {r['server']} | {r['suite']} | {r['concurrency']} | {r['completed']} | {r['failed']} | "
                     f"{_fmt(r['output_throughput'], '.1f')} | {_fmt(r['request_throughput'], '.2f')} | "
                     f"{_fmt(r['median_ttft_ms'], '.0f')} | {_fmt(r['median_tpot_ms'], '.1f')} | "
                     f"{_fmt(r['p99_itl_ms'], '.1f')} | {_fmt(r['median_e2el_ms'], '.0f')} | "
                     f"{_acc(r['spec_decode_acceptance_rate'], r.get('spec_decode_num_drafts'), '.3f')} | "
                     f"{_acc(r['spec_decode_acceptance_length'], r.get('spec_decode_num_drafts'), '.2f')} | "
                     f"{_fmt(r['holdout_share'], '.0%')} |")
    if not acc.is_empty():
        lines += ["", "## Acceptance by training source", "", "| server | suite | source | requests | acceptance rate | acceptance length |",
                  "|---|---|---|---|---|---|"]
        for r in acc.iter_rows(named=True):
            lines.append(f"| {r['server']} | {r['suite']} | {r['source']} | {r['requests']} | "
                         f"{_fmt(r['acceptance_rate'], '.3f')} | {_fmt(r['acceptance_length'], '.2f')} |")
    if hold is not None and not hold.is_empty():
        lines += ["", "## Held-out vs seen training prompts", "",
                  "Acceptance on rows the drafter was trained on overstates what unseen traffic gets.", "",
                  "| server | suite | held out | requests | acceptance rate | acceptance length |",
                  "|---|---|---|---|---|---|"]
        for r in hold.iter_rows(named=True):
            lines.append(f"| {r['server']} | {r['suite']} | {'yes' if r['source'] == 'True' else 'no'} | "
                         f"{r['requests']} | {_fmt(r['acceptance_rate'], '.3f')} | {_fmt(r['acceptance_length'], '.2f')} |")
    lines += load_generator_lines(cells or [])
    lines += ["", "Plots: `plots/throughput.png`, `plots/speedup.png`, `plots/latency_throughput.png`, "
                  "`plots/acceptance_by_source.png`. Every file has a `.prov.json` beside it: "
                  "`specmatch provenance results/summary/summary.md`."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specmatch.summary", description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True)
    p.add_argument("--settings", default="{}")
    p.add_argument("--cells", nargs="+", type=Path, required=True)
    p.add_argument("--matches", nargs="*", type=Path, default=[])
    p.add_argument("--out-dir", type=Path, required=True)
    a = p.parse_args(argv)
    settings = {"bootstrap": 1000, "confidence": 0.9, **json.loads(a.settings)}
    rec = Recorder("summary", a.cells + a.matches, {"baseline": a.baseline, "summary": settings})
    try:
        df, reqs = load_cells(a.cells)
        if a.baseline not in df["server"].to_list():
            raise SpecmatchError(f"baseline: no cells of server '{a.baseline}'")
        sp = speedups(df, reqs, a.baseline, settings["bootstrap"], settings["confidence"])
        launches = {}
        for s in df["server"].unique().to_list():
            lp = Path("results/servers") / s / "launch.json"
            if lp.exists():
                launches[s] = read_json(lp)
        floor = noise_floor(sp, launches, a.baseline)
        sp = apply_noise_margin(sp, noise_margin(floor))
        cross = crossover(sp)
        matches = [read_json(m) for m in a.matches]
        training = {m["suite"] for m in matches if m.get("representative") is not None and "candidates" in m
                    and m.get("prompt_length_ks") is not None}
        recs = recommendation(cross, launches, training)
        acc = acceptance_by_source(a.cells)
        hold = acceptance_by_source(a.cells, "acceptance_by_holdout")
        if not hold.is_empty():  # only suites that mix held-out and seen rows say anything here
            mixed = hold.group_by(["server", "suite"]).agg(pl.col("source").n_unique().alias("k")).filter(pl.col("k") > 1)
            hold = hold.join(mixed.select("server", "suite"), on=["server", "suite"])
    except SpecmatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out = a.out_dir
    with atomic_path(out / "cells.csv") as tmp:
        df.write_csv(tmp)
    with atomic_path(out / "cells.parquet", ".parquet") as tmp:
        df.write_parquet(tmp)
    with atomic_path(out / "speedups.csv") as tmp:
        (sp if not sp.is_empty() else pl.DataFrame({"server": []})).write_csv(tmp)
    made = plots(df, sp, acc, cross, out / "plots")
    write_text(out / "verdict.json", json.dumps({"crossover": cross, "recommendations": recs}, indent=2) + "\n")
    md = markdown(df, sp, cross, recs, acc, matches, a.baseline, hold, floor, [c for _pq, c in reqs.values()])
    write_text(out / "summary.md", md)
    rec.write([out / "summary.md", out / "cells.csv", out / "cells.parquet", out / "speedups.csv",
               out / "verdict.json", *made])
    print(md.split("\n## ")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
