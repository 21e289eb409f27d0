"""The summary's "Machine quietness": what else used the machine while the cells measured, which cells
were flagged and re-measured, and which claimed differences rest on flagged cells.

Renders the cells' records.Interference readings and deciding.explaining.interference's basis; decides nothing.
`quietness()` is the typed account, `section()` its markdown, `verdict_note()` the note a verdict line
carries when a claimed difference rests on flagged cells.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ..records import CellResult, FlaggedClaim, Verdict

CellKey = tuple   # (server, suite, concurrency, repeat)


def cell_label(key) -> str:
    server, suite, c, r = key
    return f"{server} / {suite} / r{r} / c={c}"


def _claims(claims: list[FlaggedClaim], verdicts: list[Verdict]) -> list[tuple[Verdict, list[CellKey]]]:
    """The decide step's flagged claims with their verdicts, in verdict order."""
    by = {(f.server, f.suite, f.concurrency, f.metric, f.against): [tuple(k) for k in f.cells] for f in claims}
    return [(v, by[key]) for v in verdicts
            if (key := (v.server, v.suite, v.concurrency, v.metric, v.against or "")) in by]


@dataclass
class Quietness:
    """The run's machine quietness, over its cells."""
    cells: int
    sampled: int                                  # cells with a reading (older cells have none)
    threshold_cores: float | None
    median_foreign_cores: float | None
    worst: tuple | None                           # (cell key, foreign cores) of the busiest kept measurement
    flagged: list = field(default_factory=list)   # cell keys whose kept measurement is flagged
    remeasured: list = field(default_factory=list)  # cell keys with an earlier, flagged measurement
    remeasured_clean: int = 0                     # of those, kept measurements that are not flagged
    gpu_read: int = 0                             # cells whose GPU was read (nvidia-smi)
    sampler_core_share: float | None = None       # the sampler's own cost, worst cell
    claims: list = field(default_factory=list)    # (Verdict, [cell keys]): pays/loses resting on flagged cells


def quietness(cells: dict[CellKey, CellResult], verdicts: list[Verdict], claims: list[FlaggedClaim]) -> Quietness:
    read = {k: c.interference for k, c in cells.items() if c.interference is not None and c.interference.available}
    foreign = {k: i.foreign_cpu_cores for k, i in read.items()}
    worst = max(foreign.items(), key=lambda kv: kv[1]) if foreign else None
    remeasured = sorted(k for k, c in cells.items() if c.earlier)
    return Quietness(
        cells=len(cells), sampled=len(read),
        threshold_cores=max((i.threshold_cores for i in read.values()), default=None),
        median_foreign_cores=statistics.median(foreign.values()) if foreign else None, worst=worst,
        flagged=sorted(k for k, c in cells.items() if c.flagged), remeasured=remeasured,
        remeasured_clean=sum(not cells[k].flagged for k in remeasured),
        gpu_read=sum(bool(i.gpu and i.gpu.available) for i in read.values()),
        sampler_core_share=max((i.sampler_core_share for i in read.values()), default=None),
        claims=_claims(claims, verdicts))


def _cores(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def section(cells: dict[CellKey, CellResult], verdicts: list[Verdict], claims: list[FlaggedClaim]) -> list[str]:
    """The "Machine quietness" section (an empty list where no cell carries a reading)."""
    q = quietness(cells, verdicts, claims)
    if not q.sampled:
        return []
    lines = ["", "## Machine quietness", "",
             "While each cell measured (never its warm-up), a sampler read what else used the machine: CPU of "
             "processes outside the server's process group, the load generator and the workflow running it "
             "(Snakemake), steal, and busy time no process accounts for, from /proc"
             + (", and other compute processes and clock slowdowns on the GPU (nvidia-smi)" if q.gpu_read else "")
             + f". A cell is flagged when that foreign CPU exceeds {_cores(q.threshold_cores)} cores "
             "(`requests.interference_threshold`): a neighbour at the lowest priority still stretches every engine "
             "step. " + f"Over {q.sampled} cells" + (f" ({q.cells - q.sampled} from before readings were recorded)"
                                                     if q.sampled < q.cells else "")
             + f": median {_cores(q.median_foreign_cores)} foreign cores, the busiest "
             + (f"{_cores(q.worst[1])} ({cell_label(q.worst[0])})" if q.worst else "—")
             + f"; {len(q.flagged)} kept measurement(s) flagged; {len(q.remeasured)} cell(s) re-measured in their "
             f"session, {q.remeasured_clean} of them clean the second time. The sampler itself used at most "
             f"{(q.sampler_core_share or 0):.2%} of a core (counted as the load generator's, never as a neighbour's)."]
    for k in q.flagged:
        i = cells[k].interference
        lines.append(f"- flagged: {cell_label(k)}: " + "; ".join(i.why))
    for k in q.remeasured:
        c = cells[k]
        for e in c.earlier:
            was = e.interference
            lines.append(f"- re-measured: {cell_label(k)}: first {e.output_throughput or 0:.1f} tok/s with "
                         f"{_cores(was.foreign_cpu_cores if was else None)} foreign cores"
                         + (f" ({', '.join(f'{o.comm} {o.cpu_cores:.2f}' for o in was.top[:2])})" if was and was.top
                            else "")
                         + f", kept {c.output_throughput or 0:.1f} tok/s with "
                         f"{_cores(c.interference.foreign_cpu_cores if c.interference else None)}"
                         + (" (still flagged)" if c.flagged else ""))
    if q.claims:
        lines += ["", "Claimed differences that rest on flagged cells (a neighbour slows whichever server it lands "
                      "on, so it can make a difference or hide one; re-run them on a quiet machine before acting):"]
        for v, keys in q.claims:
            lines.append(f"- **{v.server}** on `{v.suite}` at c={v.concurrency} ({v.metric}): {v.verdict.value} "
                         f"{v.speedup:.2f}x [{v.lo:.2f}, {v.hi:.2f}] rests on " + ", ".join(cell_label(k) for k in keys))
    elif q.flagged:
        lines += ["", "No claimed difference (pays or loses) rests on a flagged cell."]
    return lines


def verdict_note(claims: list[FlaggedClaim], server: str, suite: str, metric: str = "output_throughput") -> str:
    """For a server's verdict line on one suite: the concurrencies whose claimed difference rests on flagged
    cells ("" where none does)."""
    cs = [f.concurrency for f in claims if (f.server, f.suite, f.metric) == (server, suite, metric)]
    if not cs:
        return ""
    return (f" — **measured while the machine was busy** at c={','.join(map(str, sorted(cs)))} (flagged cells; see "
            "\"Machine quietness\")")
