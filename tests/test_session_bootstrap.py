"""A session suite's turns share their session's effect (topic, tools, cache): every verdict, attribution
and acceptance interval resamples whole sessions (reading.measurements.unit_draw), never turns."""
from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from specmatch import metrics
from specmatch.calibration.simulate import cell
from specmatch.deciding.analysis import analyse
from specmatch.deciding.reading.measurements import Arrays, Settings, take, unit_draw
from specmatch.records import Decision

SETTINGS = Settings(bootstrap=400, designs=False)


def session_cells(seed: int, sessions: int = 8, turns: int | tuple = 4, effect_sd: float = 0.20, turn_sd: float = 0.03,
                  true_log: float = 0.0, repeats: int = 2, run_sd: float = 0.01, concurrencies=(1, 4),
                  with_sessions: bool = True):
    """Cells of `base` and `spec` on session suite `sess`: spec's TPOT is base's over exp(true_log +
    u_s + e_t), u_s ~ N(0, effect_sd) shared by the turns of session s (drawn afresh per experiment: the
    population of sessions has speedup exp(true_log)), e_t ~ N(0, turn_sd) per turn; run-to-run
    lognormal(run_sd) per server session and cell. `with_sessions`: False drops the session ids, so
    the same data are resampled by turn (the bootstrap before sessions were units). `turns`: per
    session, or (fewest, most) for sessions of uneven length."""
    rng = np.random.default_rng(seed)
    length = (np.full(sessions, turns) if isinstance(turns, int)
              else rng.integers(turns[0], turns[1] + 1, sessions))
    ids = [f"s{s:02d}.t{t}" for s in range(sessions) for t in range(length[s])]
    n = len(ids)
    owner = [p.split(".")[0] for p in ids]
    u = np.repeat(rng.normal(0.0, effect_sd, sessions), length)
    gain = np.exp(true_log + u + rng.normal(0.0, turn_sd, n))
    out = np.full(n, 48.0)
    difficulty = rng.lognormal(0.0, 0.2, n)
    cells = []
    for r in range(1, repeats + 1):
        for name in ("base", "spec"):
            speed = math.exp(rng.normal(0.0, run_sd))
            for c in concurrencies:
                tpot = 0.02 * (1 + 0.1 * (c - 1)) * difficulty * speed * math.exp(rng.normal(0.0, run_sd))
                tpot = tpot / gain if name == "spec" else tpot
                tpot = tpot * rng.lognormal(0.0, 0.02, n)
                ttft = np.full(n, 0.03)
                res, req = cell(name, "sess", c, r, ttft + tpot * (out - 1), ttft, out, ids, session=f"{name}-r{r}")
                if with_sessions:
                    req = req.with_columns(pl.Series("session_id", owner))
                cells.append((res, req))
    return cells


def false_calls(an) -> tuple[int, int]:
    """(verdicts that call the servers different, verdicts) over every metric and concurrency."""
    vs = [v for v in an.verdicts if v.server == "spec" and v.metric in ("output_throughput", "tpot")]
    return sum(v.verdict in (Decision.PAYS, Decision.LOSES) for v in vs), len(vs)


