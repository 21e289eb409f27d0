"""The on/off recommendation (specmatch.deciding.recommending.deployment.recommend): an undecided concurrency
runs by its own data (off: not shown to pay there), nothing is extrapolated above an undecided largest
concurrency, and an external endpoint's recommendation follows its verdicts like any server's.

The external case runs the `recommend` step on simulated cells whose truth is known: three endpoints
(engine external, flavor vllm, launched by no one here, so their launch records say max_batch 0): the
baseline, its twin (no speculation configured, drafts nothing) and one that drafts k=4 at 1.3x up to 4
running requests and 0.6x above (specmatch.calibration.external: EXT_TRUTH in the discrete-event server).
It was told "keep speculation on at every batch size" with no schedule, and "it pays at " with nothing
after "at"."""
import json
import math
import re

import numpy as np
import pytest

from builders import launch_record
from specmatch.calibration import external, grid, ksweeps, scenarios, workload
from specmatch.deciding.verdicts.comparison import Comparison
from specmatch.deciding.recommending.deployment import ServerInfo, recommend
from specmatch.deciding.reading.measurements import Settings
from specmatch.deciding.recommend import main as recommend_main
from specmatch.files import write_json
from specmatch.records import Decision, Recommendation, Verdict
from specmatch.serving.engines.vllm import SCHEDULE, server_k, validate_schedule

S = Settings(bootstrap=400)
VLLM = ServerInfo("spec", "vllm", "vllm", {"method": "eagle3", "model": "d", "num_speculative_tokens": 3}, 256)
EMPTY = re.compile(r"\bat\s*(?:$|[;,.()])")   # a label ("pays at") with nothing after it


def verdicts(shape: dict, server="spec", suite="s"):
    """Verdicts and comparisons from {concurrency: (speedup, Decision)} (interval half-width 5%)."""
    vs, cmps = [], []
    for c, (sp, d) in sorted(shape.items()):
        vs.append(Verdict(server, suite, c, "output_throughput", d, sp, sp * 0.95, sp * 1.05, 0.9, 2))
        cmps.append(Comparison(server, "baseline", suite, c, "output_throughput", [math.log(sp)] * 2, [1e-4] * 2,
                               math.log(sp), 0.02, 30.0, True))
    return vs, cmps


def on_at(rec) -> dict:
    """Where the deployment vLLM runs speculates (its rendered speculative config, through vLLM's rules)."""
    return {b: server_k(rec.deploy.speculative, b) > 0 for b in range(1, (rec.max_batch or 1) + 1)}


def test_speculation_never_spreads_over_an_undecided_concurrency_nor_above_an_undecided_top():
    """Pays at c=1, undecided at c=16 with an estimate above 1: "keep speculation on at every batch size"
    (c=1's on spread over c=16 and was extrapolated to 256). Now c=16 runs off (not shown to pay there),
    the switch sits at the geometric mean (the measured speedup never crosses 1), and above c=16 speculation
    is off, said so, not extrapolated."""
    rec = recommend(VLLM, "s", *verdicts({1: (1.5, Decision.PAYS), 16: (1.1, Decision.INCONCLUSIVE)}), S)
    assert rec.action == "schedule" and rec.schedule.bands == [[1, 3, 3], [4, 256, 0]], rec.text
    assert rec.deploy.speculative[SCHEDULE] == rec.schedule.bands and rec.deploy.engine == "vllm"
    assert "undecided at c=16: off there, not shown to pay" in rec.text
    assert "(the largest measured concurrency is 16, undecided): speculation is off there" in rec.text
    assert "extends" not in rec.text and rec.extrapolated_above == 16
    # a decided top still extends (flagged); an undecided bottom runs off below it too
    rec = recommend(VLLM, "s", *verdicts({4: (0.97, Decision.INCONCLUSIVE), 16: (1.3, Decision.PAYS)}), S)
    on = on_at(rec)
    assert not any(on[b] for b in range(1, 5)) and all(on[b] for b in range(8, 257))
    assert "there it extends the verdict at c=16, an extrapolation" in rec.text
    for shape in ({1: (1.4, Decision.PAYS)}, {1: (0.7, Decision.LOSES), 4: (1.0, Decision.EQUIVALENT)},
                  {1: (1.3, Decision.PAYS), 4: (1.0, Decision.INCONCLUSIVE), 16: (0.7, Decision.LOSES)}):
        rec = recommend(VLLM, "s", *verdicts(shape), S)
        assert not EMPTY.search(rec.text), rec.text

ENDPOINTS = {"base": "http://10.0.0.1:8000", "twin": "http://10.0.0.2:8000", "spec": "http://10.0.0.3:8000"}


