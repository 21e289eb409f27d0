"""Render the step-cost maps (specmatch.deciding.predicting.stepcost): the summary's "What a speculative
step costs" section (the acceptance a drafter needs at each batch size with every source's beside it,
the predictions by concurrency against the cells, whether the map holds) and plots/break_even.png.
Nothing here decides anything."""
from __future__ import annotations

import math
from pathlib import Path

from ..metrics import LABEL
from ..records import REACH, Decision, StepCostKMap, StepCostMap, StepCosts
from .formats import save_figure

WORD = {Decision.PAYS: "pays", Decision.LOSES: "loses", Decision.EQUIVALENT: "no difference",
        Decision.INCONCLUSIVE: "undecided"}


def _iv(iv, unit: str = "x", digits: int = 2) -> str:
    if iv is None or iv.value is None:
        return "—"
    core = f"{iv.value:.{digits}f}{unit}"
    if iv.lo is None or iv.hi is None:
        return core
    return f"{core} [{iv.lo:.{digits}f}, {iv.hi:.{digits}f}]"


def _steps(mp: StepCostMap) -> str:
    """How the fit and the replay scheduled each server's steps (StepCostMap.steps)."""
    parts = []
    for x, st in mp.steps.items():
        budget = (f"at most {st['budget']} tokens a step ({st['source']}), prompts in chunks after the decodes"
                  if st.get("budget") else f"every prompt prefilled in one step ({st.get('source') or 'budget unknown'})")
        cache = st.get("cache_served")
        cache = (f"; its prefix cache served {cache:.0%} of the fitted cells' prompt tokens" if cache is not None
                 else "; its prefix-cache hits were not reported")
        parts.append(f"`{x}`: {budget}{cache}")
    return (" Steps replayed as the engine schedules them: " + "; ".join(parts) + ".") if parts else ""


def _busy(mp: StepCostMap, busy: dict) -> str:
    """The map's cells measured while the machine was busy (flagged), by concurrency: a check or a fit
    read on a busy machine says so."""
    at = {}
    for (server, c), cells in busy.items():
        if server in (mp.server, mp.baseline) and (c in mp.fit or c in mp.checks):
            at.setdefault(c, []).extend(cells)
    if not at:
        return ""
    return (" **Measured while the machine was busy** (flagged cells, see \"Machine quietness\"): "
            + "; ".join(f"c={c}{' (check)' if c in mp.checks else ''}: {', '.join(sorted(v))}"
                        for c, v in sorted(at.items())) + ".")


def _holds(mp: StepCostMap) -> str:
    checks = [p for p in mp.predictions if p.role == "check" and p.measured is not None]
    off = sorted({f"`{p.suite}` c={p.concurrency} ({p.metric}: measured / predicted {_iv(p.difference, '')})"
                  for p in mp.predictions if p.agrees is False and p.role == "fit"})
    fitted = ("; at the fitted concurrencies outside its own interval at " + ", ".join(off)) if off else ""
    if mp.holds is None:
        return ("**The map is unchecked**: no concurrency was measured only to check it (`step_cost.check`), so "
                "nothing it predicts decides the recommendation" + fitted + ".")
    checked = "; ".join(f"c={p.concurrency} {LABEL.get(p.metric, p.metric)}: measured {p.measured:.2f}x against "
                        f"predicted {p.predicted.value:.2f}x, measured / predicted {_iv(p.difference, '')}"
                        + (" (outside its own interval)" if p.agrees is False else "") for p in checks)
    if mp.holds is False:
        return (f"**The map misses**: the cells disagree with it beyond the family's interval at the concurrency "
                f"measured only to check it or at the measured concurrencies together (Bonferroni; checked at "
                f"{checked}){fitted}. The recommendation follows the measured cells.")
    return (f"**The map holds** at the concurrency measured only to check it ({checked}) and at the measured "
            f"concurrencies together: no difference lies outside its family's interval (Bonferroni over the "
            f"{mp.comparisons} comparisons measured only to check it, and over every measured one): its predictions "
            "within the fitted batches decide the concurrencies the verdict grid lacks, and above them, up to "
            f"{REACH}x the largest fitted batch, where their intervals decide" + fitted + ".")


def _pays(tau, need) -> str:
    """Whether a stratum's tau clears the break-even at a batch size: both intervals apart, or close."""
    if tau.lo is None or need.rho.hi is None:
        return "≥" if tau.value >= need.rho.value else "<"
    if tau.lo > need.rho.hi:
        return "pays"
    if tau.hi < need.rho.lo:
        return "short"
    return "close"


