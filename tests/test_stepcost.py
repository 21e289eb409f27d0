"""The step-cost map against a discrete-event server whose step cost and acceptance are known
(specmatch.calibration.stepcost): the map and its predictions recover the truth within their intervals at
measured and unmeasured concurrencies, coverage by simulation, the check catches a wrong map, and the
recommendation uses the map's predictions only where it holds."""
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from builders import REPO, coverage_gate, vllm_installed

from specmatch.calibration import stepcost as cal
from specmatch.calibration.des import serve
from specmatch.calibration.traffic import traffic_cells, traffic_profiles
from specmatch.config import validate
from specmatch.deciding.analysis import map_beyond, map_predictions
from specmatch.deciding.predicting.stepcost import build_map, requests_of
from specmatch.deciding.predicting.stepcost.map import map_cells
from specmatch.deciding.predicting.traffic.step_model import Scheduler, fit_step_model, simulate
from specmatch.deciding.reading.measurements import Measurements, Settings
from specmatch.deciding.recommending.deployment import ServerInfo, recommend
from specmatch.files import SpecmatchError
from specmatch.pipeline import map_keys
from specmatch.records import Decision, StepCosts, Verdict
from specmatch.serving.engines import get_engine


def one_map(seed=1, rho=lambda b: 1.4, fit=(1, 2, 4, 8, 16), check=(4,)):
    cells = traffic_cells(seed, {"basis": cal.COUNTS}, fit, rho=rho, min_requests_per_worker=cal.REQUESTS_PER_WORKER)
    s = Settings(bootstrap=200)
    m = Measurements.of(cells, s)
    return build_map(m, requests_of(m), "spec", "base", "basis", ["basis"], list(fit), list(check), 64, "sim", s)


@pytest.mark.slow
def test_the_map_recovers_a_known_step_cost_and_says_where_it_extrapolates():
    mp = one_map()
    assert mp.fit == [1, 2, 8, 16] and mp.checks == [4] and mp.repeats == 2
    errors = [math.log(p.rho.value / 1.4) for p in mp.break_even if p.batch <= 16]
    assert len(errors) == 5 and max(map(abs, errors)) < 0.1   # within 10%; the intervals' coverage: the next test
    assert all(p.extrapolated == (p.batch > 16) for p in mp.break_even)
    width = {p.batch: math.log(p.rho.hi / p.rho.lo) for p in mp.break_even}
    # beyond the fitted batches the fit's uncertainty is carried (slowly where its curvature sits at 0: a limit)
    assert width[64] > width[16]
    # the simulated engine's step cost does not depend on what a request accepts
    assert mp.tau_slope is not None and mp.tau_moves is False
    # every stratum's tau from its own prompts; agentic rows accept most
    taus = {s.stratum: s.tau for s in mp.strata}
    assert set(taus) == {"agent", "code", "chat"} and taus["agent"].value > taus["chat"].value
    roles = {(p.concurrency, p.metric): p for p in mp.predictions}
    check = roles[(4, "output_throughput")]
    assert check.role == "check" and check.measured is not None and check.agrees is True
    assert roles[(32, "output_throughput")].role == "predicted" and roles[(32, "tpot")].measured is None
    assert mp.holds is True


def covers(v: dict, n: int) -> bool:
    """A 90% interval's coverage over n experiments at nominal within 3 Monte-Carlo errors (binomial at 90%)."""
    return v["coverage"] >= coverage_gate(n)


COVERAGE_N = 40   # experiments per world: coverage must reach 0.76 (the audit's defect covered 0.55)


@pytest.mark.slow   # about 1-2 CPU-minutes per world
@pytest.mark.parametrize("rho, world", [("flat", "plain"), ("rising", "long")])
def test_coverage_of_the_map_and_its_predictions_by_simulation(rho, world):
    """90% intervals against the truth, COVERAGE_N experiments: rho at measured and unmeasured batch
    sizes, and the throughput speedup at the concurrency held out of the fit (4), a fitted one (16) and
    one beyond the map (32) cover at nominal within three Monte-Carlo errors, and inside the fitted
    batches the intervals are not a blanket. Beyond them (rho at 64, 4x the largest) the extrapolation's
    uncertainty is carried by a wider interval. The map is called wrong where it is right in at most
    about the nominal 10% (the family's test over every measured concurrency), and rho is called to move
    with tau where it does not in about the nominal 10%. `long`: prompts longer than its 256-token budget,
    with a prefix cache (the audit's world: throughput at 32 covered 0.55 while the discrete-event server
    read rho at a batch that counted prompts waiting for chunks). The figures of every world (`rising`
    and `chunked` too, 200 experiments each) are docs/methods/step-cost.md's, from
    `python -m specmatch stepcost_coverage`. Shown to fail (`bench/gate_defects.py stepcost`, 7 Dec 2026):
    with the map's variance a quarter of what it is (StepMap.part scaled by 0.25: intervals half as wide) rho covered 0.675-0.75 against the
    gate's 0.758 in both worlds; at half its variance it covered 0.78-0.85 and passed (at 40 experiments the
    gate catches a true coverage near 0.70, not 0.80), and the throughput rows, whose intervals are mostly
    the suite's own noise, did not move."""
    n = COVERAGE_N
    got = cal.coverage(n, rho, world=world, truth_suites=100)
    for key in [("rho", 1), ("rho", 4), ("rho", 16), ("throughput", 4), ("throughput", 16), ("throughput", 32)]:
        v = got[key]
        assert covers(v, n), (key, v)
        assert abs(v["bias"]) < 0.05, (key, v)
    assert got[("rho", 64)]["coverage"] >= 0.9 - 4 * math.sqrt(0.09 / n), got[("rho", 64)]
    assert got[("rho", 4)]["width"] < 0.3 and got[("rho", 16)]["width"] < 0.3
    assert got[("rho", 64)]["width"] > 2 * got[("rho", 16)]["width"]
    assert covers(got[("map holds", 0)], n)
    assert got[("rho moves with tau", 0)]["coverage"] <= 0.1 + 3 * math.sqrt(0.09 / n)


