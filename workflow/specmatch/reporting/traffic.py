"""Render the traffic predictions (specmatch.deciding.predicting.traffic): the summary's "Your traffic" section,
which answers first ("At your mix X: pays / loses / no difference / undecided at c=..."), and the
break-even plot (predicted speedup against a stratum's share, one line per concurrency, measured
suites on it). Nothing here decides anything."""
from __future__ import annotations

import math
from pathlib import Path

from ..config import TRAINING_MIX
from ..metrics import LABEL
from .formats import save_figure
from ..records import Decision, Direction, TrafficRow

WORD = {Decision.PAYS: "pays", Decision.LOSES: "loses", Decision.EQUIVALENT: "no difference",
        Decision.INCONCLUSIVE: "undecided"}


def _x(v) -> str:
    return "—" if v is None or not math.isfinite(v) else f"{v:.2f}x"


def _iv(iv) -> str:
    return f"{_x(iv.value)} [{iv.lo:.2f}, {iv.hi:.2f}]" if iv is not None and iv.value is not None else "—"


def _share(v) -> str:
    return "—" if v is None else f"{v:.0%}"


def mix_text(mix: dict, top: int = 4) -> str:
    items = sorted(mix.items(), key=lambda kv: -kv[1])
    text = ", ".join(f"{k} {v:.0%}" for k, v in items[:top])
    return text + (f", {len(items) - top} more" if len(items) > top else "")


def answer(rows: list[TrafficRow], profile: str, server: str, metric: str) -> str:
    """'pays at c=1 (1.31x [1.21, 1.42]), undecided at c=16 (...)' for one profile and server."""
    mine = sorted((r for r in rows if (r.profile, r.server, r.metric) == (profile, server, metric)),
                  key=lambda r: r.concurrency)
    parts = []
    for r in mine:
        if r.predicted is None:
            parts.append(f"not predicted at c={r.concurrency} ({r.note})")
        else:
            flag = ""
            if r.extrapolated:
                lo, hi = r.context_range
                span = f"{lo:.0f} of the one measured suite" if round(lo) == round(hi) else f"measured {lo:.0f}-{hi:.0f}"
                flag = f"; its context, {r.context:.0f} tokens a sequence, lies outside the {span}: extrapolated"
            parts.append(f"**{WORD[r.verdict]}** at c={r.concurrency} ({_iv(r.predicted)}{flag})")
    return ", ".join(parts)


def break_even_text(b, c: int) -> str | None:
    """The break-even led by its confidence set (the shares whose interval contains 1), the point
    estimate second, and only where a crossing is established (traffic.report: both ends decided, on
    opposite sides of 1)."""
    if b is None:
        return None
    toward = f"requests from `{b.toward}`"
    lo, hi = b.lo, b.hi
    if b.share is None:
        span = (f"between {_share(lo)} and {_share(hi)}" if lo is not None and hi is not None
                else f"from {_share(lo if lo is not None else hi)} on" if (lo is not None or hi is not None) else None)
        return (f"c={c}: {b.note}" + (f" (the interval contains 1 {span} of {toward})" if span else "")
                if b.note else None)
    verb = "stops paying" if b.direction == Direction.STOPS_PAYING else "starts paying"
    if not b.established:
        span = (f"from {_share(min(v for v in (lo, hi) if v is not None))} on"
                if lo is not None or hi is not None else "along the whole line")
        return (f"c={c}: the point estimate crosses 1 at {_share(b.share)} of {toward}, but {b.note} "
                f"(the interval contains 1 {span})")
    if lo is not None and hi is not None:
        where = f"somewhere between {_share(min(lo, hi))} and {_share(max(lo, hi))}"
    elif lo is not None or hi is not None:
        where = f"somewhere beyond {_share(lo if lo is not None else hi)}"
    else:
        where = "somewhere along the line (the interval never decides on one side)"
    return f"c={c}: {verb} {where} of {toward} (point estimate {_share(b.share)})"


def check_text(r: TrafficRow) -> str:
    if r.measured is None:
        return "—"
    if r.check is None:
        return f"{_iv(r.measured)}"
    ck = r.check
    if ck.agree:
        how = f"agrees within ±{ck.bound:.0%}" if ck.bound is not None else "agrees"
        if ck.detectable is not None:
            how += f" (it would catch an error of {ck.detectable:.0%} in 80% of runs)"
    else:
        how = "**misses**: the prediction is off by more than its uncertainty allows"
    if ck.same_prompts:
        how += ("; on the estimation suites' own prompts (verify: same_prompts): a check of how the step model "
                "carries them into the mix's batches, not of whether they stand for their traffic")
    elif not ck.disjoint:
        how += "; the suite may share prompts with the estimation suites (it then agrees too often)"
    return f"{_iv(r.measured)}: measured / predicted {ck.error:+.0%} [{ck.lo:+.0%}, {ck.hi:+.0%}], {how}"


