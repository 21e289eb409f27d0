"""The covariate adjustment (deciding.adjust) on synthetic cells whose truth is known: a covariate that tracks
the time-varying slowdown removes it (from the spread and from the means), one that tracks nothing changes
nearly nothing, and the adjusted cell is the measured one on another clock."""
from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from specmatch.calibration.simulate import cell
from specmatch.deciding.adjust import adjust, scaled, slopes
from specmatch.deciding.measurements import Arrays
from specmatch.files import SpecmatchError


def cells_with(slowdown, probe, repeats=6, servers=("baseline", "spec"), seed=0):
    """Each server measured `repeats` times at c=1 and 16; every cell's log speed moved by slowdown[r] (a
    time-varying machine) and a little noise of its own; its probe reads probe[r] (+ noise)."""
    rng = np.random.default_rng(seed)
    out = np.full(8, 24.0)
    cells = []
    for r in range(repeats):
        for s in servers:
            for c in (1, 16):
                speed = math.exp(slowdown[r] + rng.normal(0, 0.005))
                e2e = (0.2 + 2.0 * (1 + 0.1 * c) * rng.lognormal(0, 0.02, 8)) / speed
                res, req = cell(s, "u", c, r + 1, e2e, np.full(8, 0.2) / speed, out, [f"p{i}" for i in range(8)])
                res.started_at = 60.0 * r
                res.probe_log_speed = probe[r] + rng.normal(0, 0.002)
                cells.append((res, req))
    return cells


def spread(cells, server="baseline", c=1):
    y = [math.log(x.output_throughput) for x, _ in cells if x.server == server and x.concurrency == c]
    return float(np.var(y, ddof=1)), float(np.mean(y))


def test_a_probe_that_tracks_the_slowdown_removes_it():
    rng = np.random.default_rng(1)
    slow = rng.normal(0, 0.1, 6)
    cells = cells_with(slow, slow)
    adj, info = adjust(cells, "probe")
    before, mean_before = spread(cells)
    after, mean_after = spread(adj)
    assert after < before / 20                          # the shared slowdown is gone from the spread
    assert info.slopes[1].theta == pytest.approx(1.0, abs=0.1) and info.slopes[1].explained > 0.9
    assert info.unadjusted == []
    # every cell moved to the common probe level: both servers alike, so the difference between them stays
    diff = [spread(x, "spec")[1] - spread(x, "baseline")[1] for x in (cells, adj)]
    assert diff[1] == pytest.approx(diff[0], abs=0.01)


def test_a_probe_that_tracks_nothing_changes_nearly_nothing():
    rng = np.random.default_rng(2)
    slow = rng.normal(0, 0.1, 6)
    cells = cells_with(slow, rng.normal(0, 0.1, 6))
    adj, info = adjust(cells, "probe")
    before, mb = spread(cells)
    after, ma = spread(adj)
    assert abs(info.slopes[1].theta) < 3 * info.slopes[1].se   # theta indistinguishable from 0
    assert after == pytest.approx(before, rel=0.6) and ma == pytest.approx(mb, abs=0.05)


def test_time_adjustment_removes_a_linear_drift():
    drift = 0.01 * np.arange(6)          # 1% per minute (repeats a minute apart)
    cells = cells_with(drift, np.zeros(6))
    adj, info = adjust(cells, "time")
    for c in (1, 16):   # per minute, within its standard error
        assert abs(info.slopes[c].theta - 0.01) < 3 * info.slopes[c].se
    assert spread(adj)[0] < spread(cells)[0] / 5


def test_adjusted_cell_is_the_measured_cell_on_another_clock():
    cells = cells_with(np.zeros(6), np.zeros(6))
    c, req = cells[0]
    req = req.with_columns(pl.Series("arrivals_s", [[0.1, 0.2]] * req.height))
    c2, req2 = scaled(c, req, 1.25)
    assert c2.output_throughput == pytest.approx(c.output_throughput / 1.25) and c2.duration == pytest.approx(
        c.duration * 1.25)
    assert req2["e2e_s"].to_list() == pytest.approx([x * 1.25 for x in req["e2e_s"].to_list()])
    assert req2["arrivals_s"][0].to_list() == pytest.approx([0.125, 0.25])
    a, b = Arrays.of(c, req, {}), Arrays.of(c2, req2, {})
    idx = np.arange(len(a.out))[None, :]
    assert b.stat("output_throughput", idx)[0] == pytest.approx(a.stat("output_throughput", idx)[0] / 1.25)
    assert adjust(cells, None) == (cells, None)
    with pytest.raises(SpecmatchError, match="unknown covariate"):
        adjust(cells, "weather")
    # cells without the covariate are kept as measured, and named
    for x, _ in cells[:2]:
        x.probe_log_speed = None
    got, info = adjust(cells, "probe")
    assert got[0][0] is cells[0][0] and len(info.unadjusted) == 2
    assert slopes([x for x, _ in cells], "interference") == {}

