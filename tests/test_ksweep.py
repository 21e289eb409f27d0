"""A k sweep through the workflow's steps: the config expands it, the controls take one member,
the analysis decides the best k per band instead of an on/off call per member, the recommend step derives
`<parent>__recommended` with the schedule, and the summary verifies it against the member each band runs,
on simulated sweeps whose truth is known (builders.sweep_cells: specmatch.calibration.des servers)."""
import json

import pytest

from builders import decided, sweep_cells
from specmatch.deciding.decide import records_of
from specmatch.deciding.analysis import analyse
from specmatch.config import validate
from specmatch.controls import with_controls
from specmatch.deciding.recommending.deployment import ServerInfo
from specmatch.files import SpecmatchError
from specmatch.deciding.recommending.kmodel import KRecommendation, KSweeps
from specmatch.deciding.reading.measurements import Settings
from specmatch.records import Decision, Outcome
from specmatch.deciding.analysis import verified_analysis
from specmatch.deciding.recommend import derived_k_servers
from specmatch.reporting.markdown import markdown

# the truth (as in test_kmodel): k=4 best at c=1, k=2 at c=4, the baseline at c=16
RHO = {1: {1: 1.05, 4: 1.30, 16: 2.0}, 2: {1: 1.10, 4: 1.40, 16: 2.6}, 4: {1: 1.15, 4: 2.0, 16: 4.0}}
TRUE_K = {1: 4, 4: 2, 16: 0}
SETTINGS = Settings(bootstrap=200, confidence=0.9, min_effect=0.05)


def member_config(k: int) -> dict:
    return {"engine": "vllm", "model": "/m", "speculative": {"method": "ngram", "num_speculative_tokens": k,
                                                             "prompt_lookup_max": 4}}


CONFIGS = {"base": {"engine": "vllm", "model": "/m"}, **{f"spec@k={k}": member_config(k) for k in RHO}}


def infos(names) -> dict:
    return {n: ServerInfo(n, "vllm", "vllm", CONFIGS[n].get("speculative"), 32) for n in names if n in CONFIGS}


def as_scheduled(slow_at: dict | None = None):
    """The recommended server as its schedule runs it: the member of the band's k at each concurrency
    (the baseline where it is off), `slow_at` c -> speed factor (a switch that costs)."""
    def at(c, engines):
        name = "base" if TRUE_K[c] == 0 else f"spec@k={TRUE_K[c]}"
        eng = engines[name]
        return eng.faster((slow_at or {}).get(c, 1.0))
    return at


@pytest.fixture(scope="module")
def grid():
    good = sweep_cells(2, RHO, extra={"spec__recommended": as_scheduled()})
    costly = sweep_cells(2, RHO, extra={"spec__recommended": as_scheduled({4: 0.8})})
    return good, costly


def primary(cells):
    return [x for x in cells if x[0].server in CONFIGS]


@pytest.mark.slow
def test_the_analysis_decides_k_per_band_and_no_member_gets_an_on_off_call(grid):
    good, _ = grid
    names = list(CONFIGS)
    an = analyse(primary(good), "base", SETTINGS, infos(names), ["s"], names)
    assert an.recommendations == []            # members are one k of a question about every k
    [rec] = an.k_recommendations
    assert isinstance(rec, KRecommendation) and (rec.parent, rec.suite, rec.action) == ("spec", "s", "schedule")
    assert {ch.concurrency: ch.k for ch in rec.choices} == TRUE_K
    assert rec.schedule.bands[0][2] == 4 and rec.schedule.bands[-1][1:] == [32, 0]
    assert {(p.k, p.concurrency) for p in an.k_points} >= {(k, c) for k in (1, 2, 4) for c in TRUE_K}