def test_a_draw_takes_whole_sessions_and_a_suite_of_single_prompts_draws_as_before():
    prompts = [f"s{s}.t{t}" for s in range(5) for t in range(3)] + ["loner"]
    unit = {p: p.split(".")[0] for p in prompts if p != "loner"}
    d = unit_draw(np.random.default_rng(1), prompts, unit, 200)
    for row in d:
        got = [prompts[i] for i in row[row >= 0]]
        drawn = [x for x in got if x != "loner"]
        # every drawn session comes whole (a multiple of its 3 turns), and 6 units are drawn in all
        for s in {x.split(".")[0] for x in drawn}:
            assert sorted(x for x in drawn if x.startswith(s + ".")) == sorted(
                [f"{s}.t{t}" for t in range(3)] * (sum(x.startswith(s + ".") for x in drawn) // 3))
        assert len(drawn) // 3 + got.count("loner") == 6
        assert (row[: (row >= 0).sum()] >= 0).all()          # padding only at the end
    singles = unit_draw(np.random.default_rng(7), ["a", "b", "c"], {}, 50)
    assert (singles == np.random.default_rng(7).integers(0, 3, size=(50, 3))).all()
    assert take(np.array([1.0, 2.0]), np.array([[0, 1, -1]])).tolist() == [[1.0, 2.0, 0.0]]


def test_the_resampling_helper_draws_what_the_bootstraps_drew_by_hand():
    """resample.draws is one rng.integers call of the caller's shape (a seeded bootstrap keeps its numbers),
    with the sample itself as row 0 when asked; Clusters takes each drawn unit's items in order."""
    from specmatch.resample import Clusters, draws

    assert (draws(np.random.default_rng(4), 7, 30) == np.random.default_rng(4).integers(0, 7, (30, 7))).all()
    assert (draws(np.random.default_rng(4), 7) == np.random.default_rng(4).integers(0, 7, 7)).all()
    kept = draws(np.random.default_rng(4), 7, 30, keep_original=True)
    assert kept.shape == (31, 7) and kept[0].tolist() == list(range(7))
    assert (kept[1:] == np.random.default_rng(4).integers(0, 7, (30, 7))).all()
    cl = Clusters.of(["b", "a", "b", "c", "a"])
    assert cl.units == ["a", "b", "c"] and cl.index.tolist() == [1, 0, 1, 2, 0] and len(cl) == 3
    assert cl.items(np.array([1, 1, 2])).tolist() == [0, 2, 0, 2, 3]
    assert cl.padded(np.array([[2, 2, 2], [0, 1, 0]])).tolist() == [[3, 3, 3, -1, -1, -1], [1, 4, 0, 2, 1, 4]]


@pytest.mark.parametrize("closed", [True, False])
def test_padding_counts_for_nothing_in_any_metric(closed):
    rng = np.random.default_rng(3)
    res, req = cell("x", "s", 2, 1, rng.uniform(1, 2, 6), np.full(6, 0.1), np.full(6, 30.0), list("abcdef"))
    if not closed:
        res.request_rate = "4.0"
    a = Arrays.of(res, req, {"ttft_ms": 500})
    plain, padded = np.array([[0, 2, 2, 5]]), np.array([[0, 2, 2, 5, -1, -1]])
    for metric in metrics.NAMES:
        assert a.stat(metric, padded)[0] == pytest.approx(a.stat(metric, plain)[0]), metric


def test_the_verdicts_interval_is_a_sessions_and_wider_than_the_turns():
    """The same data: by session the prompt part has sessions - 1 dof and a variance about `turns`
    times the turns' (their shared effect), by turn it has turns - 1 dof and is short."""
    by_session = analyse(session_cells(11), "base", SETTINGS)
    by_turn = analyse(session_cells(11, with_sessions=False), "base", SETTINGS)
    key = ("spec", "sess", "tpot")
    a, b = (next(x for x in an.comparisons[key] if x.concurrency == 1) for an in (by_session, by_turn))
    assert (a.units, a.prompts, b.units, b.prompts) == (8, 32, 32, 32)
    assert a.estimate == pytest.approx(b.estimate)
    wa = sum(v for k, (v, _) in a.parts.parts.items() if k[0] == "w")
    wb = sum(v for k, (v, _) in b.parts.parts.items() if k[0] == "w")
    assert wa > 2 * wb
    assert [d for k, (_, d) in a.parts.parts.items() if k[0] == "w"] == [7]


def session_false_call_rates(n: int, seed: int = 1000) -> tuple[float, float, int]:
    """Identical servers on average whose speedup varies by session (log-sd 0.20 shared by its 2-6 turns,
    0.03 per turn), 8 sessions, 2 repeats, c = 1 and 4, throughput and TPOT at 90%, n experiments: the
    share of verdicts that call them different by session and by turn (the same data), and the verdicts."""
    sess, turn, total = 0, 0, 0
    for e in range(n):
        a, k = false_calls(analyse(session_cells(seed + e, turns=(2, 6)), "base", SETTINGS))
        b, _ = false_calls(analyse(session_cells(seed + e, turns=(2, 6), with_sessions=False), "base", SETTINGS))
        sess, turn, total = sess + a, turn + b, total + k
    return sess / total, turn / total, total


@pytest.mark.slow   # 40 experiments (about 5 s of CPU)
def test_session_verdicts_keep_their_error_rate_where_turn_verdicts_do_not():
    """Verdicts that resample whole sessions call identical servers different at about the nominal 10%;
    by turn, 42% (400 experiments, 1,600 verdicts: by session 11.4%; bench/simulation_figures.py
    session-verdicts). Thresholds: by session within nominal +/- 3 Monte-Carlo se (verdicts of one
    experiment share its sessions: the se counts experiments, not verdicts); by turn above twice the
    nominal rate."""
    n = 40
    rate_s, rate_t, total = session_false_call_rates(n)
    print(f"\nfalse calls at nominal 10%: by session {rate_s:.3f}, by turn {rate_t:.3f} ({total} verdicts, {n} experiments)")
    assert abs(rate_s - 0.10) <= 3 * math.sqrt(0.09 / n)
    assert rate_t >= 0.20


def test_a_session_worker_runs_its_turns_back_to_back_and_a_suite_of_c_sessions_is_one_wave():
    """The drain of a wave read from when its last session started: from the last turn sent, the intervals
    at c = 16 with 16 sessions were too narrow (Var / se^2 1.47 and 1.42 over 150 simulated waves, 0.97-1.12
    read from the last start: bench/simulation_figures.py session-wave). Shown to fail: with Arrays.of
    leaving drain_from unset, the assertion on it fails."""
    from specmatch.calibration.des import Engine, serve

    lab = np.repeat(np.arange(4), 3)
    sv = serve(Engine(jitter=0.0, hiccup_p=0.0), 4, np.full((1, 12), 100.0), np.full((1, 12), 8),
               np.random.default_rng(0), session=lab)
    start, end = sv.start[0], sv.start[0] + sv.e2e[0]
    for s in range(4):
        turns = np.flatnonzero(lab == s)
        assert start[turns[0]] == 0.0 and np.allclose(start[turns[1:]], end[turns[:-1]])   # one wave, back to back
    with pytest.raises(ValueError, match="consecutive"):
        serve(Engine(), 2, np.full((1, 4), 10.0), np.full((1, 4), 4), np.random.default_rng(0),
              session=np.array([0, 1, 0, 1]))
    # the analysis reads the wave's drain from when the last session started, not from the last turn sent
    res, req = cell("x", "s", 4, 1, sv.e2e[0], sv.ttft[0], np.full(12, 8.0), [f"p{i}" for i in range(12)],
                    starts=start, duration=float(end.max()))
    a = Arrays.of(res, req.with_columns(pl.Series("session_id", [f"s{x}" for x in lab])), {})
    assert a.drain_from == 0.0 and Arrays.of(res, req, {}).drain_from is None


def wave_cells(seed: int, sessions: int = 16, turns: int = 3, sigma: float = 0.3, c: int = 16, step: int = 72):
    """Sessions on the discrete-event server (calibration.des, continuous batching): `base` and `spec`
    plain engines whose pace (tokens a step) differs by a per-session lognormal factor of mean-corrected
    log-sd `sigma`, at c = 1 and `c` (one wave where c = sessions), 2 repeats."""
    from specmatch.calibration.des import Engine, serve

    rng = np.random.default_rng(seed)
    u = rng.normal(sigma ** 2 / 2, sigma, sessions)
    v = rng.normal(0.0, 0.1, sessions)
    lab = np.repeat(np.arange(sessions), turns)
    turn = np.tile(np.arange(turns), sessions)
    pt = (200 + turn * step).astype(float)
    ot = rng.integers(16, 48, sessions * turns)
    ids = [f"s{s}.t{t}" for s, t in zip(lab, turn)]
    cells = []
    for r in (1, 2):
        for name in ("base", "spec"):
            eng = Engine(speed=math.exp(rng.normal(0.0, 0.03)))
            pace = np.exp(v[lab] + (u[lab] if name == "spec" else 0.0))
            for conc in (1, c):
                sv = serve(eng, conc, pt[None], ot[None], rng, pace=pace[None], session=lab)
                res, req = cell(name, "sess", conc, r, sv.e2e[0], sv.ttft[0], ot.astype(float), ids,
                                prompt_tokens=pt, starts=sv.start[0], duration=float(sv.duration[0]),
                                session=f"{name}-r{r}")
                cells.append((res, req.with_columns(pl.Series("session_id", [f"s{x}" for x in lab]))))
    return cells