@pytest.mark.slow
def test_a_map_whose_form_is_wrong_is_caught_at_its_check_and_the_recommendation_falls_back():
    """A step cost with a knee the map's smooth form cannot follow (cheap up to batch 2, dear from 4 on),
    fitted on 1, 2, 8, 16: the prediction at the held-out c=4 misses the measured cells, the record says
    so, and map_predictions gives the recommendation nothing from it."""
    knee = lambda b: 1.15 if b <= 2 else 2.6  # noqa: E731
    misses = 0
    for seed in range(6):
        mp = one_map(seed=seed + 40, rho=knee)
        if mp.holds is False:
            misses += 1
            pred, note = map_predictions(StepCosts([mp]), "spec", "basis", "output_throughput")
            assert pred == {} and note is None
    assert misses >= 4


def verdict(c, d, value):
    return Verdict(server="eagle3", suite="u", concurrency=c, metric="output_throughput", verdict=d, speedup=value,
                   lo=value * 0.9, hi=value * 1.1, confidence=0.9, repeats=2)


def test_the_recommendation_takes_the_maps_verdicts_where_the_grid_has_no_cell():
    info = ServerInfo("eagle3", "vllm", "vllm", {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3},
                      64)
    vs = [verdict(1, Decision.PAYS, 1.3), verdict(16, Decision.PAYS, 1.1)]
    s = Settings()
    plain = recommend(info, "u", vs, [], s)
    assert plain.extrapolated_above == 16 and "extrapolation" in plain.text and plain.action == "keep"
    pred = {2: Decision.PAYS, 4: Decision.PAYS, 8: Decision.PAYS, 32: Decision.LOSES, 64: Decision.LOSES}
    got = recommend(info, "u", vs, [], s, pred, "the map agrees with the cells at c=4")
    assert got.action == "schedule" and got.extrapolated_above is None
    on = got.schedule.ks()
    assert on[0] == 3 and on[15] == 3 and on[31] == 0 and on[63] == 0
    assert got.predicted == {2: "pays", 4: "pays", 8: "pays", 32: "loses", 64: "loses"}
    assert "predicted, not measured" in got.text and "c=32,64" in got.text and "agrees with the cells" in got.text
    # a measured verdict always decides its own concurrency
    assert recommend(info, "u", vs, [], s, {16: Decision.LOSES}).predicted == {}
    # predicted only within the map's fitted batches: above them the last verdict extends, flagged
    inside = recommend(info, "u", vs, [], s, {2: Decision.PAYS, 4: Decision.PAYS, 8: Decision.PAYS})
    assert inside.extrapolated_above == 16 and "extrapolation" in inside.text and inside.predicted


def test_above_the_fitted_batches_the_maps_extrapolation_decides_where_its_interval_does():
    """A server that pays up to c=16 (measured and predicted inside the map's fit, 1-16) and runs batches up
    to 256: the map's extrapolation loses at 32 (2x the fit, as far as it may decide: records.REACH) and
    its predictions above 32 decide nothing, so 64-256 are not known, off there, with the map cells that
    would tell (one held out above the grid to check them); nothing extends the verdict at c=16. From the
    first batch size the extrapolation cannot decide, nothing above it is decided either. Without a map the
    extension is flagged and the map cells named."""
    from specmatch.deciding.recommending.deployment import MapBeyond
    from specmatch.records import Interval, Recommendation, StepCostPrediction

    def at(c, value, lo, hi, decision):   # the map's prediction at c, above its fitted batches
        return StepCostPrediction("u", c, "output_throughput", Interval(value, lo, hi), decision, 8.0, extrapolated=True)

    info = ServerInfo("eagle3", "vllm", "vllm", {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3},
                      256)
    vs = [verdict(1, Decision.PAYS, 1.3), verdict(16, Decision.PAYS, 1.1)]
    s = Settings()
    pred = {2: Decision.PAYS, 4: Decision.PAYS, 8: Decision.PAYS}
    beyond = MapBeyond({32: at(32, 0.8, 0.7, 0.9, Decision.LOSES),
                        64: at(64, 0.7, 0.5, 0.98, Decision.LOSES),
                        128: at(128, 0.6, 0.3, 1.2, Decision.INCONCLUSIVE),
                        256: at(256, 0.5, 0.1, 2.5, Decision.INCONCLUSIVE)}, [1, 2, 8, 16], [4])
    assert beyond.reach == 32
    got = recommend(info, "u", vs, [], s, pred, "the map agrees with the cells at c=4", beyond)
    assert got.action == "schedule" and got.extrapolated_above is None and "extends the verdict" not in got.text
    ks = got.schedule.ks()
    assert ks[15] == 3 and ks[31] == 0 and ks[63] == 0 and ks[127] == 0 and ks[255] == 0
    assert got.not_known == [64, 128, 256] and sorted(got.beyond_map) == ["128", "256", "32", "64"]
    assert got.measure_there == "step_cost: {concurrency: [1, 2, 4, 8, 16, 64, 128], check: [4, 64]}"
    assert "decides (predicted, not measured): loses at c=32 (0.80 [0.70, 0.90])" in got.text
    assert ("not known at c=64,128,256 (above c=32 (2x its largest fitted batch) its extrapolation decides nothing: "
            "its intervals no longer hold their level there), so speculation is off there") in got.text
    assert Recommendation.from_json(json.loads(json.dumps(got.to_json()))).beyond_map == got.beyond_map
    # where the extrapolation pays, speculation is on as far as it may decide, and off above
    pays = MapBeyond({c: at(c, 1.2, 1.1, 1.3, Decision.PAYS) for c in (32, 64, 128, 256)},
                     [1, 2, 8, 16], [4])
    kept = recommend(info, "u", vs, [], s, pred, "note", pays)
    assert kept.action == "schedule" and kept.not_known == [64, 128, 256] and kept.schedule.ks()[31] == 3
    assert kept.schedule.ks()[63] == 0 and "pays at c=32 (1.20 [1.10, 1.30])" in kept.text
    # nothing above the first batch size it cannot decide is decided: no switching back on far out
    gap = MapBeyond({24: at(24, 1.0, 0.8, 1.3, Decision.INCONCLUSIVE),
                     32: at(32, 1.3, 1.1, 1.5, Decision.PAYS)}, [1, 2, 8, 16], [4])
    got = recommend(info, "u", vs, [], s, pred, "note", gap)
    assert got.not_known == [24, 32] and got.schedule.ks()[31] == 0 and got.schedule.ks()[255] == 0
    assert "at c=24 the interval of the step-cost map's extrapolation" in got.text
    assert "at c=32, above c=24, its prediction is not taken" in got.text
    # an interval the map's error leaves open on one side still decides, written so
    open_top = MapBeyond({32: at(32, 1.5, 1.2, None, Decision.PAYS)}, [1, 2, 8, 16], [4])
    assert "pays at c=32 (1.50 [1.20, ∞])" in recommend(info, "u", vs, [], s, pred, "note", open_top).text
    # no checked map: the last verdict extends, said so, with the map cells that would tell
    plain = recommend(info, "u", vs, [], s)
    assert "there it extends the verdict at c=16, an extrapolation" in plain.text
    assert "no step-cost map that holds at its check predicts there" in plain.text
    assert "`step_cost: {concurrency: [32, 64], check: [32]}`" in plain.text


