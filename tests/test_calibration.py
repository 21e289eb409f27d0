"""Calibration of the verdicts against a simulated server, not against the analysis's own model
(specmatch.calibration: des, the server; harness, every experiment kind in one pool).

Experiments shaped like the embedded default (3 suites of 16 prompts, 16 output tokens, c = 1, 4,
16, a baseline and a second server on the same prompts) whose cells come from a discrete-event model
of a continuously batching server under a closed loop (specmatch.calibration.des), in R repeats of fresh
sessions (servers alternating), with run-to-run noise the analysis does not assume: heteroscedastic
by concurrency, Student-t(3), a linear drift over the run, one outlying session (calibration.scenarios).
Every metric: output throughput, TPOT, end-to-end latency and goodput (SLO e2el 450 ms).

Nominal: 90% confidence, so identical servers may be called pays or loses in at most 10% of verdicts.

**These are CI's gates, sized to fail on the defects they were built for**; the calibration's own figures,
with Monte-Carlo errors small enough to tell 13% from 10%, come from `python -m specmatch calibrate`
(docs/methods/calibration.md), which runs the same experiments at 300 per scenario.

**The pooled gate: twice nominal fails.** Per scenario, the rate over every metric, concurrency and suite
at R = 2 must be at most T = 15%. Verdicts of one experiment move together (shared sessions, shared
noise estimates): the design effect is 4-8 over an experiment's ~36 verdicts, so N = 40 experiments
(~1,440 verdicts) are worth ~240 independent ones: sd 1.9% at a true 10% (passes, z = 2.6) and 2.6% at
20% (fails, z = -1.9 or worse: the defects it guards were 23% and more). The Monte-Carlo error is measured
(a ratio estimator's over experiments, whatever the correlation) and must stay within the plan (<= 2.5%).

**The per-cell gate.** No (metric, concurrency) may exceed 20% (120 verdicts each, sd ~3.5% at 10%): it
exists because a pooled rate hides a failure at one concurrency (goodput at c=16 was 23-41% while the
pool read 9%); goodput at c=16 pooled over every scenario (~840 verdicts) must stay at 15%.

Power: the second server uniformly faster (every step's cost / (1 + e): the truth is 1 + e for
throughput, TPOT and e2el at every concurrency), e = 5%, 15%, 30%. Verification: a speculative
server that pays 1.4x at c=1, breaks even at c=4 and loses 0.6x at c=16; its recommended schedule
measured as the workflow measures it, with a free switch and with one whose switched-off steps cost
15% more. A/A crossovers, and repeats added while verdicts are inconclusive (optional stopping).

Runtime: about 700 analyses, without 'what would decide it' (Settings.designs) except where the hints
are checked, in SPECMATCH_CALIBRATION_WORKERS processes (tests/conftest.py: one under xdist, whose two
test processes already hold the two cores) at the lowest priority (calibration.pool). Findings are
xfail(strict=True) with the measured rate, so they flip when the analysis is fixed.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from specmatch.calibration import chances, external, grid, hints, ksweeps, scenarios, verdicts, verification, workload
from specmatch.calibration.des import Engine, serve
from specmatch.calibration.harness import compute
from specmatch.calibration.tally import Tally, fmt, pct
from specmatch.deciding.analysis import analyse
from specmatch.deciding.reading.measurements import Settings

NOMINAL = 0.10
T_POOLED = 0.15             # midway between nominal and twice nominal
T_CELL = 0.20
T_GOODPUT = 0.15            # goodput at c=16 pooled over every scenario
SE_PLAN = 0.025             # the pooled rate's Monte-Carlo error the design promises
N_NULL = 40                 # experiments per scenario (R = 2; plain also 3 and 4)
N_QUIET = 25                # quiet machine, analysed at R=1 and R=3
N_POWER = 10                # per effect (analysed at R=2, 3 and 4, fixed and sequential)
N_VERIFY = 20               # per machine (plain, quiet)
N_HINTS = 6                 # per population ('what would decide it' carried out, the designs of at most
N_HINTS_SEQ = 3             # HINT_COST repeats x suite scale; the sequential design's through the rounds)
HINT_COST = 12
N_CHANCES = 60              # the rounds' chance carried out (0.3 CPU-s each)
LONG = (pytest.mark.calibration, pytest.mark.slow)   # scripts/test.sh --quick leaves them out
CALIBRATED = ("plain", "hetero", "t3", "drift", "outlier", "prompts15", "prompts30")
TIMING = ("output_throughput", "tpot", "e2el")   # metrics whose truth is exactly 1 + effect


# -- the simulator itself (fast) ------------------------------------------------------------------
def test_des_is_a_closed_loop_of_c_workers():
    rng = np.random.default_rng(0)
    pt = rng.integers(16, 700, (5, 12)).astype(float)
    out = rng.integers(2, 30, (5, 12))
    for c in (1, 3, 12):
        s = serve(Engine(), c, pt, out, rng)
        end = s.start + s.e2e
        assert (s.ttft > 0).all() and (s.ttft < s.e2e).all()
        assert np.allclose(s.duration, end.max(1)) and (s.start[:, :c] == 0).all()
        for i in range(5):  # every send after the first c is some earlier request's completion
            assert all(np.isclose(end[i, :j], s.start[i, j]).any() for j in range(c, 12))
            t = np.sort(np.concatenate([s.start[i], end[i]]))[:-1] + 1e-12
            assert max(((s.start[i] <= x) & (end[i] > x)).sum() for x in t) <= c  # never more than c in flight


@pytest.mark.slow
def test_a_uniformly_faster_server_is_exactly_faster_and_speculation_is_geometric():
    rng = np.random.default_rng(1)
    pt, out = np.full((40, 8), 200.0), np.full((40, 8), 64)
    quiet = Engine(jitter=0.0, hiccup_p=0.0)
    a, b = serve(quiet, 4, pt, out, rng), serve(quiet.faster(1.3), 4, pt, out, rng)
    assert np.allclose(a.e2e / b.e2e, 1.3) and np.allclose(a.duration / b.duration, 1.3)
    spec = replace(quiet, k=3, rho=1.0)
    s = serve(spec, 1, np.full((200, 4), 100.0), np.full((200, 4), 4000), rng, alpha=0.6)
    length = 1 + s.accepted.sum() / s.steps.sum()
    assert length == pytest.approx(1 + 0.6 + 0.36 + 0.216, rel=0.02)   # 1 + E[min(k, Geometric)]
    assert (s.drafted == 3 * s.steps).all()
    # greedy decoding: which drafts are right is the prompt's, so every cell of a prompt accepts the same
    match = rng.random((1, 4, 40)) < 0.6
    jittery = replace(Engine(), k=3)
    one, two = (serve(jittery, 1, np.full((1, 4), 100.0), np.full((1, 4), 32), rng, match=match) for _ in range(2))
    assert (one.accepted == two.accepted).all() and (one.steps == two.steps).all() and (one.e2e != two.e2e).any()
    # a per-batch-size schedule decides per step, by the running batch: drafting only at batch <= 2
    small = replace(spec, on=lambda n: n <= 2)
    assert (serve(small, 2, np.full((5, 8), 100.0), np.full((5, 8), 50), rng, 0.6).steps > 0).all()
    assert (serve(small, 4, np.full((5, 8), 100.0), np.full((5, 8), 50), rng, 0.6).steps == 0).all()


@pytest.mark.slow
def test_one_worker_serves_a_long_suite_request_by_request_in_the_same_distribution(monkeypatch):
    """des.serve at c=1 with more than SERIAL_SPLIT requests simulates each request as a cell of its own and
    lays them end to end (nothing of one request reaches the next with one worker): the same cells in
    distribution as the step-by-step loop, speculative or not. Known truth: 300 cells of 34 requests
    each way; the mean duration and its sd, the drafting steps and the accepted tokens agree within 4%."""
    import specmatch.calibration.des as des

    rng = np.random.default_rng(5)
    pt = rng.integers(16, 400, (300, 34)).astype(float)
    out = np.full((300, 34), 16)
    spec = replace(Engine(), k=3, rho=1.4)
    for eng in (Engine(), spec):
        fast = serve(eng, 1, pt, out, rng, alpha=0.6)
        assert np.allclose(fast.start[:, 1:], fast.start[:, :-1] + fast.e2e[:, :-1])
        assert np.allclose(fast.duration, (fast.start + fast.e2e).max(1)) and (fast.ttft < fast.e2e).all()
        monkeypatch.setattr(des, "SERIAL_SPLIT", 10 ** 6)
        slow = serve(eng, 1, pt, out, rng, alpha=0.6)
        monkeypatch.undo()
        for x, y in ((fast.duration, slow.duration), (fast.steps.sum(1), slow.steps.sum(1)),
                     (fast.accepted.sum(1), slow.accepted.sum(1))):
            if y.mean() > 0:
                assert x.mean() == pytest.approx(y.mean(), rel=0.04) and x.std() == pytest.approx(y.std(), rel=0.15)
        assert fast.positions.sum() == pytest.approx(slow.positions.sum(), rel=0.04)


@pytest.mark.slow
def test_simulated_cells_are_cells_the_analysis_reads():
    rng = np.random.default_rng(2)
    work = [workload.Workload.draw(rng)]
    eff = [scenarios.run_to_run(rng, scenarios.SCENARIOS["plain"], ["baseline", "spec"], grid.SUITES,
                                grid.CONCURRENCIES, 2)]
    cells = workload.simulate_cells(rng, work, {"baseline": grid.BASE, "spec": grid.SPEC}, eff, 2)[0]
    assert len(cells) == 2 * 3 * 3 * 2
    res, req = next((r, q) for r, q in cells if r.server == "spec" and r.concurrency == 4)
    assert res.output_throughput == pytest.approx(req["output_tokens"].sum() / res.duration)
    assert res.duration == pytest.approx((req["start_s"] + req["e2e_s"]).max())
    assert res.spec_decode_num_drafts == req["num_spec_steps"].sum() > 0
    assert res.server_session == "spec-r1" and res.mean_tpot_ms > 0 and res.total_input_tokens > 0
    an = analyse(cells, "baseline", Settings(bootstrap=50, slo=dict(grid.SLO)))
    assert len(an.verdicts) == 3 * 3 * 4
    acc = next(a for a in an.acceptance if a.suite == "a")
    assert 1.5 < acc.length < 2.5   # k=3 at acceptance 0.6 a token, truncated by 16-token outputs


@pytest.mark.slow
def test_a_carried_out_design_reads_the_verdicts_the_full_analysis_gives():
    """hints.carry_out analyses throughput alone (hints.Reading): every metric's verdicts stand on
    their own run-to-run variance and bootstrap, so they are the full analysis's, interval and all."""
    rng = np.random.default_rng(11)
    eng = {"baseline": grid.BASE, "spec": grid.BASE.faster(1.04)}
    work = workload.Workload.draw(rng, prompts=32)
    eff = scenarios.run_to_run(rng, scenarios.SCENARIOS["plain"], list(eng), grid.SUITES, grid.CONCURRENCIES, 5)
    cells = workload.simulate_cells(rng, [work], eng, [eff], 5)[0]
    s = grid.settings(150, repeats=5)
    key = lambda v: (v.server, v.suite, v.concurrency, v.metric)  # noqa: E731
    full = {key(v): v for v in analyse(cells, "baseline", s).verdicts if v.metric == "output_throughput"}
    reading = hints.Reading.of(vars(s) | {"only": ("output_throughput",)})
    alone = {key(v): v for v in analyse(cells, "baseline", reading).verdicts}
    assert alone.keys() == full.keys() and len(alone) == 9
    assert all((alone[k].verdict, alone[k].speedup, alone[k].lo, alone[k].hi)
               == (full[k].verdict, full[k].speedup, full[k].lo, full[k].hi) for k in full)
    assert len({v.verdict for v in alone.values()}) > 1   # decided and undecided verdicts alike


