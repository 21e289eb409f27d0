"""What would decide an inconclusive verdict (specmatch.deciding.verdicts.designs): two power statements,
each a probability at a named effect, checked where the truth is known.

The known-truth world here is the statement's own, but for the variance: one true run to run for every
comparison, estimated today from `DOF` degrees of freedom (as a run of the default's grid at R = 2
estimates it), the design's data then drawn from that truth and decided by the verdicts' own rule. The
statement draws the variance from its posterior, so it is calibrated over every statement it makes, not
within a group that its own choice selects: the short designs are named where today's estimate ran low
(docs/methods/calibration.md). The carried-out calibration on the discrete-event server, through the
rounds, is bench/hint_calibration.py's; tests/test_calibration.py keeps a gate of it.
"""
import math

import numpy as np
import pytest

from specmatch.deciding.reading.measurements import Settings
from specmatch.deciding.reading.sequential import Design, dof_share
from specmatch.deciding.verdicts import designs as D
from specmatch.deciding.verdicts.comparison import Comparison, decide
from specmatch.deciding.verdicts.noise import request_variance
from specmatch.deciding.verdicts.noise import VarianceSum
from specmatch.records import Decision
from specmatch.stats import t_ppf

S = Settings(bootstrap=400)
FIXED = Settings.of({"bootstrap": 400, "repeats": 2})
SEQ = Settings.of({"bootstrap": 400, "repeats": {"min": 2, "max": 3}})


def hinted(cmp: Comparison, s: Settings = S):
    return D.with_design(decide(cmp, s), cmp, s)


@pytest.mark.slow
def test_the_issues_example_names_an_equivalence_design_that_can_work():
    """Finding 3 of an early review: eagle3 at 1.00x [0.81, 1.23], run to run 7.6%, R=2, min_effect 0.05
    was told 'a suite about 15x larger', which would still leave a half-width of 0.13 against a 0.05
    band. The equivalence design is solved for (repeats, suite size) jointly; at it the interval is
    narrower than the band, so 'equivalent' is reachable. Here the prompt sample holds most of the variance
    (w = 0.0073 against 0.0054 run to run), which more repeats of the same 16 prompts never average: only a
    much larger suite confirms no difference, and the likeliest design does so with about one half. The
    effect design decides speedups beyond about ±10% with 80%, and both are in the text."""
    tau2 = math.log(1.076) ** 2
    dof = 8.0
    se = math.log(1.23 / 0.81) / 2 / t_ppf(0.95, dof)
    between = 2 * tau2 / 2
    w = se ** 2 - between
    cmp = Comparison("eagle3", "baseline", "train_holdout", 1, "output_throughput", [0.0, 0.0], [w, w], 0.0, se, dof,
                     True)
    cmp.prompts = 16
    v = hinted(cmp)
    assert v.verdict == Decision.INCONCLUSIVE
    eq, eff = v.design["equivalence"], v.design["effect"]
    assert v.design == D.deciding_designs(cmp, S)
    Vn = w / eq["suite_scale"] + between * 2 / eq["repeats"]
    assert t_ppf(0.95, 30) * math.sqrt(Vn) < math.log(1.05)
    assert eq["repeats"] >= 20 and eq["suite_scale"] >= 8 and 0.3 <= eq["probability"], eq
    assert eff["reachable"] and eff["repeats"] < eq["repeats"]
    assert 0.88 <= eff["lo"] < 1 < eff["hi"] <= 1 / 0.88, eff
    assert "no difference (within ±5%)" in v.decide and f"{eq['repeats']} repeats" in v.decide
    assert f"outside [{eff['lo']:.2f}, {eff['hi']:.2f}]" in v.decide and "80%" in v.decide


def test_a_near_miss_is_decided_by_a_few_repeats_beyond_small_effects():
    """An effect of 1.06x whose interval just reaches below 1, run to run dominating: a few more repeats
    (or a slightly larger suite measured afresh) decide speedups outside ±10% with 80%."""
    tau2 = 0.035 ** 2
    se = math.sqrt(2 * tau2 / 2 + 0.0001)
    cmp = Comparison("s", "b", "u", 4, "output_throughput", [math.log(1.06)] * 2, [0.0001] * 2, math.log(1.06), se,
                     12.0, True)
    cmp.prompts = 32
    v = hinted(cmp)
    eff = v.design["effect"]
    assert v.verdict == Decision.INCONCLUSIVE and eff["reachable"] and eff["repeats"] <= 8, eff
    assert 1 / 1.1 <= eff["lo"] < 1 < eff["hi"] <= 1.1, eff


