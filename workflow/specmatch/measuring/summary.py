"""Turn per-request records into the numbers a cell reports.

Key names follow vLLM's `bench serve` result files where the same quantity exists
(`output_throughput`, `mean_ttft_ms`, `p99_itl_ms`, ...), so existing tools can read cells.
Output tokens always come from the server's `usage` (or SGLang's meta_info), never from counting
stream events: with EAGLE-3 one event can carry several tokens.
"""
from __future__ import annotations

import numpy as np

from ..metrics import tpot
from ..records import CellResult, RequestRecord

# A cell whose outputs ran past the model's natural stop (requests.ignore_eos: true) by more than this
# share of their tokens is warned about: acceptance and step costs were measured on text the model
# would not have written (the summary says it per suite too, specmatch.deciding.explaining.stopping).
PAST_STOP_WARNING = 0.10


def _dist(prefix: str, values, unit: str = "ms") -> dict:
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {f"{k}_{prefix}_{unit}": None for k in ("mean", "median", "std", "p90", "p99")}
    return {f"mean_{prefix}_{unit}": float(a.mean()), f"median_{prefix}_{unit}": float(np.median(a)),
            f"std_{prefix}_{unit}": float(a.std()), f"p90_{prefix}_{unit}": float(np.percentile(a, 90)),
            f"p99_{prefix}_{unit}": float(np.percentile(a, 99))}


def request_tpot_ms(rec: RequestRecord) -> float | None:
    """A request's TPOT in ms (metrics.tpot), from usage counts, never from event counts."""
    if not rec.ok or rec.ttft_s is None:
        return None
    t = float(tpot(rec.e2e_s, rec.ttft_s, rec.output_tokens or 0))
    return None if np.isnan(t) else t * 1000.0


def summarize(records: list[RequestRecord]) -> dict:
    """Cell-level figures (CellResult fields, vLLM key names) from measured request records."""
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    if records:
        t0 = min(r.start_s for r in records)
        t1 = max(r.start_s + (r.e2e_s or 0.0) for r in records)
        duration = t1 - t0
    else:
        duration = 0.0
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    reasons: dict[str, int] = {}
    for r in failed:
        key = (r.error or "unknown").split(":")[0]
        reasons[key] = reasons.get(key, 0) + 1
    itls = []
    for r in ok:
        arr = r.arrivals_s
        itls.extend((b - a) * 1000.0 for a, b in zip(arr, arr[1:]))
    out = {
        "completed": len(ok), "failed": len(failed), "failure_reasons": reasons,
        "duration": duration,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration if duration > 0 else None,
        "output_throughput": out_tokens / duration if duration > 0 else None,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration > 0 else None,
    }
    out.update(_dist("ttft", [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]))
    out.update(_dist("tpot", [t for t in map(request_tpot_ms, ok) if t is not None]))
    out.update(_dist("itl", itls))
    out.update(_dist("e2el", [r.e2e_s * 1000 for r in ok]))
    # How token arrivals were stamped ("kernel": the socket's receive timestamp, so the client's own
    # parsing cannot delay them; "read": the client's clock when it read the socket), and how far
    # behind the client's reads ran: the evidence that the load generator kept up.
    out["arrival_clock"] = ",".join(sorted({r.arrival_clock or "read" for r in records})) or None
    lags = [r.read_lag_max_s * 1000 for r in records if r.read_lag_max_s is not None]
    out["p99_client_read_lag_ms"] = float(np.percentile(lags, 99)) if lags else None
    out["max_client_read_lag_ms"] = float(max(lags)) if lags else None
    events = sum(len(r.arrivals_s) for r in ok)
    out["coalesced_token_events"] = sum(r.coalesced_events for r in ok)
    out["coalesced_token_share"] = out["coalesced_token_events"] / events if events else None
    out.update(reuse_and_stopping(ok))
    return out


def reuse_and_stopping(ok: list[RequestRecord]) -> dict:
    """The share of prompt tokens served from the prefix cache (over the requests whose engine reports
    it) and the output tokens generated after the natural stop (over the requests where it was
    measured: client.natural_stop); None where no request reports them."""
    cached = [r for r in ok if r.cached_tokens is not None and r.prompt_tokens]
    measured = [r for r in ok if r.past_stop_tokens is not None and r.output_tokens]
    past = sum(r.past_stop_tokens for r in measured)
    out_measured = sum(r.output_tokens for r in measured)
    return {"prefix_cache_hit_share": (sum(r.cached_tokens for r in cached) / sum(r.prompt_tokens for r in cached)
                                       if cached else None),
            "past_stop_tokens": past if measured else None,
            "past_stop_share": past / out_measured if out_measured else None}


def measurement_warnings(cell: CellResult) -> list[str]:
    """What a reader of this cell's latency figures must know about how they were measured."""
    out = []
    share = cell.coalesced_token_share
    if share is not None and share > 0.01:
        out.append(f"{cell.coalesced_token_events} token events ({share:.1%}) reached the client in one read "
                   f"together with their stream's previous token (worst read lag "
                   f"{cell.max_client_read_lag_ms or 0:.1f} ms): the client or the network fell behind, those "
                   f"inter-token gaps read as 0, and ITL/TPOT percentiles are understated")
    if cell.past_stop_share is not None and cell.past_stop_share > PAST_STOP_WARNING:
        out.append(f"{cell.past_stop_tokens} output tokens ({cell.past_stop_share:.0%}) were generated after the model's "
                   "own end-of-sequence token (requests.ignore_eos: true): acceptance and step costs were partly "
                   "measured on text the model would not have written (ignore_eos: false stops where it stops)")
    if "read" in (cell.arrival_clock or "").split(",") and cell.concurrency > 16:
        out.append("token arrivals were stamped when the client read each socket (this platform gives no kernel "
                   "receive timestamps): with many streams receiving a token in one engine step, the last socket "
                   "read carries the parsing time of the others in its ITL")
    return out


def acceptance_by_group(engine, records: list[RequestRecord], key) -> dict[str, dict]:
    """Acceptance per group of requests (prompt source, held-out or not) by the engine's own definition,
    the same one the cell's figure uses; groups whose requests never speculated are left out."""
    groups: dict[str, list] = {}
    for r in records:
        groups.setdefault(key(r), []).append(r)
    out = {}
    for name, rows in sorted(groups.items()):
        acc = engine.acceptance(rows)
        if acc is not None:
            out[name] = acc.to_json()
    return out
