"""One benchmark cell: one server, one suite, one concurrency.

Attaches to the server through the manager (holding the serving slot for the whole cell), resets
the prefix cache so the previous cell's prompts do not warm this one, reads the engine's
server-wide counters before and after (so acceptance is scoped to exactly this cell), runs the
load, and writes `c{C}.json` (vLLM `bench serve` key names where they exist) plus every request in
`c{C}.requests.parquet`. The same prompts go in the same seeded order to every server.

A cell whose failure rate exceeds `requests.max_failure_fraction` fails its job; its partial
records are kept as `c{C}.failed.json` / `c{C}.failed.requests.parquet`, names that never look
complete to Snakemake.

    python -m specmatch.cell --name SERVER --server JSON --suite S --prompts P.jsonl --concurrency C
                             --requests JSON --launch launch.json --out cC.json --requests-out cC.requests.parquet
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import polars as pl
import requests as http

from . import metrics
from .client import Request, build_payload, run, run_load
from .config import requests_per_cell
from .engines import get_engine
from .io import SpecmatchError, atomic_path, read_json, read_jsonl, write_json
from .provenance import Recorder
from .server import LeaseKeeper, Manager


def order_prompts(prompts: list[dict], n: int, seed: int) -> list[dict]:
    """A seeded order of n prompts (cycling through the suite when n is larger); server-independent."""
    if not prompts:
        raise SpecmatchError("the prompt suite is empty")
    out, rng = [], random.Random(seed)
    while len(out) < n:
        perm = list(range(len(prompts)))
        rng.shuffle(perm)
        out.extend(prompts[i] for i in perm)
    return out[:n]


def scrape(base_url: str, engine) -> dict:
    try:
        r = http.get(base_url + "/metrics", timeout=30)
        return engine.counters(r.text) if r.status_code == 200 else {}
    except http.RequestException:
        return {}


def reset_cache(base_url: str, engine) -> str:
    if not engine.reset_path:
        return "not supported by this engine"
    try:
        r = http.post(base_url + engine.reset_path, timeout=60)
        return "ok" if r.status_code == 200 else f"HTTP {r.status_code}"
    except http.RequestException as exc:
        return f"failed: {exc}"


def run_cell(name: str, cfg: dict, suite: str, prompts: list[dict], concurrency: int, req_cfg: dict,
             max_concurrency: int, manager: Manager, log_path: Path | None = None) -> tuple[dict, list[dict]]:
    engine = get_engine(cfg)
    protocol = engine.protocol(req_cfg["endpoint"])
    n = max(req_cfg["min_per_cell"], req_cfg["per_worker"] * concurrency)
    ordered = order_prompts(prompts, n + req_cfg["warmup"], req_cfg["seed"])
    model = engine.served_model()

    def mk(i, p):
        return Request(i, p["id"], p["source"], bool(p.get("holdout")),
                       build_payload(protocol, p, model, req_cfg, engine.request_extras()))

    warm = [mk(-1 - i, p) for i, p in enumerate(ordered[n:])]
    reqs = [mk(i, p) for i, p in enumerate(ordered[:n])]
    api_key = engine.api_key() if hasattr(engine, "api_key") else None
    with manager.slot():
        att = manager.attach(name, cfg, max_concurrency, log_path)
        with LeaseKeeper(manager):
            reset = reset_cache(att.base_url, engine)
            if warm:
                run(run_load(att.base_url, warm, min(concurrency, len(warm)), protocol,
                                     engine.parse_request_acceptance, req_cfg["timeout_s"], api_key))
            before = scrape(att.base_url, engine)
            t0 = time.time()
            records = run(run_load(att.base_url, reqs, concurrency, protocol, engine.parse_request_acceptance,
                                           req_cfg["timeout_s"], api_key, request_rate=req_cfg.get("request_rate"),
                                           burstiness=req_cfg.get("burstiness", 1.0), seed=req_cfg["seed"]))
            after = scrape(att.base_url, engine)
    result = {"server": name, "suite": suite, "concurrency": concurrency, "max_concurrency": concurrency,
              "engine": cfg["engine"], "protocol": protocol, "num_prompts": n, "warmup_requests": len(warm),
              "request_rate": req_cfg.get("request_rate") or "inf", "burstiness": req_cfg.get("burstiness", 1.0),
              "started_at": t0, "server_reused": att.reused, "server_config_hash": att.config_hash,
              "cache_reset": reset, "holdout_share": sum(r["holdout"] for r in records) / len(records) if records else None}
    result.update(metrics.summarize(records))
    result["warnings"] = metrics.measurement_warnings(result)
    per_req = [{"num_spec_steps": r["num_spec_steps"], "num_accepted_tokens": r["num_accepted_tokens"],
                "num_draft_tokens": r["num_draft_tokens"], "completion_tokens": r["output_tokens"]}
               for r in records if r["ok"]]
    acc = engine.cell_acceptance(before, after, per_req)
    if acc.get("acceptance_source") is None and any(r.get("num_spec_steps") for r in per_req):
        from .engines.sglang import acceptance_from_meta

        acc = acceptance_from_meta(per_req)
        acc["acceptance_source"] = "per-request metrics"
    result.update(acc)
    result["acceptance_by_source"] = metrics.acceptance_by_source(records)
    result["acceptance_by_holdout"] = {
        str(h): v for h, v in metrics.acceptance_by_source([{**r, "source": str(r["holdout"])} for r in records]).items()}
    return result, records


def write_requests(path: Path, records: list[dict]) -> None:
    df = pl.DataFrame(records, schema_overrides={"arrivals_s": pl.List(pl.Float64)}, infer_schema_length=None)
    with atomic_path(path, ".parquet") as tmp:
        df.write_parquet(tmp)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specmatch.cell", description=__doc__.split("\n\n")[0])
    p.add_argument("--name", required=True)
    p.add_argument("--server", required=True, help="the server's config as JSON")
    p.add_argument("--suite", required=True)
    p.add_argument("--prompts", required=True, type=Path)
    p.add_argument("--concurrency", required=True, type=int)
    p.add_argument("--max-concurrency", required=True, type=int)
    p.add_argument("--requests", required=True, help="the requests config as JSON")
    p.add_argument("--launch", type=Path, help="the server's launch record")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--requests-out", required=True, type=Path)
    p.add_argument("--log", type=Path)
    p.add_argument("--state-dir", type=Path)
    a = p.parse_args(argv)
    cfg, req_cfg = json.loads(a.server), json.loads(a.requests)
    mgr = Manager(a.state_dir)
    rec = Recorder("cell", [a.prompts, a.launch], {"server": cfg, "suite": a.suite, "concurrency": a.concurrency,
                                                   "requests": req_cfg})
    try:
        prompts = read_jsonl(a.prompts)
        result, records = run_cell(a.name, cfg, a.suite, prompts, a.concurrency, req_cfg, a.max_concurrency, mgr,
                                   a.log)
    except SpecmatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    launch = read_json(a.launch) if a.launch and a.launch.exists() else None
    if launch and launch.get("config_hash") and launch["config_hash"] != result["server_config_hash"]:
        print(f"warning: the running server's config hash {result['server_config_hash']} differs from its launch "
              f"record's {launch['config_hash']}", file=sys.stderr)
    total = result["completed"] + result["failed"]
    frac = result["failed"] / total if total else 1.0
    server_info = {"server": {"name": a.name, "argv": launch.get("argv") if launch else [],
                              "config_hash": result["server_config_hash"]}}
    if frac > req_cfg["max_failure_fraction"]:
        bad_json = a.out.with_name(a.out.name.replace(".json", ".failed.json"))
        bad_pq = a.requests_out.with_name(a.requests_out.name.replace(".requests.parquet", ".failed.requests.parquet"))
        write_json(bad_json, result)
        write_requests(bad_pq, records)
        first = next((r["error"] for r in records if not r["ok"]), "")
        print(f"error: cell {a.name}/{a.suite}/c{a.concurrency}: {result['failed']} of {total} requests failed "
              f"({frac:.1%} > requests.max_failure_fraction {req_cfg['max_failure_fraction']:.1%}); first: {first}. "
              f"Partial records: {bad_json}, {bad_pq}", file=sys.stderr)
        return 2
    for w in result["warnings"]:
        print(f"warning: cell {a.name}/{a.suite}/c{a.concurrency}: {w}", file=sys.stderr)
    write_requests(a.requests_out, records)
    write_json(a.out, result)
    rec.write([a.out, a.requests_out], server_info)
    acc = result.get("spec_decode_acceptance_rate")
    print(f"cell {a.name}/{a.suite}/c{a.concurrency}: {result['completed']} ok, {result['failed']} failed, "
          f"{result['output_throughput'] or 0:.1f} tok/s, median TTFT {result['median_ttft_ms'] or 0:.0f} ms"
          + (f", acceptance {acc:.3f}" if acc is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
