"""The decide step decides once and writes the decision records; the summary renders them (verdicts,
crossover, recommendation, the contract files), from cells written to disk as the workflow writes them
(synthetic cells with known answers)."""
import json

import numpy as np
import pytest

from builders import SPEC, cell_result, decide_and_render, decided, launches, run_summary, write_cells
from specmatch.files import write_json
from specmatch.deciding.recommend import main as recommend_main
from specmatch.records import DerivedServer, DerivedServers, Recommendation
from specmatch.calibration.simulate import experiment
from specmatch.reporting.loadgen import load_generator_lines
from specmatch.reporting.summary import main as summary_main


@pytest.mark.slow
def test_speedup_crossover_and_schedule(tmp_path):
    cells = experiment(np.random.default_rng(0), {1: 1.5, 4: 1.2, 16: 0.6}, repeats=3, session_sd=0.01, cell_sd=0.01)
    out, md = run_summary(tmp_path, cells, {"baseline": None, "spec": SPEC})
    verdicts = {(v["concurrency"], v["metric"]): v for v in json.loads((out / "verdicts.json").read_text())}
    assert verdicts[(1, "output_throughput")]["verdict"] == "pays"
    assert verdicts[(16, "output_throughput")]["verdict"] == "loses"
    assert verdicts[(1, "output_throughput")]["speedup"] == pytest.approx(1.5, rel=0.08)
    assert verdicts[(1, "output_throughput")]["confidence"] == 0.9 and verdicts[(1, "output_throughput")]["repeats"] == 3
    rec = json.loads((out / "recommendations.json").read_text())[0]
    assert rec["crossover"]["direction"] == "stops paying" and 4 < rec["crossover"]["point"] < 16
    sched = rec["schedule"]["bands"]
    assert rec["deploy"]["engine"] == "vllm" and rec["deploy"]["speculative"]["num_speculative_tokens_per_batch_size"] == sched
    assert sched[0][0] == 1 and sched[0][2] == 3 and sched[-1][1:] == [256, 0] and 4 <= sched[0][1] < 16
    assert "**spec** on `s`: pays at c=1,4; loses at c=16" in md and "90% confidence" in md
    assert "--speculative-config" in md and '"num_speculative_tokens_per_batch_size": [[1,' in md
    for f in ("cells.csv", "cells.parquet", "speedups.csv", "plots/throughput.png", "plots/speedup.png"):
        assert (out / f).exists(), f


@pytest.mark.slow
def test_never_pays_and_everywhere(tmp_path):
    cells = experiment(np.random.default_rng(1), 0.5, repeats=2, session_sd=0.01, cell_sd=0.01) + [
        (r, q) for r, q in experiment(np.random.default_rng(2), 2.0, repeats=2, session_sd=0.01, cell_sd=0.01)
        if r.server == "spec"]
    for res, _ in cells[len(cells) - 6:]:
        res.server = "fast"
    out, md = run_summary(tmp_path, cells, {"baseline": None, "spec": SPEC, "fast": SPEC})
    recs = {r["server"]: r for r in json.loads((out / "recommendations.json").read_text())}
    assert recs["spec"]["action"] == "off" and recs["spec"]["text"].startswith("turn speculation off: it loses at")
    assert recs["fast"]["action"] == "keep" and recs["fast"]["as_configured"] and recs["fast"]["deploy"]["flag"] is None


@pytest.mark.slow
def test_no_schedule_is_recommended_from_noise(tmp_path):
    cells = experiment(np.random.default_rng(3), {1: 1.05, 4: 1.0, 16: 0.95}, repeats=2)
    out, md = run_summary(tmp_path, cells, {"baseline": None, "spec": SPEC})
    rec = json.loads((out / "recommendations.json").read_text())[0]
    assert rec["action"] == "undecided" and rec["schedule"] is None and rec["deploy"] is None
    assert "no recommendation: no concurrency is decided" in md


