"""The verdicts in words: the distribution effect first, then one line per server and suite.

Every statement is read off the typed records (records.Verdict, Crossover, Attribution), never off
prose, so a line can never claim "pays" where the verdict table says inconclusive.
"""
from __future__ import annotations

from ..deciding.recommending.deployment import RECOMMENDED
from ..records import Attribution, Decision, Direction
from ..controls import OFF, is_cache_arm, is_control, is_off, parent
from .decided import Decided
from . import interference
from .formats import concurrencies, number


def headline(d: Decided, training: list[str], control: list[str]) -> list[str]:
    """The distribution effect, first: acceptance per suite and what a benchmark on the control
    prompts would have concluded against what the training mix says."""
    lines = []
    for server in [s for s in d.servers if s != d.baseline and not s.endswith(RECOMMENDED) and not is_control(s)]:
        acc = {a.suite: a for a in d.decisions.analysis.acceptance if a.server == server}
        if not acc:
            continue
        parts = [f"{number(a.length)} [{number(a.lo)}, {number(a.hi)}] on `{u}`" for u, a in acc.items()]
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
            on_ct = shape(d, server, ct) + cause_note(d, server, ct)
            on_tr = shape(d, server, tr) + cause_note(d, server, tr)
            text += (f"; a benchmark on `{ct}` prompts would conclude: {on_ct}" +
                     ("" if on_ct == on_tr else f", where `{tr}` says: {on_tr}"))
        lines.append(text + ".")
    return lines


def shape(d: Decided, server: str, suite: str, metric: str = "output_throughput") -> str:
    """The headline for one server and suite: where it pays, is equivalent, loses, is undecided."""
    vs = sorted((v for v in d.verdicts if (v.server, v.suite, v.metric) == (server, suite, metric)),
                key=lambda v: v.concurrency)
    if not vs:
        return "not measured"
    groups: dict = {}
    for v in vs:
        groups.setdefault(v.verdict, []).append(v.concurrency)
    order = [Decision.PAYS, Decision.EQUIVALENT, Decision.LOSES, Decision.INCONCLUSIVE]
    return "; ".join(f"{x.value} at c={concurrencies(groups[x])}" for x in order if x in groups)


def not_drafting(d: Decided, server: str, suite: str) -> dict[str, list[int]]:
    """Concurrencies where the server's throughput verdict is 'pays' but the gain is not the drafter's:
    `cheaper` where its speculative step was decisively cheaper than a plain decode step (rho < 1),
    `configured` where the configured-off control alone pays and drafting on top of it does not."""
    out: dict[str, list[int]] = {"cheaper": [], "configured": []}
    attrs: list[Attribution] = d.attribution
    for a in sorted((a for a in attrs if (a.server, a.suite) == (server, suite)), key=lambda a: a.concurrency):
        v = d.verdict(server, suite, a.concurrency)
        if v is None or v.verdict != Decision.PAYS:
            continue
        if a.explained_by_drafting is False:
            out["cheaper"].append(a.concurrency)
        if (a.configured_off and a.configured_off.verdict == Decision.PAYS and a.drafting_effect
                and a.drafting_effect.verdict != Decision.PAYS):
            out["configured"].append(a.concurrency)
    return out


def cause_note(d: Decided, server: str, suite: str) -> str:
    cs = not_drafting(d, server, suite)
    parts = []
    if cs["cheaper"]:
        parts.append(f"at c={concurrencies(cs['cheaper'])} its speculative steps cost less than a plain decode step "
                     "(of the baseline, or of its configured-off control)")
    if cs["configured"]:
        parts.append(f"at c={concurrencies(cs['configured'])} configured but drafting nothing (`{server}{OFF}`) pays "
                     "as much")
    if not parts:
        return ""
    return " — not the drafter's doing: " + "; ".join(parts) + " (see \"Why it pays\")"


DIRECTION = {Direction.STOPS_PAYING: "stops paying", Direction.STARTS_PAYING: "starts paying"}


def crossover_text(x) -> str:
    """One crossover, as the records.Crossover says it: where, its interval and the bracket of
    measured concurrencies whose verdicts decide it."""
    return (f"it {DIRECTION[x.direction]} at c≈{number(x.point, '.1f')} [{number(x.lo, '.1f')}, "
            f"{number(x.hi, '.1f')}] (between c={x.below} and c={x.above}, whose verdicts decide it)")


def verdict_lines(d: Decided) -> list[str]:
    """One line per server and suite: where it pays, its crossovers, its best speedup, and whether the
    gain is the drafter's doing."""
    lines = []
    for server in d.servers:
        if server == d.baseline:
            continue
        for suite in d.suites:
            if not any((v.server, v.suite) == (server, suite) for v in d.verdicts):
                continue
            text = f"- **{server}** on `{suite}`: {shape(d, server, suite)}"
            if is_off(server):
                text += f" (the configured-off control of `{parent(server)}`: configured, drafting nothing)"
            elif is_cache_arm(server):
                text += f" (the cache arm of `{parent(server)}`: its engine's opt-out of the drafter's prefix-cache loss)"
            for x in d.crossovers(server, suite, "output_throughput"):
                text += "; " + crossover_text(x)
            best = max((v for v in d.verdicts if (v.server, v.suite, v.metric) == (server, suite, "output_throughput")
                        and v.speedup is not None), key=lambda v: v.speedup, default=None)
            if best:
                text += f" (best {best.speedup:.2f}x at c={best.concurrency})"
            lines.append(text + cause_note(d, server, suite)
                         + interference.verdict_note(d.decisions.analysis.flagged_claims, server, suite) + ".")
    return lines
