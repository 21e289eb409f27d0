"""The order benchmark jobs run in, as Snakemake priorities (higher runs first).

Snakemake picks among ready jobs by priority; a server's launch and its cells of one repeat share one
priority, so they run back to back on one server session (one start per server and repeat). The
order alternates within repeats (config order, then reversed, ...) so drift and machine state hit
every server alike. Kept out of the Snakefile so it is tested: two servers with one priority would
interleave their cells and restart a server for every cell (as one default run did).
"""
from __future__ import annotations

UPSTREAM = 10**6  # models, data, suites, drafter training: everything before the first server starts


def priority(server: str, repeat: int, names: list[str], repeats: int) -> int:
    """The priority of `server`'s launch and cells in `repeat` (1-based), among `names` (the servers
    that run together: the configured ones, or the recommended ones derived after the decision).

    Repeat r outranks repeat r+1 entirely; within a repeat every server has a priority of its own.
    """
    if server not in names:
        raise ValueError(f"server '{server}' is not among {names}")
    if not 1 <= repeat <= repeats:
        raise ValueError(f"repeat {repeat} outside 1..{repeats}")
    order = names if repeat % 2 else names[::-1]
    value = 10 * ((repeats - repeat + 1) * (len(names) + 1) - order.index(server))
    assert 0 < value < UPSTREAM, "more servers x repeats than priorities below UPSTREAM"
    return value
