"""How the latencies were measured (the client's clock, how late it read), and every cell whose
measurement needs a caveat (the cells' own warnings, one line per distinct warning)."""
from __future__ import annotations


def load_generator_lines(cells: list) -> list[str]:
    """How the latencies were measured, and every cell whose measurement needs a caveat."""
    if not cells:
        return []
    clocks = {x for c in cells for x in (c.arrival_clock or "unrecorded").split(",")}
    how = {"kernel": "by the kernel as they reached the socket (SO_TIMESTAMPNS), so the client's own parsing "
                     "and read order do not enter TTFT, ITL or end-to-end latency",
           "read": "by the client's clock when it read each socket (no kernel receive timestamps here)",
           "unrecorded": "by a client that did not record its clock (cells from an older specmatch)"}
    lags = [c.p99_client_read_lag_ms for c in cells if c.p99_client_read_lag_ms is not None]
    coalesced = sum(c.coalesced_token_events or 0 for c in cells)
    lines = ["", "## Load generator", "",
             "Token arrivals were stamped " + "; and ".join(how[k] for k in sorted(clocks)) + "."
             + (f" The client read each response within {max(lags):.1f} ms of its arrival (worst cell's p99)"
                if lags else "")
             + f"; {coalesced} token event(s) reached it in one read with their stream's previous token."]
    by_text: dict[str, list[str]] = {}  # one line per distinct warning, naming every cell that gave it
    for c in cells:
        for w in c.warnings or []:
            by_text.setdefault(w, []).append(f"{c.server} / {c.suite} / r{c.repeat} / c={c.concurrency}")
    for w, where in by_text.items():
        lines.append(f"- warning, {where[0]}: {w}" if len(where) == 1 else
                     f"- warning, {len(where)} cells ({'; '.join(where)}): {w}")
    return lines