@pytest.mark.slow
def test_only_a_checked_map_that_holds_decides_and_never_beyond_its_fitted_batches():
    mp = one_map()
    assert mp.holds is True
    pred, note = map_predictions(StepCosts([mp]), "spec", "basis", "output_throughput")
    assert set(pred) == {1, 2, 4, 8, 16} and "c=4, measured only to check it" in note
    unchecked = one_map(check=())
    assert unchecked.holds is None
    assert map_predictions(StepCosts([unchecked]), "spec", "basis", "output_throughput") == ({}, None)
    # above the fitted batches: the map's extrapolation, its interval wider the farther it goes
    beyond = map_beyond(StepCosts([mp]), "spec", "basis", "output_throughput")
    assert sorted(beyond.predictions) == [32, 64] and beyond.fit == [1, 2, 8, 16] and beyond.checks == [4]
    width = {c: math.log(p.predicted.hi / p.predicted.lo) for c, p in beyond.predictions.items()}
    inside = next(p.predicted for p in mp.predictions
                  if (p.suite, p.metric, p.concurrency) == ("basis", "output_throughput", 16))
    assert min(width.values()) > math.log(inside.hi / inside.lo) > 0
    assert map_beyond(StepCosts([unchecked]), "spec", "basis", "output_throughput") is None


@pytest.mark.slow
def test_map_cells_and_their_config():
    raw = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg = validate({**raw, "step_cost": {"concurrency": [2, 4, 16], "check": [4]}})
    keys = map_keys(cfg, ["baseline", "eagle3"], 2)
    # the verdict grid's 16 adds nothing; the map suite is the first recommendation suite
    assert sorted({k[3] for k in keys}) == [2, 4] and {k[1] for k in keys} == {"train_holdout"} and len(keys) == 8
    assert map_keys(validate({**raw, "step_cost": {}}), ["baseline"], 2) == []
    with pytest.raises(SpecmatchError, match="step_cost.check: \\[8\\] not in step_cost.concurrency"):
        validate({**raw, "step_cost": {"concurrency": [4], "check": [8]}})
    with pytest.raises(SpecmatchError, match="also in concurrency"):
        validate({**raw, "step_cost": {"concurrency": [16], "check": [16]}})
    with pytest.raises(SpecmatchError, match="step_cost.suite: 'w' is not a suite"):
        validate({**raw, "step_cost": {"suite": "w"}})


def test_forced_acceptance_is_the_engines_own_and_the_cpu_build_refuses_it():
    gpu = get_engine({"engine": "vllm", "model": "/m", "profile": "gpu"}).forced_acceptance(2.5)
    assert gpu[0] == {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5}
    keys, why = get_engine({"engine": "vllm", "model": "/m", "profile": "cpu"}).forced_acceptance()
    assert keys is None and "CPU build" in why
    keys, _ = get_engine({"engine": "sglang", "model": "/m"}).forced_acceptance(2.0)
    assert keys == {"env": {"SGLANG_SIMULATE_ACC_LEN": "2.0", "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token"}}
    assert get_engine({"engine": "external", "base_url": "http://x"}).forced_acceptance()[0] is None


