"""Run-to-run noise (specmatch.deciding.verdicts.noise) on synthetic estimates whose structure is known."""
import math

import numpy as np
import pytest

from specmatch.deciding.verdicts.noise import _shrunk, prior_dof


def _groups(s2_by_c: dict, repeats: int = 3):
    """cfgs and residuals for _shrunk: one suite, a server per variance, `repeats` repeats (Q = s2 (R-1))."""
    cfgs, resid = [], []
    for c, s2s in s2_by_c.items():
        for i, s2 in enumerate(s2s):
            server = f"s{i}"
            cfgs.append(((server, "a", c), s2 * (repeats - 1), repeats - 1))
    for server in {cfg[0][0] for cfg in cfgs}:
        n = sum(1 for cfg in cfgs if cfg[0][0] == server)
        for r in range(1, repeats + 1):
            resid += [(server, r, 0.0, repeats)] * n
    return cfgs, resid


def test_a_shrunk_variance_has_the_dof_of_its_prior_and_its_own_data():
    """Smyth (2004): a group's variance shrunk toward its prior with weight d0 / (d0 + d) has d0 + d
    degrees of freedom: the prior is worth d0 as an estimate of this group's variance, however
    precisely the prior level itself is estimated. The prior part was given the level's own dof (all
    the groups'), and Satterthwaite then read the sum as worth about (d0 + d)^2 / d: for goodput at
    c=16 (d0 ~ 1, d ~ 3) about 5.6 instead of 4, intervals too narrow."""
    rng = np.random.default_rng(0)
    # true variances that differ by group (log sd 1.5), each estimated from R - 1 = 2 dof
    s2 = {c: list(np.exp(rng.normal(math.log(1e-3), 1.5, 8)) * rng.chisquare(2, 8) / 2) for c in (1, 4, 16)}
    cfgs, resid = _groups(s2)
    groups, _, prior = _shrunk("m", cfgs, 0.0, resid)
    d0 = min(prior["groups"], 1e9)
    assert math.isfinite(prior["groups"]) and d0 < 20   # they scatter: the prior is worth a few dof
    for (server, c), v in groups.items():
        own = 2.0   # R - 1, one suite, no session share
        assert v.dof <= d0 + own + 1e-6, (server, c, v.dof, d0)
    # where they scatter no more than sampling explains, the prior carries (almost) everything
    same = {c: [1e-3] * 8 for c in (1, 4, 16)}
    cfgs, resid = _groups(same)
    groups, _, prior = _shrunk("m", cfgs, 0.0, resid)
    assert prior["groups"] == float("inf") and all(v.dof > 20 for v in groups.values())


def test_prior_dof_reads_scatter_beyond_sampling():
    """d0 is large where the estimates scatter as their sampling explains, a few dof where the true
    variances differ (log sd 1: d0 = 2 trigamma^-1(1) ~ 3.3, read from an upper bound: smaller)."""
    rng = np.random.default_rng(1)
    d = 4.0
    flat = [(float(rng.chisquare(d) / d), d, "all") for _ in range(400)]
    assert prior_dof(flat) > 30
    wide = [(float(np.exp(rng.normal(0, 1.0)) * rng.chisquare(d) / d), d, "all") for _ in range(400)]
    assert 1.0 < prior_dof(wide) < 5.0


def test_flagged_cells_stay_out_of_tau2_and_a_dominating_suite_is_named():
    """A cell measured beside another job (interference.flagged) says how busy the machine was: it is left
    out of run to run (its verdict stays flagged elsewhere), and a suite whose cells alone hold most of
    the spread between sessions is named."""
    from specmatch.calibration.traffic import traffic_cells
    from specmatch.deciding.reading.measurements import Measurements, Settings
    from specmatch.deciding.verdicts.noise import run_to_run
    from specmatch.records import Interference

    def cells(slow: float):
        got = traffic_cells(4, {"a": {"code": 8}, "b": {"code": 8}, "c": {"code": 8}}, (1, 4), repeats=3)
        out = []
        for res, req in got:
            if (res.server, res.suite, res.concurrency, res.repeat) == ("spec", "b", 4, 2):
                res.output_throughput /= slow            # measured beside another job
                req = req.with_columns(req["e2e_s"] * slow)
                res.interference = Interference(True, flagged=slow > 1)
            out.append((res, req))
        return Measurements.of(out, Settings(bootstrap=50))

    clean, busy = run_to_run(cells(1.0)), run_to_run(cells(3.0))
    assert busy.left_out == [("spec", "b", 4, 2)] and clean.left_out == []
    at = {n: r.at("output_throughput", "spec", 4).total for n, r in (("clean", clean), ("busy", busy))}
    assert at["busy"] < 2 * at["clean"]   # left out: the busy cell does not set spec's tau^2 at c=4
    assert busy.dominant["output_throughput"] is None

    # the same slow cell not flagged (the sampler saw nothing): it stays in, and its suite is named
    m = cells(3.0)
    m.cells[("spec", "b", 4, 2)].interference = None
    rr = run_to_run(m)
    assert rr.left_out == [] and rr.at("output_throughput", "spec", 4).total > 10 * at["clean"]
    suite, share_q, share_d = rr.dominant["output_throughput"]
    assert suite == "b" and share_q > 0.5 > share_d


