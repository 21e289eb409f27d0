"""The KV cache each server admits, as its engine said at start-up (records.KvPool in the launch
records): a drafter's own cache comes out of the same memory, so a speculative server's pool beside the
baseline's is what the drafter takes from the requests that can run at once."""
from __future__ import annotations

from .decided import Decided
from .formats import number


def lines(d: Decided) -> list[str]:
    facts = [f for f in d.decisions.analysis.server_facts if f.kv_pool is not None]
    if not facts:
        return []
    longest = _longest_suite(d)
    base = next((f.kv_pool for f in facts if f.server == d.baseline and f.kv_pool.known), None)
    cols = ["server", "KV pool (tokens)", "requests at the engine's context length"]
    if longest:
        cols.append(f"requests of `{longest[0]}`'s mean length ({number(longest[1], '.0f')} tokens)")
    if base:
        cols.append("beside the baseline's pool")
    out = ["## The KV cache each server admits", "",
           "From each engine's own start-up log (vLLM's `KV cache size` line, SGLang's `max_total_num_tokens`). "
           "A drafter's cache comes out of the same memory: the concurrency a pool admits caps the load a server "
           "can serve.", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for f in facts:
        p = f.kv_pool
        if not p.known:
            row = [f.server, f"unknown: {p.reason}"] + [""] * (len(cols) - 2)
        else:
            row = [f.server, f"{p.tokens:,}",
                   f"{number(p.max_concurrency)} × {p.per_request_tokens:,}" if p.max_concurrency is not None else "—"]
            if longest:
                row.append(number(p.admits(longest[1]), ".1f"))
            if base:
                row.append("—" if f.server == d.baseline else
                           f"{(p.tokens - base.tokens) / base.tokens:+.1%} ({p.tokens - base.tokens:+,} tokens)")
        out.append("| " + " | ".join(row) + " |")
    capped = [(f.server, f.kv_pool.admits(longest[1]), f.max_batch) for f in facts if longest and f.kv_pool.known
              and f.max_batch and f.kv_pool.admits(longest[1]) < f.max_batch]
    if capped:
        out += ["", f"At `{longest[0]}`'s mean request the pool holds fewer requests than the server's largest batch: "
                + "; ".join(f"`{s}` {a:.0f} of {b}" for s, a, b in capped)
                + ". Above that many requests in flight the engine waits for KV blocks (or preempts), so larger batches "
                "are not reached on that traffic, whatever the recommendation says of them."]
    return out


def _longest_suite(d: Decided) -> tuple[str, float] | None:
    """The suite whose requests (prompt and output tokens) are longest on average, over its cells."""
    sums: dict[str, list[float]] = {}
    for c in d.cells.values():
        if c.completed:
            s = sums.setdefault(c.suite, [0.0, 0.0])
            s[0] += c.total_input_tokens + c.total_output_tokens
            s[1] += c.completed
    means = {k: v[0] / v[1] for k, v in sums.items() if v[1]}
    return max(means.items(), key=lambda kv: kv[1]) if means else None
