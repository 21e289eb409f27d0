"""Why it pays: the decomposition TPOT speedup = tau / rho on synthetic data whose truth is known.

Each synthetic server takes `rho` plain decode steps of the baseline's time per speculative step and
yields `tau` tokens per step (vLLM's definition: 1 + accepted / steps); a plain decode step costs
more over a longer prompt. The analysis sees only cells and request records, as in a real run."""
import json

import numpy as np
import pytest

from specmatch.deciding.analysis import analyse
from specmatch.deciding.reading.measurements import Settings
from specmatch.deciding.analysis import attribute
from specmatch.deciding.explaining.attribution import explained
from specmatch.records import Attribution, Interval
from specmatch.calibration.simulate import decomposed_experiment
from builders import decided
from specmatch.reporting.why import why_lines

S = Settings(bootstrap=300)


def spec_cells(rng, servers: dict, suites: dict, **kw):
    return decomposed_experiment(rng, servers, suites, **kw)


def by(attrs, server, suite, c) -> Attribution:
    return next(a for a in attrs if (a.server, a.suite, a.concurrency) == (server, suite, c))


def inside(iv: Interval, truth: float) -> bool:
    return iv.lo <= truth <= iv.hi


def test_cheaper_steps_than_a_plain_decode_step_are_not_the_drafters_doing():
    """tau 1.25 and rho 0.55 (the embedded default's eagle3 at c=1): a TPOT speedup of 2.3x, which
    drafting alone (at most 1.25x) cannot give: explained_by_drafting is false."""
    rng = np.random.default_rng(1)
    cells = spec_cells(rng, {"baseline": (None, 1.0), "fast": (1.25, 0.55)}, {"s": (200, 700)})
    attrs = attribute(analyse(cells, "baseline", S), "s")
    for c in (1, 4):
        a = by(attrs, "fast", "s", c)
        assert inside(a.tokens_per_step, 1.25), a.tokens_per_step
        assert inside(a.step_cost_ratio, 0.55), a.step_cost_ratio
        assert a.step_cost_ratio.hi < 1 and a.explained_by_drafting is False
        assert a.tpot_speedup.lo > a.tokens_per_step.hi  # the speedup's interval lies above tau
        # the identity holds for the point estimates
        assert a.tpot_speedup.value == pytest.approx(a.tokens_per_step.value / a.step_cost_ratio.value, rel=1e-9)
        assert a.run_to_run and a.repeats == 2 and a.acceptance_source == "per-request metrics"


def test_drafting_explains_everything_when_a_step_costs_more_than_a_plain_step():
    rng = np.random.default_rng(2)
    cells = spec_cells(rng, {"baseline": (None, 1.0), "good": (2.4, 1.3)}, {"s": (200, 700)})
    attrs = attribute(analyse(cells, "baseline", S), "s")
    for c in (1, 4):
        a = by(attrs, "good", "s", c)
        assert inside(a.tokens_per_step, 2.4) and inside(a.step_cost_ratio, 1.3)
        assert inside(a.tpot_speedup, 2.4 / 1.3)
        assert a.explained_by_drafting is True


@pytest.mark.slow
def test_no_drafts_no_decomposition_and_not_enough_data_is_undecided():
    """A configured-off control drafts nothing: no tau, no rho, and the record says why. A step that
    costs exactly one plain step measured once with noise is neither explained nor unexplained."""
    rng = np.random.default_rng(3)
    cells = spec_cells(rng, {"baseline": (None, 1.0), "x": (1.5, 1.0), "x__off": (None, 1.0)}, {"s": (200, 700)})
    attrs = attribute(analyse(cells, "baseline", S), "s")
    off = by(attrs, "x__off", "s", 1)
    assert off.tokens_per_step is None and off.step_cost_ratio is None and off.explained_by_drafting is None
    assert off.note == "drafted nothing in any repeat"
    assert off.tpot_speedup is not None
    noisy = spec_cells(np.random.default_rng(4), {"baseline": (None, 1.0), "x": (1.3, 1.0)}, {"s": (200, 700)},
                       repeats=1, prompts=8, request_cv=0.3, tau_cv=0.3)
    a = by(attribute(analyse(noisy, "baseline", S), "s"), "x", "s", 1)
    assert not a.run_to_run and a.step_cost_ratio.lo < 1 < a.step_cost_ratio.hi
    assert a.explained_by_drafting is None


def test_explained_needs_both_units_of_a_plain_step():
    from specmatch.deciding.explaining.attribution import both

    assert both(True, True) is True and both(True, None) is True
    assert both(False, True) is False and both(True, False) is False and both(None, False) is False
    assert both(None, True) is None and both(None, None) is None