@pytest.mark.slow
def test_the_kv_cache_each_server_admits_beside_the_baseline(tmp_path):
    """The launch records' KV pools (the embedded default's vLLM CPU figures: the eagle3 drafter's cache
    takes 3.3% of the pool) rendered beside the baseline's, with what each admits at the suite's mean
    request; a server whose engine said nothing is "unknown", with the reason."""
    from specmatch.records import KvPool

    cells = experiment(np.random.default_rng(1), 1.2, repeats=1, session_sd=0.01, cell_sd=0.01)
    for res, _ in cells:   # 100 prompt and 24 output tokens a request
        res.total_input_tokens, res.total_output_tokens = 100 * res.completed, 24 * res.completed
    pools = {"baseline": KvPool(True, tokens=93_184, per_request_tokens=2_048, max_concurrency=45.5, device="CPU"),
             "spec": KvPool(True, tokens=90_112, per_request_tokens=2_048, max_concurrency=44.0, device="CPU")}
    out, md = run_summary(tmp_path, cells, {"baseline": None, "spec": SPEC}, kv_pools=pools)
    section = md[md.index("## The KV cache each server admits"):]
    assert "| server | KV pool (tokens) | requests at the engine's context length | requests of `s`'s mean length " \
           "(124 tokens) | beside the baseline's pool |" in section
    assert "| baseline | 93,184 | 45.50 × 2,048 | 751.5 | — |" in section
    assert "| spec | 90,112 | 44.00 × 2,048 | 726.7 | -3.3% (-3,072 tokens) |" in section
    facts = {f["server"]: f for f in json.loads((out / "analysis.json").read_text())["server_facts"]}
    assert facts["spec"]["kv_pool"]["tokens"] == 90_112 and facts["spec"]["max_batch"] == 256
    # 751 and 727 requests of 124 tokens: both above the largest batch (256), so nothing is capped
    assert "holds fewer requests than the server's largest batch" not in section
    from specmatch.reporting import kvpool
    from specmatch.reporting.decided import Decided

    d = Decided.read(out, [p for p in (tmp_path / "cells").rglob("c*.json") if p.name.count(".") == 1])
    spec = next(f for f in d.decisions.analysis.server_facts if f.server == "spec")
    spec.kv_pool = KvPool(True, tokens=24_800, per_request_tokens=2_048, max_concurrency=12.1, device="GPU")
    assert ("At `s`'s mean request the pool holds fewer requests than the server's largest batch: `spec` 200 of 256"
            in "\n".join(kvpool.lines(d)))
    spec.kv_pool = KvPool(False, reason="an external endpoint")
    assert "| spec | unknown: an external endpoint |  |  |  |" in kvpool.lines(d)
    for f in d.decisions.analysis.server_facts:
        f.kv_pool = None   # launch records from before KV pools were read
    assert kvpool.lines(d) == []


def test_load_generator_section_names_the_clock_and_every_warning():
    def cell(server, c, clock, lag, coalesced, warnings):
        return cell_result(server, c, arrival_clock=clock, p99_client_read_lag_ms=lag,
                           coalesced_token_events=coalesced, warnings=warnings)

    cells = [cell("baseline", 1, "kernel", 0.3, 0, []),
             cell("eagle", 256, "kernel", 2.5, 40, ["40 token events (2.0%) reached the client in one read"])]
    text = "\n".join(load_generator_lines(cells))
    assert "SO_TIMESTAMPNS" in text and "within 2.5 ms" in text and "40 token event(s)" in text
    assert "- warning, eagle / train / r1 / c=256: 40 token events (2.0%)" in text
    burst = "16 requests at concurrency 16: each worker sends fewer than two"
    many = [cell(s, 16, "kernel", 1.0, 0, [burst]) for s in ("baseline", "eagle", "ngram")]
    text = "\n".join(load_generator_lines(many))
    assert text.count(burst) == 1  # one line per distinct warning, naming every cell
    assert f"- warning, 3 cells (baseline / train / r1 / c=16; eagle / train / r1 / c=16; ngram / train / r1 / c=16): {burst}" in text
    old = "\n".join(load_generator_lines([cell("b", 1, None, None, 0, [])]))
    assert "older specmatch" in old


