"""The report's figures (`plots/*.png`), one function per figure, every server in one colour throughout.

Each figure draws records the decide step wrote (verdicts, attribution, pooled acceptance) and the
cells; nothing here computes a decision.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..deciding.recommending.deployment import RECOMMENDED
from .formats import save_figure
from ..controls import is_control, is_off, parent
from . import context, kreport, stepcost, traffic
from .decided import Decided

PALETTE = ["#4d4d4d", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
           "#bcbd22"]


def server_styles(servers: list[str]) -> dict[str, dict]:
    """One colour per server in every plot, from the order servers appear (the config's order, the
    baseline first): a control (`x__off`) and a recommended server (`x__recommended`) take their
    parent's colour with a dashed or dotted line, so a reader links them at a glance."""
    parents = list(dict.fromkeys(parent(x) if is_control(x) else x[:-len(RECOMMENDED)] if x.endswith(RECOMMENDED) else x
                                 for x in servers))
    colour = {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(parents)}
    out = {}
    for x in servers:
        if is_control(x):
            out[x] = {"color": colour[parent(x)], "linestyle": "--" if is_off(x) else "-."}
        elif x.endswith(RECOMMENDED):
            out[x] = {"color": colour[x[:-len(RECOMMENDED)]], "linestyle": ":"}
        else:
            out[x] = {"color": colour[x], "linestyle": "-"}
    return out