@pytest.mark.slow
def test_the_summary_section_states_the_check_the_break_even_and_what_was_not_mapped(tmp_path):
    from specmatch.reporting import stepcost as render

    mp = one_map()
    sc = StepCosts([mp], skipped={"eagle3__sched": "its batch-size schedule runs plain steps at some batch sizes"})
    text = "\n".join(render.lines(sc))
    assert "**The map holds** at the concurrency measured only to check it (c=4 throughput: measured" in text
    assert "| 64* |" in text and "agent 3.07" in text and "does not detectably move with τ" in text
    assert "| `basis` | 4 (check) |" in text and "`eagle3__sched`: no step-cost map" in text
    assert [p.name for p in render.plot(sc, tmp_path)] == ["break_even.png"]
    assert "above them, up to 2x the largest fitted batch, where their intervals decide" in text
    assert "Measured while the machine was busy" not in text
    # a check measured on a busy machine says so (the summary's flagged map cells, by server and concurrency)
    busy = "\n".join(render.lines(sc, {("spec", 4): ["spec r1"], ("base", 4): ["base r2"], ("other", 8): ["other r1"]}))
    assert "**Measured while the machine was busy** (flagged cells, see \"Machine quietness\"): c=4 (check): " \
           "base r2, spec r1." in busy
    bad = one_map(seed=41, rho=lambda b: 1.15 if b <= 2 else 2.6)
    assert bad.holds is False and "**The map misses**" in "\n".join(render.lines(StepCosts([bad])))


def test_the_fit_is_its_own_fixed_point_so_the_jacobian_measures_the_data_not_the_iterations():
    """The batch features T is fitted on depend on T; the fit iterates to its fixed point, and a refit that
    starts there with the same data and its bounds held returns it (the error's Jacobian is then the
    data's effect alone); moving one concurrency's cells 2% moves the map smoothly."""
    from specmatch.deciding.predicting.stepcost.map import H, _slower, fit_model, map_cells

    cells = traffic_cells(3, {"basis": cal.COUNTS}, (1, 2, 8, 16), rho=lambda b: 1.4,
                          min_requests_per_worker=cal.REQUESTS_PER_WORKER)
    m = Measurements.of(cells, Settings(bootstrap=50))
    for x in ("spec", "base"):
        got = map_cells(requests_of(m), x, ["basis"], [1, 2, 8, 16])
        md = fit_model(got, x == "spec")
        same = fit_model(got, x == "spec", md)
        assert np.allclose(same.theta, md.theta, rtol=1e-5, atol=1e-10)
        moved = fit_model([_slower(cr, H) if cr.concurrency == 16 else cr for cr in got], x == "spec", md)
        ratio = [moved.step(b, 250) / md.step(b, 250) for b in (1, 4, 16)]
        assert all(0.97 < r < 1.05 for r in ratio), ratio


@pytest.mark.slow
def test_a_refit_that_extrapolates_below_zero_widens_the_map_instead_of_failing():
    """The Jacobian's refits have coefficients free in sign; far beyond the fitted batches one can give
    a step cost below zero (seen on a two-concurrency fit in CI). The map's error there is its relative
    move, so the interval is unbounded, never a crash."""
    from specmatch.deciding.predicting.stepcost.map import Model

    mp_cells = traffic_cells(2, {"basis": cal.COUNTS}, (1, 2, 4), rho=lambda b: 1.4,
                             min_requests_per_worker=cal.REQUESTS_PER_WORKER)
    m = Measurements.of(mp_cells, Settings(bootstrap=50))
    from specmatch.deciding.predicting.stepcost.map import fit_map

    sm = fit_map(requests_of(m), m, "spec", "base", "basis", ["basis"], [1, 2, 4])
    ok = sm.rho(256, 300, 0.9)
    assert ok.lo is not None and ok.hi is not None
    theta = sm.models["spec"].theta.copy()
    theta[4] = -abs(theta[1]) / 50          # a refit whose curvature turns the step negative far out
    sm.moved[("spec", 4)] = Model(theta, 1.0)
    assert sm.models["spec"].step(256, 300) > 0 > sm.moved[("spec", 4)].step(256, 300)
    far = sm.rho(256, 300, 0.9)
    assert far.value == pytest.approx(ok.value) and (far.hi is None or far.hi > 1e3 * ok.hi)
    near = sm.rho(2, 300, 0.9)   # within the fitted batches the refit is still close
    assert near.lo is not None and near.hi is not None


# -- what a step schedules: chunked prefill and the prefix cache ---------------------------------------------
THETA = np.array([0.04, 0.002, 0.003, 0.9])


def test_a_chunked_step_prefills_what_the_decodes_leave_first_come_first_served():
    """Two requests of 300 prompt tokens at once under a budget of 200 tokens a step: the first takes two
    steps to its first token (200, then 100), the second's first chunk rides in the first's second step
    (the 100 left), its next in the third beside the first one's decode (199: the decode takes one), its
    last token in the fourth; unchunked both are prefilled in one step of 600 tokens."""
    one = np.array([[300.0, 300.0]])
    out, steps = np.array([[2.0, 2.0]]), np.array([[1.0, 1.0]])
    _, ttft, _ = simulate(THETA, 2, one, out, steps, sched=Scheduler(200, 1))
    step = lambda b, C, P: THETA[0] + THETA[1] * b + THETA[2] * C + THETA[3] * P  # noqa: E731
    t1 = t2 = step(0, 0, 0.2)
    t3, t4 = step(1, 0.301, 0.199), step(0, 0, 0.001)
    assert ttft[0, 0] == pytest.approx(t1 + t2) and ttft[0, 1] == pytest.approx(t1 + t2 + t3 + t4)
    _, ttft, _ = simulate(THETA, 2, one, out, steps)
    assert ttft[0, 0] == ttft[0, 1] == pytest.approx(step(0, 0, 0.6))
    # a speculative server's decodes take 1 + k tokens each of the budget
    _, ttft, _ = simulate(THETA, 2, np.array([[10.0, 300.0]]), out, np.array([[2.0, 1.0]]), sched=Scheduler(200, 4))
    assert ttft[0, 1] > ttft[0, 0]


