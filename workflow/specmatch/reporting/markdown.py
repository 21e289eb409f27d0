"""summary.md: the answer first (what to deploy, the verdict per traffic and load, the machine), then the
evidence, assembled from the report's sections."""
from __future__ import annotations

from ..records import RoundPlan, SuiteMatch
from . import answer, context, interference, kreport, kvpool, stepcost, traffic
from .decided import Decided
from .design import noise_lines, sequential_lines
from .loadgen import load_generator_lines
from .recommendations import recommendation_lines
from .tables import acceptance_tables, across_suites_table, cells_table, speedup_table, suites_table
from .verdicts import headline, verdict_lines
from .why import off_lines, why_lines


def split_suites(matches: list[SuiteMatch]) -> tuple[list[str], list[str]]:
    """The training suites (sampled from the training mix, compared with it) and the control suites."""
    training = [m.suite for m in matches if m.training]
    return training, [m.suite for m in matches if m.suite not in training and m.kind not in ("session", "traffic")]


def markdown(d: Decided, matches: list[SuiteMatch], plans: list[RoundPlan] | None = None,
             files: list[str] | None = None) -> str:
    """summary.md: the answer on the first screen (answer.lines), then the evidence. `files`: every file
    the summary folder holds for the reader (plots, records, tables), listed at the end."""
    s = d.settings
    training, control = split_suites(matches)
    reps = max((v.repeats for v in d.verdicts), default=1)
    design = s.design
    reps_text = (f"{design.min}–{design.max} repeats, sequential" if design.sequential
                 else f"{reps} repeat{'s' if reps != 1 else ''}")
    lines = ["# specmatch: does speculation pay off here?", ""] + answer.lines(d)
    if d.recommendations:
        lines += ["", "## Recommendation", ""] + recommendation_lines(d, d.recommendations)
    seen = {m.suite for m in matches if m.kind == "training" and m.holdout_share == 0}
    ksweep = kreport.lines(d, seen)
    if ksweep:
        lines += [""] + ksweep
    head = headline(d, training, control)
    if head:
        lines += ["", "## The distribution effect", ""] + head
    lines += ["", f"## Verdicts (throughput; {s.confidence:.0%} confidence, ±{s.min_effect:.0%} counts as no "
                  f"difference, {reps_text})", ""]
    lines += verdict_lines(d) or [f"Only the baseline `{d.baseline}` was measured: nothing to compare."]
    lines += ["", "pays / loses: the interval lies above / below 1 (and not within the ±min_effect band); equivalent: "
                  "the whole interval lies within it, a decisive 'no difference'; inconclusive: neither (the table "
                  "says what would decide it).", ""]
    lines += noise_lines(d)
    if design.sequential:
        lines += [""] + sequential_lines(d, plans or [])
    if d.decisions.traffic:
        lines += [""] + traffic.lines(d.decisions.traffic, d.settings.recommend_metric)
    why = why_lines(d)
    if why:
        lines += [""] + why
    step = stepcost.lines(d.stepcost, busy_map_cells(d))
    if step:
        lines += [""] + step
    kv = kvpool.lines(d)
    if kv:
        lines += [""] + kv
    extra = context.lines(d)   # context length, natural stopping, sessions
    if extra:
        lines += [""] + extra
    lines += ["", "## Speculation configured but off", ""] + off_lines(d)
    if d.verdicts:
        lines += [""] + speedup_table(d)
    if len(d.suites) > 1 and d.verdicts:
        lines += [""] + across_suites_table(d)
    if matches:
        lines += [""] + suites_table(matches, training)
    lines += acceptance_tables(d)
    lines += [""] + cells_table(d)
    lines += interference.section(d.measured_cells, d.verdicts, d.decisions.analysis.flagged_claims)
    lines += load_generator_lines(list(d.cells.values()))
    lines += ["", "Definitions (every cell's `definitions` field): TTFT is the first stream chunk carrying choices, "
                  "end-to-end latency the last one, TPOT (e2e - TTFT) / (output tokens - 1) with output tokens from the "
                  "server's usage: vLLM bench serve's definitions. Acceptance follows each engine's own definition."]
    lines += files_lines(files or [])
    return "\n".join(lines) + "\n"


def busy_map_cells(d: Decided) -> dict[tuple[str, int], list[str]]:
    """(server, concurrency) -> the flagged cells (busy machine) on the map suite at that concurrency, of
    the map's servers and the baseline, where the map's fit and check read them."""
    out: dict = {}
    suites = {mp.suite for mp in (d.stepcost.maps if d.stepcost else [])}
    for k, c in d.measured_cells.items():
        if c.flagged and k[1] in suites:
            out.setdefault((k[0], k[2]), []).append(f"{k[0]} r{k[3]}")
    return out


def files_lines(files: list[str]) -> list[str]:
    """Every file of the summary folder, grouped: the page, plots, records, tables."""
    if not files:
        return []
    groups = [("Report page", lambda f: f.endswith(".html")), ("Plots", lambda f: f.endswith(".png")),
              ("Decision records (written by the decide step)", lambda f: f.endswith(".json")),
              ("Tables", lambda f: f.endswith((".csv", ".parquet")))]
    out = ["", "## Files", ""]
    for title, wanted in groups:
        mine = [f for f in files if wanted(f)]
        if mine:
            out.append(f"- {title}: " + ", ".join(f"`{f}`" for f in mine))
    out += ["", "Every file has a `.prov.json` beside it (what produced it, from which inputs): "
                "`specmatch provenance results/summary/summary.md`."]
    return out