@pytest.mark.slow
def test_the_recommended_schedule_is_derived_measured_and_verified_against_each_bands_member(grid):
    good, costly = grid
    names = list(CONFIGS)
    an = analyse(primary(good), "base", SETTINGS, infos(names), ["s"], names)
    derived = derived_k_servers(an.k_recommendations, CONFIGS, infos(names))
    assert list(derived) == ["spec__recommended"]
    d = derived["spec__recommended"]
    assert (d.parent, d.suite) == ("spec", "s")
    spec = d.config["speculative"]
    assert spec["num_speculative_tokens"] == 4 and spec["num_speculative_tokens_per_batch_size"] == an.k_recommendations[0].schedule.bands
    assert d.config["model"] == "/m" and "suites" not in d.config
    # a name the on/off recommendations took is not derived twice
    assert derived_k_servers(an.k_recommendations, CONFIGS, infos(names), taken={"spec__recommended"}) == {}

    all_infos = {**infos(names), "spec__recommended": ServerInfo("spec__recommended", "vllm", "vllm", spec, 32)}
    full = verified_analysis(good, "base", SETTINGS, CONFIGS, all_infos, ["s"], derived)
    [rec] = full.k_recommendations
    v = rec.verified
    assert v is not None and v.server == "spec__recommended"
    assert {r.concurrency: r.against for r in v.per_concurrency} == {1: "spec@k=4", 4: "spec@k=2", 16: "base"}
    assert v.outcome == Outcome.VERIFIED, [r.to_json() for r in v.per_concurrency]
    # the primary grid's decision does not move when the derived server's cells join
    assert [ch.to_json() for ch in rec.choices] == [ch.to_json() for ch in an.k_recommendations[0].choices]

    bad = verified_analysis(costly, "base", SETTINGS, CONFIGS, all_infos, ["s"], derived).k_recommendations[0].verified
    assert bad.outcome == Outcome.FAILED
    assert [r.concurrency for r in bad.per_concurrency if r.verdict == Decision.LOSES] == [4]


@pytest.mark.slow
def test_the_summary_shows_the_sweep_the_bands_predicted_vs_measured_and_the_verification(grid, tmp_path):
    from specmatch.reporting import kreport

    good, _ = grid
    names = list(CONFIGS)
    an = analyse(primary(good), "base", SETTINGS, infos(names), ["s"], names)
    derived = derived_k_servers(an.k_recommendations, CONFIGS, infos(names))
    all_infos = {**infos(names), "spec__recommended": ServerInfo("spec__recommended", "vllm", "vllm",
                                                                 derived["spec__recommended"].config["speculative"], 32)}
    full = verified_analysis(good, "base", SETTINGS, CONFIGS, all_infos, ["s"], derived)
    md = markdown(decided(full), [])
    sec = md.split("## Which k at which load")[1].split("\n## ")[0]
    assert "**spec** on `s`" in sec
    assert "| k | c=1 | c=4 | c=16 |" in sec and "| off (the baseline) |" in sec
    assert "| **best k** | **k=4** | **k=2** | **k=0** |" in sec
    assert "Bands: batch 1" in sec and "**Verified:** `spec__recommended`" in sec
    assert "num_speculative_tokens_per_batch_size" in sec
    assert "Predicted against measured TPOT speedup" in sec and "| 4 | 1 |" in sec
    rec = records_of(full, []).to_json()["k_sweeps"]
    assert rec["recommendations"][0]["verified"]["outcome"] == "verified" and rec["points"]
    back = KSweeps.from_json(json.loads(json.dumps(rec)))   # the file is the record's serialisation
    assert back.to_json() == rec
    assert isinstance(back.recommendations[0].verified.outcome, Outcome)
    assert isinstance(back.recommendations[0].choices[0].pairwise[0].verdict, Decision)
    made = []

    def save(fig, name):
        path = tmp_path / f"{name}.png"
        fig.savefig(path)
        made.append(path)

    import matplotlib

    matplotlib.use("Agg")
    kreport.heatmap(decided(full), save)
    assert made and made[0].stat().st_size > 1000