def test_run_to_run_scenarios_are_what_they_say():
    rng = np.random.default_rng(3)
    servers, suites = ["baseline", "spec"], ("a",)
    assert scenarios.run_order(servers, 3) == [("baseline", 1), ("spec", 1), ("spec", 2), ("baseline", 2),
                                         ("baseline", 3), ("spec", 3)]
    drift = replace(scenarios.SCENARIOS["drift"], session_sd=0.0, cell_sd=0.0)
    x = scenarios.run_to_run(rng, drift, servers, suites, (1,), 2)
    assert ([round(x[(s, "a", 1, r)], 4) for s, r in scenarios.run_order(servers, 2)]
            == [-0.0375, -0.0125, 0.0125, 0.0375])
    out = replace(scenarios.SCENARIOS["outlier"], session_sd=0.0, cell_sd=0.0)
    x = scenarios.run_to_run(rng, out, servers, ("a", "b"), (1, 16), 3)
    hit = {(s, r) for (s, u, c, r), v in x.items() if v > 0}
    assert len(hit) == 1 and sum(v > 0 for v in x.values()) == 4
    het = [scenarios.run_to_run(rng, scenarios.SCENARIOS["hetero"], servers, suites, (1, 16), 2) for _ in range(400)]
    sd = {c: np.std([h[("spec", "a", c, 1)] for h in het]) for c in (1, 16)}
    assert sd[1] == pytest.approx(0.02, rel=0.2) and sd[16] == pytest.approx(0.08, rel=0.2)
    t3 = [scenarios.run_to_run(rng, scenarios.SCENARIOS["t3"], servers, suites, (1,), 1) for _ in range(5000)]
    v = np.array([h[("spec", "a", 1, 1)] for h in t3])
    assert np.std(v) == pytest.approx(0.05, rel=0.3) and np.mean(np.abs(v) > 4 * 0.05) > 0.001  # normal: 6e-5