@pytest.mark.slow
def test_a_power_statement_is_exact_at_its_effect_when_the_variance_is_known():
    """With run to run known exactly (infinite dof), the probability `power` states at an effect is the
    share of designs carried out at that effect that decide as the truth is: the simulation and the
    verdicts' rule agree (known truth: 3,000 draws of today's data at the truth, each carried out)."""
    w, b1 = 1e-4, 0.04 ** 2
    rng = np.random.default_rng(3)
    for theta, design, expect in ((0.0, (24, 1.0), "equivalent"), (math.log(1.08), (6, 1.0), "pays")):
        stated, got = [], []
        for i in range(300):
            p, sess = rng.normal(0, math.sqrt(w)), rng.normal(0, math.sqrt(b1), design[0])
            cmp = _comparison(theta + p + sess[:2].mean(), w, math.inf, b1, math.inf, 2)
            stated.append(float(D.decided_as_true(D.power(cmp, FIXED, [design], theta, np.random.default_rng(i),
                                                          400), theta)[0]))
            later = _comparison(theta + p + sess.mean(), w, math.inf, b1, math.inf, design[0])
            got.append(decide(later, FIXED).verdict.value == expect)
        se = math.sqrt(np.mean(got) * (1 - np.mean(got)) / len(got))
        assert abs(np.mean(got) - np.mean(stated)) <= 3 * se + 0.01, (theta, np.mean(stated), np.mean(got))


def _comparison(est, w_hat, w_dof, b_hat, dof, repeats):
    parts = VarianceSum().add(("w",), w_hat, w_dof).add(("g", "s"), b_hat / repeats, dof)
    c = Comparison("s", "b", "u", 4, "output_throughput", [est] * repeats, [w_hat] * repeats, est,
                   math.sqrt(parts.total), parts.dof, True)
    c.parts, c.prompts = parts, 32
    return c


DOF = 5.0   # run to run's dof at R = 2 on the default's grid (an audit measured 4.9-5.0)


def known_truth(population: str, n: int, seed: int = 7) -> list:
    """Statements made and carried out in a known-truth world (the module's docstring): identical servers
    ("aa") or a speedup of 1.06-1.10x either way ("near"), w = 1e-4, run to run 5% a repeat. Rows:
    (statement, probability at the truth, decided as the truth is, the design's cost R' x g)."""
    rng = np.random.default_rng(seed)
    w, b1 = 1e-4, 0.05 ** 2
    rows = []
    for i in range(n):
        theta = 0.0 if population == "aa" else float(rng.choice([-1, 1]) * rng.uniform(math.log(1.06),
                                                                                         math.log(1.10)))
        p, sess = rng.normal(0, math.sqrt(w)), rng.normal(0, math.sqrt(b1), D.MAX_REPEATS)
        b_hat = b1 * rng.chisquare(DOF) / DOF
        cmp = _comparison(theta + p + sess[:2].mean(), w, 31, b_hat, DOF, 2)
        v = hinted(cmp, FIXED)
        if v.verdict != Decision.INCONCLUSIVE or not v.design:
            continue
        for kind in ("equivalence", "effect"):
            d = v.design[kind]
            Rn, g = d["repeats"], d["suite_scale"]
            dn = DOF * (Rn - 1)
            if g == 1:   # more repeats of today's suite: today's sessions and prompt sample kept
                later = _comparison(theta + p + sess[:Rn].mean(), w, 31,
                                    (DOF * b_hat + b1 * rng.chisquare(dn - DOF)) / dn, dn, Rn)
            else:        # a larger suite measured afresh
                wd = 32 * g - 1
                later = _comparison(theta + rng.normal(0, math.sqrt(w / g)) + rng.normal(0, math.sqrt(b1), Rn).mean(),
                                    w / g * rng.chisquare(wd) / wd, wd, b1 * rng.chisquare(dn) / dn, dn, Rn)
            truth = "equivalent" if theta == 0 else "pays" if theta > 0 else "loses"
            at = D.power(cmp, FIXED, [(Rn, g)], theta, np.random.default_rng([seed, i]), D.CONFIRM_DRAWS)
            rows.append((kind, float(D.decided_as_true(at, theta)[0]), decide(later, FIXED).verdict.value == truth,
                         Rn * g))
    return rows


def _gap(rows: list, kind: str, keep=lambda r: True) -> tuple[float, float, float, int]:
    x = np.array([(r[1], r[2]) for r in rows if r[0] == kind and keep(r)], float).reshape(-1, 2)
    if len(x) < 2:
        return float("nan"), float("nan"), float("nan"), len(x)
    gap = x[:, 1] - x[:, 0]
    return float(x[:, 0].mean()), float(x[:, 1].mean()), float(gap.std(ddof=1) / math.sqrt(len(x))), len(x)