def test_a_config_sweep_expands_and_the_control_takes_the_largest_k():
    cfg = {"dataset": {"root": "r", "tokenizer": "t"},
           "suites": {"s": {"kind": "file", "path": "p.jsonl", "size": 8}},
           "servers": {"base": {"engine": "vllm", "model": "/m"},
                       "ngram": {"engine": "vllm", "model": "/m",
                                 "speculative": {"method": "ngram", "num_speculative_tokens": [2, 4],
                                                 "prompt_lookup_max": 4}}},
           "baseline": "base", "concurrency": [1, 4], "summary": {"controls": {"configured_off": True}}}
    out = with_controls(validate(cfg))
    assert list(out["servers"]) == ["base", "ngram@k=2", "ngram@k=4", "ngram@k=4__off"]
    assert out["servers"]["ngram@k=2"]["speculative"]["num_speculative_tokens"] == 2
    off = out["servers"]["ngram@k=4__off"]["speculative"]
    assert off["num_speculative_tokens"] == 4 and off["num_speculative_tokens_per_batch_size"][0][2] == 0
    # naming the sweep in controls.servers means its member of the largest k; a member by name is itself
    named = {**cfg, "summary": {"controls": {"configured_off": True, "servers": ["ngram"]}}}
    assert [n for n in with_controls(validate(named))["servers"] if n.endswith("__off")] == ["ngram@k=4__off"]
    named["summary"]["controls"]["servers"] = ["ngram@k=2"]
    assert [n for n in with_controls(validate(named))["servers"] if n.endswith("__off")] == ["ngram@k=2__off"]
    bad = {**cfg, "servers": {**cfg["servers"], "ngram": {**cfg["servers"]["ngram"],
                                                          "speculative": {"method": "ngram", "num_speculative_tokens": [2, 0]}}}}
    with pytest.raises(SpecmatchError, match="servers.ngram.speculative.num_speculative_tokens"):
        validate(bad)


def test_a_sweep_measured_once_decides_only_what_clears_min_effect(grid):
    """One repeat measures no run-to-run variation, so a verdict needs its whole interval beyond
    +/-min_effect: every k beats off by far at c=1 and c=4; at c=1 k=4 and k=2 are not told apart (k
    stays open, the best estimate runs); at c=4 the truth's k=2 and at c=16 off clear min_effect against
    every other candidate. (With the makespan estimator, a maximum at c=16, neither did.)"""
    good, _ = grid
    names = list(CONFIGS)
    once = [x for x in primary(good) if x[0].repeat == 1]
    an = analyse(once, "base", SETTINGS, infos(names), ["s"], names)
    [rec] = an.k_recommendations
    got = {ch.concurrency: (ch.k, ch.how) for ch in rec.choices}
    assert got == {1: (4, "pays, k open"), 4: (2, "best"), 16: (0, "best")}, got
    assert rec.k_at(1) == 4 and rec.k_at(4) == 2 and rec.k_at(16) == 0
    assert not [c for b in rec.bands for c in b.pinned_at]
    assert "k is undecided between k=2, 4" in rec.text
    md = markdown(decided(an), [])
    assert "undecided" in md.split("## Which k at which load")[1]


@pytest.mark.slow  # 16 simulated grids, about 40 s
def test_verification_of_k_schedules_is_calibrated_over_seeds():
    """A correct schedule (the band's member at each concurrency) is verified often and failed rarely
    (P(failed | correct) <= alpha = 10%); one whose switch costs 20% at c=4 fails. The check has the power
    of its data: with 24 prompts and 3 repeats a correct schedule is left undecided now and then."""
    names = list(CONFIGS)
    outcomes = {"good": [], "costly": []}
    for seed in range(1, 9):
        for kind, slow in (("good", None), ("costly", {4: 0.8})):
            cells = sweep_cells(seed, RHO, extra={"spec__recommended": as_scheduled(slow)})
            an = analyse(primary(cells), "base", SETTINGS, infos(names), ["s"], names)
            assert {ch.concurrency: ch.k for ch in an.k_recommendations[0].choices} == TRUE_K
            derived = derived_k_servers(an.k_recommendations, CONFIGS, infos(names))
            spec = derived["spec__recommended"].config["speculative"]
            all_infos = {**infos(names), "spec__recommended": ServerInfo("spec__recommended", "vllm", "vllm", spec, 32)}
            full = verified_analysis(cells, "base", SETTINGS, CONFIGS, all_infos, ["s"], derived)
            outcomes[kind].append(full.k_recommendations[0].verified.outcome)
    assert outcomes["good"].count(Outcome.VERIFIED) >= 4 and outcomes["good"].count(Outcome.FAILED) <= 1, outcomes
    assert outcomes["costly"].count(Outcome.FAILED) >= 7 and Outcome.VERIFIED not in outcomes["costly"], outcomes


