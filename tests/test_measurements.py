"""A request's influence on the others in a closed loop's drain (deciding.reading.measurements): checked
against a step-by-step server whose truth is exact, by removing each request and serving the rest."""
from __future__ import annotations

import numpy as np
import pytest

from specmatch.deciding.reading.measurements import Arrays, caused_delay, load_figures
from specmatch.metrics import tpot as tpot_s

A, B = 0.020, 0.004   # step cost a + b x batch: x = b / a = 0.2


def serve(steps: list[int], workers: int, a: float = A, b: float = B, clock: list | None = None):
    """A closed loop of `workers` on a server whose every step costs a + b x the requests in flight and
    gives each one token (its first at the end of its first step). Returns start, first token, end;
    `clock` (a list) receives every step's end."""
    n = len(steps)
    start, first, end = np.zeros(n), np.zeros(n), np.zeros(n)
    queue, live, t = list(range(n)), {}, 0.0
    while queue or live:
        while queue and len(live) < workers:
            i = queue.pop(0)
            start[i], live[i] = t, 0
        t += a + b * len(live)
        if clock is not None:
            clock.append(t)
        for i in list(live):
            live[i] += 1
            if live[i] == 1:
                first[i] = t
            if live[i] == steps[i]:
                end[i] = t
                del live[i]
    return start, first, end


def sums_without(steps, workers, j):
    """The others' sum of latencies and of TPOT when request j is not sent at all."""
    rest = [s for i, s in enumerate(steps) if i != j]
    start, first, end = serve(rest, workers)
    out = np.array(rest, float)
    return float((end - start).sum()), float(np.nansum(tpot_s(end - start, first - start, out)))


STEPS = [5, 12, 3, 20, 8, 8, 15, 1, 30, 6]   # one request of one token: no TPOT


@pytest.mark.parametrize("steps", [STEPS, [5, 12, 3, 20], [2, 9, 4, 4, 17], [60, 2, 2, 2, 2, 45]],
                         ids=["one-token", "four", "ties", "skewed"])
def test_in_a_burst_a_request_adds_to_the_others_exactly_what_removing_it_takes_away(steps):
    """All requests sent at once (workers >= requests): the whole cell is the drain. Removing j makes
    every step it shared with another b cheaper for that one, so the others' sum of latencies falls by
    b x the steps they shared, and their TPOT by that over each one's decode: caused_delay's integral,
    exact on this server. The first token is not a start or an end: the timeline is cut there too
    (without it, TPOT's figure was up to 50% off where no one-token request happened to end there)."""
    n = len(steps)
    start, first, end = serve(steps, workers=n)
    e2e, out = end - start, np.array(steps, float)
    tpot = tpot_s(e2e, first - start, out)
    lat = caused_delay(start, e2e, B / A, np.ones(n))
    per_token = np.where(np.isfinite(tpot), 1 / np.maximum(out - 1, 1), 0.0)
    tp = caused_delay(start, e2e, B / A, per_token, since=first)
    for j in range(n):
        others = np.arange(n) != j
        lat_without, tpot_without = sums_without(steps, n, j)
        assert lat[j] == pytest.approx(e2e[others].sum() - lat_without, rel=1e-9)
        assert tp[j] == pytest.approx(np.nansum(tpot[others]) - tpot_without, rel=1e-9, abs=1e-15)
    order = np.argsort(steps, kind="stable")
    assert (lat > 0).all() and (np.diff(lat[order]) >= -1e-12).all()   # a longer request delays the others more


def test_the_bound_is_never_below_a_measured_scaling():
    """x -> infinity (no lower concurrency measured: every step's cost per sequence) bounds the delay
    from above for every request."""
    start, first, end = serve(STEPS, workers=len(STEPS))
    e2e = end - start
    for w in (np.ones(len(STEPS)), 1 / np.maximum(np.array(STEPS, float) - 1, 1)):
        assert (caused_delay(start, e2e, float("inf"), w) >= caused_delay(start, e2e, B / A, w) - 1e-12).all()
        assert (caused_delay(start, e2e, 1.0, w) >= caused_delay(start, e2e, 0.05, w)).all()


def test_without_a_timeline_no_request_moves_the_others():
    e2e = np.array([1.0, 2.0, 3.0])
    assert (caused_delay(np.array([0.0, np.nan, 0.0]), e2e, 0.2, np.ones(3)) == 0).all()
    assert (caused_delay(np.zeros(1), e2e[:1], 0.2, np.ones(1)) == 0).all()