@pytest.mark.slow
@pytest.mark.parametrize("population, kind", [("aa", "equivalence"), ("near", "effect")])
def test_the_statements_come_true_at_their_effect_over_every_statement(population, kind):
    """Known truth (the module's docstring), 120 inconclusive comparisons: identical servers' equivalence
    statements (the probability stated if the speedup is 1.00, which it is) and the effect statements of
    speedups 1.06-1.10x (the probability at the truth, near the bounds' 80%), each carried out: decided
    within 3 Monte-Carlo errors or 5 points of the probability at the truth, over every statement.
    Measured (150 each): identical servers 82% -> 86%; 1.06-1.10x 77% -> 78%. By the design's cost they
    part (identical servers: designs of <= 12 repeats 83% -> 62%, of 40 or more 82% -> 100%): the search
    names a short design where today's estimate of run to run ran low (its median there 0.4 of the truth),
    a selection no variance posterior on 5 dof undoes; stated in docs/methods/calibration.md.

    Its teeth: with the variance taken at today's estimate (a posterior of infinite dof), the same
    statements read 83% -> 70% for identical servers (bench/hint_calibration.py's gates too)."""
    rows = known_truth(population, 120)
    st, dec, se, n = _gap(rows, kind)
    print(f"\n{population} {kind}: at the truth {st:.1%}, decided {dec:.1%} ± {se:.1%} of {n}; by cost: "
          + "; ".join(f"{lo}-{hi}: {x[0]:.0%} -> {x[1]:.0%} of {x[3]}" for lo, hi in ((0, 12), (13, 39), (40, 9999))
                      for x in [_gap(rows, kind, lambda r, lo=lo, hi=hi: lo <= r[3] <= hi)] if x[3]))
    assert n >= 60 and abs(dec - st) <= max(3 * se, 0.05), (st, dec, se, n)


def test_the_rounds_futility_stops_are_simulated():
    """Under the sequential design a named design is carried out through the rounds, which stop a
    configuration whose remaining repeats are unlikely to decide it (deciding.rounds.plan). `power`
    simulates those stops at every look: a design of more repeats of today's suite that the rounds would
    stop at today's look is never carried out (all futile), a larger suite still is; the outcomes sum to
    one; and a fixed design reaches both equivalence and effects."""
    def cmp_of(est, w, b, prompts=16):
        se = math.sqrt(w + b)
        c = Comparison("s", "b", "u", 1, "output_throughput", [est, est], [w, w], est, se, 8.0, True)
        c.prompts = prompts
        return c

    c = cmp_of(0.03, 0.0016, 0.0002)   # the prompt sample dominates: the rounds stop more repeats today
    assert not D.continues(c, Design(2, 4), SEQ)
    ends = D.power(c, SEQ, [(4, 1.0), (4, 4.0)], 0.0, np.random.default_rng(3), 4000)
    assert set(ends) == set(D.OUTCOMES)
    assert np.allclose(sum(ends.values()), 1.0)
    assert ends["futile"][0] == 1.0 and ends["equivalent"][1] + ends["pays"][1] + ends["loses"][1] > 0.0
    flat = cmp_of(0.0, 0.00002, 0.004)   # identical-looking, run to run dominating: many looks, stops bite
    seq = D.power(flat, SEQ, [(16, 1.0)], 0.0, np.random.default_rng(3), 4000)
    assert seq["futile"][0] > 0.0
    fixed = D.power(flat, FIXED, [(8, 1.0)], 0.0, np.random.default_rng(3), 4000)
    assert fixed["futile"][0] == 0.0 and fixed["equivalent"][0] > 0.0
    up = D.power(flat, FIXED, [(8, 1.0)], math.log(1.3), np.random.default_rng(3), 4000)
    assert up["pays"][0] > 0.9 and up["loses"][0] == 0.0


@pytest.mark.slow
def test_a_named_design_leaves_the_round_budget_out():
    """The simulation measures every configuration the rounds continue; a round budget
    (repeats.max_cells) may stop this one over budget for others likelier to be decided, which it cannot
    know. So under a budget the design it names says max_cells: null, what it simulated."""
    c = Comparison("s", "b", "u", 1, "output_throughput", [0.04, 0.04], [2e-5, 2e-5], 0.04, math.sqrt(2e-5 + 0.0006),
                   8.0, True)
    c.prompts = 16
    texts = {}
    for budget in (None, 4):
        s = Settings.of({"bootstrap": 400, "repeats": {"min": 2, "max": 3, "max_cells": budget}})
        texts[budget], d = D.what_would_decide(c, s)
        assert d is not None and d["equivalence"]["suite_scale"] == 1 and d["equivalence"]["repeats"] > 3, texts[budget]
    assert "max_cells" not in texts[None] and "max_cells: null}" in texts[4], texts