def lines(sc: StepCosts | None, busy: dict | None = None) -> list[str]:
    """The step-cost section; `busy`: (server, concurrency) -> flagged cells on the map suite
    (markdown.busy_map_cells)."""
    if sc is None or not (sc.maps or sc.skipped or sc.kmaps):
        return []
    out = ["## What a speculative step costs, and the acceptance a drafter needs", "",
           "A speculative server's TPOT speedup is τ / ρ: τ tokens per speculative step (the content's and the "
           "drafter's) over ρ, what the step costs in plain decode steps of the baseline at the same batch (the "
           "engine's). The map measures ρ of a decode step at every batch size from each request's own steps and "
           "times (a busy server's prefills beside decoding add to it); a drafter pays at a batch size when its τ "
           "exceeds ρ there (docs/methods/step-cost.md).", ""]
    for mp in sc.maps:
        out += [f"### `{mp.server}` against `{mp.baseline}`", ""]
        sessions = f"{mp.repeats} session{'s' if mp.repeats != 1 else ''}"
        out.append(f"Fitted on the cells at c={', '.join(map(str, mp.fit))} (at least {sessions} each), checked at "
                   f"c={', '.join(map(str, mp.checks)) or 'none'} on `{mp.suite}`; acceptance: {mp.forced}. "
                   + _holds(mp) + _busy(mp, busy or {}) + _steps(mp))
        out.append("")
        strata = sorted(mp.strata, key=lambda s: -s.tau.value)
        head = "| batch | ρ at " + f"{mp.context} tokens (= break-even τ) |" + "".join(
            f" {s.stratum} |" for s in strata)
        out += [head, "|---|---|" + "---|" * len(strata)]
        for p in mp.break_even:
            row = f"| {p.batch}{'*' if p.extrapolated else ''} | {_iv(p.rho, '')} |"
            row += "".join(f" {_pays(s.tau, p)} |" for s in strata)
            out.append(row)
        out += ["", "τ of each stratum (tokens per decode step on this server, interval over its prompts): "
                + "; ".join(f"{s.stratum} {_iv(s.tau, '')} ({s.prompts} prompts)" for s in strata) + ". pays: the "
                "stratum's interval lies above the break-even's; short: below; close: they overlap. * beyond the "
                "fitted batches: the map's form is extrapolated (its interval grows with the fit's uncertainty there)."]
        if mp.tau_slope is not None and mp.tau_slope.lo is not None:
            moves = ("**ρ moves with τ**: a request's step time changes by "
                     f"{mp.tau_slope.value:+.3f} [{mp.tau_slope.lo:+.3f}, {mp.tau_slope.hi:+.3f}] per unit of log τ "
                     "(within its cell): the break-even depends on the content too" if mp.tau_moves else
                     f"ρ does not detectably move with τ (slope of a request's log step time in its log τ within its "
                     f"cell {mp.tau_slope.value:+.3f} [{mp.tau_slope.lo:+.3f}, {mp.tau_slope.hi:+.3f}])")
            out += ["", moves + "."]
        out += ["", f"**Predicted speedup by concurrency** (throughput; TPOT), up to batch {mp.max_batch}:", "",
                "| suite | c | throughput predicted | verdict | TPOT predicted | measured throughput | measured / "
                "predicted |", "|---|---|---|---|---|---|---|"]
        by = {}
        for p in mp.predictions:
            by.setdefault((p.suite, p.concurrency), {})[p.metric] = p
        for (suite, c), got in sorted(by.items()):
            thr, tpot = got.get("output_throughput"), got.get("tpot")
            if thr is None:
                continue
            mark = {"fit": " (fitted)", "check": " (check)", "predicted": ""}[thr.role] + (" *" if thr.extrapolated
                                                                                         else "")
            meas = f"{thr.measured:.2f}x" if thr.measured is not None else "—"
            diff = _iv(thr.difference, "") + ("" if thr.agrees is None else " ✓" if thr.agrees else " ✗")
            out.append(f"| `{suite}` | {c}{mark} | {_iv(thr.predicted)} | {WORD[thr.decision]} | "
                       f"{_iv(tpot.predicted) if tpot else '—'} | {meas} | {diff if thr.difference else '—'} |")
        out += ["", "Intervals: the prompt sample, the map's error at that batch and the acceptance's run to run; "
                "measured / predicted: the cells' run to run and the map's error (the prompts are the same). "
                "(fitted): the map was fitted on these cells; (check): measured only to check the map."]
        out += _profile_lines(mp)
        out.append("")
    for km in sc.kmaps:
        out += _k_lines(km)
    for x, why in sc.skipped.items():
        out += [f"`{x}`: no step-cost map: {why}.", ""]
    return out