def test_a_budget_no_prompt_reaches_replays_as_unchunked_and_cached_tokens_are_not_prefilled():
    rng = np.random.default_rng(3)
    ptok, out = rng.integers(10, 900, (3, 40)).astype(float), rng.integers(1, 60, (3, 40)).astype(float)
    steps = np.maximum(out - 1, 0) / rng.uniform(1, 3, (3, 40))
    for c in (1, 4, 16):
        a = simulate(THETA, c, ptok, out, steps)
        b = simulate(THETA, c, ptok, out, steps, sched=Scheduler(1e9, 4))
        assert all(np.allclose(x, y) for x, y in zip(a, b))
    # a prompt the prefix cache serves whole costs its admission step nothing for its prompt
    full = simulate(THETA, 1, ptok[:1], out[:1], steps[:1])[1]
    cached = simulate(THETA, 1, ptok[:1], out[:1], steps[:1], cached=ptok[:1])[1]
    assert np.allclose(cached, THETA[0] + THETA[1] * 0) and (full > cached).all()


def test_the_fit_recovers_a_chunked_engine_with_a_prefix_cache_that_an_unchunked_fit_cannot():
    """The discrete-event server scheduling as vLLM's V1 engine does (512 tokens a step, decodes first,
    prompts in chunks after them; a cell's later passes served their prompts from a prefix cache), without
    noise: fitted with the engine's budget and the cached tokens, T's coefficients come back (a step's
    fixed cost and a prompt token's within 2%), and the replay gives each request's first token at c = 16
    closer than the unchunked fit and replay do (on vLLM's CPU build, the embedded default's cells, the
    unchunked replay put first tokens at c = 16 at 3x their time)."""
    base, _, scheds = cal.engines("flat", "chunked")
    quiet = replace(base, jitter=0.0, hiccup_p=0.0)
    cells = traffic_cells(5001, {"basis": cal.COUNTS}, (1, 2, 8, 16), rho=cal.RHOS["flat"], min_requests_per_worker=2,
                          engine=quiet, cache_block=16, session_sd=0.0, cell_sd=0.0)
    m = Measurements.of(cells, Settings(bootstrap=50))
    crs = [cr for cr in map_cells(requests_of(m), "base", ["basis"], [1, 2, 8, 16])]
    assert any(cr.cached is not None and cr.cached.sum() > 0 for cr in crs)   # later passes hit the cache
    theta = fit_step_model(crs, 30, first_tokens_upto=1, sched=scheds["base"])
    assert theta[0] == pytest.approx(quiet.step_s, rel=0.02) and theta[3] == pytest.approx(quiet.prefill_s * 1000, rel=0.02)
    flat = fit_step_model(crs, 30, first_tokens_upto=1)
    for cr in crs:
        if cr.concurrency != 16:
            continue
        err = {}
        for name, th, sch in (("chunked", theta, scheds["base"]), ("unchunked", flat, Scheduler())):
            ttft = simulate(th, 16, cr.ptok, cr.out, cr.steps, cached=cr.cached, sched=sch)[1][0]
            err[name] = float(np.mean(np.abs(np.log(cr.ttft / ttft))))
        assert err["chunked"] < 0.05 and err["unchunked"] > 2 * err["chunked"], err


def test_the_engines_say_how_many_tokens_a_step_schedules():
    """vLLM: its args, else its API server's default on CPUs, read from the installed vLLM's own code where
    it is installed; on GPUs the default depends on the device, so the config must say; SGLang prefills in
    batches of their own; an external endpoint is not known."""
    cpu = get_engine({"engine": "vllm", "model": "/m", "gpus": 0})
    assert cpu.step_budget()[0] == 2048
    assert get_engine({"engine": "vllm", "model": "/m", "gpus": 0,
                       "args": ["--max-num-batched-tokens=4096"]}).step_budget()[0] == 4096
    assert get_engine({"engine": "vllm", "model": "/m", "gpus": 1,
                       "args": ["--max-num-batched-tokens", "8192"]}).step_budget()[0] == 8192
    budget, why = get_engine({"engine": "vllm", "model": "/m", "gpus": 1}).step_budget()
    assert budget is None and "--max-num-batched-tokens" in why
    assert get_engine({"engine": "sglang", "model": "/m"}).step_budget()[0] is None
    assert get_engine({"engine": "external", "base_url": "http://x"}).step_budget()[0] is None
    if vllm_installed():
        import importlib.util

        src = (Path(importlib.util.find_spec("vllm").origin).parent / "engine" / "arg_utils.py").read_text()
        cpu_block = src[src.index("if current_platform.is_cpu():"):]
        cpu_block = cpu_block[:cpu_block.index("return default_max_num_batched_tokens")]
        assert "UsageContext.OPENAI_API_SERVER: 2048 * world_size" in cpu_block