def test_a_larger_suite_averages_the_requests_own_noise():
    """Run to run holds each repeat's requests' own noise, which a suite g times larger averages over g
    times the requests (a session's or a cell's conditions it does not). comparison.request_variance
    reads that part from the repeats' bootstraps (each sees its own requests' noise; the prompt sample
    they share), and a larger suite's run to run shrinks by it: the same comparison is likelier decided
    by a larger suite where its run to run is all request noise."""
    rng = np.random.default_rng(4)
    shared, own = 0.0009, 0.0004
    boot = math.sqrt(shared) * rng.standard_normal((1, 20_000)) + math.sqrt(own) * rng.standard_normal((3, 20_000))
    assert request_variance(boot) == pytest.approx(own, rel=0.05)
    assert request_variance(boot[:1]) == 0.0
    c = Comparison("s", "b", "u", 16, "output_throughput", [0.03, 0.03], [1e-4, 1e-4], 0.03, math.sqrt(1e-4 + 0.002),
                   8.0, True)
    c.prompts = 16
    assert D.larger_suite(0.002, c.request_noise, 4) == 0.002
    theta = math.log(1.1)

    def decided(x):
        return D.decided_as_true(D.power(x, FIXED, [(2, 4.0), (4, 1.0)], theta, np.random.default_rng(3), 4000), theta)

    base = decided(c)
    c.request_noise = 0.0015     # three quarters of one repeat's run to run (0.002) is its requests' noise
    assert D.larger_suite(0.002, c.request_noise, 4) == pytest.approx(0.002 - 0.0015 * 0.75)
    assert D.larger_suite(0.002, 0.01, 4) == pytest.approx(0.0005)   # never below all of it averaged
    assert D.larger_suite(0.002, 0.0015, 1) == 0.002
    noisy = decided(c)
    assert noisy[0] > base[0] + 0.05 and noisy[1] == pytest.approx(base[1])


@pytest.mark.slow
def test_a_statement_assumes_the_share_of_cells_the_rounds_would_measure_again():
    """The statement's run-to-run estimate gains dof from every configuration the rounds continue, not
    only its own two cells (own_share). rounds_shares gives each comparison, per design max, the share the
    rounds would measure (their fixpoint, as deciding.rounds.plan): every undecided configuration that
    continues, and at least its own cells. Known truth: six undecided configurations of twelve cells at
    two repeats, all continued under a long design (share 1); a single undecided one gets its own share; a
    fixed design gets none; and the larger share raises a long design's probability."""
    cells = {(sv, u, c): 2 for sv in ("s", "b") for u in ("u", "v", "x") for c in (1, 16)}

    def cmp_of(u, c, est):
        parts = VarianceSum().add(("w",), 2e-5, 15).add(("g", "s", c), 0.004 / 2, 6.0)
        x = Comparison("s", "b", u, c, "output_throughput", [est, est], [2e-5] * 2, est, math.sqrt(parts.total),
                       parts.dof, True)
        x.parts, x.prompts = parts, 16
        x.own_share = dof_share(cells, {("s", u, c), ("b", u, c)}, 2)
        return x

    open_ = [cmp_of(u, c, 0.01) for u in ("u", "v", "x") for c in (1, 16)]
    assert all(D.undecided(x, SEQ) for x in open_)
    D.rounds_shares(open_, SEQ, cells)
    for x in open_:
        assert x.own_share == pytest.approx(1 / 6)
        assert x.round_shares[32] == 1.0 and min(x.round_shares.values()) >= x.own_share - 1e-12
        assert x.round_shares[3] <= x.round_shares[32]
    far = [cmp_of(u, c, 0.4) for u in ("u", "v", "x") for c in (1, 16)]
    lone = [cmp_of("u", 1, 0.01)] + far[1:]
    assert not any(D.undecided(x, SEQ) for x in far)
    D.rounds_shares(lone, SEQ, cells)
    assert lone[0].round_shares and all(v == pytest.approx(1 / 6) for v in lone[0].round_shares.values())
    assert not any(x.round_shares for x in far)
    fixed = cmp_of("u", 1, 0.01)
    D.rounds_shares([fixed], FIXED, cells)
    assert fixed.round_shares == {}
    own = cmp_of("u", 1, 0.01)
    designs = [(6, 1.0), (8, 1.0), (12, 1.0), (24, 1.0)]
    p_own = D.decided_as_true(D.power(own, SEQ, designs, 0.0, np.random.default_rng(3), 4000), 0.0)
    p_all = D.decided_as_true(D.power(open_[0], SEQ, designs, 0.0, np.random.default_rng(3), 4000), 0.0)
    assert (p_all >= p_own - 0.01).all() and (p_all > p_own + 0.03).any(), (p_own, p_all)
