"""Speedups, intervals, crossover and recommendation on synthetic cells with known answers."""
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from specmatch.cell import write_requests
from specmatch.summary import crossover, load_cells, markdown, recommendation, speedups


def fake_cell(root: Path, server, suite, c, tok_per_s, n=40, seed=0, drafts=None, rate=None):
    """Closed-loop requests with 64 output tokens each, at a per-request speed of tok_per_s."""
    rng = np.random.default_rng(seed)
    recs, t = [], 0.0
    for i in range(n):
        e2e = 64 / tok_per_s * rng.uniform(0.97, 1.03)
        recs.append({"index": i, "prompt_id": f"p{i}", "source": "code" if i % 2 else "chat", "holdout": False,
                     "start_s": (i // c) * e2e, "e2e_s": e2e, "ttft_s": 0.05, "arrivals_s": [0.05, 0.06],
                     "prompt_tokens": 10, "output_tokens": 64, "ok": True, "error": None,
                     "num_draft_tokens": None, "num_accepted_tokens": None, "num_spec_steps": None,
                     "acceptance_length": None, "acceptance_rate": None})
    duration = max(r["start_s"] + r["e2e_s"] for r in recs)
    d = root / server / suite
    d.mkdir(parents=True, exist_ok=True)
    cell = {"server": server, "suite": suite, "concurrency": c, "engine": "vllm", "completed": n, "failed": 0,
            "duration": duration, "output_throughput": 64 * n / duration,
            "mean_tpot_ms": 1000 / tok_per_s, "mean_e2el_ms": 64000 / tok_per_s,
            "spec_decode_acceptance_rate": rate, "spec_decode_num_drafts": drafts, "acceptance_by_source": {}}
    (d / f"c{c}.json").write_text(json.dumps(cell))
    write_requests(d / f"c{c}.requests.parquet", recs)
    return d / f"c{c}.json"


def test_speedup_crossover_and_schedule(tmp_path):
    paths = []
    for c, base, spec in ((1, 30, 45), (4, 25, 30), (16, 20, 12)):  # pays, pays, loses
        paths.append(fake_cell(tmp_path, "baseline", "train", c, base))
        paths.append(fake_cell(tmp_path, "eagle", "train", c, spec, seed=1, rate=0.5, drafts=100))
    df, reqs = load_cells(paths)
    sp = speedups(df, reqs, "baseline", 500, 0.9)
    row = {r["concurrency"]: r for r in sp.iter_rows(named=True)}
    assert row[1]["speedup_throughput"] == pytest.approx(1.5, rel=0.05)
    assert row[16]["speedup_throughput"] == pytest.approx(0.6, rel=0.05)
    assert row[1]["speedup_throughput_lo"] < row[1]["speedup_throughput"] < row[1]["speedup_throughput_hi"]
    assert row[1]["verdict"] == "pays" and row[16]["verdict"] == "loses"
    assert row[1]["speedup_tpot"] == pytest.approx(1.5, rel=0.05)
    cross = crossover(sp)
    assert cross[0]["crossover"] == "stops paying at c=16 (pays up to c=4)" and cross[0]["pays_up_to"] == 4
    assert cross[0]["confident_loses"] == [16]
    launches = {"eagle": {"engine": "vllm", "flavor": "vllm",
                          "speculative": {"method": "eagle3", "model": "d", "num_speculative_tokens": 3}}}
    rec = recommendation(cross, launches, {"train"})[0]
    cfg = json.loads(rec["recommendation"].split("'")[1])
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 4, 3], [5, 1024, 0]]
    md = markdown(df, sp, cross, [rec], pl.DataFrame(), [], "baseline")
    assert "**eagle** on `train`: stops paying at c=16" in md and "clearly loses at c=16" in md


def test_never_pays_and_everywhere(tmp_path):
    paths = []
    for c in (1, 8):
        paths.append(fake_cell(tmp_path, "baseline", "s", c, 30))
        paths.append(fake_cell(tmp_path, "slow", "s", c, 10, seed=2))
        paths.append(fake_cell(tmp_path, "fast", "s", c, 60, seed=3))
    df, reqs = load_cells(paths)
    cross = {x["server"]: x for x in crossover(speedups(df, reqs, "baseline", 300, 0.9))}
    assert cross["slow"]["crossover"] == "never pays" and cross["fast"]["crossover"] == "pays everywhere measured"
    recs = {r["server"]: r["recommendation"] for r in recommendation(list(cross.values()), {}, set())}
    assert recs["slow"].startswith("turn speculation off") and recs["fast"].startswith("keep speculation on")