# -- the calibration (minutes) --------------------------------------------------------------------
def long(fn):
    for m in LONG:
        fn = m(fn)
    return fn


def experiments(name, repeats, n, **kw) -> dict:
    return dict(kind="experiment", name=name, effect=kw.pop("effect", 0.0), repeats=repeats, experiments=n, **kw)


@pytest.fixture(scope="module")
def runs():
    """Every simulated experiment of the module, in one pool. Scenarios whose noise does not depend
    on the run's length are simulated once at the largest R and analysed at each R on its first
    repeats (nested, as when a repeat is added to a run); drift and outlier get one run per R."""
    specs = {("plain", 0): experiments("plain", (2, 3, 4), N_NULL, teeth=True, claims=True, sequential=True),
             ("hetero", 0): experiments("hetero", (2,), N_NULL),
             ("t3", 0): experiments("t3", (2,), N_NULL),
             ("quiet", 0): experiments("quiet", (1, 3), N_QUIET),
             ("prompts15", 0): experiments("prompts15", (2,), N_NULL),
             ("prompts30", 0): experiments("prompts30", (2,), N_NULL)}
    for name in ("drift", "outlier"):
        specs[(name, 2)] = experiments(name, (2,), N_NULL)
    for e in grid.EFFECTS:
        specs[("power", e)] = experiments("plain", (2, 3, 4), N_POWER, effect=e, sequential=True)
    for name in ("plain", "quiet"):
        specs[("verify", name)] = dict(kind="verify", name=name, experiments=N_VERIFY, repeats=2)
    for name in ("aa", "near"):
        specs[("hints", name)] = dict(kind="hints", name=name, experiments=N_HINTS, chunk=2, bootstrap=150,
                                      max_cost=HINT_COST)
    specs[("hints", "t3")] = dict(kind="hints", name="t3", experiments=N_HINTS_SEQ, chunk=1, bootstrap=150,
                                  sequential=True, max_cost=HINT_COST)
    return compute(specs, seed=18)


