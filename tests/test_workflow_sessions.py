"""A session suite through the real workflow (Snakemake, every rule) against scripted endpoints whose
greedy outputs and prefix cache are simulated (tests/fakeserver.py --words --cache): the suite is
written as sessions, replayed turn by turn in its cells, and the summary writes the context axis and
the natural-stopping report."""
import json
import subprocess
import sys

import polars as pl
import pytest
import yaml

from builders import REPO, copy_workflow, make_root, run, snakemake_cmd


@pytest.fixture(scope="module")
def endpoints():
    procs, urls = [], {}
    for name, extra in (("base", []), ("spec", ["--spec", '{"k": 3, "accept": 1}'])):
        cmd = [sys.executable, str(REPO / "tests" / "fakeserver.py"), "--tokens", "8", "--ttft", "0.005", "--itl",
               "0.002", "--words", "--eos-at", "5", "--cache", "--max-model-len", "512"] + extra
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        urls[name] = json.loads(p.stdout.readline())["base_url"]
        procs.append(p)
    yield urls
    for p in procs:
        p.terminate()
        p.wait(10)


@pytest.mark.slow  # the whole workflow
def test_a_session_suite_through_the_workflow(tmp_path, tok, tok_dir, endpoints):
    wd = copy_workflow(tmp_path)
    make_root(wd, tok, {"code": 10, "agent": 6})
    srv = {"engine": "external", "flavor": "vllm", "stop_token_ids": [2]}
    cfg = {
        "dataset": {"root": "prepared", "tokenizer": str(tok_dir), "holdout": {"fraction": 0.5}},
        "demo": {"enabled": False}, "models": {"embedded": {"enabled": False}},
        "suites": {"train_mix": {"kind": "training", "size": 6, "seed": 0, "turn": "all"},
                   "sessions": {"kind": "session", "size": 4, "seed": 0}},
        "servers": {"baseline": {**srv, "base_url": endpoints["base"]}, "eagle": {**srv, "base_url": endpoints["spec"],
                                                                                    "speculative": {"method": "eagle3", "model": "d"}}},
        "baseline": "baseline", "concurrency": [1, 2], "repeats": 1,
        # the machine running the tests is shared: a cell records its neighbours, it is not measured again
        "requests": {"warmup": 1, "max_tokens": 8, "on_interference": "flag"},
        # an external endpoint has no cache arm: the summary says so
        "summary": {"bootstrap": 200, "controls": {"prefix_cache": True}},
    }
    (wd / "test.yaml").write_text(yaml.safe_dump(cfg))
    run(snakemake_cmd() + ["--cores", "2", "--configfile", "test.yaml"], wd)
    res = wd / "results"
    lines = [json.loads(x) for x in (res / "prompts" / "sessions.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(x["kind"] == "session" and len(x["turns"]) == 2 and x["holdout"] for x in lines)
    match = json.loads((res / "prompts" / "sessions.match.json").read_text())
    assert match["kind"] == "session" and match["sessions"]["turns"] == 8
    cell = json.loads((res / "cells" / "eagle" / "sessions" / "r1" / "c2.json").read_text())
    assert cell["sessions"]["sessions"] == 4 and cell["sessions"]["completed"] == 4 and cell["completed"] == 8
    assert cell["served_context"] == 512 and cell["ignore_eos"] is False and cell["prefix_cache_hit_share"] > 0.3
    recs = pl.read_parquet(res / "cells" / "eagle" / "sessions" / "r1" / "c2.requests.parquet")
    assert recs["session_id"].n_unique() == 4 and sorted(set(recs["turn"].to_list())) == [0, 1]
    assert (recs["natural_stop"] == 6).all() and (recs["output_tokens"] == 6).all()   # stopped where the model stops
    train = json.loads((res / "cells" / "eagle" / "train_mix" / "r1" / "c1.json").read_text())
    assert train["ignore_eos"] is True and train["past_stop_tokens"] == 2 * 6      # 8 tokens, the end at the 6th
    summary = res / "summary"
    md = (summary / "summary.md").read_text()
    assert "## Context length" in md and "## Natural stopping" in md and "## Sessions" in md
    assert "**eagle** on `sessions` at c=1,2: the same tokens as `baseline`" in md
    ctx = json.loads((summary / "context.json").read_text())
    assert {r["suite"] for r in ctx} == {"train_mix", "sessions"}
    assert all(set(r) >= {"server", "suite", "concurrency", "bin", "requests", "tokens_per_step", "step_cost_ratio",
                          "tpot_speedup", "verdict"} for r in ctx)
    assert (summary / "plots" / "context.png").exists() and (summary / "stopping.json").exists()
    # the ledger of each concurrency: both servers keep the whole history cached, so no prefill part
    # is the cache's, and the decode part is measured with its interval
    led = json.loads((summary / "stopping.json").read_text())["ledgers"]
    assert [(x["server"], x["against"], x["concurrency"]) for x in led] == [("eagle", "baseline", 1), ("eagle", "baseline", 2)]
    assert all(x["sessions"] == 4 and x["decode"]["lo"] <= x["decode"]["value"] <= x["decode"]["hi"] for x in led)
    assert "**Where a session's time goes**" in md and "`eagle` against `baseline` at c=1:" in md
    assert "- **eagle**: no cache arm, the prefix-cache opt-out on sessions (an external endpoint" in md
    assert "Nothing to be done" in run(snakemake_cmd() + ["--cores", "2", "--configfile", "test.yaml", "-n"], wd).stdout