def servers(max_batch: int | None = None) -> dict:
    out = {n: {"engine": "external", "base_url": url, "flavor": "vllm"} for n, url in ENDPOINTS.items()}
    if max_batch:
        out["spec"]["max_batch"] = max_batch
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """The endpoints' cells (c = 1, 4, 16; 3 repeats; 16 prompts, 24 output tokens; run to run 1.5%) and
    launch records written as the workflow writes them."""
    d = tmp_path_factory.mktemp("ext")
    rng = np.random.default_rng(34)
    engines = {"base": grid.BASE, "twin": grid.BASE, "spec": ksweeps.calibrated(4, external.EXT_TRUTH, step_at=4)}
    work = [workload.Workload.draw(rng, ("s",), ksweeps.K_PROMPTS, out_tokens=ksweeps.K_OUT_TOKENS)]
    eff = [scenarios.run_to_run(rng, scenarios.SCENARIOS["quiet"], list(engines), ("s",), external.EXT_CONCURRENCIES, 3)]
    cells = workload.simulate_cells(rng, work, engines, eff, 3, external.EXT_CONCURRENCIES, ksweeps.K_OUT_TOKENS)[0]
    paths = {"cells": [], "requests": [], "launches": []}
    for res, req in cells:
        stem = d / "cells" / res.server / res.suite / f"r{res.repeat}" / f"c{res.concurrency}"
        stem.parent.mkdir(parents=True, exist_ok=True)
        write_json(stem.with_suffix(".json"), res.to_json())
        req.write_parquet(stem.with_suffix(".requests.parquet"))
        paths["cells"].append(str(stem.with_suffix(".json")))
        paths["requests"].append(str(stem.with_suffix(".requests.parquet")))
    for name, cfg in servers().items():
        for r in (1, 2, 3):
            p = d / "servers" / name / f"r{r}" / "launch.json"
            p.parent.mkdir(parents=True, exist_ok=True)
            write_json(p, launch_record(name, None, engine="external", max_batch=0, config=cfg, repeat=r).to_json())
            paths["launches"].append(str(p))
    return d, paths


def recommend_step(run_dir, cfg: dict) -> list[Recommendation]:
    d, paths = run_dir
    out = d / f"rec-{len(list(d.glob('rec-*')))}"
    out.mkdir()
    argv = ["--baseline", "base", "--settings", json.dumps({"bootstrap": 300, "repeats": 3}),
            "--servers", json.dumps(cfg), "--cells", *paths["cells"], "--requests", *paths["requests"],
            "--launches", *paths["launches"], "--suites", "s", "--out", str(out / "servers.json"),
            "--recommendations", str(out / "recommendations.json"), "--k-schedules", str(out / "k.json")]
    assert recommend_main(argv) == 0
    assert json.loads((out / "servers.json").read_text())["servers"] == {}   # nothing restarts an endpoint
    return [Recommendation.from_json(x) for x in json.loads((out / "recommendations.json").read_text())]


@pytest.mark.slow
def test_an_endpoint_that_pays_at_low_load_gets_a_schedule_that_drafts_below_the_crossover(run_dir):
    recs = recommend_step(run_dir, servers())
    # the twin configures no speculation and drafts nothing: no speculation recommendation at all
    assert [r.server for r in recs] == ["spec"]
    [rec] = recs
    assert [(x.verdict.value, x.first, x.last) for x in rec.regions] == [("pays", 1, 4), ("loses", 16, 16)]
    cross = rec.crossover
    assert cross is not None and 4 < cross.point < 16
    # the batch range is the measured concurrencies' (the endpoint's own is not known), said so
    assert rec.max_batch == 16 and rec.extrapolated_above is None and "set `max_batch` on it" in rec.text
    assert rec.action == "schedule" and not rec.as_configured
    sched = rec.deploy.speculative[SCHEDULE]   # rendered for the engine behind the endpoint (its flavor)
    validate_schedule(sched)
    assert rec.deploy.speculative["num_speculative_tokens"] == 4 and "--speculative-config" in rec.deploy.flag
    ks = [server_k(rec.deploy.speculative, b) for b in range(1, 17)]
    assert ks[:4] == [4] * 4 and ks[15] == 0 and ks == rec.schedule.ks(), sched
    switch = ks.index(0) + 1
    assert all(k == 4 for k in ks[:switch - 1]) and not any(ks[switch - 1:])
    assert cross.lo <= switch <= math.ceil(cross.hi), (switch, cross)
    assert "k=4: the endpoint's draft counters" in rec.text
    assert rec.verified is not None and rec.verified.outcome.value == "not verifiable"
    assert not EMPTY.search(rec.text), rec.text    # no label with an empty list after it
    # vLLM's own validation and lookup of the schedule (where the vLLM build is installed)
    utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    parsed = utils.validate_and_normalize_dynamic_sd_schedule(sched)
    assert [list(x) for x in parsed] == sched
    dense = utils.build_dynamic_sd_schedule_lookup(sched, vllm_max_batch_size=64,
                                                  vllm_num_speculative_tokens=4)
    assert dense[1:17] == ks and set(dense[17:]) == {0}   # vLLM carries the last (off) range to its max batch