def tally(runs, name, R) -> Tally:
    return (runs[(name, R)] if (name, R) in runs else runs[(name, 0)])["tally"][R]


def pooled(runs, name) -> Tally:
    return tally(runs, name, 2)


def report(runs, name) -> str:
    lines = [f"\n{name}: {scenarios.SCENARIOS[name].about}; false calls, rate ± MC se [c=1/4/16]"]
    for R in (2,):
        t = tally(runs, name, R)
        lines.append(f"  R={R}: " + "; ".join(
            f"{m} {fmt(t.rate(metric=m))} [" + "/".join(pct(t.rate(metric=m, c=c)) for c in grid.CONCURRENCIES)
            + "]" for m in grid.METRICS))
    p, se, n = pooled(runs, name).rate()
    lines.append(f"  pooled: {p:.1%} ± {se:.1%} over {n} verdicts "
                 f"(design effect {pooled(runs, name).design_effect():.1f})")
    return "\n".join(lines)


XFAIL_POOLED: dict = {}
# Fixed: prompts30 (a speedup varying by prompt with log-sd 0.30, one burst at c=16)
# was 12.3% ± 1.0% pooled, TPOT and end-to-end latency 18-19% at c=16: only throughput's latencies
# carried their influence on the others in the drain; now TPOT and latency do too (10.7% ± 0.9% pooled,
# 11-12% at c=16 for every timing metric; deciding.reading.measurements.load_figures).
# Fixed: goodput at c=16 was called different in 23% (plain, R=2) to 41% (outlier) of
# identical-server verdicts. At c=16 one burst of 16 requests finishes together, so goodput is all or
# nothing: a repeat where no request met the SLO has no figure, the comparison kept the other repeat
# alone, and with one paired repeat it fell back to the prompt sample's interval without the run-to-run
# variance that was measured for those servers (comparison.compare).
XFAIL_CELL: dict = {}


def _mark(table: dict):
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=table[n])) if n in table else n
            for n in CALIBRATED]


@long
@pytest.mark.parametrize("name", _mark(XFAIL_POOLED))
def test_identical_servers_are_called_different_at_most_nominally(runs, name):
    """Pooled over metrics, concurrencies and suites at R = 2: at most T = 15% (see the module's docstring:
    a true 10% passes and twice nominal fails)."""
    print(report(runs, name))
    p, se, n = pooled(runs, name).rate()
    assert n >= N_NULL * 30
    assert se <= SE_PLAN, f"Monte-Carlo error {se:.2%} above the plan's {SE_PLAN:.1%}: more experiments needed"
    assert p <= T_POOLED, f"{name}: identical servers called different in {p:.1%} ± {se:.1%} of verdicts"


@long
@pytest.mark.parametrize("name", _mark(XFAIL_CELL))
def test_no_metric_or_concurrency_is_called_different_too_often(runs, name):
    t = pooled(runs, name)
    rates = {(m, c): t.rate(metric=m, c=c) for m in grid.METRICS for c in grid.CONCURRENCIES}
    print(report(runs, name))
    over = {k: f"{v[0]:.1%} ± {v[1]:.1%}" for k, v in rates.items() if v[2] and v[0] > T_CELL}
    assert not over, f"{name}: false-call rate above {T_CELL:.0%} at {over}"


@long
def test_goodput_at_the_highest_concurrency_keeps_the_per_cell_gate(runs):
    """The one cell every scenario fails (goodput at c=16), pooled over the scenarios so the finding
    is decided robustly (~3,600 verdicts) whatever one scenario's seed gives."""
    t = sum((pooled(runs, n) for n in CALIBRATED[1:]), pooled(runs, CALIBRATED[0]))
    p, se, n = t.rate(metric="goodput", c=16)
    print(f"\ngoodput at c=16, every scenario: {p:.1%} ± {se:.1%} over {n} verdicts")
    assert p <= T_GOODPUT