def _k_lines(km: StepCostKMap) -> list[str]:
    """One k sweep's map in k: rho by k and batch, the checks, the schedule and every k's speedup."""
    out = [f"### Which k at which load, from the map: `{km.parent}`", ""]
    off = sorted({f"k={c.k} at batch {c.batch} (own / line {_iv(c.difference, '')})"
                  for c in km.rho_checks if c.agrees is False})
    linear = {True: "each inner mapped k's own ρ lies on the line through its neighbours at every fitted batch "
                    "(Bonferroni over the batches)",
              False: "**ρ is not linear in k**: off the line at " + "; ".join(off) + " (read the k not mapped as the "
                     "model's, not as evidence)",
              None: "linear in k is unchecked (a third mapped k would check it)"}[km.linear]
    bad = [p for p in km.checks if p.agrees is False]
    held = {True: "every held-out member agrees with its cells (Bonferroni over "
                  f"{len(km.checks)} comparisons)",
            False: "**a held-out member disagrees with its cells**: " + "; ".join(
                f"k={p.k} `{p.suite}` c={p.concurrency} {LABEL.get(p.metric, p.metric)} measured / predicted "
                f"{_iv(p.difference, '')}" for p in bad),
            None: "no member could be held out"}[km.holds]
    cells = (f" This schedule needs {km.cells['map']} cells (the baseline's and the largest k's on every suite, the "
             f"other mapped k's on the map suite at the fitted concurrencies); the sweep measured {km.cells['sweep']} "
             f"({km.cells['members']} members on every suite)." if km.cells else "")
    if km.misses:
        cells += (" **The map of " + ", ".join(f"`{km.members.get(str(k), k)}`" for k in km.misses) + " misses at its "
                  "check**: what the map in k draws from it (the k beside it, its schedule) is the model's, not evidence.")
    out.append(f"Mapped at k = {', '.join(map(str, km.mapped))} (`{km.suite}`); ρ at any other k is linear in k between "
               f"the nearest mapped k (a step drafts k tokens and verifies k + 1): {linear}. τ at each k from the "
               f"per-position acceptance of `{km.tau_from or '—'}`; held out of the prediction (ρ from the other "
               f"mapped k, τ from those rates), {held}.{cells}" + (f" {km.note}." if km.note else ""))
    bs = sorted({p.batch for p in km.rho})
    ks = sorted({p.k for p in km.rho})
    by = {(p.k, p.batch): p for p in km.rho}
    out += ["", f"ρ by k and batch at {km.context} tokens of context (i: interpolated in k between "
            "the nearest mapped k, *: beyond the fitted batches):", "",
            "| k |" + "".join(f" b={b} |" for b in bs), "|---|" + "---|" * len(bs)]
    for k in ks:
        row = []
        for b in bs:
            p = by.get((k, b))
            mark = " i" if p and p.how == "interpolated" else ""
            row.append(f"{_iv(p.rho, '')}{mark}{'*' if p and p.extrapolated else ''}" if p else "—")
        out.append(f"| {k} |" + "".join(f" {x} |" for x in row))
    for u in dict.fromkeys(p.suite for p in km.predictions):
        preds = [p for p in km.predictions if p.suite == u]
        metric = next((b.metric for b in km.schedule if b.suite == u), "output_throughput")
        bands = [b for b in km.schedule if b.suite == u]
        say = "; ".join(f"batch {b.lo}-{b.hi}{'*' if b.extrapolated else ''}: "
                        + ("undecided" if b.k is None else "off" if b.k == 0 else f"k={b.k}")
                        + (f" (best point k={b.best})" if b.best is not None and b.best != b.k else "") for b in bands)
        cs = sorted({p.concurrency for p in preds})
        pk = {(p.k, p.concurrency): p for p in preds if p.metric == metric}
        out += ["", f"**`{u}`: the k schedule from the map** ({LABEL.get(metric, metric)}; predicted, not deployed: "
                f"where some k pays at the level that allows for the k compared, the one with the largest point "
                f"among them, untested against the others): {say}.", "",
                "| k |" + "".join(f" c={c} |" for c in cs), "|---|" + "---|" * len(cs)]
        for k in sorted({p.k for p in preds}):
            row = [f"{_iv(pk[(k, c)].predicted)} {WORD[pk[(k, c)].decision]}" if (k, c) in pk else "—" for c in cs]
            out.append(f"| {k} |" + "".join(f" {x} |" for x in row))
    if km.checks:
        out += ["", "Held-out members against their cells (ρ from the other mapped k, τ from the largest k's "
                "per-position acceptance): " + "; ".join(
                    f"k={p.k} `{p.suite}` c={p.concurrency} {LABEL.get(p.metric, p.metric)} predicted "
                    f"{_iv(p.predicted)}, measured {p.measured:.2f}x, measured / predicted {_iv(p.difference, '')}"
                    + (" ✗" if p.agrees is False else "") for p in km.checks) + "."]
    out.append("")
    return out


