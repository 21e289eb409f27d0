"""Which verdicts rest on cells measured while the machine was not their own.

A cell is flagged when others used the machine while it measured (records.Interference.flagged,
specmatch.measuring.interference); a flagged cell that could be re-measured in its session was, and
only a measurement still flagged is kept flagged. A verdict compares a server with another (the
baseline unless `against` says) at one suite and concurrency, over every repeat of both: it rests
on a flagged cell when any of those cells is flagged. Nothing here changes a verdict: a neighbour
slows whichever server it lands on, so it can make or hide a difference, and which one cannot be
read from the cell; the verdict says it rests on such cells, and the reader (or
`requests.on_interference: fail`) decides what that is worth.
"""
from __future__ import annotations

from ...records import CellResult, Decision, FlaggedClaim, Verdict

CellKey = tuple   # (server, suite, concurrency, repeat)
VerdictKey = tuple  # (server, suite, concurrency, metric, against): `against` "" for the baseline


def verdict_key(v: Verdict) -> VerdictKey:
    return (v.server, v.suite, v.concurrency, v.metric, v.against or "")


def cells_of(v: Verdict, cells: dict[CellKey, CellResult], baseline: str) -> list[CellKey]:
    """The cells a verdict compares: every repeat of its server and of the server it is compared with at
    its suite and concurrency."""
    other = v.against or baseline
    return sorted(k for k in cells if k[0] in (v.server, other) and k[1:3] == (v.suite, v.concurrency))


def flagged_basis(verdicts: list[Verdict], cells: dict[CellKey, CellResult], baseline: str
                  ) -> dict[VerdictKey, list[CellKey]]:
    """Verdict key -> the flagged cells it rests on, for every verdict that rests on any."""
    out = {}
    for v in verdicts:
        bad = [k for k in cells_of(v, cells, baseline) if cells[k].flagged]
        if bad:
            out[verdict_key(v)] = bad
    return out


def claims_on_flagged(verdicts: list[Verdict], cells: dict[CellKey, CellResult], baseline: str
                      ) -> list[tuple[Verdict, list[CellKey]]]:
    """The claimed differences (pays or loses) that rest on flagged cells, with those cells, in verdict order."""
    basis = flagged_basis(verdicts, cells, baseline)
    return [(v, basis[verdict_key(v)]) for v in verdicts
            if v.verdict in (Decision.PAYS, Decision.LOSES) and verdict_key(v) in basis]


def flagged_claims(verdicts: list[Verdict], cells: dict[CellKey, CellResult], baseline: str) -> list[FlaggedClaim]:
    """claims_on_flagged as the records the decide step writes (analysis.json), which the report renders."""
    return [FlaggedClaim(v.server, v.suite, v.concurrency, v.metric, v.against or "", [list(k) for k in keys])
            for v, keys in claims_on_flagged(verdicts, cells, baseline)]