@pytest.mark.slow
def test_recommended_server_cells_join_the_tables_but_not_the_decision(tmp_path):
    """The recommend step derived `spec__recommended` and the workflow measured it: its cells get
    verdicts and verify the recommendation, while the recommendation stays the primary grid's."""
    primary = experiment(np.random.default_rng(0), {1: 1.5, 4: 1.2, 16: 0.6}, repeats=3, session_sd=0.01, cell_sd=0.01)
    alone, _ = run_summary(tmp_path / "alone", primary, {"baseline": None, "spec": SPEC})
    # the schedule's switch costs 20% at c=16, where the baseline is the best
    measured = [(r, q) for r, q in experiment(np.random.default_rng(5), {1: 1.5, 4: 1.2, 16: 0.8}, repeats=3,
                                              session_sd=0.01, cell_sd=0.01) if r.server == "spec"]
    for res, _ in measured:
        res.server = "spec__recommended"
    root = tmp_path / "with"
    cp, rp = write_cells(root, primary + measured)
    lp = launches(root, {"baseline": None, "spec": SPEC})
    derived = root / "servers.json"
    write_json(derived, DerivedServers({"spec__recommended": DerivedServer("spec", "s", {})}).to_json())
    cfgs = {"baseline": {"engine": "vllm", "model": "m"}, "spec": {"engine": "vllm", "model": "m", "speculative": SPEC}}
    out = root / "summary"
    decide_and_render(out, ["--baseline", "baseline", "--settings", json.dumps({"bootstrap": 300}), "--servers",
                            json.dumps(cfgs), "--requests", *rp, "--launches", *lp, "--suites", "s", "--derived",
                            str(derived)], cp)
    verdicts = json.loads((out / "verdicts.json").read_text())
    mine = {(v["concurrency"], v["metric"]): v["verdict"] for v in verdicts if v["server"] == "spec__recommended"}
    assert {c for c, _ in mine} == {1, 4, 16} and mine[(1, "output_throughput")] == "pays"
    assert mine[(16, "output_throughput")] == "loses"
    spec_alone = [v for v in json.loads((alone / "verdicts.json").read_text()) if v["server"] == "spec"]
    assert [v for v in verdicts if v["server"] == "spec"] == spec_alone  # the primary grid's verdicts, unchanged
    rec = json.loads((out / "recommendations.json").read_text())[0]
    assert rec["schedule"] == json.loads((alone / "recommendations.json").read_text())[0]["schedule"]
    assert rec["verified"]["server"] == "spec__recommended" and rec["verified"]["outcome"] == "failed"
    # the switch's truth is 0.8 at c=16 (the rate at the load; the makespan, a maximum, read 0.7)
    assert "**Verification failed:** `spec__recommended` ran at 0.8" in (out / "summary.md").read_text()
    assert "of `baseline` at c=16: the schedule's switch costs throughput" in (out / "summary.md").read_text()


@pytest.mark.slow
def test_why_it_pays_names_what_drafting_cannot_explain(tmp_path):
    """A server whose steps cost about half a plain decode step (tau 1.25, rho 0.55: the embedded
    default's eagle3 at c=1) 'pays', but never as the drafter's doing: the verdict line says so, the
    'Why it pays' section gives tau and rho with intervals and splits the speedup with the
    configured-off control, and attribution.json carries the contract."""
    from specmatch.records import Attribution
    from specmatch.calibration.simulate import decomposed_experiment

    cells = decomposed_experiment(np.random.default_rng(11), {"baseline": (None, 1.0), "x": (1.25, 0.55),
                                                               "x__off": (None, 1.15)}, {"s": (200, 700)})
    off = {**SPEC, "num_speculative_tokens_per_batch_size": [[1, 256, 0]]}
    out, md = run_summary(tmp_path, cells, {"baseline": None, "x": SPEC, "x__off": off},
                          settings={"bootstrap": 300, "controls": {"configured_off": True}})
    assert "## Why it pays: tokens per step × step cost" in md
    line = next(x for x in md.splitlines() if x.startswith("- **x** on `s`"))
    assert "pays at c=1,4" in line and "not the drafter's doing" in line
    assert "- **x: drafting cannot explain its gain**" in md
    assert "configuration × drafting" in md and "(loses) × 2." in md
    attrs = [Attribution.from_json(a) for a in json.loads((out / "attribution.json").read_text())]
    contract = {"server", "suite", "concurrency", "tokens_per_step", "step_cost_ratio", "tpot_speedup",
                "explained_by_drafting", "configured_off", "length_adjusted_speedup"}
    assert all(contract <= set(a) for a in json.loads((out / "attribution.json").read_text()))
    x1 = next(a for a in attrs if (a.server, a.concurrency) == ("x", 1))
    assert x1.explained_by_drafting is False and x1.step_cost_ratio.hi < 1
    assert x1.configured_off.verdict == "loses" and x1.drafting_effect.verdict == "pays"
    recs = json.loads((out / "recommendations.json").read_text())
    assert [r["server"] for r in recs] == ["x"]  # a control is never a deployment to recommend
    assert (out / "plots" / "attribution.png").stat().st_size > 10_000