def test_explained_reads_the_interval_against_one_plain_step():
    assert explained(Interval(0.6, 0.5, 0.7), 0.05) is False
    assert explained(Interval(1.2, 1.0, 1.4), 0.05) is True
    assert explained(Interval(0.98, 0.96, 1.3), 0.05) is True        # within min_effect of one plain step
    assert explained(Interval(0.95, 0.85, 1.05), 0.05) is None
    # one repeat (no measured run-to-run variation): "cheaper" needs the interval beyond the band
    assert explained(Interval(0.95, 0.93, 0.99), 0.05, run_to_run=False) is None
    assert explained(Interval(0.9, 0.85, 0.94), 0.05, run_to_run=False) is False


@pytest.mark.slow  # a simulation of many identical-cost experiments: about 7 s
def test_identical_step_costs_are_rarely_called_unexplained():
    """Truth rho = 1: 'not the drafter's doing' is a false finding; over 40 experiments at 90%
    confidence it must stay rare (each experiment makes 2 calls)."""
    rng = np.random.default_rng(5)
    calls = false = 0
    for _ in range(40):
        cells = spec_cells(rng, {"baseline": (None, 1.0), "x": (1.4, 1.0)}, {"s": (200, 700)}, prompts=16,
                           session_sd=0.03, cell_sd=0.03, request_cv=0.1)
        for a in attribute(analyse(cells, "baseline", S), "s"):
            calls += 1
            false += a.explained_by_drafting is False
    assert false / calls <= 0.15, (false, calls)


def test_a_contrast_between_suites_that_is_purely_prompt_length():
    """The speculative step costs fewer plain steps over longer prompts (rho falls with length) and
    tau is the same on both suites: the long suite 'pays more' only because its prompts are longer.
    Raw, the contrast is decisive; at matched prompt length it vanishes."""
    rng = np.random.default_rng(6)
    servers = {"baseline": (None, 1.0), "x": (1.5, lambda L: 1.4 * (L / 100.0) ** -0.35)}
    cells = spec_cells(rng, servers, {"long": (250, 750), "short": (15, 80)}, prompts=32)
    an = analyse(cells, "baseline", S)
    attrs = attribute(an, "long")
    # the summary renders these records (Contrast, AdjustedSpeedup) and says what explains the contrast
    rendered = "\n".join(why_lines(decided(an, attrs)))
    assert "**x** on `short` at c=1" in rendered and "prompt length explains" in rendered
    for c in (1, 4):
        short, long_ = by(attrs, "x", "short", c), by(attrs, "x", "long", c)
        raw, adj = short.contrast.raw, short.contrast.length_adjusted
        assert raw.hi < 1, raw                    # raw: the short suite looks much worse
        assert adj.lo <= 1 <= adj.hi, adj      # at the long suite's length: no difference
        assert long_.contrast is None and short.contrast.reference_suite == "long"
        la = short.length_adjusted_speedup
        assert la.reference_suite == "long" and la.slope == pytest.approx(0.35, abs=0.1)
        assert la.lo <= long_.length_adjusted_speedup.hi and long_.length_adjusted_speedup.lo <= la.hi
        # tau is the same on both suites: acceptance does not explain the contrast
        assert short.tokens_per_step.lo <= long_.tokens_per_step.hi


def test_a_real_acceptance_contrast_survives_the_length_adjustment():
    """Same prompt lengths, tau 2.2 on one suite and 1.1 on the other: the contrast is the drafter's."""
    rng = np.random.default_rng(7)
    cells = []
    for u, tau in (("train", 2.2), ("generic", 1.1)):
        part = spec_cells(rng, {"baseline": (None, 1.0), "x": (tau, 1.2)}, {u: (100, 500)}, prompts=24)
        cells += part
    attrs = attribute(analyse(cells, "baseline", S), "train")
    g = by(attrs, "x", "generic", 1)
    assert g.contrast.length_adjusted.hi < 0.7 and g.contrast.raw.hi < 0.7


@pytest.mark.slow
def test_configured_off_splits_configuration_and_drafting():
    """Configured but drafting nothing costs 15% (its plain step is 1/0.85 slower); drafting then
    gains. The record carries both verdicts."""
    rng = np.random.default_rng(8)
    servers = {"baseline": (None, 1.0), "x": (2.0, 1.4), "x__off": (None, 1 / 0.85)}
    cells = spec_cells(rng, servers, {"s": (200, 700)})
    attrs = attribute(analyse(cells, "baseline", S), "s")
    a = by(attrs, "x", "s", 1)
    assert a.configured_off.server == "x__off" and a.configured_off.verdict == "loses"
    assert a.drafting_effect.against == "x__off" and a.drafting_effect.verdict == "pays"
    assert a.configured_off.speedup * a.drafting_effect.speedup == pytest.approx(
        next(v for v in analyse(cells, "baseline", S).verdicts if (v.server, v.suite, v.concurrency, v.metric)
             == ("x", "s", 1, "output_throughput")).speedup, rel=0.02)
    # the record round-trips through its JSON form
    assert Attribution.from_json(a.to_json()) == a


