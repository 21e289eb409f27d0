"""The real workflow (all rules, real Snakemake) on a small training root, against scripted
OpenAI-compatible endpoints (`external` engine): fast, no vLLM needed. Also checks provenance."""
import json
import sys

import pytest
import yaml

from builders import REPO, copy_workflow, job_counts, make_root, run, scripted_endpoints, snakemake_cmd
from specmatch.files import current_umask


@pytest.fixture(scope="module")
def endpoints():
    with scripted_endpoints({"base": None, "spec": '{"k": 4, "accept": 2}'}) as urls:
        yield urls


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tok, tok_dir, endpoints):
    wd = copy_workflow(tmp_path_factory.mktemp("wf"))
    make_root(wd, tok, {"code": 12, "agent": 6, "chat": 4})
    cfg = {
        "dataset": {"root": "prepared", "tokenizer": str(tok_dir), "holdout": {"fraction": 0.25}},
        "demo": {"enabled": False}, "models": {"embedded": {"enabled": False}},
        "suites": {"train_mix": {"kind": "training", "size": 8, "seed": 0},
                   "generic": {"kind": "file", "path": "resources/prompts/generic.jsonl", "size": 8}},
        "servers": {"baseline": {"engine": "external", "base_url": endpoints["base"], "flavor": "vllm"},
                    "eagle": {"engine": "external", "base_url": endpoints["spec"], "flavor": "vllm"}},
        "baseline": "baseline", "concurrency": [1, 2], "repeats": 2,
        "requests": {"warmup": 1, "max_tokens": 12, "on_interference": "flag"},   # a shared machine: neighbours flagged, not remeasured
        "summary": {"bootstrap": 200},
    }
    (wd / "test.yaml").write_text(yaml.safe_dump(cfg))
    return wd


def sm(wd, *args, check=True):
    return run(snakemake_cmd() + ["--cores", "2", "--configfile", "test.yaml", *args], wd, check=check)


@pytest.mark.slow  # the whole workflow, then a minute of reruns and dry runs
def test_full_run_then_nothing_then_exact_reruns(workdir):
    sm(workdir)
    res = workdir / "results"
    summary = (res / "summary" / "summary.md").read_text()
    assert "## The answer" in summary.splitlines()[:3] and (res / "summary" / "report.html").exists()
    readable = 0o444 & ~current_umask()   # a teammate reads what the umask lets them (atomic writes too)
    unreadable = [p for p in res.rglob("*") if p.is_file() and p.stat().st_mode & readable != readable]
    assert not unreadable, unreadable[:5]
    assert "**eagle** on `train_mix`" in summary and "acceptance" in summary.lower()
    assert "90% confidence" in summary and "Run-to-run variation, measured" in summary
    cell = json.loads((res / "cells" / "eagle" / "train_mix" / "r2" / "c2.json").read_text())
    assert cell["completed"] == 8 and cell["failed"] == 0 and cell["total_output_tokens"] == 96  # the whole suite
    assert cell["spec_decode_acceptance_rate"] == pytest.approx(0.5)
    assert cell["spec_decode_acceptance_length"] == pytest.approx(3.0)
    assert set(cell["acceptance_by_source"]) <= {"code", "agent", "chat"}
    for f in ("cells.csv", "cells.parquet", "speedups.csv", "plots/throughput.png", "plots/speedup.png",
              "verdicts.json", "recommendations.json"):
        assert (res / "summary" / f).exists(), f
    assert not list(res.rglob("*.partial*"))
    # second run: nothing to do (a dry run needs no --cores: test_commands_without_cores_work)
    out = run(snakemake_cmd() + ["--configfile", "test.yaml", "-n"], workdir).stdout
    assert "Nothing to be done" in out
    # one concurrency changed: only the new cells (both repeats), the recommendation and the summary
    counts = job_counts(sm(workdir, "-n", "--config", "concurrency=[1, 3]").stdout)
    assert counts == {"all": 1, "cell": 8, "stepcost": 1, "recommend": 1, "decide": 1, "summary": 1}
    # one more repeat: only the new repeat's launches and cells
    counts = job_counts(sm(workdir, "-n", "--config", "repeats=3").stdout)
    assert counts == {"all": 1, "launch": 2, "cell": 8, "stepcost": 1, "recommend": 1, "decide": 1, "summary": 1}
    # one server changed: its launch records and its cells only
    counts = job_counts(sm(workdir, "-n", "--config", "servers={'eagle': {'engine': 'external', 'base_url': "
                                                    f"'{json.loads((res / 'servers/eagle/r1/launch.json').read_text())['config']['base_url']}', "
                                                    "'flavor': 'vllm', 'args': ['--x']}}").stdout)
    assert counts == {"all": 1, "launch": 2, "cell": 8, "stepcost": 1, "recommend": 1, "decide": 1, "summary": 1}
    # one suite changed: that suite and its cells only
    counts = job_counts(sm(workdir, "-n", "--config", "suites={'generic': {'kind': 'file', 'size': 6, "
                                                    "'path': 'resources/prompts/generic.jsonl'}}").stdout)
    assert counts == {"all": 1, "prompts": 1, "cell": 8, "stepcost": 1, "recommend": 1, "decide": 1, "summary": 1}
    # a server restricted to one suite: no launch or cell reruns, its other suite's cells just leave
    eagle_url = json.loads((res / "servers/eagle/r1/launch.json").read_text())["config"]["base_url"]
    out = sm(workdir, "-n", "--config", "servers={'eagle': {'engine': 'external', 'base_url': "
                                        f"'{eagle_url}', 'flavor': 'vllm', 'suites': ['train_mix']}}}}").stdout
    assert job_counts(out) == {"all": 1, "stepcost": 1, "recommend": 1, "decide": 1, "summary": 1}
    out = sm(workdir, "-n", "--config", "servers={'eagle': {'engine': 'external', 'base_url': "
                                        f"'{eagle_url}', 'flavor': 'vllm', 'suites': ['train_mix']}}}}",
             "concurrency=[1, 3]").stdout
    assert job_counts(out)["cell"] == 6  # baseline on both suites, eagle on train_mix only


