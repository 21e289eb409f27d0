"""One benchmark cell: one server session, one suite, one concurrency, one repeat.

The cell sends every prompt of the suite once per pass (`requests.passes`), in a seeded order that
is the same for every server and every concurrency, so cells differ only by the server and the
load, never by the work. Warm-up requests use prompts of their own (never a measured prompt), then
the prefix cache is reset, so neither warm-up nor the previous cell warms this one. The engine's
server-wide counters are read before and after, so acceptance is scoped to exactly this cell.
Writes `c{C}.json` (a records.CellResult, vLLM `bench serve` key names) and every request in
`c{C}.requests.parquet` (records.RequestRecord).

While the requests run (never the warm-up), a sampler records what else used the machine
(specmatch.measuring.interference: other processes' CPU, steal, the GPU's other tenants) into the cell's
`interference`. A cell whose foreign CPU exceeds `requests.interference_threshold` is flagged; with
`requests.on_interference: remeasure` (the default) it is measured once more in the same session (the
cache reset again first) and the re-measurement is kept, flagged if it still is, the first measurement's
reading and figures in `earlier`; `flag` keeps the one measurement, flagged; `fail` fails the cell.

A cell sends every prompt once per pass; `requests.min_requests_per_worker` raises a cell's passes at
high concurrency until every worker sends at least that many requests (passes_for), so a c=16 cell of
a 16-prompt suite is a steady state rather than one burst.

A cell whose failure rate exceeds `requests.max_failure_fraction` fails its job; its partial
records are kept as `c{C}.failed.json` / `c{C}.failed.requests.parquet`, names that never look
complete to Snakemake. If the server died meanwhile, the error says so, with its exit status and
the tail of its log.

    python -m specmatch cell --name SERVER --server JSON --suite S --prompts P.jsonl --concurrency C
                             --repeat R --requests JSON --launch launch.json --out cC.json
                             --requests-out cC.requests.parquet [--server-log LOG]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import requests as http

from . import summary as figures
from .. import steps
from .client import DEFINITIONS, Request, run, run_load
from .interference import Owners, Sampler, listener_pids
from ..config import keeps_busy, passes_for
from ..serving.engines import get_engine
from ..files import SpecmatchError, atomic_path, read_json, read_jsonl, write_json
from ..provenance import Recorder
from .protocols import protocol as protocol_of
from ..records import (CellResult, EarlierMeasurement, Interference, LaunchRecord, Prompt, RequestRecord,
                       RequestSettings, Session, frame)
from ..serving.server import Attached, LeaseKeeper, Manager, session_of
from .sessions import check_sessions, describe_outcome, session_passes, read_suite, run_sessions, served_context

WARMUP_TEXT = ("Warm-up request {i} (not measured): count from one to twenty in words, separated by commas, "
               "then say which of those numbers are prime.")


def plan_requests(prompts: list[Prompt], passes: int, seed: int) -> list[tuple[Prompt, int]]:
    """(prompt, pass) for every prompt once per pass, each pass in its own seeded order. It depends
    only on the suite, `passes` and the seed: the same for every server and every concurrency."""
    if not prompts:
        raise SpecmatchError("the prompt suite is empty")
    out = []
    for k in range(passes):
        order = list(range(len(prompts)))
        random.Random(f"{seed}:{k}").shuffle(order)
        out += [(prompts[i], k) for i in order]
    return out


def check_load(n_prompts: int, passes: int, concurrency: int, suite: str) -> list[str]:
    """A suite too small for the concurrency is a configuration error; one that gives each worker
    fewer than two requests measures a burst rather than a steady state, which the cell says."""
    n = n_prompts * passes
    if not keeps_busy(n_prompts, passes, concurrency):
        raise SpecmatchError(f"suite {suite}: {n_prompts} prompts x requests.passes {passes} = {n} requests cannot "
                             f"keep concurrency {concurrency} busy; raise suites.{suite}.size (or requests.passes: "
                             "whole passes of the suite) or drop that concurrency")
    if n < 2 * concurrency:
        return [f"{n} requests at concurrency {concurrency}: each worker sends fewer than two, so the cell measures "
                f"one burst rather than a steady state (suites.{suite}.size or requests.passes would lengthen it)"]
    return []


def warmup_prompt(i: int) -> Prompt:
    """A synthetic warm-up prompt, never a suite prompt (its token count is not needed: never measured)."""
    text = WARMUP_TEXT.format(i=i + 1)
    return Prompt(id=f"warmup-{i}", suite="warmup", source="warmup", file="", line=None, row=None,
                  row_id=f"warmup-{i}", turn=0, turns=1, text=text, messages=[{"role": "user", "content": text}],
                  prompt_tokens=0, reference_completion_tokens=None, holdout=False)


def warmup_requests(n: int, protocol: str, model: str, settings: RequestSettings, extras: dict) -> list[Request]:
    """Synthetic warm-up prompts, never suite prompts: a measured prompt must not have been seen
    (and prefix-cached) by the server before its measurement. Each generates `warmup_tokens` tokens:
    a prefill and a few decode (or speculative) steps exercise every path a measured request takes,
    and the rest of a full-length answer only cost time in every cell (about 3 s at c=1 here)."""
    proto = protocol_of(protocol)
    settings = replace(settings, max_tokens=max(1, min(settings.max_tokens, settings.warmup_tokens)),
                       use_reference_length=False)
    return [Request(-1 - i, f"warmup-{i}", "warmup", False, proto.body(warmup_prompt(i), model, settings, extras))
            for i in range(n)]


def scrape(base_url: str, engine) -> dict:
    try:
        r = http.get(base_url + "/metrics", timeout=30, headers=engine.auth_headers())
        return engine.counters(r.text) if r.status_code == 200 else {}
    except http.RequestException:
        return {}


def reset_cache(base_url: str, engine) -> str:
    """Clear the prefix cache after warm-up, so every server starts the measurement equally cold;
    the outcome is recorded in the cell, since an engine without the endpoint cannot guarantee it."""
    if not engine.reset_path:
        return "not supported by this engine"
    try:
        r = http.post(base_url + engine.reset_path, timeout=60, headers=engine.auth_headers())
        return "ok" if r.status_code == 200 else f"HTTP {r.status_code}"
    except http.RequestException as exc:
        return f"failed: {exc}"


def owners(att: Attached, manager: Manager, base_url: str) -> Owners:
    """Whose CPU is the cell's own: the managed server's process group (its pid is its group's and its
    session's id) and its watchdog; for an endpoint on this machine that we did not start, the processes
    listening on its port (and their descendants); and this process."""
    own = Owners()
    if att.pid:
        own.server_groups.add(att.pid)
        own.server_pids.add(att.pid)
        wd = (manager.read_current() or {}).get("watchdog_pid")
        if wd:
            own.own_pids.add(int(wd))
    else:
        u = urlsplit(base_url)
        if u.hostname in ("127.0.0.1", "localhost", "::1") and u.port:
            own.server_pids |= listener_pids(u.port)
    return own


def output_settings(engine, settings: RequestSettings) -> tuple[dict, frozenset | None]:
    """With requests.record_outputs: the body fields that return each output's token ids, and the served
    model's stop token ids (the natural stop is looked for there); nothing otherwise."""
    if not settings.record_outputs:
        return {}, None
    return engine.output_extras(), engine.stop_token_ids()


def run_cell(name: str, cfg: dict, suite: str, prompts: list[Prompt], concurrency: int, repeat: int,
             settings: RequestSettings, max_batch: int, manager: Manager, server_log: Path | None = None,
             sessions: list[Session] | None = None) -> tuple[CellResult, list[RequestRecord], str | None]:
    """Measure the cell; returns its result, its request records, and a death notice if the server died.
    `sessions`: a session suite's sessions, replayed turn by turn (specmatch.measuring.sessions)."""
    engine = get_engine(cfg)
    protocol = engine.protocol(settings.endpoint)
    proto = protocol_of(protocol)
    salt, why_no_salt = engine.cache_salt_field()
    if sessions is not None and settings.session_salt is not None:
        salt, why_no_salt = None, settings.session_salt   # another server of the run has none: the same passes for all
    if sessions is not None:
        passes = session_passes(len(sessions), settings.passes, settings.min_requests_per_worker, concurrency, salt)
        warnings = check_sessions(len(sessions), passes, concurrency, suite, settings.min_requests_per_worker,
                                  None if salt else why_no_salt)
    else:
        passes = passes_for(len(prompts), settings.passes, settings.min_requests_per_worker, concurrency)
        warnings = check_load(len(prompts), passes, concurrency, suite)
    model = engine.served_model()
    out_extras, stop_ids = output_settings(engine, settings)
    extras = {**engine.request_extras(), **out_extras}
    reqs = [Request(i, p.id, p.source, p.holdout, proto.body(p, model, settings, extras), k,
                    collect=settings.record_outputs, stop_ids=stop_ids)
            for i, (p, k) in enumerate(plan_requests(prompts, passes, settings.seed))] if sessions is None else []
    warm = warmup_requests(settings.warmup, protocol, model, settings, extras)
    api_key = engine.api_key()
    session = session_of(repeat)
    att = manager.attach(name, cfg, max_batch, server_log, session)
    ours = owners(att, manager, att.base_url)
    earlier: list[EarlierMeasurement] = []

    def measure() -> tuple[list[RequestRecord], dict, dict, float, str, Interference, object, object]:
        reset = reset_cache(att.base_url, engine)  # after the warm-up: nothing this measurement sends is cached
        before = scrape(att.base_url, engine)
        t0 = time.time()
        outcome = served = None
        with Sampler(ours) as sampler:  # the measured part only
            if sessions is not None:
                served = served_context(att.base_url, api_key)
                records, outcome = run(run_sessions(
                    att.base_url, plan_requests(sessions, passes, settings.seed), concurrency, protocol, model,
                    settings, extras, engine.parse_request_acceptance, api_key, served, stop_ids,
                    settings.record_outputs, salt))
            else:
                records = run(run_load(att.base_url, reqs, concurrency, protocol, engine.parse_request_acceptance,
                                       settings.timeout_s, api_key, request_rate=settings.request_rate,
                                       burstiness=settings.burstiness, seed=settings.seed))
        after = scrape(att.base_url, engine)
        return records, before, after, t0, reset, sampler.result(settings.interference_threshold), outcome, served

    with LeaseKeeper(manager):
        if warm:
            run(run_load(att.base_url, warm, min(concurrency, len(warm)), protocol, engine.parse_request_acceptance,
                         settings.timeout_s, api_key))
        records, before, after, t0, reset, seen, outcome, served = measure()
        if seen.flagged and settings.on_interference == "remeasure" and all(r.ok for r in records):
            first = figures.summarize(records)
            earlier.append(EarlierMeasurement(interference=seen, started_at=t0, duration=first["duration"],
                                              output_throughput=first["output_throughput"],
                                              median_tpot_ms=first["median_tpot_ms"]))
            records, before, after, t0, reset, seen, outcome, served = measure()
    died = manager.death_notice(att) if any(not r.ok for r in records) else None
    summary = figures.summarize(records)
    result = CellResult(
        server=name, suite=suite, concurrency=concurrency, repeat=repeat, engine=cfg["engine"], protocol=protocol,
        flavor=engine.flavor,
        max_concurrency=concurrency, num_prompts=len(records) if sessions is not None else len(reqs),
        suite_prompts=len(sessions) if sessions is not None else len(prompts), passes=passes,
        warmup_requests=len(warm), request_rate=settings.request_rate or "inf",
        burstiness=settings.burstiness, started_at=t0, server_session=session,
        server_reused=att.reused, server_config_hash=att.config_hash, cache_reset=reset,
        holdout_share=sum(r.holdout for r in records) / len(records) if records else None,
        definitions=DEFINITIONS, interference=seen, earlier=earlier, **summary)
    result.sessions, result.served_context, result.ignore_eos = outcome, served, settings.ignore_eos
    result.warnings = warnings + figures.measurement_warnings(result)
    result.set_acceptance(engine.cell_acceptance(before, after, records))
    result.acceptance_by_source = figures.acceptance_by_group(engine, records, lambda r: r.source)
    result.acceptance_by_holdout = figures.acceptance_by_group(engine, records,
                                                               lambda r: "held_out" if r.holdout else "seen")
    return result, records, died


def quietness(cell: CellResult) -> dict:
    """The cell's interference as its provenance records it: the reading's headline and whether it was
    re-measured (the full readings are in the cell)."""
    i = cell.interference
    if i is None or not i.available:
        return {"available": False, "reason": i.reason if i else "not sampled"}
    return {"flagged": i.flagged, "foreign_cpu_cores": i.foreign_cpu_cores, "other_cpu_cores": i.other_cpu_cores,
            "steal_share": i.steal_share, "threshold_cores": i.threshold_cores, "why": i.why,
            "remeasured": len(cell.earlier), "gpu": i.gpu.available if i.gpu else False}


def write_requests(path: Path, records: list[RequestRecord]) -> None:
    with atomic_path(path, ".parquet") as tmp:
        frame(records, RequestRecord).write_parquet(tmp)


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", required=True)
    p.add_argument("--server", required=True, help="the server's config as JSON")
    p.add_argument("--suite", required=True)
    p.add_argument("--prompts", required=True, type=Path)
    p.add_argument("--concurrency", required=True, type=int)
    p.add_argument("--repeat", type=int, default=1, help="which repeat (each in a fresh server session)")
    p.add_argument("--max-batch", required=True, type=int)
    p.add_argument("--requests", required=True, help="the requests config as JSON")
    p.add_argument("--launch", type=Path, help="the server's launch record for this repeat")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--requests-out", required=True, type=Path)
    p.add_argument("--server-log", type=Path, help="where a server this cell has to (re)start writes its log")
    p.add_argument("--state-dir", type=Path)


def execute(a: argparse.Namespace) -> int:
    cfg, req_cfg = json.loads(a.server), json.loads(a.requests)
    settings = RequestSettings.from_json(req_cfg)
    mgr = Manager(a.state_dir)
    rec = Recorder("cell", [a.prompts, a.launch], {"server": cfg, "suite": a.suite, "concurrency": a.concurrency,
                                                   "repeat": a.repeat, "requests": req_cfg})
    prompts, sessions = read_suite(read_jsonl(a.prompts))
    result, records, died = run_cell(a.name, cfg, a.suite, prompts, a.concurrency, a.repeat, settings,
                                     a.max_batch, mgr, a.server_log, sessions)
    launch = LaunchRecord.from_json(read_json(a.launch)) if a.launch and a.launch.exists() else None
    if launch and launch.config_hash and launch.config_hash != result.server_config_hash:
        print(f"warning: the running server's config hash {result.server_config_hash} differs from its launch "
              f"record's {launch.config_hash}", file=sys.stderr)
    total = result.completed + result.failed
    frac = result.failed / total if total else 1.0
    where = f"cell {a.name}/{a.suite}/r{a.repeat}/c{a.concurrency}"
    bad_json = a.out.with_name(a.out.name.replace(".json", ".failed.json"))
    bad_pq = a.requests_out.with_name(a.requests_out.name.replace(".requests.parquet", ".failed.requests.parquet"))
    if frac > settings.max_failure_fraction or died:
        write_json(bad_json, result.to_json())
        write_requests(bad_pq, records)
        first = next((r.error for r in records if not r.ok), "")
        print(f"error: {where}: {result.failed} of {total} requests failed ({frac:.1%}; "
              f"requests.max_failure_fraction {settings.max_failure_fraction:.1%}); first: {first}. "
              + (f"\n{died}\n" if died else "") + f"Partial records: {bad_json}, {bad_pq}", file=sys.stderr)
        return 2
    if result.flagged and settings.on_interference == "fail":
        write_json(bad_json, result.to_json())
        write_requests(bad_pq, records)
        print(f"error: {where}: the machine was not this cell's own while it measured: "
              f"{'; '.join(result.interference.why)} (requests.on_interference: fail; raise "
              f"requests.interference_threshold, or free the machine and rerun). Its records: {bad_json}, {bad_pq}",
              file=sys.stderr)
        return 2
    for m in result.earlier:
        print(f"warning: {where}: re-measured: the first measurement ({m.output_throughput or 0:.1f} tok/s) was "
              f"flagged: {'; '.join(m.interference.why if m.interference else [])}", file=sys.stderr)
    if result.flagged:
        print(f"warning: {where}: flagged (requests.on_interference: {settings.on_interference}): "
              f"{'; '.join(result.interference.why)}", file=sys.stderr)
    for w in result.warnings:
        print(f"warning: {where}: {w}", file=sys.stderr)
    write_requests(a.requests_out, records)
    write_json(a.out, result.to_json())
    rec.write([a.out, a.requests_out], {"server": {"name": a.name, "argv": launch.argv if launch else [],
                                                   "config_hash": result.server_config_hash,
                                                   "session": result.server_session},
                                        "interference": quietness(result)})
    if result.sessions is not None:
        print(f"{where}: {describe_outcome(result.sessions)}")
    acc = result.spec_decode_acceptance_rate
    print(f"{where}: {result.completed} ok, {result.failed} failed, {result.output_throughput or 0:.1f} tok/s, "
          f"median TTFT {result.median_ttft_ms or 0:.0f} ms" + (f", acceptance {acc:.3f}" if acc is not None else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    return steps.main("cell", __doc__, arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