def test_a_gain_the_configuration_gives_without_drafting():
    """Configured but drafting nothing, the engine already runs twice as fast (the control's plain step
    costs 0.5 of the baseline's); drafting tau 1.5 at 1.5 control steps per step adds nothing. The
    server 'pays 2x' for reasons that are not the drafter's, and the record shows both."""
    rng = np.random.default_rng(9)
    servers = {"baseline": (None, 1.0), "x": (1.5, 0.75), "x__off": (None, 0.5)}
    cells = spec_cells(rng, servers, {"s": (200, 700)})
    a = by(attribute(analyse(cells, "baseline", S), "s"), "x", "s", 1)
    assert a.configured_off.verdict == "pays" and a.drafting_effect.verdict in ("equivalent", "inconclusive")
    assert inside(a.step_cost_vs_configured_off, 1.5) and a.step_cost_vs_configured_off.lo > 1
    assert inside(a.step_cost_ratio, 0.75) and a.explained_by_drafting is False


SCHEDULE = {"method": "eagle3", "model": "d", "num_speculative_tokens": 3,
            "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 256, 0]]}


def schedule_cells(seed: int = 11):
    """A derived batch-size schedule (k=3 at batches 1-4, off above): tau 2 at 1.3 plain steps at
    c=1; at c=16 plain steps, except that the engine drafts once as the batch drains (one request,
    one step accepting 3: an acceptance length of 4.0 over speculative steps)."""
    from specmatch.deciding.recommending.deployment import ServerInfo
    from specmatch.calibration.simulate import decomposed_experiment

    rng = np.random.default_rng(seed)
    suites = {"s": (200, 700)}
    low = decomposed_experiment(rng, {"baseline": (None, 1.0), "sched": (2.0, 1.3)}, suites, concurrencies=(1,))
    high = decomposed_experiment(rng, {"baseline": (None, 1.0), "sched": (None, 1.0)}, suites, concurrencies=(16,))
    cells = []
    for res, req in low + high:
        if res.server == "sched":
            if res.concurrency == 16:
                n = req.height
                req = req.with_columns(num_spec_steps=np.array([1.0] + [0.0] * (n - 1)),
                                       num_accepted_tokens=np.array([3.0] + [0.0] * (n - 1)))
            res.spec_decode_num_drafts = int(req["num_spec_steps"].sum())
            res.spec_decode_num_accepted_tokens = int(req["num_accepted_tokens"].sum())
        cells.append((res, req))
    infos = {"sched": ServerInfo("sched", "vllm", "vllm", SCHEDULE, 256),
             "baseline": ServerInfo("baseline", "vllm", "vllm", None, 256)}
    return cells, infos


def without_request_metrics(cells, share: float = 1.0):
    """The schedule's cells with the first `share` of each cell's per-request spec metrics missing."""
    import polars as pl

    out = []
    for res, req in cells:
        if res.server == "sched":
            gone = np.arange(req.height) < round(share * req.height)
            req = req.with_columns(**{k: pl.when(pl.Series(gone)).then(None).otherwise(pl.col(k))
                                      for k in ("num_spec_steps", "num_accepted_tokens")})
        out.append((res, req))
    return out


@pytest.mark.slow
def test_a_schedule_that_runs_plain_steps_is_decomposed_over_all_its_decode_steps():
    """A derived batch-size schedule (k=3 at batches 1-4, off above). At c=16 the engine drafts only as
    the batch drains: one request, one step accepting 3, an acceptance length of 4.0 over speculative
    steps, while every other step was plain. TPOT = step time / tokens per step holds over all decode
    steps: tau is about 1 and rho about one plain step, not 4 and 4. At c=1, where every step speculates,
    tau is the tokens per decode step (the engine's acceptance length less what max_tokens cut off)."""
    from specmatch.deciding.recommending.deployment import ServerInfo

    cells, infos = schedule_cells()
    attrs = attribute(analyse(cells, "baseline", S, infos), "s")
    hi = by(attrs, "sched", "s", 16)
    assert inside(hi.tokens_per_step, 1.0) and hi.tokens_per_step.hi < 1.05, hi.tokens_per_step
    assert inside(hi.step_cost_ratio, 1.0) and hi.step_cost_ratio.hi < 1.3, hi.step_cost_ratio
    assert "tokens per decode step" in hi.acceptance_source
    lo = by(attrs, "sched", "s", 1)
    assert inside(lo.tokens_per_step, 2.0) and inside(lo.step_cost_ratio, 1.3)
    # exactly TPOT's tokens (all but the first) over the decode steps (a step yields 1 + its accepted
    # tokens; what the speculative steps did not produce took plain steps), per repeat (geometric mean)
    def ratio(req):
        dec, st, acc = ((req["output_tokens"] - 1).to_numpy(), req["num_spec_steps"].to_numpy(),
                        req["num_accepted_tokens"].to_numpy())
        return dec.sum() / (st + np.maximum(dec - st - acc, 0)).sum()

    per_repeat = [ratio(req) for res, req in cells if (res.server, res.concurrency) == ("sched", 1)]
    assert lo.tokens_per_step.value == pytest.approx(float(np.exp(np.mean(np.log(per_repeat)))), rel=1e-9)
    # the same cells without the schedule on record: the speculative steps alone (the selection)
    plain_attrs = attribute(analyse(cells, "baseline", S, {"sched": ServerInfo("sched", "vllm", "vllm",
                                                                               {"num_speculative_tokens": 3}, 256)}), "s")
    assert by(plain_attrs, "sched", "s", 16).tokens_per_step.value == pytest.approx(4.0)
    lines = "\n".join(why_lines(decided(analyse(cells, "baseline", S, infos), attrs)))
    assert "tokens per decode step" in lines and "`sched`" in lines


@pytest.mark.slow
def test_a_schedule_without_per_request_metrics_uses_the_cells_counters_and_nothing_unknown_is_plain():
    """Without per-request metrics the cell's counters give the plain steps (tokens after the first less
    what the speculative steps produced); without counters either, tau is unknown (no decomposition),
    never 1.0; with half the requests' metrics missing (and the rest not adding up to the counters) the
    missing ones are not counted as plain: the counters stand in."""
    cells, infos = schedule_cells()
    counters = attribute(analyse(without_request_metrics(cells), "baseline", S, infos), "s")
    for c, tau in ((1, 2.0), (16, 1.0)):
        a = by(counters, "sched", "s", c)
        assert a.acceptance_source == "cell counters, tokens per decode step"
        assert a.tokens_per_step.value == pytest.approx(tau, rel=0.1), (c, a.tokens_per_step)
    half = attribute(analyse(without_request_metrics(cells, 0.5), "baseline", S, infos), "s")
    a = by(half, "sched", "s", 1)
    assert a.acceptance_source == "cell counters, tokens per decode step"
    assert a.tokens_per_step.value == pytest.approx(2.0, rel=0.1) and a.explained_by_drafting is not False
    bare = []
    for res, req in without_request_metrics(cells):
        if res.server == "sched":
            res.spec_decode_num_drafts = res.spec_decode_num_accepted_tokens = None
        bare.append((res, req))
    for c in (1, 16):
        a = by(attribute(analyse(bare, "baseline", S, infos), "s"), "sched", "s", c)
        assert a.tokens_per_step is None and a.step_cost_ratio is None and a.explained_by_drafting is None


def test_which_schedules_run_plain_steps(tmp_path):
    """vLLM: k=0 beside k>0 bands; a configured-off control (k=0 everywhere) and one k everywhere are
    not mixed. SGLang: the adaptive config's candidate steps, read from its file; a file that cannot be
    read counts as mixed (tokens per decode step is right for any server)."""
    from specmatch.deciding.explaining.attribution import mixed_schedule
    from specmatch.serving.engines.sglang import adaptive_config

    assert mixed_schedule(SCHEDULE)
    assert not mixed_schedule({"num_speculative_tokens_per_batch_size": [[1, 256, 0]]})
    assert not mixed_schedule({"num_speculative_tokens_per_batch_size": [[1, 4, 5], [5, 256, 3]]})
    assert not mixed_schedule({"num_speculative_tokens": 3}) and not mixed_schedule(None)
    off_above = tmp_path / "adaptive.json"
    off_above.write_text(json.dumps(adaptive_config([[1, 4, 3], [5, 256, 0]])))
    assert mixed_schedule({"algorithm": "EAGLE3", "adaptive": str(off_above)})
    steps_only = tmp_path / "steps.json"
    steps_only.write_text(json.dumps({"1": {"candidate_steps": [5]}, "8": {"candidate_steps": [2]}}))
    assert not mixed_schedule({"adaptive": str(steps_only)})
    assert mixed_schedule({"adaptive": str(tmp_path / "missing.json")})
