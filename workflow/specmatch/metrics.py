"""Turn per-request records into the numbers a cell reports, and read Prometheus text.

Key names follow vLLM's `bench serve` result files where the same quantity exists
(`output_throughput`, `mean_ttft_ms`, `p99_itl_ms`, ...), so existing tools can read cells.
Output tokens always come from the server's `usage` (or SGLang's meta_info), never from counting
stream events: with EAGLE-3 one event can carry several tokens.
"""
from __future__ import annotations

import re

import numpy as np

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[tuple[str, tuple], float]:
    """{(metric name, sorted label tuple): value} for every sample line."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels = tuple(sorted(_LABEL.findall(m.group(3) or "")))
        try:
            out[(m.group(1), labels)] = float(m.group(4))
        except ValueError:
            continue
    return out


def _dist(prefix: str, values, unit: str = "ms") -> dict:
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {f"{k}_{prefix}_{unit}": None for k in ("mean", "median", "std", "p90", "p99")}
    return {f"mean_{prefix}_{unit}": float(a.mean()), f"median_{prefix}_{unit}": float(np.median(a)),
            f"std_{prefix}_{unit}": float(a.std()), f"p90_{prefix}_{unit}": float(np.percentile(a, 90)),
            f"p99_{prefix}_{unit}": float(np.percentile(a, 99))}


def request_tpot_ms(rec: dict) -> float | None:
    """Time per output token after the first, from usage counts (not from event counts)."""
    n = rec.get("output_tokens") or 0
    if not rec.get("ok") or n < 2 or rec.get("ttft_s") is None:
        return None
    return (rec["e2e_s"] - rec["ttft_s"]) / (n - 1) * 1000.0


def summarize(records: list[dict]) -> dict:
    """Cell-level figures from measured (non-warm-up) request records."""
    ok = [r for r in records if r["ok"]]
    failed = [r for r in records if not r["ok"]]
    if records:
        t0 = min(r["start_s"] for r in records)
        t1 = max(r["start_s"] + (r["e2e_s"] or 0.0) for r in records)
        duration = t1 - t0
    else:
        duration = 0.0
    out_tokens = sum(r["output_tokens"] or 0 for r in ok)
    in_tokens = sum(r["prompt_tokens"] or 0 for r in ok)
    reasons: dict[str, int] = {}
    for r in failed:
        key = (r.get("error") or "unknown").split(":")[0]
        reasons[key] = reasons.get(key, 0) + 1
    itls = []
    for r in ok:
        arr = r.get("arrivals_s") or []
        itls.extend((b - a) * 1000.0 for a, b in zip(arr, arr[1:]))
    out = {
        "completed": len(ok), "failed": len(failed), "failure_reasons": reasons,
        "duration": duration,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration if duration > 0 else None,
        "output_throughput": out_tokens / duration if duration > 0 else None,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration > 0 else None,
    }
    out.update(_dist("ttft", [r["ttft_s"] * 1000 for r in ok if r["ttft_s"] is not None]))
    out.update(_dist("tpot", [t for t in map(request_tpot_ms, ok) if t is not None]))
    out.update(_dist("itl", itls))
    out.update(_dist("e2el", [r["e2e_s"] * 1000 for r in ok]))
    return out


def acceptance_by_source(records: list[dict]) -> dict[str, dict]:
    """Per-prompt-source acceptance from per-request figures (what lets the summary name weak sources)."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        if r["ok"] and r.get("num_spec_steps"):
            groups.setdefault(r["source"], []).append(r)
    out = {}
    for src, rows in sorted(groups.items()):
        steps = sum(r["num_spec_steps"] for r in rows)
        acc = sum(r.get("num_accepted_tokens") or 0 for r in rows)
        drafted = sum(r.get("num_draft_tokens") or 0 for r in rows)
        out[src] = {"requests": len(rows), "acceptance_rate": acc / drafted if drafted else None,
                    "acceptance_length": 1 + acc / steps if steps else None,
                    "num_accepted_tokens": acc, "num_draft_tokens": drafted, "num_spec_steps": steps}
    return out
