"""The recommendation, as an experiment: decide it from the measured grid, then measure it.

A Snakemake checkpoint. From the cells of the configured servers it builds the recommendation for
each speculative server (analysis.recommend: built from verdicts) and, where the recommended
deployment is a configuration nobody measured (the schedule as its engine runs it: records.Deployment,
e.g. a vLLM batch-size schedule, SGLang's adaptive speculation), derives a server
`<server>__recommended` that the workflow then measures on the same
grid (every concurrency and repeat of the suite the recommendation was made on). The summary step
verifies it (analysis.verified_analysis, deployment.verification): at each concurrency against the server the
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

from .analysis import frozen_verdicts, primary_analysis
from .reading.measurements import Settings
from .recommending.deployment import RECOMMENDED, ServerInfo
from .recommending.deployment import engine_of
from .recommending.kmodel import KRecommendation
from .recommending.krecommend import derived_config
from ..sweep import members as sweep_members
from .. import steps
from .inputs import analysis_arguments, load, server_infos
from ..files import read_json, write_json
from ..provenance import Recorder
from ..records import Deployment, DerivedServer, DerivedServers, Recommendation, RoundPlan, StepCosts
from ..serving.engines import get_engine


def same_deployment(a: dict, b: dict, max_batch: int) -> bool:
    """Whether two server configs deploy the same thing: equal but for `suites` and `speculative`, and
    speculative blocks their engine calls the same at every batch size (Engine.same_speculation: for
    vLLM, a schedule of one constant k is no schedule)."""
    def rest(c: dict) -> dict:
        return {k: v for k, v in c.items() if k not in ("suites", "speculative")}

    if rest(a) != rest(b):
        return False
    sa, sb = a.get("speculative") or {}, b.get("speculative") or {}
    return get_engine(a).same_speculation(sa, sb, max_batch)


def deployment_files(deploy: Deployment, name: str, folder: Path | None) -> dict[str, str] | None:
    """Write the files a deployment's config points at (Deployment.files) into `folder` as
    `<name>.json` (`<name>.<key>.json` where there are several): key -> path. None where there are
    files and no folder to write them to (the deployment cannot be launched)."""
    if not deploy.files:
        return {}
    if folder is None:
        return None
    out = {}
    for key, content in deploy.files.items():
        path = Path(folder) / (f"{name}.json" if len(deploy.files) == 1 else f"{name}.{key}.json")
        write_json(path, content)
        out[key] = str(path)
    return out


def derived_servers(recs: list[Recommendation], configs: dict, infos: dict[str, ServerInfo],
                    adaptive_dir: Path | None = None) -> dict[str, DerivedServer]:
    """`<server>__recommended` configurations for recommendations that are new deployments: the
    server's config with its engine's rendering (Recommendation.deploy); a file it points at (SGLang's
    adaptive config) is written into `adaptive_dir`, which the server then reads."""
    out = {}
    for r in recs:
        cfg = configs.get(r.server)
        if (cfg is None or not engine_of(infos[r.server]).launches or r.action not in ("schedule", "keep")
                or r.as_configured or r.deploy is None or r.deploy.speculative is None):
            continue
        paths = deployment_files(r.deploy, r.server + RECOMMENDED, adaptive_dir)
        if paths is None:
            continue
        spec = {**copy.deepcopy(r.deploy.speculative), **paths}
        config = {**{k: v for k, v in copy.deepcopy(cfg).items() if k != "suites"}, "speculative": spec}
        twin = next((n for n, c in configs.items() if n != r.server and r.suite in (c.get("suites") or [r.suite])
                     and same_deployment(config, c, infos[r.server].max_batch)), None)
        if twin:  # measured already, on the same grid: verify against its cells instead of measuring it twice
            r.measured_by = twin
            continue
        name = r.server + RECOMMENDED
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
        name = r.parent + RECOMMENDED
        ks = sweep_members(r.parent, configs)
        if not ks:
            continue
        if r.action == "off" and r.server:
            r.derived_server = r.server
            continue
        if r.action not in ("schedule", "keep") or name in out or (r.action == "schedule" and name in (taken or ())):
            continue
        member = ks[r.k] if r.action == "keep" and r.k in ks else ks[max(ks)]
        paths = {}
        if r.action == "schedule" and r.deploy is not None:
            paths = deployment_files(r.deploy, name, adaptive_dir)
            if paths is None:
                continue
        config = derived_config(configs[member], r, paths)
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
        if infos.get(member) is not None and not engine_of(infos[member]).launches:
            continue
        out[name] = DerivedServer(parent=r.parent, suite=r.suite, config=config)
        r.derived_server = name
    return out


def arguments(p: argparse.ArgumentParser) -> None:
    analysis_arguments(p)
    p.add_argument("--no-verify", action="store_true", help="derive no recommended server")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--recommendations", required=True, type=Path)
    p.add_argument("--adaptive-dir", type=Path, help="where the files a recommended server's config points at go "
                   "(records.Deployment.files: SGLang's adaptive config)")
    p.add_argument("--k-schedules", type=Path, help="where the k sweeps' recommendations go (kmodel.KRecommendation)")
    p.add_argument("--rounds", nargs="*", type=Path, default=[],
                   help="the sequential design's round plans: the configurations they stopped keep their verdicts")
    p.add_argument("--stepcost", type=Path, help="the step-cost maps (results/stepcost/stepcost.json): their "
                   "predictions decide the concurrencies the verdict grid lacks")


def execute(a: argparse.Namespace) -> int:
    settings, configs = Settings.of(json.loads(a.settings)), json.loads(a.servers)
    rec = Recorder("recommend", a.cells + a.requests + a.launches + a.rounds + ([a.stepcost] if a.stepcost else []),
                   {"baseline": a.baseline, "summary": settings.__dict__, "suites": a.suites, "verify": not a.no_verify})
    infos = server_infos(a.launches, configs)
    plans = [RoundPlan.from_json(read_json(x)) for x in a.rounds]
    stepcost = StepCosts.from_json(read_json(a.stepcost)) if a.stepcost else None
    an = primary_analysis(load(a.cells, a.requests, settings), a.baseline, settings, configs, infos, a.suites,
                          frozen_verdicts(plans, a.baseline), stepcost)
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
