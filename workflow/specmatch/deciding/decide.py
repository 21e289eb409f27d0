"""Decide once: every decision the report renders, computed from the cells and written as records.

The `decide` step runs after every cell, the recommended servers' included. From the cells it takes
the primary grid's analysis, joins the recommended servers' cells and verifies each recommendation
(analysis.verified_analysis), splits every speedup into tokens per step x step cost
(analysis.attribute), and collects what the report needs beside the verdicts. It writes

- `verdicts.json`: records.Verdict per (server, suite, concurrency, metric);
- `recommendations.json`: records.Recommendation per speculative server and recommendation suite,
  with its measured verification;
- `attribution.json`: records.Attribution per speculative server, suite and concurrency;
- `k_sweeps.json`: kmodel.KSweeps (each k sweep's recommendation and each k's predicted vs measured);
- `analysis.json`: records.AnalysisRecord (the grid, run-to-run variation, acceptance, the cells that
  drafted nothing, crossovers, what the launch records say, cell goodput, the claims resting on cells
  measured while the machine was busy);
- `context.json`, `context_trends.json`: deciding.explaining.context.ContextRow per (server, suite, concurrency,
  context bin) and ContextTrend per (server, suite, concurrency): tau, rho and the TPOT speedup by
  context length, acceptance per doubling of the context, where the speedup crosses 1;
- `stopping.json`: deciding.explaining.stopping.StoppingReport (outputs against the baseline's, tokens past the
  natural stop, the session suites' sessions);
- `traffic.json`: records.TrafficRow per traffic profile, speculative server, concurrency and metric:
  the mix's predicted speedup, the measured one where it is verified, the break-even share
  (specmatch.deciding.predicting.traffic).

The summary step (specmatch.reporting.summary) reads these and renders them; it decides nothing.

    python -m specmatch decide --baseline NAME --settings JSON --servers JSON --cells c*.json
        --requests c*.requests.parquet --launches launch.json... --suites S... --matches *.match.json
        [--recommendations R] [--derived servers.json] [--traffic traffic.json] [--rounds r*.json] --out-dir results/summary
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import steps
from ..files import read_json, write_json
from ..pipeline import DECISION_FILES
from ..provenance import Recorder
from ..records import (AnalysisRecord, Attribution, CellGoodput, CrossoverSet, DerivedServers, Recommendation,
                       RoundPlan, RunToRunFigure, RunToRunSummary, ServerFacts, SuiteMatch, TrafficProfiles, TrafficRow,
                       Verdict)
from ..controls import OFF, cache_arm_plan, is_control, why_no_control
from .verdicts.acceptance import pooled_acceptance
from .analysis import Analysis, attribute, frozen_verdicts, verified_analysis
from .reading.measurements import Settings
from .recommending.deployment import RECOMMENDED, ServerInfo
from .explaining.attribution import launch_differences, mixed_servers
from .recommending.deployment import rendered
from .explaining.interference import flagged_claims
from .explaining.context import ContextAxis, ContextRow, ContextTrend, context_report
from .recommending.kmodel import KSweeps
from .explaining.stopping import StoppingReport, stopping_report
from .predicting.traffic.report import traffic_report
from .inputs import analysis_arguments, load, server_infos

# the decision records, by name: the files the decide step writes into its folder and the summary reads
FILES = DECISION_FILES


@dataclass
class Decisions:
    """Every decision of a run, as the records the decide step writes (one file each, FILES)."""
    verdicts: list[Verdict]
    recommendations: list[Recommendation]
    attribution: list[Attribution]
    k_sweeps: KSweeps
    analysis: AnalysisRecord
    traffic: list[TrafficRow] = dataclasses.field(default_factory=list)
    context: list[ContextRow] = dataclasses.field(default_factory=list)
    context_trends: list[ContextTrend] = dataclasses.field(default_factory=list)
    stopping: StoppingReport = dataclasses.field(default_factory=StoppingReport)

    def to_json(self) -> dict:
        """name -> the JSON of its file."""
        return {"verdicts": [v.to_json() for v in self.verdicts],
                "recommendations": [r.to_json() for r in self.recommendations],
                "attribution": [a.to_json() for a in self.attribution],
                "k_sweeps": self.k_sweeps.to_json(), "analysis": self.analysis.to_json(),
                "traffic": [t.to_json() for t in self.traffic],
                "context": [r.to_json() for r in self.context],
                "context_trends": [t.to_json() for t in self.context_trends],
                "stopping": self.stopping.to_json()}

    @classmethod
    def from_json(cls, obj: dict) -> "Decisions":
        return cls([Verdict.from_json(v) for v in obj["verdicts"]],
                   [Recommendation.from_json(r) for r in obj["recommendations"]],
                   [Attribution.from_json(a) for a in obj["attribution"]],
                   KSweeps.from_json(obj["k_sweeps"]), AnalysisRecord.from_json(obj["analysis"]),
                   [TrafficRow.from_json(t) for t in obj.get("traffic") or []],
                   [ContextRow.from_json(r) for r in obj.get("context") or []],
                   [ContextTrend.from_json(t) for t in obj.get("context_trends") or []],
                   StoppingReport.from_json(obj["stopping"]) if obj.get("stopping") else StoppingReport())

    def write(self, folder: Path) -> list[Path]:
        out = []
        for name, obj in self.to_json().items():
            write_json(Path(folder) / FILES[name], obj)
            out.append(Path(folder) / FILES[name])
        return out

    @classmethod
    def read(cls, folder: Path) -> "Decisions":
        return cls.from_json({name: read_json(Path(folder) / f) for name, f in FILES.items()})


# -- what the report needs beside the verdicts ------------------------------------------------------
def run_to_run_summary(an: Analysis) -> RunToRunSummary:
    rr = an.run_to_run
    return RunToRunSummary(rr.configurations, rr.repeats,
                           [RunToRunFigure(m, t, rr.dof.get(m)) for m, t in rr.tau2.items()],
                           [RunToRunFigure(m, v.total, v.dof, c) for m, lv in rr.levels.items()
                            for c, v in sorted(lv.items())],
                           {m: list(d) for m, d in rr.dominant.items() if d is not None}, len(rr.left_out))


def server_facts(infos: dict[str, ServerInfo], baseline: str) -> list[ServerFacts]:
    """Every server's facts from its launch record, against the baseline's (deployment.ServerInfo)."""
    mixed = mixed_servers(infos)
    base = infos.get(baseline)
    out = []
    for name, info in infos.items():
        warnings = [w for w in info.engine_warnings if w not in set(base.engine_warnings)] if base else []
        diffs = launch_differences(info.argv, base.argv) if base else None
        out.append(ServerFacts(name, info.speculative, name in mixed, warnings, diffs, info.kv_pool, info.max_batch))
    return out


def uncontrolled(settings: dict, configs: dict, baseline: str) -> dict[str, str]:
    """Speculative servers whose configured-off control was asked for (summary.controls) but cannot be
    expressed for their engine, and why."""
    ctl = settings.get("controls") or {}
    if not ctl.get("configured_off"):
        return {}
    names = ctl.get("servers") or [n for n, c in configs.items() if c.get("speculative") and not is_control(n)
                                   and not n.endswith(RECOMMENDED) and n != baseline]
    out = {}
    for n in names:
        if n in configs and n + OFF not in configs:
            why = why_no_control(configs[n])
            if why:
                out[n] = why
    return out


def without_cache_arm(settings: dict, configs: dict, kinds: dict[str, str]) -> dict[str, str]:
    """Speculative servers whose cache arm was asked for (summary.controls.prefix_cache) but that have
    none, and why: the plan's own reasons (controls.cache_arm_plan) for the configured servers
    and the suites' kinds."""
    cfg = {"summary": settings, "suites": {u: {"kind": k} for u, k in kinds.items()},
           "servers": {n: c for n, c in configs.items() if not is_control(n)}}
    return cache_arm_plan(cfg)[1]