def test_controls_not_expressible_are_said():
    from specmatch.deciding.decide import uncontrolled

    configs = {"baseline": {"engine": "sglang", "model": "m"},
               "e": {"engine": "sglang", "model": "m", "speculative": {"method": "eagle3", "model": "d"}},
               "x": {"engine": "external", "base_url": "http://127.0.0.1:1", "speculative": {"method": "ngram"}}}
    why = uncontrolled({"controls": {"configured_off": True}}, configs, "baseline")
    assert set(why) == {"e", "x"} and "SGLang" in why["e"] and "external" in why["x"]
    assert uncontrolled({}, configs, "baseline") == {}


@pytest.mark.slow
def test_a_gain_of_the_configuration_alone_is_never_the_drafters(tmp_path):
    from specmatch.calibration.simulate import decomposed_experiment

    cells = decomposed_experiment(np.random.default_rng(12), {"baseline": (None, 1.0), "x": (1.5, 0.75),
                                                               "x__off": (None, 0.5)}, {"s": (200, 700)})
    off = {**SPEC, "num_speculative_tokens_per_batch_size": [[1, 256, 0]]}
    out, md = run_summary(tmp_path, cells, {"baseline": None, "x": SPEC, "x__off": off},
                          settings={"bootstrap": 300, "controls": {"configured_off": True}})
    line = next(x for x in md.splitlines() if x.startswith("- **x** on `s`"))
    assert "not the drafter's doing" in line and "configured but drafting nothing (`x__off`) pays as much" in line
    assert "of the control's plain steps for τ 1.5" in md
    rec = next(x for x in md.splitlines() if x.startswith("- **x** (`s`)"))
    assert "its configured-off control `x__off` pays as much" in rec


def test_the_summary_renders_typed_crossovers_and_verification():
    """Issue 18: the summary renders the analysis's records (a typed crossover direction, the
    verification's outcome and error rates); it never decides or calls verify itself."""
    from specmatch.deciding.analysis import analyse
    from specmatch.deciding.reading.measurements import Settings
    from specmatch.deciding.recommending.deployment import ServerInfo, recommend
    from specmatch.records import Direction, Outcome
    from specmatch.reporting.recommendations import recommendation_lines
    from specmatch.reporting.verdicts import verdict_lines

    cells = experiment(np.random.default_rng(0), {1: 1.5, 4: 1.2, 16: 0.6}, repeats=3, session_sd=0.01, cell_sd=0.01)
    an = analyse(cells, "baseline", Settings(bootstrap=300))
    (x,) = an.crossovers[("spec", "s", "output_throughput")]
    assert x.direction is Direction.STOPS_PAYING and (x.below, x.above) == (4, 16)
    line = next(t for t in verdict_lines(decided(an)) if t.startswith("- **spec**"))
    assert "it stops paying at c≈" in line and "between c=4 and c=16" in line
    ext = ServerInfo("spec", "external", "vllm", SPEC, 256)
    key = ("spec", "s", "output_throughput")
    rec = recommend(ext, "s", [v for v in an.verdicts if (v.server, v.suite, v.metric) == key], an.comparisons[key],
                    an.settings)
    assert rec.verified.outcome is Outcome.NOT_VERIFIABLE
    text = recommendation_lines(decided(an), [rec])[0]
    assert "--speculative-config" in text and "**Not verified:** an external endpoint" in text