@pytest.mark.slow
def test_every_traffic_profile_is_predicted_from_the_map_at_every_load_and_a_missing_stratum_is_said():
    """Profiles from their strata's prompts (the basis suite's sources, the file suite `generic`) on the
    map's grid, up to its largest batch; the training mix agrees with the basis suite's own prediction
    (the same strata in about the same shares); a profile with a stratum nobody measured is not predicted,
    and says why. Coverage against the truth: test_the_profiles_predictions_cover_the_truth."""
    cells = traffic_cells(3, {"basis": cal.COUNTS, "generic": {"generic": 4}}, (1, 2, 4, 8, 16), rho=lambda b: 1.4,
                          min_requests_per_worker=cal.REQUESTS_PER_WORKER)
    s = Settings(bootstrap=200)
    m = Measurements.of(cells, s)
    profiles = traffic_profiles({"training_mix": {"agent": 4 / 14, "code": 6 / 14, "chat": 4 / 14},
                                 "generic_heavy": {"agent": 0.18, "code": 0.3, "chat": 0.12, "generic": 0.4},
                                 "unseen": {"agent": 0.5, "reasoning": 0.5}})
    mp = build_map(m, requests_of(m), "spec", "base", "basis", ["basis", "generic"], [1, 2, 4, 8, 16], [4], 64, "sim", s,
                   profiles=profiles)
    got = {(p.suite, p.concurrency, p.metric): p for p in mp.profiles}
    assert {c for (n, c, _) in got if n == "generic_heavy"} == {1, 2, 4, 8, 16, 32, 64}
    assert all(got[("generic_heavy", c, "output_throughput")].extrapolated == (c > 16) for c in (16, 32))
    suite = {(p.concurrency, p.metric): p for p in mp.predictions if p.suite == "basis"}
    for c in (1, 16):
        a, b = got[("training_mix", c, "output_throughput")].predicted, suite[(c, "output_throughput")].predicted
        assert abs(math.log(a.value / b.value)) < 0.05 and a.lo < b.value < a.hi
    # generic prompts accept little: the mix that holds 40% of them gains less
    assert got[("generic_heavy", 1, "output_throughput")].predicted.value < got[("training_mix", 1,
                                                                                  "output_throughput")].predicted.value
    assert "unseen" not in {p.suite for p in mp.profiles} and "reasoning" in mp.profiles_skipped["unseen"]


@pytest.mark.slow   # about a CPU-minute
def test_the_profiles_predictions_cover_the_truth():
    """A profile's throughput speedup predicted from the map against the truth (suites of the basis suite's
    size drawn in its shares from the strata's populations, whole passes, no run-to-run noise), 40
    experiments: at the concurrency held out of the fit (4), a fitted one (16) and one beyond the map
    (32), the 90% intervals cover at nominal within three Monte-Carlo errors."""
    got = cal.profile_coverage(40, "flat", "generic_heavy")
    for c, v in got.items():
        assert v["n"] >= 36 and covers(v, v["n"]), (c, v)
        assert abs(v["bias"]) < 0.05, (c, v)


def test_a_budget_must_be_positive_and_decodes_that_take_it_all_do_not_stall_the_replay():
    with pytest.raises(ValueError):
        Scheduler(0, 1)
    with pytest.raises(ValueError):
        serve(replace(cal.BASE, budget=0.0), 2, np.array([[100.0, 100.0]]), np.array([[3, 3]]), np.random.default_rng(0))
    # two long decodes take the whole budget (2 x 4 tokens of 8): the third prompt waits until one ends, and
    # the replay jumps there instead of stepping one decode step at a time
    ptok, out = np.array([[10.0, 10.0, 100.0]]), np.array([[20001.0, 20001.0, 2.0]])
    e2e, ttft, _ = simulate(THETA, 3, ptok, out, out - 1, sched=Scheduler(8, 4))
    assert np.isfinite(e2e).all() and ttft[0, 2] > ttft[0, 0]


@pytest.mark.slow
def test_a_profiles_predicted_cells_resend_one_drawn_suite_in_whole_passes(monkeypatch):
    """Each predicted cell sends whole passes over one suite of the basis suite's size (as a cell and the
    truth do), so a later pass resends the first pass's prompts (and may hit the cache)."""
    from specmatch.deciding.predicting.stepcost import predict

    seen = []
    real = predict.simulate

    def spy(theta, c, ptok, out, steps, **kw):
        seen.append((c, np.array(ptok)))
        return real(theta, c, ptok, out, steps, **kw)

    monkeypatch.setattr(predict, "simulate", spy)
    cells = traffic_cells(3, {"basis": cal.COUNTS, "generic": {"generic": 4}}, (1, 4, 16), rho=lambda b: 1.4,
                          min_requests_per_worker=cal.REQUESTS_PER_WORKER)
    s = Settings(bootstrap=50)
    m = Measurements.of(cells, s)
    build_map(m, requests_of(m), "spec", "base", "basis", ["basis", "generic"], [1, 4, 16], [4], 16, "sim", s,
              profiles=traffic_profiles({"generic_heavy": {"agent": 0.18, "code": 0.3, "chat": 0.12, "generic": 0.4}}))
    n = sum(cal.COUNTS.values())
    total = predict.PROFILE_ROWS + predict.PROFILE_RESAMPLES * predict.PROFILE_DRAWS
    rows = [p for c, p in seen if p.shape[0] == total and p.shape[1] >= 2 * n]   # the profile's
    assert rows and all((p[:, :n] == p[:, n:2 * n]).all() for p in rows)