@pytest.mark.slow  # runs the whole workflow (a minute) unless a test before it did
def test_every_file_is_a_serialisation_of_its_record(workdir):
    """The files between stages are the records of specmatch.records, nothing else."""
    import dataclasses

    import polars as pl

    from specmatch.records import (CUT_SCHEMA, REQUEST_SCHEMA, AnalysisRecord, CellResult, Crossover, Decision,
                                   Prompt, Recommendation, Region, Verdict)

    res = workdir / "results"
    if not (res / "summary" / "summary.md").exists():
        sm(workdir)
    names = {f.name for f in dataclasses.fields(CellResult)}
    for p in res.glob("cells/*/*/r*/c*.json"):
        if p.name.count(".") == 1:
            assert set(json.loads(p.read_text())) == names, p
            assert dict(pl.read_parquet(p.with_name(p.stem + ".requests.parquet")).schema) == REQUEST_SCHEMA
    assert dict(pl.read_parquet(res / "inspect" / "cuts.parquet").schema) == CUT_SCHEMA
    prompt = {f.name for f in dataclasses.fields(Prompt)} | {"origin"}
    for line in (res / "prompts" / "train_mix.jsonl").read_text().splitlines():
        assert set(json.loads(line)) <= prompt and set(json.loads(line)) >= prompt - {"messages", "origin"}
    contract = {"server", "suite", "concurrency", "metric", "verdict", "speedup", "lo", "hi", "confidence", "repeats"}
    verdicts = json.loads((res / "summary" / "verdicts.json").read_text())
    assert verdicts and all(contract <= set(v) for v in verdicts)
    assert {v["metric"] for v in verdicts} <= {"output_throughput", "goodput", "tpot", "e2el"}
    assert {v["verdict"] for v in verdicts} <= {"pays", "loses", "equivalent", "inconclusive"}
    assert all(Verdict.from_json(v).to_json() == v for v in verdicts)
    recs = json.loads((res / "summary" / "recommendations.json").read_text())
    assert recs and all({"server", "suite", "regions", "crossover", "schedule", "deploy", "verified"} <= set(r)
                        for r in recs)
    fields = {f.name for f in dataclasses.fields(Recommendation)}
    for r in recs:  # each is a Recommendation's serialisation: typed when read, and unchanged when written again
        assert set(r) <= fields, set(r) - fields
        rec = Recommendation.from_json(r)
        assert rec.server == "eagle" and rec.suite == "train_mix"  # the first training suite
        assert all(isinstance(x, Region) and isinstance(x.verdict, Decision) for x in rec.regions)
        assert rec.crossover is None or isinstance(rec.crossover, Crossover)
        back = rec.to_json()
        assert {k: back[k] for k in r} == r
    analysis = json.loads((res / "summary" / "analysis.json").read_text())   # the decide step's other record
    assert AnalysisRecord.from_json(analysis).to_json() == analysis
    assert analysis["baseline"] == "baseline" and analysis["servers"] == ["baseline", "eagle"]