def analysis_record(an: Analysis, no_control: dict[str, str] | None = None) -> AnalysisRecord:
    """The analysis's findings beside its verdicts, as the record the report renders."""
    m = an.measurements
    goodput = [CellGoodput(*key, m.arrays[key].point("goodput", cell)) for key, cell in sorted(m.cells.items())
               ] if an.settings.slo else []
    return AnalysisRecord(
        an.baseline, list(an.servers), list(an.suites), list(an.concurrencies), dataclasses.asdict(an.settings),
        run_to_run_summary(an), list(an.acceptance), list(an.off_cost),
        [CrossoverSet(s, u, metric, list(xs)) for (s, u, metric), xs in an.crossovers.items()],
        server_facts(an.infos, an.baseline), dict(no_control or {}),
        pooled_acceptance(m, "acceptance_by_source"), pooled_acceptance(m, "acceptance_by_holdout"), goodput,
        flagged_claims(an.verdicts, m.cells, an.baseline), any(x.closed for x in m.arrays.values()))


def records_of(an: Analysis, attrs: list[Attribution], no_control: dict[str, str] | None = None) -> Decisions:
    """An analysis and its attribution as the decision records."""
    return Decisions(an.verdicts, an.recommendations, attrs, KSweeps(an.k_recommendations, an.k_points),
                     analysis_record(an, no_control))


