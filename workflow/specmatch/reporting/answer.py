"""The summary's first screen: what to deploy and why, the verdict per traffic profile and load, and
whether the machine was quiet. A reader who stops after it has the answer; everything below it in
summary.md is the evidence, for reference.

It renders records only (records.Recommendation, KRecommendation, TrafficRow, Verdict and the cells'
quietness readings); the same lines open `report.html`.
"""
from __future__ import annotations

from ..config import TRAINING_MIX
from ..metrics import LABEL
from ..deciding.recommending.deployment import RECOMMENDED
from ..records import Decision, Outcome, Verdict
from ..controls import OFF, is_control
from . import interference
from .decided import Decided
from .formats import concurrencies, number
from .traffic import WORD   # one word per verdict, as "Your traffic" says it
from .verdicts import not_drafting

OUTCOME = {Outcome.VERIFIED: "verified on the grid", Outcome.FAILED: "its verification failed",
           Outcome.UNDECIDED: "its verification is undecided", Outcome.NOT_VERIFIABLE: "not verifiable"}


def _cell(verdict: Decision, value, lo, hi) -> str:
    word = WORD[verdict]
    word = f"**{word}**" if verdict in (Decision.PAYS, Decision.LOSES) else word
    return f"{word} {number(value)}x [{number(lo)}, {number(hi)}]" if value is not None else word


def speculative_servers(d: Decided) -> list[str]:
    """The configured speculative servers: not the baseline, its derived `__recommended` or `__off` servers."""
    return [s for s in d.servers if s != d.baseline and not s.endswith(RECOMMENDED) and not is_control(s)]


def deploy_lines(d: Decided) -> list[str]:
    """One line per recommendation (and per k sweep), servers in config order: what to do, in the
    engine's terms, with its evidence and whether the deployment was verified; the section
    "Recommendation" has the detail."""
    order = {x: i for i, x in enumerate(d.servers)}
    out = []
    for r in sorted(d.recommendations, key=lambda r: order.get(r.server, len(order))):
        status = ""
        if r.verified is not None:
            status = f"; {OUTCOME.get(r.verified.outcome, 'not verified yet')}"
            if r.verified.outcome == Outcome.VERIFIED and r.verified.server:
                status += f" (`{r.verified.server}`)"
        elif r.as_configured or r.action == "off":
            status = "; the deployment is one already measured"
        schedule = f"; {r.deploy.flag}" if r.deploy and r.deploy.flag else ""
        cause = not_drafting(d, r.server, r.suite)["configured"]
        cause = (f" At c={concurrencies(cause)} its configured-off control `{r.server}{OFF}` pays as much: the gain "
                 "comes with the configuration, not from drafting." if cause else "")
        out.append(f"- **{r.server}** (`{r.suite}`): {r.text}{schedule}{status}. Evidence: {r.evidence}.{cause}")
    for k in d.k_recommendations:
        status = f"; {OUTCOME.get(k.verified.outcome, 'not verified yet')}" if k.verified is not None else ""
        flag = f"; {k.deploy.flag}" if k.deploy and k.deploy.flag else ""
        out.append(f"- **{k.parent}**, which k (`{k.suite}`): {k.text}{flag}{status}. Evidence: the best k at each "
                   "measured concurrency (\"Which k at which load\").")
    return out


Row = tuple[str, str, dict[int, str]]   # (what: a profile or a suite, server, {concurrency: verdict text})


def _traffic_rows(d: Decided, metric: str) -> list[Row]:
    """Per traffic profile and configured speculative server: the declared mixes first, the training
    mix last (the derived `__recommended` servers are the recommendation's check, not an answer)."""
    servers = speculative_servers(d)
    mine = [r for r in d.decisions.traffic if r.metric == metric and r.server in servers]
    profiles = list(dict.fromkeys(r.profile for r in mine))
    profiles = [p for p in profiles if p != TRAINING_MIX] + [p for p in profiles if p == TRAINING_MIX]
    out = []
    for p in profiles:
        for x in [x for x in servers if any((r.profile, r.server) == (p, x) for r in mine)]:
            cells = {}
            for r in (r for r in mine if (r.profile, r.server) == (p, x)):
                if r.predicted is None:
                    cells[r.concurrency] = "not predicted"
                    continue
                cells[r.concurrency] = _cell(r.verdict, r.predicted.value, r.predicted.lo, r.predicted.hi)
                if r.check is not None:
                    cells[r.concurrency] += (f"; measured {number(r.measured.value)}x, "
                                             + ("agrees" if r.check.agree else "**disagrees**"))
            what = "the training mix (predicted)" if p == TRAINING_MIX else f"your mix `{p}` (predicted)"
            out.append((what, x, cells))
    return out