def test_before_the_drain_a_request_delays_nobody():
    """With fewer workers than requests, a request sent while others wait is replaced by the next if it
    is not there: only its time after the last request was sent counts, and there it delays each other
    request in flight by b per step they share. That is the model's assumption, not the exact effect
    of removing it (which also moves when the others start): exact only in a burst."""
    clock: list = []
    start, first, end = serve(STEPS, workers=3, clock=clock)
    e2e, clock = end - start, np.array(clock)
    lat = caused_delay(start, e2e, B / A, np.ones(len(STEPS)))
    drain0 = start.max()
    done_early = end <= drain0
    assert done_early.sum() >= 3 and (lat[done_early] == 0).all()
    for j in np.where(~done_early)[0]:
        shared = sum(((clock > max(drain0, start[i], start[j]) + 1e-12) & (clock <= min(end[i], end[j]) + 1e-12)).sum()
                     for i in np.where(~done_early)[0] if i != j)
        assert lat[j] == pytest.approx(B * shared, rel=1e-9)
    assert (lat[~done_early] > 0).any()


def test_the_load_figures_keep_every_point_estimate():
    start, first, end = serve(STEPS, workers=len(STEPS))
    e2e, out = end - start, np.array(STEPS, float)
    a = Arrays(keys=[f"p{i}#0" for i in range(len(STEPS))], out=out, e2e=e2e, ttft=first - start,
               tpot=tpot_s(e2e, first - start, out), good=np.ones(len(STEPS), bool), closed=True,
               concurrency=16, duration=float(end.max()), start=start)
    e2e_load, tpot_load = load_figures(a, B / A)
    assert e2e_load.mean() == pytest.approx(e2e.mean())
    assert np.nanmean(tpot_load) == pytest.approx(np.nanmean(a.tpot))
    assert np.isnan(tpot_load).sum() == np.isnan(a.tpot).sum() == 1   # the one-token request has none


def test_the_decide_step_reads_every_cell_once_and_estimates_run_to_run_once_per_question(tmp_path, monkeypatch):
    """One door: the decide step reads each cell's request records once (measurements.Measurements), and
    every question that rests on run to run or acceptance run to run (verdicts, verification,
    attribution, the context axis, traffic) reads the one estimate of its set of servers."""
    import json

    import polars as pl

    from builders import SPEC, launches, write_cells
    from specmatch.calibration.simulate import experiment
    from specmatch.deciding.explaining import attribution
    from specmatch.deciding.reading import measurements
    from specmatch.deciding.verdicts import noise
    from specmatch.deciding.decide import main as decide_main

    calls: dict = {"read_parquet": [], "Arrays.of": [], "estimates": []}

    def spy(owner, name, log, key):
        real = getattr(owner, name)

        def wrapped(*a, **k):
            calls[log].append(key(*a))
            return real(*a, **k)

        monkeypatch.setattr(owner, name, staticmethod(wrapped) if isinstance(owner, type) else wrapped)

    spy(pl, "read_parquet", "read_parquet", lambda path, *_: str(path))
    spy(measurements.Arrays, "of", "Arrays.of", lambda cell, *_: (cell.server, cell.suite, cell.concurrency, cell.repeat))
    spy(noise, "_run_to_run", "estimates", lambda m, servers: ("run_to_run", tuple(m.servers()), servers and tuple(servers)))
    spy(attribution, "_acceptance_run_to_run", "estimates",
        lambda m, servers: ("acceptance", tuple(m.servers()), servers and tuple(servers)))
    cells = experiment(np.random.default_rng(5), 1.3, concurrencies=(1, 4), repeats=2, prompts=12)
    cp, rp = write_cells(tmp_path, cells)
    cfgs = {"baseline": {"engine": "vllm", "model": "m"}, "spec": {"engine": "vllm", "model": "m", "speculative": SPEC}}
    assert decide_main(["--baseline", "baseline", "--settings", json.dumps({"bootstrap": 200}), "--servers",
                        json.dumps(cfgs), "--cells", *cp, "--requests", *rp,
                        "--launches", *launches(tmp_path, {"baseline": None, "spec": SPEC}), "--suites", "s",
                        "--out-dir", str(tmp_path / "out")]) == 0
    assert sorted(calls["read_parquet"]) == sorted(rp)                 # every request file, once
    assert len(calls["Arrays.of"]) == len(cells) == len(set(calls["Arrays.of"]))
    assert calls["estimates"] and len(calls["estimates"]) == len(set(calls["estimates"]))


def test_measurements_read_with_another_slo_are_read_again():
    """The good-request flags follow the SLO of the settings analysed with, whoever read the cells."""
    from specmatch.calibration.simulate import experiment
    from specmatch.deciding.analysis import analyse
    from specmatch.deciding.reading.measurements import Measurements, Settings

    cells = experiment(np.random.default_rng(3), 1.2, concurrencies=(1, 4), repeats=2, prompts=12)
    slo = Settings(bootstrap=200, slo={"e2el_ms": 450.0, "tpot_ms": 40.0})
    m = Measurements.of(cells, Settings(bootstrap=200))
    direct = {(v.suite, v.concurrency, v.metric): v.speedup for v in analyse(cells, "baseline", slo).verdicts}
    via = {(v.suite, v.concurrency, v.metric): v.speedup for v in analyse(m, "baseline", slo).verdicts}
    assert any(k[2] == "goodput" for k in direct) and via == direct
