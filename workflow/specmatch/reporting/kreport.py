"""Render the k sweeps: which k at which load, as summary.md's "Which k at which load"
section and `plots/k_sweep.png`.

What is rendered was decided elsewhere and written in `k_sweeps.json` (kmodel.KSweeps, by the decide
step: each k's speedup and verdict against the baseline, the best k per concurrency, the bands, the
deployment, the predicted vs measured check, and the verification of `<parent>__recommended`);
nothing here decides anything.
"""
from __future__ import annotations

import math

from ..deciding.recommending.kmodel import KPoint, KRecommendation
from ..metrics import LABEL
from .decided import Decided
from .formats import UNKNOWN, number, of
from .recommendations import deploy_lines, verification_text


def _ks(rec: KRecommendation) -> list[int]:
    return sorted({int(k) for ch in rec.choices for k in ch.speedups if int(k) > 0})


def _choice_cell(ch) -> str:
    if ch.k is not None:
        among = f" of k={', '.join(map(str, ch.candidates))}" if ch.candidates else ""
        return f"**k={ch.k}**" + ("" if ch.how == "best" else f" ({ch.how}{among})")
    if ch.candidates:
        return f"undecided (k={', '.join(map(str, ch.candidates))})"
    return "—"


def table(rec: KRecommendation) -> list[str]:
    """k x concurrency: each k's speedup over the baseline with its verdict, and the choice per column."""
    cs = [ch.concurrency for ch in rec.choices]
    lines = ["| k | " + " | ".join(f"c={c}" for c in cs) + " |", "|---|" + "---|" * len(cs),
             "| off (the baseline) | " + " | ".join("1.00" for _ in cs) + " |"]
    for k in _ks(rec):
        row = []
        for ch in rec.choices:
            x = ch.speedups.get(str(k))
            row.append(UNKNOWN if not x or x.get("speedup") is None else
                       f"{number(x['speedup'])}x [{number(x['lo'])}, {number(x['hi'])}] {x['verdict']}")
        lines.append(f"| {k} | " + " | ".join(row) + " |")
    lines.append("| **best k** | " + " | ".join(_choice_cell(ch) for ch in rec.choices) + " |")
    return lines


def band_text(rec: KRecommendation) -> str:
    parts = []
    for b in rec.bands:
        span = f"{b.lo}" if b.lo == b.hi else f"{b.lo}–{b.hi}"
        how = {"crossover": "from the crossing of the two k's speedup curves",
               "geometric mean": "at the geometric mean of the two concurrencies (the curves do not cross)"
               }.get(b.boundary)
        pinned = ", ".join(f"c={c}" for c in b.pinned_at)
        own = ("no k shown to pay there, so off" if b.k == 0 else f"k={b.k} pays there") if pinned else ""
        above = b.extrapolated == "above" and rec.undecided_top is not None
        parts.append(f"batch {span}: **{'off' if b.k == 0 else f'k={b.k}'}**"
                     + (f" (starts {how})" if how and b.lo > 1 else "")
                     + (f" (at {pinned}: undecided, run by its own data: {own})" if pinned else "")
                     + (f" (above the measured concurrencies, whose largest, c={rec.undecided_top}, is undecided: "
                        "off, not extrapolated)" if above else
                        f" (extrapolated {b.extrapolated} the measured concurrencies)" if b.extrapolated else ""))
    return "; ".join(parts)


def points_table(points: list[KPoint]) -> list[str]:
    """Predicted against measured TPOT speedup per k and concurrency (the model is checked, not trusted).
    A k the model cannot predict and nobody measured (below the smallest measured k: the step cost is
    never extrapolated) gets one sentence, not a row of dashes."""
    blank = sorted({p.k for p in points} - {p.k for p in points if p.predicted is not None or p.measured is not None})
    points = [p for p in points if p.k not in blank]
    if not points:
        return []
    lines = ["| k | c | τ used (tokens/step) | ρ used (plain steps/step) | predicted TPOT speedup | measured | "
             "inside the interval | held out of the prediction |", "|---|---|---|---|---|---|---|---|"]
    for p in sorted(points, key=lambda p: (p.concurrency, p.k)):
        rho_from = p.step_cost_from or "—"
        if p.interpolated_between:
            rho_from = f"interpolated between k={p.interpolated_between[0]} and k={p.interpolated_between[1]}"
        within = {True: "yes", False: "**no**", None: "no check"}[p.within]
        lines.append(f"| {p.k} | {p.concurrency} | {of(p.tokens_per_step)} ({p.tau_from or '—'}) | "
                     f"{of(p.step_cost)} ({rho_from}) | {of(p.predicted)} | {of(p.measured)} | {within} | "
                     f"{', '.join(p.held_out) or 'nothing'}" + (f" ({p.note})" if p.note else "") + " |")
    if blank:
        ks = ", ".join(f"k={k}" for k in blank)
        lines += ["", f"{ks}: τ is known from the per-position acceptance, but the step cost was neither measured nor "
                      "lies between two measured k, and it is not extrapolated: no prediction (add the value to the "
                      "sweep to have one)."]
    return lines


