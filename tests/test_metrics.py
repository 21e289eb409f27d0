"""One definition of each metric (specmatch.metrics): no copy of a formula anywhere else in the package,
and every reader (the verdicts' cell figure and bootstrap estimator, the traffic prediction's simulated
suite, the model check's replay) reads a cell as the table does."""
from __future__ import annotations

import re

import numpy as np
import pytest

from builders import REPO
from specmatch import metrics
from specmatch.calibration.des import Engine, serve
from specmatch.calibration.simulate import cell
from specmatch.deciding.reading.measurements import Arrays, Settings
from specmatch.deciding.predicting.traffic.step_model import figures

PKG = REPO / "workflow" / "specmatch"
SLO = {"ttft_ms": 60.0, "tpot_ms": 9.0, "e2el_ms": 400.0}

# A formula written outside the table: TPOT's denominator, an SLO threshold, a closed loop's rate.
COPIES = {
    "TPOT's denominator (metrics.tpot_tokens)": re.compile(r"maximum\(\s*[\w.\[\]]+\s*-\s*1\s*,\s*1\s*\)"),
    "an SLO filter (metrics.good)": re.compile(r"\*\s*1000\s*<=|slo\[\s*[\"'](ttft|tpot|e2el)_ms"),
    "a closed loop's rate (metrics.estimate)": re.compile(r"workers\s*\*\s*[\w.\[\]()]+\s*/"),
}


def test_no_metric_formula_is_written_outside_the_table():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if path == PKG / "metrics.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for what, pattern in COPIES.items():
                if pattern.search(code):
                    found.append(f"{path.relative_to(REPO)}:{i}: {what}: {line.strip()}")
    assert found == []


def test_the_searches_find_the_copies_they_look_for():
    """The patterns above on the formulas as they were once copied, so the search cannot pass by
    matching nothing."""
    copies = ["tpot = np.where(out > 1, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)",
              "good &= ttft * 1000 <= slo['ttft_ms']", "good &= e2e * 1000 <= slo[\"e2el_ms\"]",
              "return self.workers * num / lat[idx].sum(-1)"]
    for text in copies:
        assert any(p.search(text) for p in COPIES.values()), text


def test_the_table_is_the_one_list_of_metrics():
    assert metrics.NAMES == ("output_throughput", "goodput", "tpot", "e2el")
    assert metrics.LATENCY == {"tpot", "e2el"}
    assert Settings().metrics == ("output_throughput", "tpot", "e2el")      # goodput only with an SLO
    assert Settings(slo=SLO).metrics == metrics.NAMES
    assert all(metrics.LABEL[n] for n in metrics.NAMES)


def test_tpot_and_good_requests_are_vllms():
    e2e, ttft, out = np.array([0.5, 0.3, 0.2]), np.array([0.05, 0.1, 0.2]), np.array([51, 1, 11])
    tp = metrics.tpot(e2e, ttft, out)
    assert tp[0] == pytest.approx(0.45 / 50) and np.isnan(tp[1]) and tp[2] == pytest.approx(0.0)
    # a request of one token has TPOT 0 for the SLO (vLLM's --goodput); every threshold is inclusive
    assert metrics.good(e2e, ttft, tp, {"tpot_ms": 9.5}).tolist() == [True, True, True]
    assert metrics.good(e2e, ttft, tp, {"tpot_ms": 8.5}).tolist() == [False, True, True]
    assert metrics.good(e2e, ttft, tp, {"ttft_ms": 250.0, "e2el_ms": 300.0}).tolist() == [False, True, True]


def test_a_closed_loops_rate_is_c_times_tokens_over_the_sum_of_latencies():
    out, e2e = np.array([10.0, 20.0, 30.0]), np.array([1.0, 2.0, 3.0])
    got = metrics.closed_loop("output_throughput", 2, out, np.ones(3, bool), e2e, e2e)
    assert got == pytest.approx(2 * 60 / 6)
    assert metrics.log_speedup("output_throughput", 2.0, 1.0) == pytest.approx(np.log(2))
    assert metrics.log_speedup("e2el", 2.0, 1.0) == pytest.approx(-np.log(2))


@pytest.mark.parametrize("c", [1, 4, 16])
def test_a_predicted_suite_is_read_as_the_verdicts_read_a_measured_cell(c):
    """The traffic prediction's figure of a suite (traffic.figures) and the verdicts' figure of the same
    requests measured as a cell (Arrays.point, and the bootstrap estimator at the identity resample)
    are one number, for every metric: a traffic check compares the quantity that was predicted."""
    rng = np.random.default_rng(c)
    ptok = rng.integers(16, 400, (1, 16)).astype(float)
    out = rng.integers(2, 40, (1, 16))
    s = serve(Engine(), c, ptok, out, rng)
    res, frame = cell("x", "s", c, 1, s.e2e[0], s.ttft[0], out[0].astype(float), [f"p{i}" for i in range(16)],
                      starts=s.start[0], duration=float(s.duration[0]))
    a = Arrays.of(res, frame, SLO)
    for metric in metrics.NAMES:
        predicted = float(figures(metric, c, out.astype(float), s.e2e, s.ttft, SLO)[0])
        assert a.point(metric, res) == pytest.approx(predicted, rel=1e-12), metric
        assert float(a.stat(metric, np.arange(16)[None, :])[0]) == pytest.approx(predicted, rel=1e-12), metric
