"""The on/off recommendation (specmatch.deciding.deployment.recommend): an undecided concurrency
runs by its own data (off: not shown to pay there), nothing is extrapolated above an undecided largest
concurrency, and an external endpoint's recommendation follows its verdicts like any server's.

The external case runs the `recommend` step on simulated cells whose truth is known: three endpoints
(engine external, flavor vllm, launched by no one here, so their launch records say max_batch 0): the
baseline, its twin (no speculation configured, drafts nothing) and one that drafts k=4 at 1.3x up to 4
running requests and 0.6x above (specmatch.calibration.harness: EXT_TRUTH in the discrete-event server).
It was told "keep speculation on at every batch size" with no schedule, and "it pays at " with nothing
after "at"."""
import json
import math
import re

import numpy as np
import pytest

from builders import launch_record
from specmatch.calibration import harness as cal
from specmatch.deciding.comparison import Comparison
from specmatch.deciding.deployment import ServerInfo, recommend, server_k, validate_schedule
from specmatch.deciding.measurements import Settings
from specmatch.deciding.recommend import main as recommend_main
from specmatch.files import write_json
from specmatch.records import Decision, Recommendation, Verdict

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


def on_at(rec, k: int = 3) -> dict:
    spec = {"num_speculative_tokens": k, "num_speculative_tokens_per_batch_size": rec.vllm_schedule}
    return {b: server_k(spec, b) > 0 for b in range(1, (rec.max_batch or 1) + 1)}


def test_speculation_never_spreads_over_an_undecided_concurrency_nor_above_an_undecided_top():
    """Pays at c=1, undecided at c=16 with an estimate above 1: "keep speculation on at every batch size"
    (c=1's on spread over c=16 and was extrapolated to 256). Now c=16 runs off (not shown to pay there),
    the switch sits at the geometric mean (the measured speedup never crosses 1), and above c=16 speculation
    is off, said so, not extrapolated."""
    rec = recommend(VLLM, "s", *verdicts({1: (1.5, Decision.PAYS), 16: (1.1, Decision.INCONCLUSIVE)}), S)
    assert rec.action == "schedule" and rec.vllm_schedule == [[1, 3, 3], [4, 256, 0]], rec.text
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
    engines = {"base": cal.BASE, "twin": cal.BASE, "spec": cal.calibrated(4, cal.EXT_TRUTH, step_at=4)}
    work = [cal.Workload.draw(rng, ("s",), cal.K_PROMPTS, out_tokens=cal.K_OUT_TOKENS)]
    eff = [cal.run_to_run(rng, cal.SCENARIOS["quiet"], list(engines), ("s",), cal.EXT_CONCURRENCIES, 3)]
    cells = cal.simulate_cells(rng, work, engines, eff, 3, cal.EXT_CONCURRENCIES, cal.K_OUT_TOKENS)[0]
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
    validate_schedule(rec.vllm_schedule)
    spec = {"num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": rec.vllm_schedule}
    ks = [server_k(spec, b) for b in range(1, 17)]
    assert ks[:4] == [4] * 4 and ks[15] == 0, rec.vllm_schedule
    switch = ks.index(0) + 1
    assert all(k == 4 for k in ks[:switch - 1]) and not any(ks[switch - 1:])
    assert cross.lo <= switch <= math.ceil(cross.hi), (switch, cross)
    assert "k=4: the endpoint's draft counters" in rec.text
    assert rec.verified is not None and rec.verified.outcome.value == "not verifiable"
    assert not EMPTY.search(rec.text), rec.text    # no label with an empty list after it
    # vLLM's own validation and lookup of the schedule (where the vLLM build is installed)
    utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    parsed = utils.validate_and_normalize_dynamic_sd_schedule(rec.vllm_schedule)
    assert [list(x) for x in parsed] == rec.vllm_schedule
    dense = utils.build_dynamic_sd_schedule_lookup(rec.vllm_schedule, vllm_max_batch_size=64,
                                                  vllm_num_speculative_tokens=4)
    assert dense[1:17] == ks and set(dense[17:]) == {0}   # vLLM carries the last (off) range to its max batch


def test_a_configured_max_batch_is_the_endpoints_batch_range(run_dir):
    [rec] = recommend_step(run_dir, servers(max_batch=64))
    assert rec.max_batch == 64 and rec.extrapolated_above == 16 and "17-64 were not measured" in rec.text
    assert rec.vllm_schedule[-1][1:] == [64, 0] and "set `max_batch`" not in rec.text