def lines(d: Decided, seen: set | None = None) -> list[str]:
    """The section: per sweep and suite, the k x c table, the bands, the deployment, its verification
    (recommendations.verification_text) and predicted vs measured. `seen`: suites drawn only from rows
    the drafter trained on (their schedule is flagged: acceptance there overstates unseen traffic's)."""
    if not d.k_recommendations:
        return []
    out = ["## Which k at which load", "",
           f"Each k of a sweep against the baseline on {LABEL.get(d.settings.recommend_metric, 'throughput')} "
           f"({d.settings.confidence:.0%} intervals). The best k at a concurrency is decided only where the data "
           "decide it: better than every other candidate (off included), or equivalent within "
           f"±{d.settings.min_effect:.0%} to the best (then the smaller k); where the best pays against the baseline "
           "(at the Bonferroni level over the k measured) but the data cannot tell it from another k, speculation is "
           "decided and k is not: the best estimate is deployed (\"pays, k open\"; its verification calls a cost only "
           "where one shows against every candidate); otherwise undecided. Speculation is deployed at a concurrency "
           "only where some k beats off there at the Bonferroni level (at most α/2 false \"speculate\" per "
           "concurrency where every k is as fast as off, whatever the number of k). An undecided concurrency runs by "
           "its own data, never a neighbour's k: off (no k was shown to pay there); above an undecided largest "
           "concurrency speculation is off, not extrapolated. Bands switch where the two k's measured speedup "
           "curves cross."]
    for rec in d.k_recommendations:
        flag = (" (in-sample: no prompt is held out of the drafter's training rows, so acceptance here can "
                "overstate what unseen traffic gets; deploy what held-out rows decide)") if rec.suite in (seen or ()) else ""
        out += ["", f"**{rec.parent}** on `{rec.suite}`{flag}:", ""] + table(rec)
        out += ["", f"- Bands: {band_text(rec) or 'none (nothing decided)'}.",
                f"- Recommendation ({rec.action}): {rec.text}."]
        out += [f"- {x}." for x in deploy_lines(rec.deploy)]
        v = rec.verified
        if rec.action in ("keep", "off") and v is not None and v.per_concurrency and all(
                x.against == v.server for x in v.per_concurrency):
            who = f"the baseline `{d.baseline}`" if rec.action == "off" else f"`{v.server}` as configured"
            out.append(f"- **Verified as measured:** the recommended deployment is {who}, so its own cells at "
                       + ", ".join(f"c={x.concurrency}" for x in v.per_concurrency) + " are its measurement "
                       "(no schedule switches k, so there is no switch to check).")
        else:
            if rec.action == "keep" and rec.server:
                out.append(f"- The recommended deployment is one already measured (`{rec.server}`).")
            elif rec.action == "off":
                out.append(f"- The recommended deployment is one already measured (the baseline `{d.baseline}`).")
            if v is not None:
                out.append("-" + verification_text(rec.verified))
        for ch in rec.choices:
            if ch.decide and ch.k is None:
                out.append(f"- Undecided at c={ch.concurrency}: {ch.decide}.")
            elif ch.decide:
                out.append(f"- k undecided at c={ch.concurrency} (speculation pays; k={ch.k}, the best estimate among the k that pay, is "
                           f"deployed): {ch.decide}.")
        pts = [p for p in d.k_points if (p.parent, p.suite) == (rec.parent, rec.suite)]
        if pts:
            out += ["", "Predicted against measured TPOT speedup (τ from the largest k's per-position acceptance, ρ the "
                        "step cost in plain decode steps; a k's own data are held out of its prediction where another "
                        "k can stand in):", ""] + points_table(pts)
    return out


def heatmap(d: Decided, save) -> None:
    """`plots/k_sweep.png`: k x concurrency, coloured by the log speedup over the baseline, each cell
    labelled with its speedup and verdict; the chosen k per concurrency outlined."""
    import matplotlib.pyplot as plt
    import numpy as np

    recs = d.k_recommendations
    if not recs:
        return
    fig, axes = plt.subplots(1, len(recs), figsize=(1.6 + 1.5 * max(len(r.choices) for r in recs) * len(recs), 3.6),
                             squeeze=False)
    for ax, rec in zip(axes[0], recs):
        ks = [0] + _ks(rec)
        cs = [ch.concurrency for ch in rec.choices]
        grid = np.full((len(ks), len(cs)), np.nan)
        for j, ch in enumerate(rec.choices):
            for i, k in enumerate(ks):
                x = ch.speedups.get(str(k))
                if x and x.get("speedup"):
                    grid[i, j] = math.log(x["speedup"])
        # a fixed floor on the scale (1.5x): an inconclusive 0.93x stays pale instead of taking the darkest red
        lim = max(math.log(1.5), float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 0.0)
        ax.imshow(grid, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto", origin="lower")
        for j, ch in enumerate(rec.choices):
            for i, k in enumerate(ks):
                x = ch.speedups.get(str(k))
                if x and x.get("speedup"):
                    ax.text(j, i, f"{x['speedup']:.2f}x" + (f"\n{x['verdict']}" if x.get("verdict") else ""),
                            ha="center", va="center", fontsize=8)
            if ch.k is not None:
                i = ks.index(ch.k)
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", lw=2.5))
        ax.set_xticks(range(len(cs)), [str(c) for c in cs])
        ax.set_yticks(range(len(ks)), ["off" if k == 0 else f"k={k}" for k in ks])
        ax.set_xlabel("concurrency")
        ax.set_title(f"{rec.parent} on {rec.suite}")
    fig.suptitle("k sweep: speedup over the baseline (outlined: the decided best k)")
    fig.tight_layout()
    save(fig, "k_sweep")
