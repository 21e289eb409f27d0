"""The decision rules on synthetic measurements whose truth is known (issue 11's defects included)."""
import math

import numpy as np
import pytest

from specmatch.analysis import (Comparison, ServerInfo, Settings, analyse, crossover, decide, recommend, server_k,
                                validate_schedule, verify)
from specmatch.records import Decision, Verdict
from specmatch.simulate import cell, experiment

S = Settings(bootstrap=400)


def verdicts(shape: dict, server="spec", suite="s", run_to_run=True):
    """Verdicts and comparisons from {concurrency: (speedup, Decision)} (interval half-width 5%)."""
    vs, cmps = [], []
    for c, (sp, d) in sorted(shape.items()):
        vs.append(Verdict(server, suite, c, "output_throughput", d, sp, sp * 0.95, sp * 1.05, 0.9, 2))
        cmps.append(Comparison(server, "baseline", suite, c, "output_throughput", [math.log(sp)] * 2, [1e-4] * 2,
                               math.log(sp), 0.02, 30.0, run_to_run))
    return vs, cmps


VLLM = ServerInfo("spec", "vllm", "vllm", {"method": "eagle3", "model": "d", "num_speculative_tokens": 3}, 256)


def test_decide_four_ways():
    def cmp(est, se, rtr=True):
        return Comparison("s", "b", "u", 1, "output_throughput", [est], [se ** 2], est, se, 50.0, rtr)

    assert decide(cmp(math.log(1.3), 0.03), S).verdict == Decision.PAYS
    assert decide(cmp(math.log(0.7), 0.03), S).verdict == Decision.LOSES
    assert decide(cmp(math.log(1.01), 0.01), S).verdict == Decision.EQUIVALENT  # inside ±5%: decisively no difference
    v = decide(cmp(math.log(1.05), 0.06), S)
    assert v.verdict == Decision.INCONCLUSIVE and "repeats" in v.decide
    assert v.confidence == 0.9 and v.lo < v.speedup < v.hi


def test_one_repeat_needs_an_effect_beyond_min_effect_and_says_so(tmp_path):
    """Defect 1: with no measure of run-to-run variation, verdicts rested on a request-level bootstrap
    and the summary said nothing. Now a verdict needs an effect beyond min_effect, equivalence is never
    called, and the summary says plainly that the intervals exclude run-to-run variation."""
    def cmp(est, se):
        return Comparison("s", "b", "u", 1, "output_throughput", [est], [se ** 2], est, se, float("inf"), False)

    tight_small = decide(cmp(math.log(1.03), 0.005), S)  # the old rule: lo > 1, so "pays"
    assert tight_small.verdict == Decision.INCONCLUSIVE and not tight_small.run_to_run
    assert "repeats: 2 or more" in tight_small.decide
    assert decide(cmp(math.log(1.3), 0.02), S).verdict == Decision.PAYS
    assert decide(cmp(math.log(1.0), 0.001), S).verdict == Decision.INCONCLUSIVE  # never 'equivalent' with R=1
    from specmatch.summary import markdown

    an = analyse(experiment(np.random.default_rng(0), 1.3, repeats=1), "baseline", S)
    md = markdown(an, [], {}, [], [], [])
    assert "These intervals exclude run-to-run variation" in md and "90% confidence" in md


@pytest.mark.parametrize("shape, action", [
    # defect 2: one undecided cell at c=1 and pays above used to read "turn speculation off"
    ({1: (0.98, Decision.INCONCLUSIVE), 4: (1.3, Decision.PAYS), 16: (1.5, Decision.PAYS), 64: (1.2, Decision.PAYS)},
     "keep"),
    # defect 3: an undecided dip between two paying concurrencies used to set the boundary
    ({1: (1.5, Decision.PAYS), 4: (0.99, Decision.INCONCLUSIVE), 16: (1.3, Decision.PAYS)}, "keep"),
    ({1: (0.7, Decision.LOSES), 4: (0.8, Decision.LOSES)}, "off"),
    ({1: (1.0, Decision.EQUIVALENT), 4: (0.99, Decision.EQUIVALENT)}, "off"),
    ({1: (1.02, Decision.INCONCLUSIVE), 4: (0.98, Decision.INCONCLUSIVE)}, "undecided"),
])
def test_recommendation_is_built_from_verdicts(shape, action):
    rec = recommend(VLLM, "s", *verdicts(shape), S)
    assert rec.action == action, rec.text
    if action != "schedule":
        assert rec.vllm_schedule is None