@pytest.mark.slow
def test_a_round_of_the_sequential_design_continues_undecided_k_choices():
    """Two k that the data cannot tell apart at c=4 after two repeats (both pay: speculation is decided
    there, k is not): the round measures both members again there (and only what continues); decided
    choices stop."""
    from specmatch.records import Continuation
    from specmatch.deciding.rounds import plan
    from specmatch.deciding.reading.sequential import Design

    close = {2: {1: 1.10, 4: 1.40, 16: 2.6}, 4: {1: 1.15, 4: 1.62, 16: 4.0}}   # c=4: k=2 and k=4 within ~2%
    cells = [x for x in sweep_cells(3, close, repeats=2) if x[0].repeat <= 2]
    names = ["base", "spec@k=2", "spec@k=4"]
    s = Settings(bootstrap=200, confidence=0.9, min_effect=0.05,
                 repeats={"min": 2, "max": 3, "min_probability": 0})
    an = analyse(cells, "base", s, infos(names), ["s"], names)
    [rec] = an.k_recommendations
    undecided = [ch.concurrency for ch in rec.choices if ch.candidates]      # k still open
    p = plan(an, Design(2, 3, 0), 2)
    assert all(d.against is not None for d in p.decisions)   # on the sweep's suite its question is the k choice
    ks = [d for d in p.decisions if d.action != Continuation.DECIDED]
    assert {d.concurrency for d in ks} == set(undecided)
    for d in ks:
        assert d.verdict == Decision.INCONCLUSIVE and d.action == Continuation.CONTINUE
        assert {(c.server, c.concurrency) for c in p.next} >= {(d.server, d.concurrency), (d.against, d.concurrency)}
    # every decided comparison a choice rests on is on record as decided (the round log says why it stopped)
    decided = {(d.server, d.against, d.concurrency) for d in p.decisions if d.action == Continuation.DECIDED}
    assert decided == {(v.server, v.against, ch.concurrency) for ch in rec.choices for v in ch.pairwise
                       if v.verdict != Decision.INCONCLUSIVE}
    assert {c.concurrency for c in p.next} == set(undecided)
    assert 4 in undecided, [ch.to_json() for ch in rec.choices]
    assert next(ch for ch in rec.choices if ch.concurrency == 4).how == "pays, k open"
    # at the last look nothing continues
    assert all(d.action != Continuation.CONTINUE for d in plan(an, Design(2, 2, 0), 2).decisions)


@pytest.mark.slow
def test_a_k_choice_whose_best_changed_is_looked_at_although_one_side_missed_the_round():
    """Round 2 continued k=2 against k=4 at c=4 (the baseline was not measured again there). If at round 3
    the best's comparison is with the baseline, its pair has 2 common repeats: it is still this round's
    question (one side was measured), not a pair that stopped earlier."""
    from specmatch.deciding.rounds import k_choices
    from specmatch.deciding.reading.sequential import Design

    close = {2: {1: 1.10, 4: 1.40, 16: 2.6}, 4: {1: 1.15, 4: 1.62, 16: 4.0}}
    cells = [x for x in sweep_cells(3, close, repeats=3)
             if x[0].repeat <= 2 or (x[0].concurrency == 4 and x[0].server != "base")]
    names = ["base", "spec@k=2", "spec@k=4"]
    s = Settings(bootstrap=200, confidence=0.9, min_effect=0.05,
                 repeats={"min": 2, "max": 4, "min_probability": 0})
    an = analyse(cells, "base", s, infos(names), ["s"], names)
    [rec] = an.k_recommendations
    ch = next(ch for ch in rec.choices if ch.concurrency == 4)
    got = {(d.server, d.against) for d in k_choices(an, Design(2, 4, 0), 3) if d.concurrency == 4}
    assert got == {(v.server, v.against) for v in ch.pairwise}, (got, [v.to_json() for v in ch.pairwise])
    assert any("base" in pair for pair in got)
    # at c=1 and c=16 nothing was measured in round 3: those pairs stopped at round 2
    assert all(d.concurrency == 4 for d in k_choices(an, Design(2, 4, 0), 3))