@pytest.mark.slow  # runs the whole workflow (a minute) unless a test before it did
def test_provenance_and_verify(workdir):
    res = workdir / "results"
    if not (res / "summary" / "summary.md").exists():
        sm(workdir)
    cli = [sys.executable, "-m", "specmatch.cli"]
    env = {"PYTHONPATH": str(REPO / "workflow")}
    out = run(cli + ["provenance", "results/summary/summary.md"], workdir, env=env).stdout
    assert "made by rule summary" in out and "made by rule cell" in out and "made by rule inspect" in out
    assert "results/summary/verdicts.json" in out and "made by rule decide" in out   # the summary renders its records
    assert "prepared/code/tokenized_data.jsonl" in out and "(source input)" in out
    assert "server eagle" in out
    ok = run(cli + ["verify"], workdir, env=env)
    assert "matches" in ok.stdout
    # change one training file: verify names exactly the results it invalidates
    f = workdir / "prepared" / "chat" / "tokenized_data.jsonl"
    f.write_text(f.read_text() + f.read_text().splitlines()[0] + "\n")
    bad = run(cli + ["verify"], workdir, env=env, check=False)
    assert bad.returncode == 1
    assert f"CHANGED prepared/chat/tokenized_data.jsonl (input content changed) -> results/inspect/manifest.json" in bad.stdout
    invalid = bad.stdout.split("invalidated results:")[1].split()
    assert "results/inspect/manifest.json" in invalid and "results/prompts/train_mix.jsonl" in invalid
    assert "results/prompts/generic.jsonl" in invalid  # the control suite's match report reads the manifest
    assert "results/inspect/cuts.parquet" in invalid
    assert all(not p.startswith("results/servers/") for p in invalid)
    assert "results/summary/summary.md" in invalid


@pytest.mark.slow  # runs the whole workflow (a minute) unless a test before it did
def test_snakemake_report_has_the_verdict_and_plots(workdir):
    if not (workdir / "results" / "summary" / "summary.md").exists():
        sm(workdir)
    sm(workdir, "--report", "report.html")
    html = (workdir / "report.html").read_text()
    assert html.lstrip().lower().startswith("<!doctype html")
    for needle in ("summary.md", "throughput.png", "speedup.png", "manifest", "4. Verdict", "3. Plots",
                   "1. Training data", "2. Prompt suites"):
        assert needle in html, needle


@pytest.mark.slow  # two Snakemake runs on the test workflow: several seconds
def test_commands_without_cores_work(workdir):
    """`--unlock`, `--summary` and a dry run take no `--cores`: no rule may need the core count
    while the rules are parsed (a `threads: workflow.cores` did, and `--unlock` failed). The dry run
    without it is test_full_run_then_nothing_then_exact_reruns's "nothing to be done"."""
    base = snakemake_cmd() + ["--configfile", "test.yaml"]
    unlock = run(base + ["--unlock"], workdir)
    assert "Unlocked" in unlock.stdout + unlock.stderr   # one run's own output (Snakemake logs to stderr)
    run(base + ["--summary"], workdir)