@pytest.mark.slow
def test_a_configured_max_batch_is_the_endpoints_batch_range(run_dir):
    [rec] = recommend_step(run_dir, servers(max_batch=64))
    assert rec.max_batch == 64 and rec.extrapolated_above == 16 and "17-64 were not measured" in rec.text
    assert rec.schedule.bands[-1][1:] == [64, 0] and "set `max_batch`" not in rec.text
    assert rec.deploy.speculative[SCHEDULE] == rec.schedule.bands



def test_the_schedule_is_engine_neutral_and_each_engine_renders_it():
    """The deciding stage's schedule names k per batch band only; vLLM's and SGLang's adapters render the
    same schedule in their own terms, and an external endpoint's for the engine behind it."""
    from specmatch.records import Schedule
    from specmatch.serving.engines import get_engine

    sched = Schedule.of([3] * 4 + [0] * 12)
    assert sched.bands == [[1, 4, 3], [5, 16, 0]] and sched.max_batch == 16 and sched.top == 3
    assert (sched.k_at(4), sched.k_at(5), sched.k_at(17)) == (3, 0, None) and sched.ks() == [3] * 4 + [0] * 12
    for bad in ([[2, 16, 3]], [[1, 4, 3], [6, 16, 0]], [[1, 4, -1], [5, 16, 0]], [[1, 8, 3]]):
        with pytest.raises(ValueError):
            Schedule(bad, 16)
    spec = {"method": "eagle3", "model": "d", "num_speculative_tokens": 3}
    v = get_engine({"engine": "vllm"}).render(sched, spec)
    assert v.speculative == {**spec, SCHEDULE: [[1, 4, 3], [5, 16, 0]]}
    assert v.flag == f"vLLM: `--speculative-config '{json.dumps(v.speculative, sort_keys=True)}'`"
    assert get_engine({"engine": "vllm"}).render(sched, spec, new=False).flag is None   # the server as configured
    assert get_engine({"engine": "vllm"}).render(Schedule.of([0] * 16), spec).speculative is None   # the baseline
    g = get_engine({"engine": "sglang"}).render(sched, {"method": "eagle3", "model": "d"}, "0.5.23")
    assert g.engine == "sglang" and g.files == {"adaptive": {"1": {"candidate_steps": [3]}, "5": {"candidate_steps": [0]}}}
    assert g.speculative["num_steps"] == 3 and g.speculative["num_draft_tokens"] == 4 and g.speculative["adaptive"]
    ext = get_engine({"engine": "external", "flavor": "vllm"}).render(sched, spec)
    assert ext == v   # rendered for the engine behind the endpoint
    assert get_engine({"engine": "external", "flavor": "openai"}).render(sched, spec) is None   # no engine named
    # the k a block names, for a caller that does not know its engine: no engine's default assumed
    from specmatch.deciding.recommending.deployment import own_k
    assert (own_k(spec), own_k({"method": "ngram"}), own_k({"method": "eagle3", "num_steps": 5}), own_k({})) == (3, 0, 5, 0)
    assert get_engine({"engine": "sglang"}).own_k({"method": "eagle3"}) == 3   # SGLang's own default, where it drafts


def test_a_recommendation_file_that_names_only_vllms_schedule_reads_and_is_rendered_again():
    """recommendations.json of the recommend step as it names the bands by vLLM's schedule: the decide step
    reads the bands as the schedule and has the server's adapter render it, as recommend() does."""
    from specmatch.deciding.recommending.deployment import rendered

    rec = recommend(VLLM, "s", *verdicts({1: (1.5, Decision.PAYS), 16: (0.7, Decision.LOSES)}), S)
    old = {k: v for k, v in rec.to_json().items() if k not in ("schedule", "deploy")}
    old.update(vllm_schedule=rec.schedule.bands, sglang=None)
    back = rendered(Recommendation.from_json(old), VLLM)
    assert back.schedule == rec.schedule and back.deploy == rec.deploy