def test_tail_weights_read_heavy_tails_where_the_residuals_show_them():
    """noise.tail_weights (issue 48): the posterior weight of normal and Student-t tails given
    standardised run-to-run residuals, each model at its own best scale. Known truth: 400 residuals of
    Student-t(3) effects put nearly all weight on heavy tails, 400 normal ones most on normal; a few
    dozen (a default run's configurations at two repeats) move the prior only a little either way, which
    is why a prior decides (HEAVY_PRIOR measured, TAIL_PRIOR used: normal alone, which no residual moves);
    fewer than three leave it as it is."""
    from specmatch.deciding.verdicts.noise import HEAVY_PRIOR, TAIL_PRIOR, tail_weights

    rng = np.random.default_rng(5)
    heavy = [(float(x), 1.0) for x in rng.standard_t(3, 400) / math.sqrt(3)]
    normal = [(float(x), 1.0) for x in rng.standard_normal(400)]
    w_heavy, w_normal = dict(tail_weights(heavy, HEAVY_PRIOR)), dict(tail_weights(normal, HEAVY_PRIOR))
    assert w_heavy[math.inf] < 0.01 and w_heavy[3.0] > 0.5, w_heavy
    assert w_normal[math.inf] > 0.8, w_normal
    # scale-free: the same residuals in other units, the same weights
    scaled = dict(tail_weights([(10 * x, w) for x, w in heavy], HEAVY_PRIOR))
    assert all(scaled[nu] == pytest.approx(w_heavy[nu], abs=1e-3) for nu in w_heavy), (scaled, w_heavy)
    small = [dict(tail_weights([(float(x), 1.0) for x in draw(18)], HEAVY_PRIOR))[math.inf]
             for draw in (rng.standard_normal, lambda k: rng.standard_t(3, k) / math.sqrt(3)) for _ in range(60)]
    assert 0.3 < np.mean(small[:60]) < 0.9 and 0.2 < np.mean(small[60:]) < 0.9
    assert tail_weights([(1.0, 1.0), (-0.5, 1.0)], HEAVY_PRIOR) == HEAVY_PRIOR
    assert tail_weights(heavy) == TAIL_PRIOR == ((math.inf, 1.0),)
    # out of any fixed scale grid, and a non-finite residual left out rather than poisoning the weights
    far = dict(tail_weights([(1e-4 * x, w) for x, w in heavy] + [(float("nan"), 1.0)], HEAVY_PRIOR))
    assert all(far[nu] == pytest.approx(w_heavy[nu], abs=1e-3) for nu in w_heavy), far


def test_run_to_run_carries_the_tails_its_residuals_give():
    """run_to_run records, per metric, the tail weights of its configurations' residuals in units of
    their concurrency's level (the comparisons carry them to 'what would decide it')."""
    from specmatch.deciding.verdicts.noise import standardised
    from specmatch.deciding.verdicts.noise import VarianceSum

    cfgs = [(("s", "u", 1), 0.02, 1), (("s", "v", 1), 0.5, 2)]
    resid = [("s", 1, 0.1, 2), ("s", 2, -0.1, 2), ("s", 1, 0.5, 3), ("s", 2, -0.3, 3), ("s", 3, -0.2, 3)]
    levels = {("s", 1): VarianceSum({("g",): [0.04, 4.0]})}
    got = standardised(cfgs, resid, levels)
    # two repeats: |y1 - y2| / sqrt(2 tau^2), once; three: each residual over sqrt(tau^2 2 / 3), weight 2 / 3
    assert got[0] == pytest.approx((0.2 / math.sqrt(0.08), 1.0))
    assert [x for x, _ in got[1:]] == pytest.approx([e / math.sqrt(0.04 * 2 / 3) for e in (0.5, -0.3, -0.2)])
    assert [w for _, w in got[1:]] == pytest.approx([2 / 3] * 3)
