"""The distributions the decision rules use (specmatch.stats): SciPy's special functions behind the
names the rules call. Checked against values computed independently with mpmath at 40 digits (the
expected numbers below), against scipy.stats over a grid of degrees of freedom (1 to 1e6 and inf)
and probabilities (1e-6 to 1 - 1e-6), and by the identities the functions obey."""
import math
from statistics import NormalDist

import numpy as np
import pytest
from scipy import stats as sps

from specmatch import stats

INF = math.inf
DOFS = [1, 1.5, 2, 3, 5, 10, 30, 100, 1e3, 1e4, 1e5, 1e6, INF]
PROBS = [1e-6, 1e-4, 0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 0.95, 0.975, 0.99, 1 - 1e-4, 1 - 1e-6]

# mpmath (mp.dps = 40): t quantiles by root-finding on 1 - I_{d/(d+t^2)}(d/2, 1/2)/2, chi-square ones
# on the regularized lower incomplete gamma, the normal by erfinv; the digits are mpmath's, rounded
KNOWN = [
    (stats.t_ppf, (0.975, 1), 12.706204736174693),
    (stats.t_ppf, (0.975, 10), 2.2281388519862742),
    (stats.t_ppf, (0.95, 30), 1.6972608865939574),
    (stats.t_ppf, (1 - 1e-6, 3), 103.29946777942897),
    (stats.t_ppf, (0.9, 1.5), 2.1963984175655378),
    (stats.t_ppf, (0.999, 1e6), 3.0902404563165193),
    (stats.t_ppf, (1e-6, 1e6), -4.7534523482796808),
    (stats.t_ppf, (0.975, INF), 1.9599639845400539),
    (stats.t_ppf, (1e-6, INF), -4.7534243088228990),
    (stats.t_cdf, (2.0, 3), 0.93033701572057841),
    (stats.t_cdf, (-4.5, 1), 0.069604487273063949),
    (stats.t_cdf, (1.0, 1e6), 0.84134462508321094),
    (stats.chi2_ppf, (0.95, 1), 3.8414588206941245),
    (stats.chi2_ppf, (0.1, 3), 0.58437437415518328),
    (stats.chi2_ppf, (0.5, 2), 1.3862943611198906),
    (stats.chi2_ppf, (1e-6, 1), 1.5707963267957189e-12),
    (stats.chi2_ppf, (1 - 1e-6, 1e6), 1006736.7596362823),
    (stats.chi2_ppf, (0.5, 1e6), 999999.33333341235),
    (stats.chi2_ppf, (0.99, 7.5), 19.288172099817386),
    (stats.chi2_cdf, (1.0, 1), 0.68268949213708590),
    (stats.chi2_cdf, (3.0, 4), 0.44217459962892543),
    (stats.chi2_cdf, (0.5, 2.5), 0.13611637154141116),
    (stats.chi2_cdf, (1e6, 1e6), 0.50018806319660550),
    (stats.chi2_pdf, (1.0, 1), 0.24197072451914335),
    (stats.chi2_pdf, (3.0, 4), 0.16734762011132237),
    (stats.chi2_pdf, (0.5, 2.5), 0.30378078659502494),
    (stats.chi2_pdf, (1e6, 1e6), 0.00028209474475808343),
    (stats.digamma, (1.0,), -0.57721566490153286),
    (stats.digamma, (0.5,), -1.9635100260214235),
    (stats.digamma, (1e-3,), -1000.5755719318103),
    (stats.digamma, (7.3,), 1.9178203356379861),
    (stats.digamma, (1e6,), 13.815510057964191),
    (stats.trigamma, (1.0,), 1.6449340668482264),
    (stats.trigamma, (0.5,), 4.9348022005446793),
    (stats.trigamma, (1e-3,), 1000001.6425331958),
    (stats.trigamma, (7.3,), 0.14679576813142710),
    (stats.trigamma, (1e6,), 1.0000005000001667e-6),
    (stats.trigamma_inverse, (1.6449340668482264,), 1.0),
    (stats.trigamma_inverse, (4.9348022005446793,), 0.5),
    (stats.median_fit_dof, ([1],), 0.36752293759560291),
    (stats.median_fit_dof, ([2],), 0.96090602783640285),
    (stats.median_fit_dof, ([5],), 2.8446414493218177),
    (stats.median_fit_dof, ([1, 4],), 2.1915417910800191),
]


@pytest.mark.parametrize("fn, args, want", KNOWN, ids=[f"{f.__name__}{a}" for f, a, _ in KNOWN])
def test_known_values(fn, args, want):
    got = fn(*args)
    assert type(got) is float  # records, JSON and f-strings get plain floats
    assert got == pytest.approx(want, rel=1e-12), (fn.__name__, args)


def test_t_over_the_grid():
    for d in DOFS:
        ref = sps.norm if d == INF else sps.t(d)
        for p in PROBS:
            q = stats.t_ppf(p, d)
            assert q == pytest.approx(np.clip(ref.ppf(p), -stats.T_MAX, stats.T_MAX), rel=1e-12), (p, d)
            if abs(q) < stats.T_MAX:
                assert stats.t_cdf(q, d) == pytest.approx(p, rel=1e-9), (p, d)      # the small tail too
            assert stats.t_ppf(1 - p, d) == pytest.approx(-q, rel=1e-7, abs=1e-12)  # symmetric (1 - p rounds)
            if d == INF:
                assert q == pytest.approx(NormalDist().inv_cdf(p), rel=1e-12)