def _suite_rows(d: Decided, metric: str) -> list[Row]:
    """Per measured suite and configured speculative server, from the verdicts."""
    out = []
    for u in d.suites:
        for x in speculative_servers(d):
            vs: list[Verdict] = [v for v in d.verdicts if (v.server, v.suite, v.metric) == (x, u, metric)]
            if vs:
                out.append((f"suite `{u}` (measured)", x, {v.concurrency: _cell(v.verdict, v.speedup, v.lo, v.hi)
                                                            for v in vs}))
    return out


def verdict_table(d: Decided) -> list[str]:
    """Traffic (profiles predicted, suites measured) by load: the verdict and its interval in each cell.
    One row per profile or suite; with several speculative servers, a column per server and load, so
    the table's length does not grow with the servers (the first screen stays one screen)."""
    metric = d.settings.recommend_metric
    rows = _traffic_rows(d, metric) + _suite_rows(d, metric)
    if not rows:
        return []
    servers = list(dict.fromkeys(x for _, x, _ in rows))
    cs = sorted({c for _, _, cells in rows for c in cells})
    cols = [(x, c) for x in servers for c in cs]
    head = [f"c={c}" for _, c in cols] if len(servers) == 1 else [f"`{x}` c={c}" for x, c in cols]
    table: dict[str, dict] = {}
    for what, x, cells in rows:
        table.setdefault(what, {}).update({(x, c): v for c, v in cells.items()})
    out = ["| traffic | " + " | ".join(head) + " |", "|---|" + "---|" * len(cols)]
    for what, cells in table.items():
        out.append(f"| {what} | " + " | ".join(cells.get(k, "—") for k in cols) + " |")
    return out


def quietness_line(d: Decided) -> str:
    """Whether the machine was quiet while the cells measured, in one line."""
    q = interference.quietness(d.measured_cells, d.verdicts, d.decisions.analysis.flagged_claims)
    if not q.sampled:
        return ("- **Machine:** not sampled (the cells carry no quietness reading): a busy machine would go "
                "unnoticed.")
    base = (f"over {q.sampled} cells, median {number(q.median_foreign_cores)} cores used by others "
            f"(threshold {number(q.threshold_cores)})")
    if not q.flagged:
        again = f", {len(q.remeasured)} cell(s) re-measured clean" if q.remeasured else ""
        return f"- **Machine:** quiet: no kept measurement flagged{again}; {base}."
    rests = (f"; {len(q.claims)} claimed difference(s) rest on them: re-run those on a quiet machine before acting"
             if q.claims else "; no claimed difference rests on them")
    mapped = sorted({k[2] for k in q.flagged if k in d.map_cells})
    if mapped:
        rests += (f"; the step-cost map's own cells at c={','.join(map(str, mapped))} among them: what the map fits or "
                  "checks there was measured on a busy machine")
    return (f"- **Machine:** **busy** during {len(q.flagged)} kept measurement(s){rests}; {base} (see "
            "\"Machine quietness\").")


def lines(d: Decided) -> list[str]:
    """The answer, first: what to deploy, the verdicts per traffic and load, the machine."""
    s = d.settings
    out = ["## The answer", ""]
    deploy = deploy_lines(d)
    if deploy:
        out += ["**What to deploy**", ""] + deploy + [""]
    elif not speculative_servers(d):
        out += [f"Only the baseline `{d.baseline}` was measured: nothing to compare.", ""]
    table = verdict_table(d)
    if table:
        label = LABEL.get(s.recommend_metric, s.recommend_metric)
        servers = speculative_servers(d)
        whose = f"`{servers[0]}`" if len(servers) == 1 else "each server"
        out += [f"**Speedup of {whose} over `{d.baseline}` by traffic and load** ({label}; {s.confidence:.0%} "
                f"intervals; ±{s.min_effect:.0%} counts as no difference)", ""] + table + [""]
    out += [quietness_line(d), "",
            "Everything below is the evidence: the recommendation in full, the verdicts and the noise they were "
            "decided against, your traffic, why it pays, and the tables."]
    return out