@long
def test_one_repeat_is_calibrated_on_a_quiet_machine_and_equivalence_needs_repeats(runs):
    """With R=1 a verdict needs an effect beyond min_effect: calibrated where run to run is small
    (1.5%, vLLM's GPU figure); equivalence is never called without measured run-to-run variation,
    and with three repeats on that machine identical servers are mostly called equivalent."""
    one, three = tally(runs, "quiet", 1), tally(runs, "quiet", 3)
    p, se, n = one.rate()
    eq = three.rate(("equivalent",), metric="output_throughput")[0]
    print(f"\nquiet, R=1: false calls {p:.1%} ± {se:.1%} ({n} verdicts); R=3: false calls "
          f"{fmt(three.rate())}, equivalent (throughput) {eq:.0%}")
    assert p <= T_CELL
    assert one.rate(("equivalent",))[0] == 0
    assert eq > 0.5 and three.rate()[0] <= T_CELL


@long
def test_ignoring_run_to_run_variation_is_caught(runs):
    """The calibration has teeth, without monkeypatching: the same experiments' first repeats, analysed
    with intervals from requests alone and no margin (one repeat, min_effect 0: what the analysis
    did before repeats), call identical servers different far more often than nominal."""
    teeth = runs[("plain", 0)]["teeth"]
    p, se, n = teeth.rate(metric="output_throughput")
    print(f"\nrun-to-run variation ignored: identical servers called different in {p:.1%} ± {se:.1%} "
          f"(throughput), {teeth.rate()[0]:.1%} (every metric)")
    assert teeth.experiments == N_NULL
    assert p > 3 * NOMINAL and p - 3 * se > T_POOLED


@long
def test_power_at_5_15_and_30_percent(runs):
    rows = {}
    for e in grid.EFFECTS:
        for R in (2, 3):
            t = runs[("power", e)]["tally"][R]
            rows[(e, R)] = {m: (t.rate(("pays",), metric=m), t.rate(("loses",), metric=m)) for m in grid.METRICS}
            print(f"\ntrue {1 + e:.2f}x, R={R}: " + "; ".join(
                f"{m} pays {fmt(v[0])} loses {v[1][0]:.1%}" for m, v in rows[(e, R)].items()), end="")
    for (e, R), r in rows.items():  # the wrong way: at most the interval's one-sided error, 5%
        assert all(r[m][1][0] <= NOMINAL / 2 for m in grid.METRICS), f"called the wrong way at {e:.0%}, R={R}"
        for m in TIMING:
            assert r[m][0][0] >= {0.05: 0.0, 0.15: 0.5, 0.30: 0.95}[e], (e, R, m)
    for R in (2, 3):
        for m in grid.METRICS:
            pays = [rows[(e, R)][m][0][0] for e in grid.EFFECTS]
            assert pays == sorted(pays) and pays[0] < 0.6
    for m in TIMING:
        assert rows[(0.15, 3)][m][0][0] >= 0.8 and rows[(0.15, 3)][m][0][0] >= rows[(0.15, 2)][m][0][0]


@long
def test_identical_servers_get_no_crossover(runs):
    """A/A: a server identical to the baseline, configured as speculative, is given a
    crossover in at most nominal of its recommendations (a crossover needs a verdict that pays and one
    that loses); how often it is told to speculate somewhere is printed (three verdicts each)."""
    for R in (2, 3):
        c = verdicts.claim_rates(runs[("plain", 0)]["claims"][R])
        print(f"\nA/A, R={R}: crossover claimed in {c['crossover']:.1%}, speculate somewhere in "
              f"{c['speculate']:.1%} of {c['recommendations']} recommendations", end="")
        assert c["recommendations"] == 3 * N_NULL
        assert c["crossover"] <= NOMINAL


def _sequential_text(runs) -> str:
    r = runs[("plain", 0)]
    used = r["used"][:, 0].sum() / r["used"][:, 1].sum()
    return (f"sequential R=2..4 (stop when the throughput verdict is decided; alpha spent per look): false calls "
            f"{fmt(r['sequential'].rate())} vs fixed R=4 {fmt(r['tally'][4].rate())}; repeats used "
            f"{used:.0%} of R=4's; the same stopping at the fixed design's level: {fmt(r['naive'].rate())}")


@long
def test_repeats_added_until_decided_keep_the_error_rate(runs):
    """Optional stopping (item 5): each (suite, concurrency) gets another repeat while its throughput
    verdict is inconclusive, from 2 up to 4; the verdicts it ends with must keep the pooled gate, and
    the gate must catch the same stopping analysed at the fixed design's level at every look (each
    look another chance to cross: measured ~13% against ~7% with the spending)."""
    print("\n" + _sequential_text(runs))
    r = runs[("plain", 0)]
    p, se, n = r["sequential"].rate()
    assert p <= T_POOLED, f"{p:.1%} ± {se:.1%}"
    naive, _, _ = r["naive"].rate()
    assert naive > p + 2 * se, "the spending changed nothing: the teeth are gone"