def test_noise_floor_from_cells_where_speculation_was_off(tmp_path):
    from specmatch.summary import apply_noise_margin, noise_floor

    paths = []
    for c, base, spec, drafts in ((1, 30, 45, 100), (16, 20, 21.2, 0)):  # at c=16 the schedule turned drafting off
        paths.append(fake_cell(tmp_path, "baseline", "s", c, base))
        paths.append(fake_cell(tmp_path, "sched", "s", c, spec, seed=4, drafts=drafts, rate=0.5 if drafts else None))
    df, reqs = load_cells(paths)
    sp = speedups(df, reqs, "baseline", 300, 0.9)
    floor = noise_floor(sp)
    assert [f["concurrency"] for f in floor] == [16] and floor[0]["speedup"] == pytest.approx(1.06, rel=0.03)
    judged = {r["concurrency"]: r["verdict"] for r in apply_noise_margin(sp, 0.06).iter_rows(named=True)}
    assert judged == {1: "pays", 16: "inconclusive"}
    md = markdown(df, sp, crossover(sp), [], pl.DataFrame(), [], "baseline")
    assert "Noise floor" in md and "off (0 drafts)" in md


def test_load_generator_section_names_the_clock_and_every_warning():
    from specmatch.summary import load_generator_lines

    cells = [{"server": "baseline", "suite": "train", "concurrency": 1, "arrival_clock": "kernel",
              "p99_client_read_lag_ms": 0.3, "coalesced_token_events": 0, "warnings": []},
             {"server": "eagle", "suite": "train", "concurrency": 256, "arrival_clock": "kernel",
              "p99_client_read_lag_ms": 2.5, "coalesced_token_events": 40,
              "warnings": ["40 token events (2.0%) reached the client in one read"]}]
    text = "\n".join(load_generator_lines(cells))
    assert "SO_TIMESTAMPNS" in text and "within 2.5 ms" in text and "40 token event(s)" in text
    assert "- warning, eagle / train / c=256: 40 token events (2.0%)" in text
    old = "\n".join(load_generator_lines([{"server": "b", "suite": "s", "concurrency": 1}]))
    assert "older specmatch" in old


def test_noise_floor_from_servers_identical_at_a_concurrency(tmp_path):
    """Always-on n-gram and a schedule that switches it off above 4 run the same computation at c<=4:
    their difference there is run-to-run noise, and it widens the margin verdicts must clear."""
    from specmatch.summary import effective_config, noise_floor

    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}
    launches = {"baseline": {"config": {"engine": "vllm", "model": "m"}},
                "ngram": {"config": {"engine": "vllm", "model": "m", "speculative": spec}},
                "sched": {"config": {"engine": "vllm", "model": "m", "idle_timeout_s": 5, "speculative": {
                    **spec, "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 256, 0]]}}}}
    assert effective_config(launches["ngram"], 4) == effective_config(launches["sched"], 4)
    assert effective_config(launches["ngram"], 16) != effective_config(launches["sched"], 16)
    assert effective_config(launches["baseline"], 16) != effective_config(launches["sched"], 16)  # K=4 at bs<=4
    assert effective_config({"config": {"engine": "vllm", "model": "m", "speculative": {
        **spec, "num_speculative_tokens_per_batch_size": [[1, 256, 0]]}}}, 8) == effective_config(launches["baseline"], 8)
    paths = []
    for c, base, ng, sc in ((1, 30, 36, 30), (16, 20, 15, 21)):
        paths.append(fake_cell(tmp_path, "baseline", "s", c, base))
        paths.append(fake_cell(tmp_path, "ngram", "s", c, ng, seed=1, drafts=50, rate=0.3))
        paths.append(fake_cell(tmp_path, "sched", "s", c, sc, seed=2, drafts=50 if c == 1 else 0, rate=0.3))
    df, reqs = load_cells(paths)
    sp = speedups(df, reqs, "baseline", 300, 0.9)
    floor = noise_floor(sp, launches, "baseline")
    pair = [f for f in floor if f["against"] == "sched"]
    assert len(pair) == 1 and pair[0]["server"] == "ngram" and pair[0]["concurrency"] == 1
    assert pair[0]["speedup"] == pytest.approx(36 / 30, rel=0.03)
    assert [f["concurrency"] for f in floor if f["against"] == "baseline"] == [16]
    md = markdown(df, sp, crossover(sp), [], pl.DataFrame(), [], "baseline", floor=floor)
    assert "apart (ngram vs sched, s, c=1)" in md and f"within about ±{pair[0]['speedup'] - 1:.0%}" in md


def test_no_schedule_is_recommended_from_noise():
    x = {"server": "s", "suite": "t", "crossover": "stops paying at c=16 (pays up to c=4)", "pays_up_to": 4,
         "confident": False, "confident_pays": [], "confident_loses": [], "inconclusive": [1, 4, 16],
         "speedups": {1: 1.05, 4: 1.04, 16: 0.93}}
    launches = {"s": {"engine": "vllm", "flavor": "vllm", "speculative": {"method": "ngram", "num_speculative_tokens": 4}}}
    rec = recommendation([x], launches, {"t"})[0]
    assert rec["recommendation"].startswith("no change: at every measured concurrency the difference")
    x2 = {**x, "confident_pays": [1], "inconclusive": [4, 16]}
    assert "num_speculative_tokens_per_batch_size" in recommendation([x2], launches, {"t"})[0]["recommendation"]
