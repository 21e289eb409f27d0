"""The recommendation, as an experiment: decide it from the measured grid, then measure it.

A Snakemake checkpoint. From the cells of the configured servers it builds the recommendation for
each speculative server (analysis.recommend: built from verdicts) and, where the recommended
deployment is a configuration nobody measured (a vLLM batch-size schedule, SGLang's adaptive
speculation), derives a server `<server>__recommended` that the workflow then measures on the same
grid (every concurrency and repeat of the suite the recommendation was made on). The summary step
verifies it (verified_analysis, deployment.verification): at each concurrency against the server the
schedule says should run there, an equivalence test within +/-min_effect.

    python -m specmatch recommend --baseline B --settings JSON --servers JSON --cells c*.json
        --requests c*.requests.parquet --launches launch.json... --suites train_mix --out servers.json
        --recommendations recommendations.json [--no-verify] [--rounds results/rounds/r*.json]
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import polars as pl

from .analysis import (RECOMMENDED, Analysis, ServerInfo, Settings, analyse, frozen_verdicts, join_derived, server_k,
                       verify_k_recommendations, verify_recommendations)
from .kmodel import KRecommendation
from .krecommend import derived_config
from ..sweep import members as sweep_members
from .. import steps
from ..serving.engines.sglang import adaptive_support
from ..files import SpecmatchError, read_json, write_json
from ..provenance import Recorder
from ..records import CellResult, DerivedServer, DerivedServers, LaunchRecord, Recommendation, RoundPlan

SUFFIX = RECOMMENDED


def load(cell_paths: list[Path], request_paths: list[Path]) -> list[tuple[CellResult, pl.DataFrame]]:
    """Cells and their request records, paired in the order Snakemake passed them (never guessed)."""
    if len(cell_paths) != len(request_paths):
        raise SpecmatchError(f"{len(cell_paths)} cell files but {len(request_paths)} request files")
    out = []
    for c, r in zip(cell_paths, request_paths):
        cell = CellResult.from_json(read_json(c))
        out.append((cell, pl.read_parquet(r)))
    if not out:
        raise SpecmatchError("no cells to analyse")
    return out


def server_infos(launches: list[Path], configs: dict) -> dict[str, ServerInfo]:
    """What the recommendation needs of each server, from its (first repeat's) launch record (an external
    endpoint's largest batch from its config's `max_batch`, else 0: not known)."""
    infos: dict[str, ServerInfo] = {}
    for p in sorted(launches):
        rec = LaunchRecord.from_json(read_json(p))
        if rec.server in infos:
            continue
        cfg = configs.get(rec.server) or rec.config
        version = (rec.engine_versions or {}).get("sglang")
        # an external endpoint is launched by no one here (max_batch 0): its configured `max_batch`, else
        # none known (the recommendation then covers the measured concurrencies)
        max_batch = (cfg.get("max_batch") or 0) if rec.engine == "external" else rec.max_batch
        infos[rec.server] = ServerInfo(rec.server, rec.engine, rec.flavor, cfg.get("speculative"), max_batch,
                                       adaptive_support(version) if rec.flavor == "sglang" else None, version,
                                       tuple(rec.engine_warnings), tuple(rec.argv))
    return infos


def same_deployment(a: dict, b: dict, max_batch: int) -> bool:
    """Whether two server configs deploy the same thing: equal but for `suites`, and speculating
    with the same k at every batch size (a schedule of one constant k is no schedule)."""
    def rest(c: dict) -> dict:
        return {k: v for k, v in c.items() if k not in ("suites", "speculative")}

    def spec_rest(c: dict) -> dict:
        return {k: v for k, v in (c.get("speculative") or {}).items() if k != "num_speculative_tokens_per_batch_size"}

    if rest(a) != rest(b) or spec_rest(a) != spec_rest(b):
        return False
    sa, sb = a.get("speculative") or {}, b.get("speculative") or {}
    return all(server_k(sa, n) == server_k(sb, n) for n in range(1, max_batch + 1))


def derived_servers(recs: list[Recommendation], configs: dict, infos: dict[str, ServerInfo],
                    adaptive_dir: Path | None = None) -> dict[str, DerivedServer]:
    """`<server>__recommended` configurations for recommendations that are new deployments (an SGLang
    adaptive config is written into `adaptive_dir`, which the server then reads)."""
    out = {}
    for r in recs:
        cfg = configs.get(r.server)
        if (cfg is None or infos[r.server].engine == "external" or r.action not in ("schedule", "keep")
                or r.as_configured):
            continue
        spec = copy.deepcopy(cfg.get("speculative") or {})
        if r.vllm_schedule:
            spec["num_speculative_tokens_per_batch_size"] = r.vllm_schedule
        elif r.sglang and r.sglang.get("mechanism") == "speculative-adaptive" and adaptive_dir is not None:
            path = Path(adaptive_dir) / f"{r.server}{SUFFIX}.json"
            write_json(path, r.sglang["config"])
            spec["adaptive"] = str(path)
        else:
            continue
        config = {**{k: v for k, v in copy.deepcopy(cfg).items() if k != "suites"}, "speculative": spec}
        twin = next((n for n, c in configs.items() if n != r.server and r.suite in (c.get("suites") or [r.suite])
                     and same_deployment(config, c, infos[r.server].max_batch)), None)
        if twin:  # measured already, on the same grid: verify against its cells instead of measuring it twice
            r.measured_by = twin
            continue
        name = r.server + SUFFIX
        if name in out:   # one recommended server per server: the first recommendation suite's deployment
            continue
        out[name] = DerivedServer(parent=r.server, suite=r.suite, config=config)
        r.derived_server = name
    return out


def derived_k_servers(recs: list[KRecommendation], configs: dict, infos: dict[str, ServerInfo],
                      adaptive_dir: Path | None = None, taken: set | None = None) -> dict[str, DerivedServer]:
    """The server that deploys each k recommendation (krecommend.derived_config), as `derived_server`: a schedule
    is `<parent>__recommended` (the sweep's member config with the recommended speculative config), measured
    on the grid; one k everywhere is the member of that k as configured and off everywhere the baseline, each
    already measured (its own cells are its measurement); a deployment some configured server already
    deploys is verified against that server's cells instead (`measured_by` in the text)."""
    out = {}
    for r in recs:
        name = r.parent + SUFFIX
        ks = sweep_members(r.parent, configs)
        if not ks:
            continue
        if r.action == "off" and r.server:
            r.derived_server = r.server
            continue
        if r.action not in ("schedule", "keep") or name in out or (r.action == "schedule" and name in (taken or ())):
            continue
        member = ks[r.k] if r.action == "keep" and r.k in ks else ks[max(ks)]
        path = None
        if r.action == "schedule" and r.sglang and r.sglang.get("mechanism") == "speculative-adaptive":
            if adaptive_dir is None:
                continue
            path = str(Path(adaptive_dir) / f"{name}.json")
            write_json(Path(path), r.sglang["config"])
        config = derived_config(configs[member], r, path)
        if config is None:
            continue
        batch = r.max_batch or infos[member].max_batch
        twin = next((n for n in ([member] if r.action == "keep" else []) + list(configs)
                     if r.suite in (configs[n].get("suites") or [r.suite]) and same_deployment(config, configs[n], batch)),
                    None)
        if twin:
            r.derived_server = twin
            if twin != r.server:
                r.text += f" (already measured as {twin})"
            continue
        if infos.get(member) is not None and infos[member].engine == "external":
            continue
        out[name] = DerivedServer(parent=r.parent, suite=r.suite, config=config)
        r.derived_server = name
    return out


def primary_analysis(cells, baseline: str, settings: Settings, configs: dict, infos: dict,
                     suites: list[str], frozen: dict | None = None) -> Analysis:
    """The analysis of the configured servers only: a recommendation must not depend on the
    derived servers that exist to verify it. `frozen`: the verdicts the sequential design kept
    (analysis.frozen_verdicts of the round plans)."""
    primary = [s for s in configs if not s.endswith(SUFFIX)]
    return analyse([c for c in cells if c[0].server in primary], baseline, settings, infos, suites, primary, frozen)


def verified_analysis(cells, baseline: str, settings: Settings, configs: dict, infos: dict, suites: list[str],
                      derived: dict[str, DerivedServer], recs: list[Recommendation] | None = None,
                      frozen: dict | None = None) -> Analysis:
    """Everything the summary renders, decided here: the primary grid's analysis, the recommended
    servers' cells joined (their verdicts; no decision of the primary grid changes), and each
    recommendation (the recommend step's, which name the servers that deploy them; else the
    analysis's own) with its measured verification against the reference its schedule fixes."""
    an = primary_analysis(cells, baseline, settings, configs, infos, suites, frozen)
    an = join_derived(an, cells, list(derived))
    an.recommendations = verify_recommendations(an, recs or an.recommendations, derived)
    an.k_recommendations = verify_k_recommendations(an, an.k_recommendations, derived)
    return an


def analysis_arguments(p: argparse.ArgumentParser) -> None:
    """What every step that analyses the cells reads (recommend, summary): one definition, so the
    two steps cannot come to read the same measurements differently."""
    p.add_argument("--baseline", required=True)
    p.add_argument("--settings", default="{}")
    p.add_argument("--servers", required=True, help="the configured servers as JSON (name -> config)")
    p.add_argument("--cells", nargs="+", type=Path, required=True)
    p.add_argument("--requests", nargs="+", type=Path, required=True)
    p.add_argument("--launches", nargs="*", type=Path, default=[])
    p.add_argument("--suites", nargs="*", default=[], help="the suites recommendations are made on")


def arguments(p: argparse.ArgumentParser) -> None:
    analysis_arguments(p)
    p.add_argument("--no-verify", action="store_true", help="derive no recommended server")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--recommendations", required=True, type=Path)
    p.add_argument("--adaptive-dir", type=Path, help="where SGLang adaptive configs of recommended servers go")
    p.add_argument("--k-schedules", type=Path, help="where the k sweeps' recommendations go (kmodel.KRecommendation)")
    p.add_argument("--rounds", nargs="*", type=Path, default=[],
                   help="the sequential design's round plans: the configurations they stopped keep their verdicts")


def execute(a: argparse.Namespace) -> int:
    settings, configs = Settings.of(json.loads(a.settings)), json.loads(a.servers)
    rec = Recorder("recommend", a.cells + a.requests + a.launches + a.rounds,
                   {"baseline": a.baseline, "summary": settings.__dict__, "suites": a.suites, "verify": not a.no_verify})
    infos = server_infos(a.launches, configs)
    plans = [RoundPlan.from_json(read_json(x)) for x in a.rounds]
    an = primary_analysis(load(a.cells, a.requests), a.baseline, settings, configs, infos, a.suites,
                          frozen_verdicts(plans, a.baseline))
    if a.adaptive_dir:
        a.adaptive_dir.mkdir(parents=True, exist_ok=True)
    derived = {} if a.no_verify else derived_servers(an.recommendations, configs, infos, a.adaptive_dir)
    if not a.no_verify:
        derived.update(derived_k_servers(an.k_recommendations, configs, infos, a.adaptive_dir, set(derived)))
    write_json(a.recommendations, [r.to_json() for r in an.recommendations])
    outs = [a.out, a.recommendations]
    if a.k_schedules:
        write_json(a.k_schedules, [r.to_json() for r in an.k_recommendations])
        outs.append(a.k_schedules)
    why = {r.server: f"{r.action}: {r.text}" for r in an.recommendations if r.derived_server is None}
    why.update({r.parent: f"{r.action}: {r.text}" for r in an.k_recommendations if r.derived_server not in derived})
    write_json(a.out, DerivedServers(derived, why).to_json())
    rec.write(outs)
    for r in an.recommendations:
        print(f"{r.server} ({r.suite}): {r.text}" + (f" -> measuring {r.derived_server}" if r.derived_server else "")
              + (f" -> already measured as {r.measured_by}" if r.measured_by else ""))
    for r in an.k_recommendations:
        print(f"{r.parent} k sweep ({r.suite}): {r.text}" + (f" -> measuring {r.derived_server}"
                                                             if r.derived_server in derived else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    return steps.main("recommend", __doc__, arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