def _mean_repeats(r) -> float:
    return 4 * r["used"][:, 0].sum() / r["used"][:, 1].sum()


@long
@pytest.mark.parametrize("effect", [0.15, 0.30])
def test_the_sequential_design_saves_repeats_at_the_power_of_a_fixed_design(runs, effect):
    """Compute saved against a fixed design of equal power (item 5): a true effect stops at the first
    look it is decided, so the sequential design (2..4) uses fewer repeats per cell than a fixed R=3
    while calling it at least as often (within two Monte-Carlo se)."""
    r = runs[("power", effect)]
    seq, _, _ = r["sequential"].rate(("pays",), metric="output_throughput")
    fixed, se, _ = r["tally"][3].rate(("pays",), metric="output_throughput")
    used = _mean_repeats(r)
    print(f"\n{effect:.0%}: sequential pays {seq:.1%} with {used:.2f} repeats per cell; fixed R=3 {fixed:.1%}")
    assert seq >= fixed - 2 * max(se, 0.01)
    assert used <= 2.8


@long
@pytest.mark.parametrize("name", ["prompts15", "prompts30"])
def test_a_speedup_that_varies_by_prompt_is_not_called_different_in_one_burst(runs, name):
    """Issue 34, finding 2: servers identical on average whose speedup varies by prompt (log-sd 0.15 and
    0.30; each server's pace per prompt drawn independently, so every estimand's truth is 1) at c = 16
    with 16 prompts, one burst. The makespan is then the slowest request and a bootstrap of a maximum
    understated the prompt sample's variance: 12-18% and 24-31% false calls at nominal 10%. Throughput
    there, at R = 2, must be within nominal plus two Monte-Carlo errors (120 verdicts: about 15%, which the
    defect's 24-31% fails). The full figures (`python -m specmatch calibrate`, 300 experiments): prompts15
    9.2% ± 1.1%, prompts30 11.9% ± 1.2% of 720 at R = 2 and 3 (10.0-10.8% ± 1.1 in 240 experiments of
    bench/burst_variance.py)."""
    p, se, n = pooled(runs, name).rate(metric="output_throughput", c=16)
    print(f"\n{name}: throughput at c=16 called different in {p:.1%} ± {se:.1%} of {n} verdicts")
    assert n >= N_NULL * 3
    assert p <= NOMINAL + 2 * se, f"{name}: {p:.1%} ± {se:.1%}"


def _hint_line(rows, kind) -> str:
    st, dec, gap, se, n = hints.hint_gap(rows, kind)
    return f"{kind}: at the truth {st:.0%}, decided as the truth is {dec:.0%} (gap {gap:+.0%} ± {se:.0%} of {n})"


@long
@pytest.mark.parametrize("population", [
    pytest.param("aa", marks=pytest.mark.xfail(strict=True, reason=(
        "measured: on identical servers the short designs (at most 12 repeats x suite scale) are named where "
        "today's run-to-run estimate ran low, and come true less often than stated (33.6% at the truth, 8.8% "
        "decided of 57 statements, 6 experiments); over every design they come true or better (79.9% -> "
        "91.2%, bench/hint_calibration.py). Issue 67 stays open on it"))),
    "near", "t3"])
def test_what_would_decide_it_comes_true_when_carried_out(runs, population):
    """'What would decide it' states two power statements (verdicts.designs): each named design carried
    out on its own experiment as the workflow would (hints.carry_out: more repeats add fresh sessions to
    today's cells, through the rounds' plans under the sequential design; a larger suite reruns every cell
    with new prompts and sessions), the verdict read again. The share decided as the truth is must come
    within 3 Monte-Carlo errors or 10 points of the probability the statement's own simulation gives at
    the truth (designs.power at the true effect), both statements pooled: identical servers, speedups of
    1.06-1.10x (near the effect design's bounds), and, under the sequential design, identical servers on
    Student-t(3) noise (stalled engines name long designs only: bench/hint_calibration.py's). Here only the short
    designs (at most HINT_COST repeats x suite scale) are carried out: they are the ones a low draw of
    today's run-to-run variance names, and they are cheap; every design, with more experiments, is
    bench/hint_calibration.py's (docs/methods/calibration.md)."""
    rows = runs[("hints", population)]["rows"]
    print(f"\n{population} ({hints.HINT_POPULATIONS[population][1]}): " + "; ".join(
        _hint_line(rows, k) for k in ("equivalence", "effect")))
    st, dec, gap, se, n = hints.hint_gap(rows)
    assert n >= 10, f"only {n} statements: too few to check"
    assert all(r[5] * r[6] <= HINT_COST for r in rows)
    assert abs(gap) <= max(3 * se, 0.10), f"at the truth {st:.1%}, decided {dec:.1%}: {gap:+.1%} ± {se:.1%} of {n}"