def test_schedule_has_valid_inclusive_ranges_and_keeps_the_servers_own_k():
    shape = {1: (1.4, Decision.PAYS), 4: (1.02, Decision.INCONCLUSIVE), 16: (0.7, Decision.LOSES)}
    rec = recommend(VLLM, "s", *verdicts(shape), S)
    assert rec.action == "schedule"
    sched = rec.vllm_schedule
    validate_schedule(sched)
    assert sched[0][0] == 1 and sched[0][2] == 3 and sched[-1] == [sched[-1][0], 256, 0]
    assert 1 <= sched[0][1] < 16  # the switch lies between the last paying and the first losing concurrency
    assert "undecided at c=4" in rec.text and "the switch follows where the measured speedup crosses 1" in rec.text
    # pays up to the server's largest batch: no [max+1, max, 0] range (defect 3)
    rec = recommend(VLLM, "s", *verdicts({1: (1.4, Decision.PAYS), 256: (1.2, Decision.PAYS)}), S)
    assert rec.action == "keep" and rec.vllm_schedule is None
    # a server with a schedule but no num_speculative_tokens: its own k per batch size, never an invented 4
    own = ServerInfo("spec", "vllm", "vllm", {"method": "ngram", "num_speculative_tokens_per_batch_size":
                                              [[1, 8, 2], [9, 512, 1]]}, 256)
    assert server_k(own.speculative, 3) == 2 and server_k(own.speculative, 100) == 1
    rec = recommend(own, "s", *verdicts({1: (1.4, Decision.PAYS), 16: (1.2, Decision.PAYS),
                                         64: (0.6, Decision.LOSES)}), S)
    validate_schedule(rec.vllm_schedule)
    assert {k for _, _, k in rec.vllm_schedule} <= {0, 1, 2} and rec.vllm_schedule[0] == [1, 8, 2]