def test_t_quantiles_are_held_within_a_thousand():
    """dof far below 1 (Satterthwaite's rule gives them) have quantiles beyond any float's exp: held at
    +-T_MAX, as the hand-written bisection was, so an interval exp(estimate +- t se) stays finite."""
    assert stats.T_MAX == 1e3
    assert stats.t_ppf(1e-6, 1) == -1e3 and stats.t_ppf(0.95, 0.05) == 1e3      # true: -3.2e5 and 3.7e19
    assert stats.t_ppf(0.95, 0.5) == pytest.approx(sps.t.ppf(0.95, 0.5), rel=1e-12)  # 31.4: left alone
    assert math.isfinite(math.exp(0.1 + stats.t_ppf(0.95, 0.05) * 0.3))
    assert stats.t_ppf(np.array([1e-6, 0.5]), 1).tolist() == [-1e3, 0.0]


def test_chi2_over_the_grid():
    for d in DOFS[:-1]:
        ref = sps.chi2(d)
        for p in PROBS:
            x = stats.chi2_ppf(p, d)
            assert x == pytest.approx(ref.ppf(p), rel=1e-12), (p, d)
            assert stats.chi2_cdf(x, d) == pytest.approx(p, rel=1e-9), (p, d)
            assert stats.chi2_pdf(x, d) == pytest.approx(ref.pdf(x), rel=1e-12), (p, d)


def test_chi2_is_zero_below_zero():
    for d in (1, 2, 7.5):
        assert stats.chi2_cdf(0.0, d) == 0.0 and stats.chi2_cdf(-3.0, d) == 0.0
        assert stats.chi2_pdf(-1.0, d) == 0.0


def test_digamma_and_trigamma_obey_their_recurrences():
    x = np.logspace(-3, 6, 91)
    assert np.allclose(stats.digamma(x + 1), stats.digamma(x) + 1 / x, rtol=1e-12, atol=1e-12)
    assert np.allclose(stats.trigamma(x + 1), stats.trigamma(x) - 1 / x ** 2, rtol=1e-10, atol=0)


def test_trigamma_inverse_inverts_trigamma():
    x = np.logspace(-6, 6, 121)
    y = stats.trigamma(x)
    back = stats.trigamma_inverse(y)
    assert np.max(np.abs(back / x - 1)) < 1e-12
    assert [stats.trigamma_inverse(float(v)) for v in y[::20]] == pytest.approx(x[::20], rel=1e-12)
    assert stats.trigamma_inverse(0.0) == INF and stats.trigamma_inverse(-1.0) == INF


def test_vectorised_calls_equal_the_scalar_ones():
    p = np.array([[1e-6, 0.3], [0.9, 1 - 1e-6]])
    d = np.array([[1.0, 30.0], [1e6, INF]])
    got = stats.t_ppf(p, d)
    assert isinstance(got, np.ndarray) and got.shape == (2, 2)
    assert got.tolist() == [[stats.t_ppf(float(a), float(b)) for a, b in zip(ra, rb)] for ra, rb in zip(p, d)]
    q = stats.chi2_ppf(p, d[:, :1])   # broadcasting: one dof per row
    assert q.shape == (2, 2) and q[1, 1] == stats.chi2_ppf(1 - 1e-6, 1e6)
    assert stats.chi2_cdf(q, d[:, :1]) == pytest.approx(p, rel=1e-9)


def test_median_fit_dof_adds_up_over_configurations():
    """nu = 8 n g^2: n configurations of one dof give n times one's; none give 0."""
    assert stats.median_fit_dof([]) == 0.0
    one = stats.median_fit_dof([3])
    assert stats.median_fit_dof([3] * 7) == pytest.approx(7 * one, rel=1e-14)
    assert stats.median_fit_dof(np.array([3.0] * 7)) == stats.median_fit_dof([3] * 7)


@pytest.mark.parametrize("dof", [0.05, 1, 2.5, 30, INF])
@pytest.mark.parametrize("confidence", [0.8, 0.9, 0.95])
def test_the_interval_helpers_are_the_two_sided_t_interval_to_the_last_bit(dof, confidence):
    """Every interval of the decisions is t_interval or its log form: the t quantile at 0.5 + confidence / 2
    (capped, as t_ppf), estimate -+ t se, the log form exponentiated after; equal, not approximately, to
    the arithmetic the call sites once wrote by hand."""
    est, se = 0.137, 0.0421
    t = stats.t_ppf(0.5 + confidence / 2, dof)
    assert stats.t_critical(dof, confidence) == t
    assert stats.t_half_width(se, dof, confidence) == t * se
    assert stats.t_interval(est, se, dof, confidence) == (est - t * se, est + t * se)
    assert stats.log_t_interval(est, se, dof, confidence) == (math.exp(est - t * se), math.exp(est + t * se))
    lo, hi = stats.t_interval(est, se, dof, confidence)
    assert lo < est < hi and stats.t_interval(est, 0.0, dof, confidence) == (est, est)