@pytest.fixture(scope="module")
def chance_runs():
    return compute({name: dict(kind="chances", name=name, experiments=N_CHANCES, chunk=25)
                    for name in ("near",)}, seed=5)


def _chance_text(rows) -> str:
    out = []
    for what, cont in (("continued", True), ("stopped as unlikely", False)):
        st, dec, se, n = chances.chance_rates(rows, continued=cont)
        out.append(f"{what}: stated {st:.1%}, decided {dec:.1%} ± {se:.1%} of {n}")
    return "; ".join(out)


@long
def test_the_rounds_chance_comes_true_near_the_band(chance_runs):
    """The probability that the remaining repeats decide a configuration (sequential.chance_decided,
    recorded as RoundDecision.chance), by which the rounds continue it or stop it as unlikely and a cell
    budget ranks it, carried out (calibration.chances: round 2's plan, then its cells of repeat 3 and no
    others; the stopped ones measured again on their own). For speedups of 1.06-1.10x, where the
    rounds matter most (an effect at the edge of the band): the continued decide within 3 Monte-Carlo
    errors or 6 points of the stated chance (measured: 47% stated, 48% ± 3 decided of 589, 300
    experiments), and a stop as unlikely gives up no more than it states plus the same allowance
    (4.7% stated, 7.7% ± 0.8)."""
    rows = chance_runs["near"]["rows"]
    print("\nnear: " + _chance_text(rows))
    st, dec, se, n = chances.chance_rates(rows, continued=True)
    us, ud, use, un = chances.chance_rates(rows, continued=False)
    assert n >= 60 and un >= 60
    assert abs(dec - st) <= max(3 * se, 0.06) and ud <= us + max(3 * use, 0.06)


def _verification_text(v: dict) -> str:
    return "; ".join(f"{k} switch: " + ", ".join(f"{o} {x:.0%}" if o != "derived" else f"of {x}"
                                                  for o, x in verification.verified_shares(v[k]).items())
                     for k in ("correct", "costly"))


@long
@pytest.mark.parametrize("machine", ["plain", "quiet"])
def test_verification_keeps_its_stated_error_rates(runs, machine):
    """records.Verification states P(failed | correct) <= alpha and P(verified | costs > min_effect)
    <= alpha (alpha = 10%): measured on a schedule that is right (free switch) and one whose
    switched-off steps cost 15%. N_VERIFY experiments: the bound allows two binomial sd."""
    v = runs[("verify", machine)]
    print(f"\n{machine}: " + _verification_text(v) + f"; schedules e.g. {v['schedules'][:2]}")
    correct, costly = verification.verified_shares(v["correct"]), verification.verified_shares(v["costly"])
    assert correct["derived"] >= N_VERIFY * 0.75 and costly["derived"] >= N_VERIFY * 0.75
    bound = NOMINAL + 2 * math.sqrt(NOMINAL * (1 - NOMINAL) / correct["derived"])
    assert correct["failed"] <= bound and costly["verified"] <= bound


@long
@pytest.mark.xfail(strict=True, reason="measured: a right schedule verified in 38% (undecided 60%, failed 2%) of "
                                       "40; a costly switch failed in 100%. Power fell with the honest burst "
                                       "interval at c=16 (the prompt sample's variance of the rate "
                                       "at the load), which non-inferiority must clear at every concurrency")
def test_verification_decides_on_a_quiet_machine(runs):
    """Power of the verification where run to run is small (1.5%): a right schedule is verified and a
    switch costing 15% fails, mostly. (With 5% run to run and R=2 both are mostly undecided.) Fixed:
    a right schedule was verified in only 35% (undecided 60%), because 'verified'
    asked for two-sided TOST equivalence at every concurrency, so a deployment that ran faster than
    its reference (its tail speculating at small batches) was undecided; it asks for non-inferiority
    (deployment.verification), each concurrency at alpha (an intersection-union test needs no
    correction)."""
    v = runs[("verify", "quiet")]
    print("\nquiet: " + _verification_text(v))
    assert verification.verified_shares(v["costly"])["failed"] >= 0.8
    assert verification.verified_shares(v["correct"])["verified"] >= 0.5


# -- k sweeps and external endpoints -----------------------------------------------------
N_K = 60                # simulated k sweeps per scenario: binomial Monte-Carlo se 3.9% at 10%
N_K_NULL = 120          # the null: se 2.0% at 5% (its defect, a k with no support at all, is exact: 0)
N_EXT = 20


def k_scenarios(n: int, *names) -> dict:
    """KScenario name -> its k_rates over `n` simulated sweeps (decided as the workflow does: krecommend.recommend
    on the sequential design's cells)."""
    res = compute({x: dict(kind="ksweep", name=x, experiments=n, repeats=3) for x in names})
    return {x: ksweeps.k_rates(res[x]["rows"], ksweeps.K_SCENARIOS[x]) for x in names}


