"""One cell run by hand against a scripted server: failures fail the job without a complete-looking file."""
import json

import polars as pl

from specmatch.cell import main, order_prompts

REQ = {"endpoint": "completions", "min_per_cell": 6, "per_worker": 1, "warmup": 0, "max_tokens": 8,
       "use_reference_length": False, "temperature": 0.0, "ignore_eos": True, "seed": 0, "timeout_s": 5,
       "max_failure_fraction": 0.0, "request_rate": None, "burstiness": 1.0}


def prompts_file(tmp_path, texts):
    p = tmp_path / "s.jsonl"
    p.write_text("".join(json.dumps({"id": f"s-{i}", "source": "src", "text": t, "messages": None,
                                     "holdout": False}) + "\n" for i, t in enumerate(texts)))
    return p


def args(tmp_path, url, prompts, req):
    return ["--name", "ext", "--server", json.dumps({"engine": "external", "base_url": url, "flavor": "vllm"}),
            "--suite", "s", "--prompts", str(prompts), "--concurrency", "2", "--max-concurrency", "0",
            "--requests", json.dumps(req), "--out", str(tmp_path / "c2.json"),
            "--requests-out", str(tmp_path / "c2.requests.parquet"), "--state-dir", str(tmp_path / "state")]


def test_failures_over_the_bound_fail_the_cell(tmp_path, fake_server):
    srv = fake_server(tokens=8, ttft=0.005, itl=0.001)
    p = prompts_file(tmp_path, ["ok one", "ok two", "FAIL500 three"])
    assert main(args(tmp_path, srv.base_url, p, REQ)) == 2
    assert not (tmp_path / "c2.json").exists() and not (tmp_path / "c2.requests.parquet").exists()
    partial = json.loads((tmp_path / "c2.failed.json").read_text())
    assert partial["failed"] == 2 and partial["completed"] == 4 and partial["failure_reasons"] == {"http": 2}
    recs = pl.read_parquet(tmp_path / "c2.failed.requests.parquet")
    assert recs.height == 6 and recs.filter(~pl.col("ok"))["error"].str.contains("HTTP 500").all()


def test_tolerated_failures_are_counted(tmp_path, fake_server):
    srv = fake_server(tokens=8, ttft=0.005, itl=0.001, spec={"k": 2, "accept": 1})
    p = prompts_file(tmp_path, ["ok one", "ok two", "FAIL500 three"])
    assert main(args(tmp_path, srv.base_url, p, {**REQ, "max_failure_fraction": 0.5})) == 0
    cell = json.loads((tmp_path / "c2.json").read_text())
    assert cell["failed"] == 2 and cell["completed"] == 4 and cell["total_output_tokens"] == 32
    assert cell["cache_reset"] == "ok" and srv.resets == 1
    assert cell["spec_decode_acceptance_rate"] == 0.5  # from the /metrics delta over this cell only
    assert (tmp_path / "c2.json.prov.json").exists()


def test_same_prompt_order_for_every_server():
    prompts = [{"id": i} for i in range(5)]
    a = order_prompts(prompts, 12, seed=3)
    assert a == order_prompts(prompts, 12, seed=3) and len(a) == 12
    assert sorted(p["id"] for p in a[:5]) == [0, 1, 2, 3, 4]  # every prompt once before any repeats