def decide(cells, baseline: str, settings: Settings, configs: dict, infos: dict[str, ServerInfo], suites: list[str],
           derived: dict, recs: list[Recommendation], training: list[str], no_control: dict[str, str],
           matches: list[SuiteMatch] | None = None, profiles: TrafficProfiles | None = None,
           frozen: dict | None = None) -> Decisions:
    """Everything the report renders, decided once: the verified analysis (the recommend step's
    recommendations, each with its measured check) and the attribution, on the first recommendation
    suite or training suite measured as the reference for prompt length."""
    an = verified_analysis(cells, baseline, settings, configs, infos, suites, derived, recs, frozen)
    reference = next((u for u in [*suites, *training] if u in an.suites), None)
    got = records_of(an, attribute(an, reference), no_control)
    got.traffic = traffic_report(an, profiles, matches or [])
    axis, got.stopping = context_and_stopping(an, matches or [])
    got.context, got.context_trends = axis.rows, axis.trends
    return got


AXIS_KINDS = ("training", "session")   # the suites the context-length axis is read on


def context_and_stopping(an: Analysis, matches: list[SuiteMatch]) -> tuple[ContextAxis, StoppingReport]:
    """The context-length axis over the training and session suites (every suite, where no match record
    says its kind), and natural stopping and the session suites' sessions over every cell."""
    kinds = {m.suite: m.kind for m in matches}
    suites = [u for u in an.suites if not kinds or kinds.get(u) in AXIS_KINDS]
    axis = context_report(an, an.measurements.session_ids(), suites) if suites else ContextAxis([], [])
    return axis, stopping_report(an.measurements, an.baseline, an.run_to_run)


# -- the step -----------------------------------------------------------------------------------------
def arguments(p: argparse.ArgumentParser) -> None:
    analysis_arguments(p)
    p.add_argument("--matches", nargs="*", type=Path, default=[], help="the prompt suites' match reports")
    p.add_argument("--recommendations", type=Path, help="the recommend step's recommendations.json")
    p.add_argument("--derived", type=Path, help="the recommend step's servers.json")
    p.add_argument("--traffic", type=Path, help="results/prompts/traffic.json (the traffic profiles)")
    p.add_argument("--rounds", nargs="*", type=Path, default=[],
                   help="the sequential design's round plans: a configuration a round stopped keeps that verdict")
    p.add_argument("--out-dir", type=Path, required=True)


def execute(a: argparse.Namespace) -> int:
    raw = json.loads(a.settings)
    settings, configs = Settings.of(raw), json.loads(a.servers)
    rec = Recorder("decide", a.cells + a.requests + a.launches + a.matches +
                   [x for x in (a.recommendations, a.derived, a.traffic) if x] + a.rounds,
                   {"baseline": a.baseline, "summary": settings.__dict__, "suites": a.suites})
    cells = load(a.cells, a.requests, settings)
    infos = server_infos(a.launches, configs)
    derived = DerivedServers.from_json(read_json(a.derived)).servers if a.derived else {}
    recs = [rendered(Recommendation.from_json(r), infos.get(r["server"]))
            for r in read_json(a.recommendations)] if a.recommendations else []
    matches = [SuiteMatch.from_json(read_json(x)) for x in a.matches]
    training = [m.suite for m in matches if m.training]
    profiles = TrafficProfiles.from_json(read_json(a.traffic)) if a.traffic else None
    got = decide(cells, a.baseline, settings, configs, infos, a.suites, derived, recs, training,
                 uncontrolled(raw, configs, a.baseline), matches, profiles,
                 frozen_verdicts([RoundPlan.from_json(read_json(x)) for x in a.rounds], a.baseline))
    got.analysis.no_cache_arm = without_cache_arm(raw, configs, {m.suite: m.kind for m in matches})
    written = got.write(a.out_dir)
    rec.write(written)
    print(f"decide: {len(got.verdicts)} verdicts, {len(got.recommendations)} recommendations, "
          f"{len(got.attribution)} attributions, {len(got.k_sweeps.recommendations)} k sweep recommendations "
          f"-> {', '.join(str(p) for p in written)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return steps.main("decide", __doc__, arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