@pytest.fixture(scope="module")
def seq_workdir(tmp_path_factory, tok, tok_dir, endpoints):
    """The sequential design on the real workflow: `copy` is the baseline's own endpoint under another
    name (identical: with min_effect 0.1% no interval will be 'equivalent', so its verdicts stay
    inconclusive, and with min_probability 0 every inconclusive verdict gets another repeat), `eagle`
    the speculating endpoint."""
    wd = copy_workflow(tmp_path_factory.mktemp("seq"))
    make_root(wd, tok, {"code": 12, "agent": 6, "chat": 4})
    base = {"engine": "external", "base_url": endpoints["base"], "flavor": "vllm"}
    cfg = {
        "dataset": {"root": "prepared", "tokenizer": str(tok_dir), "holdout": {"fraction": 0.25}},
        "demo": {"enabled": False}, "models": {"embedded": {"enabled": False}},
        "suites": {"train_mix": {"kind": "training", "size": 8, "seed": 0}},
        "servers": {"baseline": base, "copy": dict(base),
                    "eagle": {"engine": "external", "base_url": endpoints["spec"], "flavor": "vllm"}},
        "baseline": "baseline", "concurrency": [1, 2], "repeats": {"min": 2, "max": 3, "min_probability": 0},
        "requests": {"warmup": 1, "max_tokens": 12, "on_interference": "flag"},   # a shared machine: neighbours flagged, not remeasured
        "summary": {"bootstrap": 200, "min_effect": 0.001},
    }
    (wd / "test.yaml").write_text(yaml.safe_dump(cfg))
    return wd


@pytest.mark.slow  # the whole workflow with a round of the sequential design (about a minute)
def test_the_sequential_design_measures_another_repeat_only_where_undecided(seq_workdir):
    from specmatch.records import Continuation, RoundPlan

    wd = seq_workdir
    sm(wd)
    res = wd / "results"
    plan = RoundPlan.from_json(json.loads((res / "rounds" / "r2.json").read_text()))
    assert plan.round == 2 and plan.design == {"min": 2, "max": 3, "min_probability": 0}
    assert {(d.server, d.concurrency) for d in plan.decisions} == {(s, c) for s in ("copy", "eagle") for c in (1, 2)}
    go = {(d.server, d.suite, d.concurrency) for d in plan.decisions if d.action == Continuation.CONTINUE}
    assert go, [(d.server, d.concurrency, d.verdict, d.action) for d in plan.decisions]
    planned = {(c.server, c.suite, c.concurrency) for c in plan.next}
    assert planned == go | {("baseline", u, c) for _, u, c in go}
    # repeat 3: exactly the planned cells, on fresh launches of exactly those servers
    measured = {(p.parts[-4], p.parts[-3], int(p.stem[1:])) for p in res.glob("cells/*/*/r3/c*.json")
                if p.name.count(".") == 1}
    assert measured == planned
    assert {p.parts[-3] for p in res.glob("servers/*/r3/launch.json")} == {s for s, _, _ in planned}
    verdicts = json.loads((res / "summary" / "verdicts.json").read_text())
    thr = {(v["server"], v["concurrency"]): v for v in verdicts if v["metric"] == "output_throughput"}
    for (s, c), v in thr.items():
        assert v["repeats"] == (3 if (s, "train_mix", c) in go else 2)
        assert 0.9 < v["confidence"] < 1       # each look's level: stricter than the fixed design's
    summary = (res / "summary" / "summary.md").read_text()
    assert "Sequential design (repeats 2–3)" in summary and f"repeat 3 measured {len(planned)} cells" in summary
    # each continued configuration's chance, as recorded (min_probability 0 continues every inconclusive one)
    chances = sorted((d.chance for d in plan.decisions if d.action == Continuation.CONTINUE), reverse=True)
    assert all(x is not None for x in chances)
    assert "continued at " + ", ".join(f"{x:.0%}" for x in chances) in summary
    out = run([sys.executable, "-m", "specmatch.cli", "provenance", "results/rounds/r2.json"], wd,
              env={"PYTHONPATH": str(REPO / "workflow")}).stdout
    assert "made by rule sequential_round" in out
    # nothing left to do, and no round past the last
    assert "Nothing to be done" in sm(wd, "-n").stdout
    assert not (res / "rounds" / "r3.json").exists()