def _profile_lines(mp: StepCostMap) -> list[str]:
    """Every traffic profile on the map's grid: one row per profile, a column per concurrency."""
    if not (mp.profiles or mp.profiles_skipped):
        return []
    out = []
    if mp.profiles:
        cs = sorted({p.concurrency for p in mp.profiles})
        by = {(p.suite, p.concurrency, p.metric): p for p in mp.profiles}
        names = list(dict.fromkeys(p.suite for p in mp.profiles))
        beyond = {p.concurrency for p in mp.profiles if p.extrapolated}
        out += ["", f"**Your traffic at every load, from the map** (throughput, predicted; {WORD_OF_HOLDS[mp.holds]}):",
                "", "| profile |" + "".join(f" c={c}{'*' if c in beyond else ''} |" for c in cs),
                "|---|" + "---|" * len(cs)]
        for name in names:
            cells = []
            for c in cs:
                p = by.get((name, c, "output_throughput"))
                if p is None:
                    cells.append("—")
                    continue
                meas = f"; measured {p.measured:.2f}x" if p.measured is not None else ""
                cells.append(f"{_iv(p.predicted)} {WORD[p.decision]}{meas}")
            out.append(f"| `{name}` |" + "".join(f" {x} |" for x in cells))
        out += ["", "Each profile's suite is drawn stratum by stratum in its shares from the strata's measured prompts "
                "(the basis suite's sources and the file suites, never a verifying suite's) and replayed through the "
                "map at each load; intervals: the strata's prompt sample, the map's error and the acceptance's run to "
                "run. measured: the profile's verifying suite where it was measured (its check against the "
                "prediction of the cells' own step model is in \"Your traffic\"). * outside the fitted batches."]
    for name, why in mp.profiles_skipped.items():
        out += ["", f"`{name}`: not predicted from the map: {why}."]
    return out


WORD_OF_HOLDS = {True: "the map holds at its check", False: "the map misses: read these as the model's, not as "
                 "evidence", None: "the map is unchecked: read these as the model's, not as evidence"}


def plot(sc: StepCosts | None, out: Path) -> list[Path]:
    """plots/break_even.png: per speculative server, the break-even τ (ρ at the map suite's median context)
    against batch size with its band, every stratum's τ as a horizontal line."""
    if sc is None or not sc.maps:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sc.maps), figsize=(6 * len(sc.maps), 4.2), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, mp in zip(axes[0], sc.maps):
        pts = [p for p in mp.break_even if p.rho.value is not None]
        xs = [p.batch for p in pts]
        ax.plot(xs, [p.rho.value for p in pts], color="black", marker="o", label="break-even τ (= ρ)")
        lo = [p.rho.lo if p.rho.lo is not None else p.rho.value for p in pts]
        hi = [min(p.rho.hi, 50) if p.rho.hi is not None else p.rho.value for p in pts]
        ax.fill_between(xs, lo, hi, color="grey", alpha=0.25)
        top = max(mp.fit)
        ax.axvspan(top, max(xs + [top]), color="orange", alpha=0.08, label="extrapolated")
        for i, s in enumerate(sorted(mp.strata, key=lambda s: -s.tau.value)):
            ax.axhline(s.tau.value, color=colours[i % len(colours)], lw=1.2, ls="--", label=f"{s.stratum} τ")
        ax.set_xscale("log", base=2)
        vals = [p.rho.value for p in pts] + [s.tau.value for s in mp.strata]
        ax.set_ylim(0.8, max(vals) * 1.3 if vals and all(math.isfinite(v) for v in vals) else 4)
        ax.set_xlabel("batch size")
        ax.set_ylabel("tokens per speculative step")
        ax.set_title(f"{mp.server}: speculation pays above the black line")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return [save_figure(fig, out / "break_even.png")]