# -- the map in k --------------------------------------------------------------------------------------
def k_sweep(seed=9001, shape="linear", mapped=(1, 3, 5)):
    from specmatch.deciding.predicting.stepcost.kmap import build_kmap

    specs = cal.k_engines(mapped, shape)
    cells = traffic_cells(seed, {"basis": cal.COUNTS}, cal.MEASURED, min_requests_per_worker=cal.REQUESTS_PER_WORKER,
                          engine=cal.BASE, specs=specs)
    s = Settings(bootstrap=200)
    m = Measurements.of(cells, s)
    reqs = requests_of(m)
    fitted = {}
    for x in specs:
        build_map(m, reqs, x, "base", "basis", ["basis"], list(cal.MEASURED), [cal.CHECK], 64, "sim", s, fitted=fitted)
    ks = {k: f"spec@k={k}" for k in mapped}
    km = build_kmap(m, reqs, "spec", ks, {k: fitted[x] for k, x in ks.items()}, ["basis"], [1, 2, 4, 8, 16, 32, 64], s,
                    "output_throughput")
    return km, fitted, m


def test_the_simulated_engine_reports_vllms_per_position_acceptance():
    """Per position p, the drafting steps that accepted p over the drafts: they add up to the accepted tokens,
    fall with p (a draft is accepted only after every one before it), and a smaller k's are a prefix."""
    rng = np.random.default_rng(3)
    tok = np.full((1, 40), 100.0)
    match = rng.random((1, 40, 32)) < 0.7
    got = {k: serve(replace(cal.BASE, k=k, rho=1.3), 4, tok, np.full((1, 40), 24), np.random.default_rng(0), match=match)
           for k in (2, 5)}
    for k, x in got.items():
        assert x.positions.shape == (1, k)   # one column per drafted position
        assert x.positions.sum() == x.accepted.sum() and np.all(np.diff(x.positions[0, :k]) <= 0)
    cells = traffic_cells(1, {"basis": cal.COUNTS}, (1,), specs=cal.k_engines((3,)))
    rates = [res.spec_decode_per_position_acceptance_rates for res, _ in cells if res.server == "spec@k=3"]
    assert all(len(r) == 3 and r[0] > r[1] > r[2] > 0 for r in rates)
    res = next(res for res, _ in cells if res.server == "spec@k=3")
    assert sum(res.spec_decode_per_position_acceptance_rates) == pytest.approx(res.spec_decode_acceptance_length - 1)


@pytest.mark.slow
def test_a_k_between_two_mapped_k_is_their_line_and_none_is_drawn_beyond_them():
    from specmatch.deciding.predicting.stepcost.kmap import at_k

    _, fitted, _ = k_sweep(mapped=(1, 5))
    maps = {1: fitted["spec@k=1"], 5: fitted["spec@k=5"]}
    km = at_k(maps, 2, "spec@k=2")
    assert km.how == "interpolated" and km.weights == {1: 0.75, 5: 0.25} and km.models["spec@k=2"].sched.per_sequence == 3
    for b in (1, 4, 16, 64):
        T = [maps[j].models[f"spec@k={j}"].step(b, 264) for j in (1, 5)]
        assert km.models["spec@k=2"].step(b, 264) == pytest.approx(0.75 * T[0] + 0.25 * T[1])
        # the baseline's part is the members' one fit; the speculative part weighs each member by its share of T_k
        assert km.part("base", b, 264).total == pytest.approx(maps[1].part("base", b, 264).total)
        assert km.error(b, 264).total > km.part("base", b, 264).total
    assert at_k(maps, 5, "x").how == "map" and at_k(maps, 6, "x") is None and at_k(maps, 1, "x", leave_out=True) is None


def test_a_prompts_steps_at_another_k_follow_the_per_position_acceptance():
    from specmatch.deciding.predicting.stepcost.kmap import steps_at

    # prompts that accept every draft with their own probability a (geometric): whatever the suite's mix,
    # a prompt's tau at k is 1 + a + ... + a^k, read back from its tau at K = 5 through the suite's shape
    a = np.array([0.3, 0.6, 0.9])
    tau = {k: 1 + sum(a ** (p + 1) for p in range(k)) for k in range(1, 6)}
    data = {"out": np.full(3, 25.0), "steps": {"s": 24 / tau[5]}}
    w = data["steps"]["s"] / data["steps"]["s"].sum()          # vLLM pools the rates over drafts (steps)
    rates = [float((w * a ** (p + 1)).sum()) for p in range(5)]
    for k in range(1, 6):   # whole steps (the replay ceils a fractional count)
        assert steps_at(data, "s", rates, k) == pytest.approx(np.round(24 / tau[k]))
    # one ratio for every prompt (tau_i(k) - 1 scaled by the suite's) would give the low one too little at k = 1
    ratio = rates[0] / sum(rates)
    assert 1 + (tau[5][0] - 1) * ratio < tau[1][0] - 0.1
    # a prompt that accepted nothing stays at one token a step; one that accepted everything at 1 + k
    edge = {"out": np.full(2, 25.0), "steps": {"s": np.array([24.0, 4.0])}}
    assert steps_at(edge, "s", rates, 2) == pytest.approx([24.0, 8.0])


