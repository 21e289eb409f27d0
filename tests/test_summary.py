"""The summary renders the analysis: verdicts, crossover, recommendation and the contract files, from
cells written to disk as the workflow writes them (synthetic cells with known answers)."""
import json
from pathlib import Path

import numpy as np
import pytest

from specmatch.cell import write_requests
from specmatch.files import write_json
from specmatch.records import CellResult, RequestRecord
from specmatch.simulate import experiment
from specmatch.summary import load_generator_lines, main


def write_cells(root: Path, cells) -> tuple[list[str], list[str]]:
    """Cells and request records on disk, as the cell step writes them."""
    cpaths, rpaths = [], []
    for res, req in cells:
        d = root / "cells" / res.server / res.suite / f"r{res.repeat}"
        d.mkdir(parents=True, exist_ok=True)
        c, r = d / f"c{res.concurrency}.json", d / f"c{res.concurrency}.requests.parquet"
        write_json(c, res.to_json())
        recs = [RequestRecord(i, row["prompt_id"], "code" if i % 2 else "chat", False, 0, row["start_s"], row["e2e_s"],
                              row["ttft_s"], [row["ttft_s"]], 0, 10, int(row["output_tokens"]), True, None,
                              None, None if row["num_spec_steps"] is None else int(row["num_accepted_tokens"]),
                              None if row["num_spec_steps"] is None else int(row["num_spec_steps"]))
                for i, row in enumerate(req.iter_rows(named=True))]
        write_requests(r, recs)
        cpaths.append(str(c))
        rpaths.append(str(r))
    return cpaths, rpaths


def launches(root: Path, servers: dict) -> list[str]:
    out = []
    for name, spec in servers.items():
        p = root / "servers" / name / "r1" / "launch.json"
        write_json(p, {"server": name, "engine": "vllm", "flavor": "vllm", "max_batch": 256,
                       "config": {"engine": "vllm", "model": "m", **({"speculative": spec} if spec else {})}})
        out.append(str(p))
    return out


SPEC = {"method": "eagle3", "model": "d", "num_speculative_tokens": 3}


def run_summary(tmp_path, cells, servers, suites=("s",), settings=None):
    cp, rp = write_cells(tmp_path, cells)
    lp = launches(tmp_path, servers)
    cfgs = {n: {"engine": "vllm", "model": "m", **({"speculative": s} if s else {})} for n, s in servers.items()}
    out = tmp_path / "summary"
    assert main(["--baseline", "baseline", "--settings", json.dumps(settings or {"bootstrap": 300}),
                 "--servers", json.dumps(cfgs), "--cells", *cp, "--requests", *rp, "--launches", *lp,
                 "--suites", *suites, "--out-dir", str(out)]) == 0
    return out, (out / "summary.md").read_text()


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
    sched = rec["vllm_schedule"]
    assert sched[0][0] == 1 and sched[0][2] == 3 and sched[-1][1:] == [256, 0] and 4 <= sched[0][1] < 16
    assert "**spec** on `s`: pays at c=1,4; loses at c=16" in md and "90% confidence" in md
    assert "--speculative-config" in md and '"num_speculative_tokens_per_batch_size": [[1,' in md
    for f in ("cells.csv", "cells.parquet", "speedups.csv", "plots/throughput.png", "plots/speedup.png"):
        assert (out / f).exists(), f


def test_never_pays_and_everywhere(tmp_path):
    cells = experiment(np.random.default_rng(1), 0.5, repeats=2, session_sd=0.01, cell_sd=0.01) + [
        (r, q) for r, q in experiment(np.random.default_rng(2), 2.0, repeats=2, session_sd=0.01, cell_sd=0.01)
        if r.server == "spec"]
    for res, _ in cells[len(cells) - 6:]:
        res.server = "fast"
    out, md = run_summary(tmp_path, cells, {"baseline": None, "spec": SPEC, "fast": SPEC})
    recs = {r["server"]: r for r in json.loads((out / "recommendations.json").read_text())}
    assert recs["spec"]["action"] == "off" and recs["spec"]["text"].startswith("turn speculation off: it loses at")
    assert recs["fast"]["action"] == "keep" and recs["fast"]["vllm_schedule"] is None


def test_no_schedule_is_recommended_from_noise(tmp_path):
    cells = experiment(np.random.default_rng(3), {1: 1.05, 4: 1.0, 16: 0.95}, repeats=2)
    out, md = run_summary(tmp_path, cells, {"baseline": None, "spec": SPEC})
    rec = json.loads((out / "recommendations.json").read_text())[0]
    assert rec["action"] == "undecided" and rec["vllm_schedule"] is None
    assert "no recommendation: no concurrency is decided" in md


def test_load_generator_section_names_the_clock_and_every_warning():
    def cell(server, c, clock, lag, coalesced, warnings):
        return CellResult(server, "train", c, 1, "vllm", "openai-completions", "vllm", c, 8, 8, 1, 0, "inf", 1.0, 0.0,
                          "r1", False, "h", "ok", 8, 0, {}, 1.0, 0, 8, 8.0, 8.0, None, arrival_clock=clock,
                          p99_client_read_lag_ms=lag, coalesced_token_events=coalesced, warnings=warnings)

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
    write_json(derived, {"servers": {"spec__recommended": {"parent": "spec", "suite": "s", "config": {}}}})
    cfgs = {"baseline": {"engine": "vllm", "model": "m"}, "spec": {"engine": "vllm", "model": "m", "speculative": SPEC}}
    out = root / "summary"
    assert main(["--baseline", "baseline", "--settings", json.dumps({"bootstrap": 300}), "--servers", json.dumps(cfgs),
                 "--cells", *cp, "--requests", *rp, "--launches", *lp, "--suites", "s", "--derived", str(derived),
                 "--out-dir", str(out)]) == 0
    verdicts = json.loads((out / "verdicts.json").read_text())
    mine = {(v["concurrency"], v["metric"]): v["verdict"] for v in verdicts if v["server"] == "spec__recommended"}
    assert {c for c, _ in mine} == {1, 4, 16} and mine[(1, "output_throughput")] == "pays"
    assert mine[(16, "output_throughput")] == "loses"
    spec_alone = [v for v in json.loads((alone / "verdicts.json").read_text()) if v["server"] == "spec"]
    assert [v for v in verdicts if v["server"] == "spec"] == spec_alone  # the primary grid's verdicts, unchanged
    rec = json.loads((out / "recommendations.json").read_text())[0]
    assert rec["vllm_schedule"] == json.loads((alone / "recommendations.json").read_text())[0]["vllm_schedule"]
    assert rec["verified"]["server"] == "spec__recommended" and rec["verified"]["matches_best"] is False
    assert "**Verification failed:** `spec__recommended` ran at 0.7" in (out / "summary.md").read_text()
    assert "of `baseline` at c=16: the schedule's switch costs throughput" in (out / "summary.md").read_text()