def lines(rows: list[TrafficRow], metric: str) -> list[str]:
    """The summary section (empty without predictions)."""
    if not rows:
        return []
    label = LABEL.get(metric, metric)
    conf = rows[0].confidence
    servers = list(dict.fromkeys(r.server for r in rows))
    profiles = list(dict.fromkeys(r.profile for r in rows))
    declared = [p for p in profiles if p != TRAINING_MIX] + [p for p in profiles if p == TRAINING_MIX]
    out = [f"## Your traffic: predicted from per-source measurements ({label}; {conf:.0%} intervals)", ""]
    for p in declared:
        mix = next(r.mix for r in rows if r.profile == p)
        for x in servers:
            out.append(f"- At {'the training mix' if p == TRAINING_MIX else f'your mix `{p}`'} ({mix_text(mix)}): "
                       f"`{x}` {answer(rows, p, x, metric)}.")
    for x in servers:
        for r in sorted((r for r in rows if (r.server, r.metric) == (x, metric) and r.check is not None),
                        key=lambda r: (r.profile, r.concurrency)):
            out.append(f"- Measured on `{r.suite}` (`{x}`, c={r.concurrency}): {check_text(r)}.")
    fams = {(r.server, r.concurrency): r.check for r in rows
            if r.metric == metric and r.check is not None and r.check.family}
    for (x, c), ck in sorted(fams.items()):
        how = "every check agrees" if ck.family_holds else "**the prediction misses** on at least one"
        out.append(f"- All {len(ck.family)} verified mixes together (`{x}`, c={c}; each at the family's level, "
                   f"Bonferroni): {how}.")
    for x in servers:
        be = [break_even_text(r.break_even, r.concurrency)
              for r in sorted((r for r in rows if (r.profile, r.server, r.metric) == (TRAINING_MIX, x, metric)),
                              key=lambda r: r.concurrency)]
        be = [b for b in be if b]
        if be:
            toward = next(r.break_even.toward for r in rows if r.profile == TRAINING_MIX and r.server == x
                          and r.break_even is not None)
            out.append(f"- Break-even from the training mix toward `{toward}`, `{x}`: " + "; ".join(be) + ".")
        for r in sorted((r for r in rows if (r.profile, r.server, r.metric) == (TRAINING_MIX, x, metric)
                         and r.strata), key=lambda r: r.concurrency):
            carry = sorted(r.strata.items(), key=lambda kv: -(kv[1].value or 0))
            out.append(f"- Which sources carry the gain (`{x}`, c={r.concurrency}, each stratum alone): "
                       + ", ".join(f"{k} {_iv(v)}" for k, v in carry) + ".")
    out += ["", "| profile | server | c | predicted | verdict | TPOT predicted | measured | prompts / run to run / "
                "model (sd) |", "|---|---|---|---|---|---|---|---|"]
    for p in profiles:
        for x in servers:
            for r in sorted((r for r in rows if (r.profile, r.server, r.metric) == (p, x, metric)),
                            key=lambda r: r.concurrency):
                tp = next((t for t in rows if (t.profile, t.server, t.concurrency, t.metric) ==
                           (p, x, r.concurrency, "tpot")), None)
                sd = "—"
                if r.parts:
                    sd = " / ".join("—" if r.parts.get(k) is None else f"{math.sqrt(r.parts[k]):.3f}"
                                    for k in ("prompts", "run_to_run", "model"))
                out.append(f"| {p} | {x} | {r.concurrency} | {_iv(r.predicted)} | {WORD[r.verdict]} | "
                           f"{_iv(tp.predicted) if tp else '—'} | {check_text(r)} | {sd} |"
                           + (f" {r.note}" if r.note and r.predicted is None else ""))
    notes = sorted({r.note for r in rows if r.note and r.predicted is not None})
    out += [""] + [f"- note: {n}" for n in notes]
    out += ["", "A mix is predicted from each stratum's requests as measured (post-stratification): at c=1 exactly "
                "(a request takes the time it took alone); at higher concurrency through a model of each server's "
                "step cost by batch size, context and prefill, fitted to the cells' own timelines, with every "
                "request's own decode steps (acceptance is per sequence) and speed. It assumes a request's "
                "acceptance does not depend on what it is batched with, the step cost depends on the batch and not "
                "on its sources, and the strata's measured prompts stand for their traffic. Intervals: the prompt "
                "sample per stratum, run to run, and the model's own error (`traffic.json`, docs/guides/"
                "your-traffic.md); plot: `plots/traffic.png`."]
    return out


def plot(rows: list[TrafficRow], out: Path, metric: str) -> list[Path]:
    """plots/traffic.png: per speculative server, the predicted speedup along the line from the training
    mix toward the first file suite, one line (and band) per concurrency, measured suites on it."""
    mine = [r for r in rows if r.profile == TRAINING_MIX and r.metric == metric and r.break_even is not None
            and r.break_even.curve]
    if not mine:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = list(dict.fromkeys(r.server for r in mine))
    fig, axes = plt.subplots(1, len(servers), figsize=(5.5 * len(servers), 4), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, x in zip(axes[0], servers):
        rs = sorted((r for r in mine if r.server == x), key=lambda r: r.concurrency)
        toward = rs[0].break_even.toward
        for i, r in enumerate(rs):
            col = colours[i % len(colours)]
            cv = r.break_even.curve
            ax.plot([p[0] for p in cv], [p[1] for p in cv], color=col, marker=".", label=f"c={r.concurrency} predicted")
            ax.fill_between([p[0] for p in cv], [p[2] for p in cv], [p[3] for p in cv], color=col, alpha=0.15)
            for share, v, lo, hi, suite in r.break_even.measured:
                ax.errorbar([share], [v], yerr=[[v - lo], [hi - v]], color=col, marker="s", capsize=3,
                            linestyle="none", label=f"c={r.concurrency} measured")
                ax.annotate(suite, (share, v), fontsize=7, alpha=0.7)
        ax.axhline(1.0, color="black", lw=1)
        ax.set_title(f"{x}: training mix → {toward}")
        ax.set_xlabel(f"share of requests from {toward}")
        ax.set_ylabel(f"{LABEL.get(metric, metric)} speedup vs baseline")
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        keep = dict(zip(labels, handles))
        ax.legend(keep.values(), keep.keys(), fontsize=7)
    fig.suptitle("Your traffic: predicted speedup as the mix moves (band: interval; squares: measured suites)")
    fig.tight_layout()
    return [save_figure(fig, out / "traffic.png")]