@pytest.mark.slow
def test_the_report_names_ks_it_cannot_predict_in_one_sentence_and_flags_in_sample_suites(grid):
    """A k below the smallest measured one has τ but no step cost (never extrapolated): no row of dashes
    for it, one sentence; a sweep on a suite of seen rows carries the in-sample caveat."""
    from specmatch.reporting import kreport
    from specmatch.deciding.recommending.kmodel import KPoint
    from specmatch.records import Interval

    iv = Interval(1.2, 1.1, 1.3)
    pts = [KPoint("spec", "s", c, k, None, iv, "rates", None, None, None, None) for k in (1, 2) for c in (1, 16)]
    pts += [KPoint("spec", "s", 1, 3, "spec@k=3", iv, "rates", iv, "measured", None, iv, ["tokens per step"],
                   measured=iv, within=True)]
    text = "\n".join(kreport.points_table(pts))
    assert text.count("\n| 3 | 1 |") == 1 and "| 1 | 1 |" not in text and "| 2 | 16 |" not in text
    assert "k=1, k=2: τ is known from the per-position acceptance" in text
    good, _ = grid
    names = list(CONFIGS)
    an = analyse(primary(good), "base", SETTINGS, infos(names), ["s"], names)
    assert "(in-sample:" in "\n".join(kreport.lines(decided(an), {"s"}))
    assert "(in-sample:" not in "\n".join(kreport.lines(decided(an), set()))


@pytest.mark.slow
def test_with_two_recommendation_suites_each_schedule_is_checked_by_its_own_server_only(grid):
    """`<parent>__recommended` deploys one suite's schedule. Another suite's undecided recommendation is not
    "not verified" against it, and another suite's schedule says which suite's schedule that server runs."""
    import copy

    from specmatch.deciding.analysis import verify_k_recommendations
    from specmatch.records import DerivedServer

    good, _ = grid
    names = list(CONFIGS)
    an = analyse(primary(good), "base", SETTINGS, infos(names), ["s"], names)
    [rec] = an.k_recommendations
    other = copy.deepcopy(rec)
    other.suite = "t"
    undecided = copy.deepcopy(rec)
    undecided.suite, undecided.action = "t", "undecided"
    derived = {"spec__recommended": DerivedServer(parent="spec", suite="s", config={})}
    verify_k_recommendations(an, [other, undecided], derived)
    assert undecided.verified is None
    assert other.verified.outcome == Outcome.NOT_MEASURED and "decided on `s`" in other.verified.reason


@pytest.mark.slow
def test_one_k_everywhere_is_measured_as_that_member_and_verified_against_the_references():
    """Issue 34: "keep one k everywhere" was never derived and so never verified. It is a recommendation
    like any other: derived (krecommend.derived_config), found identical to the member of that k as configured
    (so no new server is measured: that member IS its measurement), and verified against the references
    like a schedule, each row the member's own cells; the summary says so."""
    from specmatch.reporting import kreport

    rho = {1: {1: 1.05, 4: 1.10, 16: 1.20}, 2: {1: 1.10, 4: 1.15, 16: 1.25}, 4: {1: 1.60, 4: 1.80, 16: 2.40}}
    cells = sweep_cells(4, rho, session_sd=0.005, cell_sd=0.005)
    names = list(CONFIGS)
    an = analyse(cells, "base", SETTINGS, infos(names), ["s"], names)
    [rec] = an.k_recommendations
    assert (rec.action, rec.k, rec.server) == ("keep", 2, "spec@k=2"), rec.text
    assert {ch.concurrency: (ch.k, ch.how) for ch in rec.choices} == {c: (2, "best") for c in (1, 4, 16)}
    assert "that is `spec@k=2` as configured, so its cells are this recommendation's measurement" in rec.text
    assert derived_k_servers(an.k_recommendations, CONFIGS, infos(names)) == {}   # nothing new to measure
    assert rec.derived_server == "spec@k=2"
    full = verified_analysis(cells, "base", SETTINGS, CONFIGS, infos(names), ["s"], {})
    v = full.k_recommendations[0].verified
    assert v is not None and v.server == "spec@k=2" and v.outcome == Outcome.VERIFIED, v
    assert [(r.concurrency, r.against, r.not_worse) for r in v.per_concurrency] == [(c, "spec@k=2", True)
                                                                                 for c in (1, 4, 16)]
    assert "its own cells are the deployment's measurement" in v.reason
    sec = "\n".join(kreport.lines(decided(full), set()))
    assert "**Verified as measured:** the recommended deployment is `spec@k=2` as configured" in sec