class Canvas:
    """Where the figures go: the plots folder, each server's style, and the files saved so far."""

    def __init__(self, d: Decided, out: Path):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.plt, self.d, self.out, self.made = plt, d, out, []
        self.style = server_styles([d.baseline] + [x for x in d.servers if x != d.baseline])
        out.mkdir(parents=True, exist_ok=True)

    def save(self, fig, name: str) -> None:
        self.made.append(save_figure(fig, self.out / f"{name}.png"))

    def log_concurrency(self, ax) -> None:
        cs = self.d.concurrencies
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.minorticks_off()

    @staticmethod
    def legend(fig, axes) -> int:
        """Every drawn line in the legend, once, whichever panel drew it."""
        seen = {}
        for ax in axes:
            for h, label in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(label, h)
        if seen:
            fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=min(len(seen), 4), fontsize=8,
                       bbox_to_anchor=(0.5, 0.0))
        return len(seen)

    def panels(self, name, title, draw, panels, xlabel="concurrency", ylabel="", log_c=True, width=5.5) -> None:
        """A figure of one panel per suite, `draw(ax, suite)` filling each."""
        fig, axes = self.plt.subplots(1, len(panels), figsize=(width * len(panels), 4), squeeze=False)
        for ax, panel in zip(axes[0], panels):
            draw(ax, panel)
            if log_c:
                self.log_concurrency(ax)
            ax.set_title(f"suite {panel}")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        n = self.legend(fig, axes[0])
        fig.suptitle(title)
        fig.tight_layout(rect=(0, 0.08 + 0.04 * ((n - 1) // 4), 1, 1))
        self.save(fig, name)


def throughput(cv: Canvas) -> None:
    """Output throughput against concurrency: each repeat a dot, their mean a line."""
    d, style = cv.d, cv.style

    def draw(ax, suite):
        for server in d.servers:
            xs, ys = [], []
            for c in d.concurrencies:
                vals = [d.cells[(server, suite, c, r)].output_throughput for r in d.repeats(server, suite, c)]
                vals = [v for v in vals if v]
                if vals:
                    ax.scatter([c] * len(vals), vals, s=10, alpha=0.5, color=style[server]["color"])
                    xs.append(c)
                    ys.append(float(np.mean(vals)))
            if xs:
                ax.plot(xs, ys, marker="o", label=server, **style[server])

    cv.panels("throughput", "Output throughput vs concurrency (line: mean of repeats; dots: each repeat)", draw,
              d.suites, ylabel="output tokens/s")


def speedup(cv: Canvas) -> None:
    """The throughput speedup over the baseline with its interval, against the equivalence band."""
    d, style = cv.d, cv.style

    def draw(ax, suite):
        for server in d.servers:
            vs = sorted((v for v in d.verdicts if (v.server, v.suite, v.metric) == (server, suite, "output_throughput")
                         and v.speedup is not None), key=lambda v: v.concurrency)
            if not vs:
                continue
            x = [v.concurrency for v in vs]
            ax.plot(x, [v.speedup for v in vs], marker="o", label=server, **style[server])
            ax.fill_between(x, [v.lo for v in vs], [v.hi for v in vs], alpha=0.15, color=style[server]["color"])
        ax.axhline(1.0, color="black", lw=1, label="no difference (1x)")
        band = d.settings.min_effect
        ax.axhspan(1 / (1 + band), 1 + band, color="grey", alpha=0.1, label=f"±{band:.0%} (equivalent)")

    cv.panels("speedup", f"Throughput speedup over the baseline (band: {d.settings.confidence:.0%} interval; grey: "
                         f"±{d.settings.min_effect:.0%})", draw, d.suites, ylabel="speedup vs baseline")


def latency_throughput(cv: Canvas) -> None:
    """Median TPOT against output throughput, one point per concurrency."""
    d, style = cv.d, cv.style

    def draw(ax, suite):
        for server in d.servers:
            xs, ys, cc = [], [], []
            for c in d.concurrencies:
                rows = [d.cells[(server, suite, c, r)] for r in d.repeats(server, suite, c)]
                if rows:
                    xs.append(float(np.mean([x.output_throughput or 0 for x in rows])))
                    ys.append(float(np.mean([x.median_tpot_ms or 0 for x in rows])))
                    cc.append(c)
            if not xs:
                continue
            ax.plot(xs, ys, marker="o", label=server, **style[server])
            for c, x, y in zip(cc, xs, ys):
                ax.annotate(f"c{c}", (x, y), fontsize=7, alpha=0.7)

    cv.panels("latency_throughput", "Latency vs throughput (lower right is better)", draw, d.suites,
              xlabel="output tokens/s", ylabel="median TPOT (ms)", log_c=False)


def acceptance_by_source(cv: Canvas) -> None:
    """Acceptance length by prompt source, per suite (pooled over concurrencies and repeats)."""
    d, style = cv.d, cv.style
    acc = d.decisions.analysis.acceptance_by_source
    if not acc:
        return
    suites = sorted({a.suite for a in acc})
    spec_servers = [s for s in d.servers if any(a.server == s for a in acc)]

    def draw(ax, suite):
        rows = [a for a in acc if a.suite == suite]
        sources = sorted({a.group for a in rows})
        width = 0.8 / max(1, len(spec_servers))
        for k, server in enumerate(spec_servers):
            vals = [next((a.acceptance.acceptance_length or 0 for a in rows if a.server == server and a.group == g),
                         0) for g in sources]
            ax.bar(np.arange(len(sources)) + k * width, vals, width, label=server, color=style[server]["color"],
                   hatch="//" if style[server]["linestyle"] != "-" else None)
        ax.set_xticks(np.arange(len(sources)) + 0.4 - width / 2, sources, rotation=30, ha="right", fontsize=8)

    cv.panels("acceptance_by_source", "Acceptance length by prompt source (tokens per speculative step)", draw,
              suites, xlabel="", ylabel="acceptance length", log_c=False, width=6.5)


def attribution(cv: Canvas) -> None:
    """Why it pays: tau and rho per concurrency (top) and the TPOT speedup tau / rho (bottom), per suite."""
    d, style = cv.d, cv.style
    decomposed = [a for a in d.attribution if a.tokens_per_step is not None and a.step_cost_ratio is not None]
    if not decomposed:
        return
    suites = [u for u in d.suites if any(a.suite == u for a in decomposed)]
    fig, axes = cv.plt.subplots(2, len(suites), figsize=(5.5 * len(suites), 7.5), squeeze=False, sharex=True)
    for j, suite in enumerate(suites):
        top, bottom = axes[0][j], axes[1][j]
        for server in d.servers:
            rows = sorted((a for a in decomposed if (a.server, a.suite) == (server, suite)), key=lambda a: a.concurrency)
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
            cv.log_concurrency(ax)
            ax.grid(alpha=0.3)
    axes[0][0].plot([], [], color="grey", marker="o", linestyle="-", label="top: τ tokens per step (solid)")
    axes[0][0].plot([], [], color="grey", marker="s", linestyle="--", label="top: ρ step cost, in plain steps (dashed)")
    n = cv.legend(fig, [ax for row in axes for ax in row])
    fig.suptitle("Why it pays: tokens per step τ against step cost ρ (speculation stops paying where ρ crosses τ)")
    fig.tight_layout(rect=(0, 0.01 + 0.03 * ((n + 3) // 4), 1, 1))
    cv.save(fig, "attribution")


FIGURES = (throughput, speedup, latency_throughput, acceptance_by_source, attribution)


def plots(d: Decided, out: Path) -> list[Path]:
    """Every figure the records allow, in `out`; returns the files written."""
    cv = Canvas(d, out)
    for figure in FIGURES:
        figure(cv)
    kreport.heatmap(d, cv.save)
    return (cv.made + traffic.plot(d.decisions.traffic, out, d.settings.recommend_metric) + context.plots(d, out)
            + stepcost.plot(d.stepcost, out))