@pytest.mark.slow
def test_the_map_in_k_recovers_the_step_cost_checks_its_line_and_predicts_every_k():
    km, _, m = k_sweep()
    assert km.mapped == [1, 3, 5] and km.tau_from == "spec@k=5" and km.linear is True and km.holds is True
    rho = {(p.k, p.batch): p for p in km.rho}
    assert {p.how for p in km.rho if p.k in (2, 4)} == {"interpolated"}
    inside = [p.rho.lo <= cal.k_rho(p.k)(p.batch) <= p.rho.hi for p in km.rho if p.batch <= 16]
    assert np.mean(inside) >= 0.8         # 25 intervals of one experiment; their coverage: the next test
    assert rho[(4, 16)].rho.value > rho[(2, 16)].rho.value and rho[(4, 64)].extrapolated
    # every k from 1 to 5 predicted at every load; the inner member held out and checked against its cells
    assert {(p.k, p.concurrency) for p in km.predictions if p.metric == "output_throughput"} == {
        (k, c) for k in range(1, 6) for c in (1, 2, 4, 8, 16, 32, 64)}
    assert {p.tau_from for p in km.predictions if p.k in (2, 4)} == {"per-position acceptance of spec@k=5 (k=5)"}
    assert {p.tau_from for p in km.predictions if p.k in (1, 3, 5)} == {"measured"}
    assert {(p.k, p.concurrency) for p in km.checks} == {(3, c) for c in cal.MEASURED}
    assert all(p.measured is not None and p.difference is not None and p.between == [1, 5] for p in km.checks)
    # the schedule covers the grid, a k where one pays; the sweep's cells against what the map's schedule needs
    sched = km.schedule
    assert sched[0].lo == 1 and sched[-1].hi == 64 and all(a.hi < b.lo for a, b in zip(sched, sched[1:]))
    assert sched[0].k in (1, 2, 3, 4, 5)
    assert km.cells == {"sweep": 40, "map": 36, "members": 3, "mapped": 3}
    assert StepCosts.from_json(StepCosts(kmaps=[km]).to_json()).kmaps[0] == km


@pytest.mark.slow
def test_a_step_cost_curved_in_k_is_caught_by_the_line():
    km, _, _ = k_sweep(shape="curved")
    assert km.linear is False and any(c.agrees is False for c in km.rho_checks)
    from specmatch.reporting import stepcost as render
    text = "\n".join(render.lines(StepCosts(kmaps=[km])))
    assert "**ρ is not linear in k**" in text


@pytest.mark.slow  # 15-30 simulated sweeps of three servers each: about a CPU-minute each
@pytest.mark.parametrize("shape, n", [("linear", 30), ("curved", 15), ("identical", 30)])
def test_coverage_of_the_map_in_k_by_simulation(shape, n):
    """The map in k against the truth, n experiments (200 each in docs/methods/step-cost.md: `python -m
    specmatch stepcost_coverage --k linear|curved`). Shown to fail (`bench/gate_defects.py kmap`, 7 Dec 2026):
    with KStepMap.part's variance a quarter of what it is, 12 of the 35 rho and prediction keys fell below the gate (0.53-0.73);
    with the baseline's side left out of the error it passed (the baseline's part is small in this world)."""
    got = cal.k_coverage(n, shape=shape, truth_suites=100)
    if shape == "curved":
        # the line is wrong at the inner k: its check says so in most experiments, and the held-out member's
        # check against its cells (paired: the prompts cancel) catches it too
        assert got[("linear", 0)]["coverage"] <= 0.4 and got[("holds", 0)]["coverage"] <= 0.8
        return
    if shape == "identical":
        # every k exactly off: the schedule deploys one rarely (the level allows for the k compared; 0.085 at
        # c = 4 in 200 experiments, where the single predictions cover 0.84-0.89), and the checks hold
        assert all(got[("deploys", c)]["coverage"] <= 0.085 + 3 * math.sqrt(0.085 * 0.915 / n) for c in cal.PREDICTED)
        assert covers(got[("linear", 0)], got[("linear", 0)]["n"]) and covers(got[("holds", 0)], got[("holds", 0)]["n"])
        return
    for (key, kc), v in got.items():
        if key in ("rho", "pred") and (key == "pred" or kc[1] <= 16):
            assert covers(v, v["n"]), (key, kc, v)
    assert covers(got[("linear", 0)], n) and covers(got[("holds", 0)], n)


@pytest.mark.slow
def test_the_stepcost_step_maps_every_k_sweep_in_k(tmp_path):
    """The step as the workflow runs it: a sweep's members found by name, each mapped, the map in k written
    beside the maps and rendered."""
    import json

    from builders import write_cells
    from specmatch.deciding.stepcost import main
    from specmatch.files import read_json
    from specmatch.reporting import stepcost as render

    specs = {f"eagle3@k={k}": replace(cal.BASE, k=k, rho=cal.k_rho(k)) for k in (1, 3, 5)}
    cells = traffic_cells(9001, {"basis": cal.COUNTS}, cal.MEASURED, min_requests_per_worker=cal.REQUESTS_PER_WORKER,
                          engine=cal.BASE, specs=specs)
    cp, rp = write_cells(tmp_path, [(res, req) for res, req in cells])
    servers = {"base": {"engine": "vllm", "model": "m"},
               **{x: {"engine": "vllm", "model": "m", "speculative": {"method": "eagle3", "model": "d",
                                                                       "num_speculative_tokens": e.k}}
                  for x, e in specs.items()}}
    out = tmp_path / "stepcost.json"
    assert main(["--baseline", "base", "--settings", json.dumps({"bootstrap": 200}), "--servers", json.dumps(servers),
                 "--cells", *cp, "--requests", *rp, "--suites", "basis",
                 "--step-cost", json.dumps({"concurrency": [4], "check": [4]}), "--out", str(out)]) == 0
    sc = StepCosts.from_json(read_json(out))
    assert sorted(mp.server for mp in sc.maps) == sorted(specs)
    (km,) = sc.kmaps
    assert km.parent == "eagle3" and km.mapped == [1, 3, 5] and km.members == {"1": "eagle3@k=1", "3": "eagle3@k=3",
                                                                                "5": "eagle3@k=5"}
    assert km.tau_from == "eagle3@k=5" and km.schedule and km.checks
    text = "\n".join(render.lines(sc))
    assert "### Which k at which load, from the map: `eagle3`" in text and "**`basis`: the k schedule from the map**" in text