def reporting_imports_from_deciding() -> dict[str, set[str]]:
    """Every name a reporting module imports from the deciding stage: module -> names."""
    import ast

    from specmatch.files import PACKAGE_DIR

    out = {}
    for path in sorted((PACKAGE_DIR / "reporting").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and "deciding" in (node.module or ""):
                out.setdefault(f"specmatch.{node.module.lstrip('.')}", set()).update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                assert not any("deciding" in a.name for a in node.names), path
    return out


def test_the_report_decides_nothing():
    """What the reporting stage takes from the deciding stage is records, their container, settings and
    names (labels, suffixes): never a function that computes, so every figure it shows was decided and
    written upstream (by the decide step)."""
    import dataclasses
    import importlib

    from specmatch.records import Record

    got = reporting_imports_from_deciding()
    assert "specmatch.deciding.decide" in got and "specmatch.deciding.recommending.kmodel" in got   # the check sees imports
    for module, names in got.items():
        mod = importlib.import_module(module)
        for name in names:
            obj = getattr(mod, name)
            ok = (isinstance(obj, (str, dict, set, frozenset, tuple))
                  or (isinstance(obj, type) and (issubclass(obj, Record) or dataclasses.is_dataclass(obj))))
            assert ok, f"reporting imports {module}.{name}, which is not a record, a container of records or a name"


@pytest.mark.slow
def test_the_decision_records_read_back_as_written(tmp_path):
    """Every file the decide step writes is its record's serialisation: read back, it writes the same
    JSON, so the summary renders exactly what was decided."""
    from specmatch.calibration.simulate import decomposed_experiment
    from specmatch.deciding.decide import FILES, Decisions

    cells = decomposed_experiment(np.random.default_rng(11), {"baseline": (None, 1.0), "x": (1.25, 0.55),
                                                               "x__off": (None, 1.15)}, {"s": (200, 700)})
    off = {**SPEC, "num_speculative_tokens_per_batch_size": [[1, 256, 0]]}
    out, _ = run_summary(tmp_path, cells, {"baseline": None, "x": SPEC, "x__off": off},
                         settings={"bootstrap": 300, "controls": {"configured_off": True}, "slo": {"e2el_ms": 5000}})
    back = Decisions.read(out).to_json()
    for name, f in FILES.items():
        assert back[name] == json.loads((out / f).read_text()), name
    an = json.loads((out / "analysis.json").read_text())
    assert an["baseline"] == "baseline" and an["servers"] == ["baseline", "x", "x__off"]
    assert an["run_to_run"]["pooled"] and {g["goodput"] is not None for g in an["goodput"]} == {True}
    assert [a["server"] for a in an["acceptance"]] == ["x"] and an["settings"]["slo"] == {"e2el_ms": 5000}
    import polars as pl

    assert pl.read_csv(out / "cells.csv")["request_goodput"].to_list() == [g["goodput"] for g in an["goodput"]]
    for f in FILES.values():   # each written with its provenance
        assert (out / f"{f}.prov.json").exists() and json.loads((out / f"{f}.prov.json").read_text())["rule"] == "decide"


@pytest.mark.slow
def test_the_summary_reads_the_records_not_the_requests(tmp_path):
    """Re-rendering from the records alone, after the request files are gone, gives the same report."""
    cells = experiment(np.random.default_rng(0), {1: 1.5, 4: 1.2, 16: 0.6}, repeats=2, session_sd=0.01, cell_sd=0.01)
    out, md = run_summary(tmp_path, cells, {"baseline": None, "spec": SPEC})
    for p in tmp_path.rglob("*.requests.parquet"):
        p.unlink()
    plots = {p.name: p.read_bytes() for p in (out / "plots").glob("*.png")}
    cp = [str(tmp_path / "cells" / r.server / r.suite / f"r{r.repeat}" / f"c{r.concurrency}.json") for r, _ in cells]
    assert summary_main(["--cells", *cp, "--out-dir", str(out)]) == 0
    assert (out / "summary.md").read_text() == md
    assert {p.name: p.read_bytes() for p in (out / "plots").glob("*.png")} == plots


@pytest.mark.slow
def test_the_recommend_step_writes_its_derived_servers_as_records(tmp_path):
    """servers.json is the DerivedServers serialisation: a schedule that stops speculating above c=4
    derives `spec__recommended` (its config carries the schedule, never `suites`), and the file reads
    back to the same record the workflow and the summary use."""
    cells = experiment(np.random.default_rng(0), {1: 1.5, 4: 1.2, 16: 0.6}, repeats=3, session_sd=0.01, cell_sd=0.01)
    cp, rp = write_cells(tmp_path, cells)
    lp = launches(tmp_path, {"baseline": None, "spec": SPEC})
    cfgs = {"baseline": {"engine": "vllm", "model": "m"},
            "spec": {"engine": "vllm", "model": "m", "speculative": SPEC, "suites": ["s"]}}
    out = tmp_path / "recommend"
    assert recommend_main(["--baseline", "baseline", "--settings", json.dumps({"bootstrap": 300}),
                           "--servers", json.dumps(cfgs), "--cells", *cp, "--requests", *rp, "--launches", *lp,
                           "--suites", "s", "--out", str(out / "servers.json"),
                           "--recommendations", str(out / "recommendations.json")]) == 0
    written = json.loads((out / "servers.json").read_text())
    derived = DerivedServers.from_json(written)
    assert derived.to_json() == written and list(derived.servers) == ["spec__recommended"]
    d = derived.servers["spec__recommended"]
    assert (d.parent, d.suite) == ("spec", "s") and "suites" not in d.config
    schedule = d.config["speculative"]["num_speculative_tokens_per_batch_size"]
    assert schedule[-1][1] == 256 and schedule[-1][2] == 0  # up to the launch record's max_batch
    recs = [Recommendation.from_json(r) for r in json.loads((out / "recommendations.json").read_text())]
    assert recs[0].derived_server == "spec__recommended" and recs[0].schedule.bands == schedule


def test_one_formatter_writes_unknown_as_a_dash_and_unbounded_as_infinity():
    """summary and kreport had their own formatters and disagreed: NaN (unknown) was "—" in one and
    "nan" in the other, an infinite bound "—" in one and "inf" in the other. One home now: unknown is
    "—", an infinite bound is a bound ("∞"), in every part of the report."""
    from specmatch.records import Decision, Effect, Interval, Verdict
    from specmatch.reporting import formats, kreport
    from specmatch.deciding.recommending.kmodel import KChoice, KRecommendation

    nan, inf = float("nan"), float("inf")
    assert [formats.number(x) for x in (None, nan, inf, -inf, 1.234, 2)] == ["—", "—", "∞", "-∞", "1.23", "2.00"]
    assert formats.number(np.float64(nan)) == "—" and formats.number(0.5, ".0%") == "50%"
    assert formats.of(Interval(1.5, 1.2, inf)) == "1.50 [1.20, ∞]"
    assert formats.of(Interval(None, None, None)) == "—" and formats.of(None) == "—"   # no figure, no interval
    assert formats.of(Effect("x", "b", "output_throughput", 0.9, nan, 1.1, Decision.INCONCLUSIVE)) == "0.90 [—, 1.10]"
    v = Verdict("x", "s", 1, "output_throughput", Decision.PAYS, 1.3, 1.1, inf, 0.9, 2)
    assert formats.speedup(v) == "1.30x [1.10, ∞]" and formats.speedup(None) == "—"
    ch = KChoice("spec", "s", 1, "output_throughput", 2, "spec@k=2", "best", 2,
                 speedups={"2": {"speedup": 1.4, "lo": nan, "hi": inf, "verdict": "pays"}})
    row = kreport.table(KRecommendation("spec", "s", "output_throughput", "keep", [ch]))[-2]
    assert row == "| 2 | 1.40x [—, ∞] pays |"


@pytest.mark.slow
def test_a_schedule_with_plain_steps_says_over_how_many_steps_its_acceptance_was_measured():
    """The engine's acceptance length of a schedule that runs plain steps at some batch sizes counts its
    speculative steps only: the speedup table and the table of every cell both say over how many (the
    cell table never did: a later variable of the same name hid the servers' set)."""
    from specmatch.deciding.analysis import analyse
    from specmatch.deciding.reading.measurements import Settings
    from specmatch.deciding.recommending.deployment import ServerInfo
    from specmatch.reporting.markdown import markdown

    cells = experiment(np.random.default_rng(0), {1: 1.5, 4: 1.2}, repeats=2, session_sd=0.01, cell_sd=0.01)
    for res, _ in cells:
        if res.server == "spec":
            res.spec_decode_acceptance_length = 2.5
    schedule = {**SPEC, "num_speculative_tokens_per_batch_size": [[1, 2, 3], [3, 256, 0]]}
    infos = {"baseline": ServerInfo("baseline", "vllm", "vllm", None, 256),
             "spec": ServerInfo("spec", "vllm", "vllm", schedule, 256)}
    an = analyse(cells, "baseline", Settings(bootstrap=200), infos)
    md = markdown(decided(an), [], files=["report.html", "plots/speedup.png", "analysis.json", "cells.csv"])
    x = an.measurements.cells[("spec", "s", 4, 2)]
    assert x.spec_decode_num_drafts
    table = md.split("## All cells")[1]
    row = next(t for t in table.splitlines() if t.startswith("| spec | s | 4 | 2 |"))
    assert f"over {x.spec_decode_num_drafts} speculative steps" in row
    assert "over" not in next(t for t in table.splitlines() if t.startswith("| baseline | s | 4 | 2 |"))
    speedups = md.split("## Speedup over")[1].split("\n## ")[0]
    assert "speculative steps" in next(t for t in speedups.splitlines() if t.startswith("| spec | s | 4 |"))
    files = md.split("## Files")[1]
    assert "- Decision records (written by the decide step): `analysis.json`" in files and "`report.html`" in files