def _k_text(r: dict, cs) -> str:
    f = lambda x: f"{x[0]:.1%} ± {x[1]:.1%}"  # noqa: E731
    return ("speculation at " + ", ".join(f"c={c} {f(r['speculate_at'][c])}" for c in cs) + f", above {f(r['above'])}; "
            "k at " + "; ".join(f"c={c}: " + ", ".join(f"{k} {x[0]:.1%}" for k, x in r["k_at"][c].items()) for c in cs)
            + "; off where a k pays at alpha/K " + ", ".join(f"{f(r['off_over_beaten'][c])}" for c in cs)
            + " (at alpha " + ", ".join(f"{f(r['off_over_beaten_90'][c])}" for c in cs) + ")")


@long
def test_a_k_schedule_deploys_speculation_where_off_is_best_rarely():
    """Issue 34, finding 1: truth k=3 best by 10% at c=1 (1.32x; k=5 1.20x), off best at c=16 (k=3 0.85x,
    k=5 0.75x), on the default's shape. An undecided c=16 inherited c=1's k unless that k was shown worse
    there, and batch sizes to 256 extended it: speculation at c=16 and above in 28.0 ± 3.2% of 200 sweeps
    with run to run of 10% a cell (9.5 ± 2.1% on a quiet machine), most as "keep one k everywhere",
    never verified. Now each concurrency runs by its own data: a k only where some k pays there against
    off at alpha / K, so no k runs where none does, and off never runs where one does (both exactly,
    read against the harness's own comparisons); above an undecided c=16 speculation is off."""
    got = k_scenarios(N_K, "one", "one-quiet")
    for name, r in got.items():
        print(f"\n{name}: " + _k_text(r, (1, 16)))
        assert r["speculate_at"][16][0] <= 0.10 and r["above"][0] <= 0.10, name
        for c in (1, 16):
            assert r["off_over_beaten"][c][0] == 0 and r["unsupported"][c][0] == 0, (name, c)
    # where the data decide, batch 1 runs the truth's k
    assert got["one-quiet"]["k_at"][1].get(3, (0,))[0] >= 0.95


@long
def test_the_k_sweep_null_speculates_at_most_at_its_stated_bound_per_concurrency():
    """Issue 34, finding 5: every k as fast as off on average at c=1 and c=16 (per prompt the speedup
    varies: speculation helps prompts it accepts on). The stated bound: a false "speculate" at most
    alpha / 2 = 5% at each measured concurrency (one-sided, whatever K), at most 10% over the two.
    Before, the "best" path deployed the best of K at alpha and an undecided concurrency inherited its
    neighbour's k: 5.5 ± 1.6% at each (200 sweeps), of which 3.0% (c=1) and 2.0% (c=16) with no k paying
    there at alpha / K at all. Now only where some k pays at alpha / K (none otherwise: exactly), within
    Monte-Carlo error of the bound at both concurrencies. What is left above alpha / 2 at c=16 is the
    burst cell's interval (k_interval_rates: its variance ratio), not the rule."""
    r = k_scenarios(N_K_NULL, "null")["null"]
    print("\nnull: " + _k_text(r, (1, 16)) + f"; anywhere {r['anywhere'][0]:.1%} ± {r['anywhere'][1]:.1%}")
    for c in (1, 16):
        p, se, _ = r["speculate_at"][c]
        assert p <= 0.05 + 2 * se, (c, p, se)
        assert r["unsupported"][c][0] == 0, c
    assert r["anywhere"][0] <= 0.10 + 2 * r["anywhere"][1]


@long
def test_external_endpoints_get_a_schedule_that_follows_their_verdicts():
    """Issue 34, finding 6, over N_EXT simulated runs (calibration.external.external_task): an external
    endpoint 1.3x faster up to 4 running requests and 0.6x above gets a valid vLLM schedule that follows
    its verdicts (drafting where it pays, off where not, drafts below the switch and off above it), and
    where they are the issue's (pays at c=1 and 4, loses at 16) one that drafts at batch 1-4 and is off at
    16 (was, in 40 of 40 runs: "keep speculation on at every batch size", no schedule, as configured);
    marked not verifiable; its twin, configured with no speculation and drafting nothing, gets no
    recommendation; no text names a list and leaves it empty (was: 1 in 40 quiet, 12 in 40 at 10% run to
    run)."""
    res = compute({"ext": dict(kind="external", experiments=N_EXT, repeats=3)})
    r = external.external_rates(res["ext"]["rows"])
    print(f"\nexternal: schedule {r['schedule'][0]:.1%}, following the verdicts {r['follows'][0]:.1%}, pays/pays/"
          f"loses {r['pattern'][0]:.1%} and then right {r['right'][0]:.1%}, not verifiable {r['not_verifiable'][0]:.1%}, "
          f"switch at {sorted(r['switch'])}, actions {r['actions']}")
    assert r["schedule"][0] >= 0.9 and r["follows"][0] == 1 and r["not_verifiable"][0] == 1
    assert r["pattern"][2] >= N_EXT // 3 and r["right"][0] == 1
    assert r["twin"][0] == 0 and r["empty_list"][0] == 0
