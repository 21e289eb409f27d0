"""The step-cost map: what a speculative step costs at every batch size and context against the
baseline's plain step, the acceptance a drafter needs at each batch size, and every suite's speedup
predicted on a concurrency grid up to the largest batch, checked against the cells
(specmatch.deciding.predicting.stepcost).

    python -m specmatch stepcost --baseline B --settings JSON --servers JSON --cells c*.json
        --requests c*.requests.parquet --launches launch.json... --step-cost JSON [--traffic traffic.json]
        --out stepcost.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import inputs
from .explaining.attribution import mixed_schedule
from .predicting.stepcost import build_map, requests_of
from .predicting.stepcost.kmap import build_kmap
from .predicting.traffic.step_model import Scheduler
from .reading.measurements import Settings
from .. import steps
from ..config import TRAFFIC_PREFIX
from ..controls import is_control
from ..files import read_json, write_json
from ..provenance import Recorder
from ..records import StepCosts, TrafficProfiles
from ..serving.engines import get_engine
from ..sweep import members, parents


def arguments(p: argparse.ArgumentParser) -> None:
    inputs.analysis_arguments(p)
    p.add_argument("--step-cost", default="{}", help="config `step_cost` as JSON (fit, check, suite)")
    p.add_argument("--traffic", type=Path, help="results/prompts/traffic.json: the traffic profiles, each predicted "
                                                "from the map on its grid too")
    p.add_argument("--out", required=True, type=Path)


def forced(cfg: dict) -> str:
    """How the map's acceptance was set: the engine's forced acceptance where it has one (not planned
    yet: the real drafter's requests), or why it has none."""
    keys, why = get_engine(cfg).forced_acceptance()
    if keys is None:
        return f"the real drafter's requests: {why}"
    return ("the real drafter's requests (the engine can force acceptance with "
            + ", ".join(f"{k}={v}" for k, v in keys.items()) + "; forced-acceptance map cells are not planned)")


def schedulers(configs: dict, servers: list[str]) -> tuple[dict, dict]:
    """Each server's Scheduler (the tokens one of its steps schedules, Engine.step_budget; a decoding
    sequence takes 1 + k of them on a speculative server) and where its budget comes from."""
    scheds, sources = {}, {}
    for x in servers:
        eng = get_engine(configs[x])
        budget, sources[x] = eng.step_budget()
        k = eng.own_k(configs[x].get("speculative") or {}) if configs[x].get("speculative") else 0
        scheds[x] = Scheduler(float(budget) if budget else float("inf"), 1 + k)
    return scheds, sources


def execute(a: argparse.Namespace) -> int:
    settings, configs, cfg = Settings.of(json.loads(a.settings)), json.loads(a.servers), json.loads(a.step_cost)
    rec = Recorder("stepcost", a.cells + a.requests + a.launches + ([a.traffic] if a.traffic else []),
                   {"baseline": a.baseline, "summary": settings.__dict__, "step_cost": cfg})
    m = inputs.load(a.cells, a.requests, settings)
    profiles = TrafficProfiles.from_json(read_json(a.traffic)) if a.traffic else None
    infos = inputs.server_infos(a.launches, configs)
    reqs = requests_of(m)
    suites = [u for u in dict.fromkeys(k[1] for k in m.cells) if not u.startswith(TRAFFIC_PREFIX)]
    suite = cfg.get("suite") or (a.suites[0] if a.suites else suites[0])
    fit = sorted({k[2] for k in m.cells})
    out = StepCosts(config=cfg)
    fitted: dict = {}
    for x, c in configs.items():
        if x == a.baseline or is_control(x) or not c.get("speculative") or x not in m.servers():
            continue
        if mixed_schedule(c["speculative"]):
            out.skipped[x] = ("its batch-size schedule runs plain steps at some batch sizes: its step cost is not "
                              "one speculative step's (map the server as configured without the schedule)")
            continue
        mb = infos[x].max_batch if x in infos else 0
        scheds, sources = schedulers(configs, [x, a.baseline])
        got = build_map(m, reqs, x, a.baseline, suite, suites, fit, list(cfg.get("check", [])), mb, forced(c),
                        settings, scheds, sources, profiles, fitted)
        if got is None:
            out.skipped[x] = "no closed-loop cell with per-request decode steps for it or the baseline"
        else:
            out.maps.append(got)
    # every k sweep with two mapped members or more: the map in k, its predictions on the largest k's grid
    on = [u for u in suites if u in a.suites] or [suite]
    for parent in parents(configs):
        ks = {k: x for k, x in members(parent, configs).items() if x in m.servers()}
        maps = {k: fitted[x] for k, x in ks.items() if x in fitted}
        if len(maps) < 2:
            continue
        top = next(mp for mp in out.maps if mp.server == ks[max(maps)])
        cs = sorted({p.concurrency for p in top.predictions})
        holds = {k: mp.holds for k in maps for mp in out.maps if mp.server == ks[k]}
        got = build_kmap(m, reqs, parent, ks, maps, on, cs, settings, settings.recommend_metric, holds)
        if got is not None:
            out.kmaps.append(got)
    write_json(a.out, out.to_json())
    rec.write([a.out])
    for x, why in out.skipped.items():
        print(f"{x}: no map: {why}")
    for mp in out.maps:
        print(f"{mp.server}: fitted at c={mp.fit}, checked at c={mp.checks}: "
              + {True: "holds", False: "misses", None: "unchecked"}[mp.holds])
    for km in out.kmaps:
        print(f"{km.parent}: map in k from k={km.mapped}: linear in k "
              + {True: "holds", False: "misses", None: "unchecked"}[km.linear] + ", held-out members "
              + {True: "agree", False: "disagree", None: "unchecked"}[km.holds] + f" (cells {km.cells})")
    return 0


def main(argv: list[str] | None = None) -> int:
    return steps.main("stepcost", __doc__, arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