def test_keep_on_for_a_server_whose_schedule_switches_off_is_a_new_deployment():
    """A server configured off above batch 4 that pays wherever it speculates and is never beaten:
    'keep on' is not the server as configured; the recommendation is a schedule on at every batch
    size with the server's k, to be measured, never 'already measured'."""
    sched = ServerInfo("spec", "vllm", "vllm", {"method": "ngram", "num_speculative_tokens": 4,
                                                "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 256, 0]]}, 256)
    rec = recommend(sched, "s", *verdicts({1: (1.5, Decision.PAYS), 4: (1.4, Decision.PAYS),
                                           16: (1.1, Decision.INCONCLUSIVE)}), S)
    assert rec.action == "keep"
    assert rec.vllm_schedule == [[1, 256, 4]]
    assert "configured schedule switches speculation off" in rec.text
    # the same verdicts for a server without a schedule: the deployment is the server as configured
    rec = recommend(VLLM, "s", *verdicts({1: (1.5, Decision.PAYS), 4: (1.4, Decision.PAYS),
                                          16: (1.1, Decision.INCONCLUSIVE)}), S)
    assert rec.action == "keep" and rec.vllm_schedule is None
    # verdicts that put the switch elsewhere: a new schedule, to be measured
    rec = recommend(sched, "s", *verdicts({1: (1.5, Decision.PAYS), 4: (1.4, Decision.PAYS),
                                           16: (0.7, Decision.LOSES)}), S)
    assert rec.action == "schedule" and not rec.as_configured
    assert rec.vllm_schedule[0][2] == 4 and rec.vllm_schedule[-1][2] == 0 and rec.vllm_schedule[0][1] > 4
    # verdicts that put it where the server already has it: nothing new to measure
    rec = recommend(sched, "s", *verdicts({1: (1.5, Decision.PAYS), 4: (1.4, Decision.PAYS),
                                           5: (0.7, Decision.LOSES)}), S)
    assert rec.action == "schedule" and rec.as_configured and rec.vllm_schedule == [[1, 4, 4], [5, 256, 0]]
    from specmatch.recommend import derived_servers
    assert derived_servers([rec], {"spec": {"engine": "vllm", "speculative": sched.speculative}},
                           {"spec": sched}) == {}


def test_non_monotone_shapes_are_regions():
    """Loses at low concurrency and pays higher up (as with MoE targets): regions, and a schedule
    that drafts nothing at small batches."""
    shape = {1: (0.7, Decision.LOSES), 4: (0.9, Decision.LOSES), 16: (1.3, Decision.PAYS), 64: (1.4, Decision.PAYS)}
    rec = recommend(VLLM, "s", *verdicts(shape), S)
    assert [(r.verdict, r.first, r.last) for r in rec.regions] == [(Decision.LOSES, 1, 4), (Decision.PAYS, 16, 64)]
    assert rec.crossover.direction == "starts paying" and 4 < rec.crossover.point < 16
    assert rec.vllm_schedule[0][2] == 0 and rec.vllm_schedule[-1][2] == 3


def test_crossover_has_an_interval():
    vs, cmps = verdicts({1: (1.3, Decision.PAYS), 4: (1.0, Decision.INCONCLUSIVE), 16: (0.7, Decision.LOSES)})
    x = crossover(cmps, S)
    assert x.direction == "stops paying" and 3 < x.point < 5.5 and x.lo < x.point < x.hi
    assert crossover(verdicts({1: (1.3, Decision.PAYS), 4: (1.2, Decision.PAYS)})[1], S) is None


def test_sglang_gets_its_nearest_mechanism_or_an_honest_none():
    old = ServerInfo("spec", "sglang", "sglang", {"method": "eagle3"}, 256, None, "0.5.4")
    shape = {1: (1.4, Decision.PAYS), 16: (0.7, Decision.LOSES)}
    rec = recommend(old, "s", *verdicts(shape), S)
    assert rec.vllm_schedule is None and rec.sglang["mechanism"] is None and "0.5.4" in rec.sglang["why"]
    new = ServerInfo("spec", "sglang", "sglang", {"method": "eagle3"}, 256,
                     {"flags": ["--speculative-adaptive", "--speculative-adaptive-config"]}, "0.5.23")
    assert recommend(new, "s", *verdicts(shape), S).sglang["mechanism"] == "speculative-adaptive"


def _cells(e2e_b, e2e_s, out, c=1, repeats=(1, 2), request_rate=None, prompts=None):
    ids = prompts or [f"p{i}" for i in range(len(out))]
    cells = []
    for r in repeats:
        for name, e2e in (("baseline", e2e_b), ("spec", e2e_s)):
            res, req = cell(name, "s", c, r, e2e, e2e * 0.05, out, ids)
            if request_rate:
                res.request_rate = request_rate
            cells.append((res, req))
    return cells


def test_paired_bootstrap_is_narrow_when_output_lengths_vary():
    """Defect 8: the unpaired bootstrap made e2e and TPOT intervals several times too wide when output
    lengths vary, although both servers served the same prompts."""
    rng = np.random.default_rng(3)
    out = rng.choice([8.0, 32.0, 128.0, 256.0], 32)
    e2e_b = out * 0.02 * rng.lognormal(0, 0.02, 32)
    e2e_s = e2e_b / 1.10
    an = analyse(_cells(e2e_b, e2e_s, out), "baseline", S)
    for metric in ("e2el", "tpot", "output_throughput"):
        v = an.verdict("spec", "s", 1, metric)
        assert v.hi / v.lo < 1.06, (metric, v)  # unpaired, e2e alone spreads by a factor of 30 across prompts


def test_open_loop_throughput_is_not_littles_law():
    """Defect 7: in open loop the bootstrap used the closed-loop formula C x mean(out) / mean(e2e), so a
    server with lower latency looked faster in throughput although both served the same arrivals."""
    out = np.full(32, 64.0)
    e2e_b = np.full(32, 2.0) * np.random.default_rng(1).lognormal(0, 0.05, 32)
    cells = _cells(e2e_b, e2e_b / 1.5, out, c=8, request_rate=2.0)
    for res, _req in cells:
        res.duration = 16.0 + 1.0  # the same arrival schedule; the tail is all that differs
        res.output_throughput = 32 * 64 / res.duration
    an = analyse(cells, "baseline", S)
    thr, tpot = an.verdict("spec", "s", 8, "output_throughput"), an.verdict("spec", "s", 8, "e2el")
    assert thr.lo <= 1.0 <= thr.hi and tpot.verdict == Decision.PAYS


def test_run_to_run_variance_is_robust_to_one_outlier():
    rng = np.random.default_rng(5)
    cells = experiment(rng, 1.0, repeats=2, suites=("a", "b", "c"), session_sd=0.0, cell_sd=0.03)
    base = analyse(cells, "baseline", S).run_to_run.sd("output_throughput")
    for res, req in cells:  # one cell ran beside a noisy neighbour: three times slower
        if (res.server, res.suite, res.concurrency, res.repeat) == ("baseline", "a", 4, 2):
            res.output_throughput /= 3
    hit = analyse(cells, "baseline", S).run_to_run.sd("output_throughput")
    assert 0.01 < base < 0.06 and hit < base * 1.5


def off_at_16(seed: int, speedups: dict) -> list:
    """A synthetic experiment whose speculative server drafted nothing at c=16 (a schedule's switch)."""
    cells = experiment(np.random.default_rng(seed), speedups, repeats=2, session_sd=0.01, cell_sd=0.01,
                       request_cv=0.02)
    for res, req in cells:
        if res.server == "spec" and res.concurrency == 16:
            res.spec_decode_num_drafts = 0
    return cells


def test_configured_but_off_is_a_finding_not_noise():
    cells = off_at_16(2, {1: 1.3, 4: 1.0, 16: 0.87})
    an = analyse(cells, "baseline", S)
    assert [(v.server, v.concurrency) for v in an.off_cost] == [("spec", 16)]
    assert an.off_cost[0].speedup == pytest.approx(0.87, abs=0.06)
    from specmatch.summary import markdown

    md = markdown(an, [], {}, [], [], [])
    assert "drafted nothing at c=16" in md and "a finding, not noise" in md and "costs 1" in md


def test_configured_but_off_faster_names_what_the_engine_changed():
    """Measured on vLLM 0.32 CPU: an n-gram server whose schedule is off at c=16 ran 1.36x the
    baseline, because configuring n-gram speculation disables async scheduling. The finding must say
    'faster' (not 'pays for being configured') and quote the engine's own warnings the baseline lacks."""
    cells = off_at_16(3, {1: 1.3, 4: 1.2, 16: 1.35})
    shared = "Chunked prefill is enabled with max_num_batched_tokens=2048."
    infos = {"baseline": ServerInfo("baseline", "vllm", "vllm", None, 256, engine_warnings=(shared,)),
             "spec": ServerInfo("spec", "vllm", "vllm", {"method": "ngram", "num_speculative_tokens": 4}, 256,
                                engine_warnings=(shared, "Async scheduling not supported with ngram-based "
                                                 "speculative decoding and will be disabled."))}
    an = analyse(cells, "baseline", S, infos=infos)
    assert an.off_cost[0].verdict == Decision.PAYS
    from specmatch.summary import markdown

    md = markdown(an, [], {}, [], [], [])
    assert "runs 3" in md and "faster than the baseline" in md and "pays for being" not in md
    assert '"Async scheduling not supported with ngram-based' in md and shared not in md


def test_configured_but_off_within_noise_claims_nothing():
    cells = off_at_16(5, {1: 1.3, 4: 1.0, 16: 1.0})
    an = analyse(cells, "baseline", S)
    assert an.off_cost[0].verdict in (Decision.EQUIVALENT, Decision.INCONCLUSIVE)
    from specmatch.summary import markdown

    md = markdown(an, [], {}, [], [], [])
    assert "no cost of being configured is established" in md and "a finding, not noise" not in md


def test_goodput_follows_vllm():
    s = Settings(bootstrap=300, slo={"e2el_ms": 1500})
    out = np.full(20, 32.0)
    e2e_b = np.linspace(1.0, 2.0, 20)  # about half the baseline's requests meet the SLO
    an = analyse(_cells(e2e_b, e2e_b / 2, out), "baseline", s)
    v = an.verdict("spec", "s", 1, "goodput")
    res = an.measurements.cells[("baseline", "s", 1, 1)]
    good = int((e2e_b * 1000 <= 1500).sum())
    assert an.measurements.arrays[("baseline", "s", 1, 1)].point("goodput", res) == pytest.approx(good / res.duration)
    assert v is not None and v.speedup > 1


def test_verification_catches_a_switch_that_costs_throughput():
    rng = np.random.default_rng(4)
    cells = experiment(rng, {1: 1.4, 4: 1.0, 16: 0.6}, repeats=2)
    out = np.full(32, 64.0)
    rec_cells = []
    for res, req in cells:
        if res.server == "baseline":
            e2e = req["e2e_s"].to_numpy()
            # the recommended server runs at c=16 like the baseline, minus 20% (a costly switch)
            slower = e2e / 0.8 if res.concurrency == 16 else e2e / (1.4 if res.concurrency == 1 else 1.0)
            rec_cells.append(cell("spec__recommended", "s", res.concurrency, res.repeat, slower, slower * 0.05, out,
                                  req["prompt_id"].to_list()))
    an = analyse(cells, "baseline", S, {"spec": VLLM}, ["s"], primary=["baseline", "spec"])
    an2 = analyse(cells + rec_cells, "baseline", S, {"spec": VLLM}, ["s"], primary=["baseline", "spec"])
    assert an.run_to_run.tau2 == an2.run_to_run.tau2  # the recommendation's grid decides, not the check
    v = verify(an2, an2.recommendations[0], "spec__recommended")
    assert v["matches_best"] is False and [x["concurrency"] for x in v["costs"]] == [16]
    assert v["costs"][0]["against"] == "baseline"


def test_a_recommendation_another_server_already_deploys_is_not_measured_twice():
    """`ngram_off_above_4` should be on everywhere: that is `ngram` as configured, whose cells on the
    same suite verify it; an SGLang-free, vLLM-only check of the config equivalence."""
    from specmatch.recommend import derived_servers, same_deployment

    ngram = {"engine": "vllm", "model": "m", "speculative": {"method": "ngram", "num_speculative_tokens": 4}}
    off4 = {"engine": "vllm", "model": "m", "suites": ["s"],
            "speculative": {"method": "ngram", "num_speculative_tokens": 4,
                            "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 256, 0]]}}
    info = ServerInfo("off4", "vllm", "vllm", off4["speculative"], 256)
    rec = recommend(info, "s", *verdicts({1: (1.5, Decision.PAYS), 4: (1.4, Decision.PAYS),
                                          16: (1.1, Decision.INCONCLUSIVE)}), S)
    assert rec.vllm_schedule == [[1, 256, 4]]
    assert derived_servers([rec], {"ngram": ngram, "off4": off4}, {"off4": info}) == {}
    assert rec.measured_by == "ngram" and rec.derived_server is None
    # not the same deployment: another k, another model, or not measured on that suite
    assert not same_deployment({**ngram, "speculative": {**ngram["speculative"], "num_speculative_tokens": 3}},
                               ngram, 256)
    assert not same_deployment({**ngram, "model": "other"}, ngram, 256)
    rec.measured_by = None
    got = derived_servers([rec], {"ngram": {**ngram, "suites": ["other"]}, "off4": off4}, {"off4": info})
    assert list(got) == ["off4__recommended"] and "suites" not in got["off4__recommended"]["config"]
