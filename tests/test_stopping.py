"""Natural stopping against scripted servers whose greedy outputs are known: outputs kept per request,
the natural stop measured from the token ids, greedy outputs that agree, and a server whose outputs
diverge, reported by the summary."""
import asyncio
import hashlib
import json

import pytest

from builders import REQ, cell_args, launch_record, load_requests, prompts_file, session, sessions_file
from specmatch.files import write_json
from specmatch.measuring.cell import main as cell_main
from specmatch.measuring.client import natural_stop, run_load
from specmatch.deciding.decide import main as decide_main
from specmatch.reporting.summary import main as summary_main
from specmatch.serving.engines import get_engine

STOP = frozenset({2})


def collecting(n, text, protocol, ignore_eos, max_tokens=12):
    reqs = load_requests(n, text, protocol, max_tokens=max_tokens)
    for r in reqs:
        r.collect, r.stop_ids = True, STOP
        if protocol == "sglang-generate":
            r.payload["sampling_params"]["ignore_eos"] = ignore_eos
        else:
            r.payload.update(ignore_eos=ignore_eos, return_token_ids=True)
    return reqs


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["openai-completions", "openai-chat", "sglang-generate"])
@pytest.mark.parametrize("incremental", [False, True])
def test_outputs_are_kept_and_the_natural_stop_is_measured(fake_server, protocol, incremental):
    if incremental and protocol != "sglang-generate":
        pytest.skip("delta text is SGLang's option")
    srv = fake_server(words=True, eos_at=5, ttft=0.001, itl=0.001, tokens=12, cache=True, incremental=incremental)
    past = asyncio.run(run_load(srv.base_url, collecting(2, "hello world", protocol, True), 1, protocol))
    for r in past:   # ignore_eos: 12 tokens, the model's own end at the 6th, 6 decoded past it
        assert r.ok and r.output_tokens == 12 and len(r.output_token_ids) == 12 and r.output_token_ids[5] == 2
        assert r.natural_stop == 6 and r.past_stop_tokens == 6 and r.finish_reason == "length"
        assert r.output_sha256 == hashlib.sha256(r.output_text.encode()).hexdigest() and r.output_text.count(" w") == 11
    assert past[0].cached_tokens == 0 and past[1].cached_tokens == past[1].prompt_tokens > 0   # the same prompt again
    stop = asyncio.run(run_load(srv.base_url, collecting(1, "hello world", protocol, False), 1, protocol))[0]
    assert stop.ok and stop.output_tokens == 6 and stop.natural_stop == 6 and stop.past_stop_tokens == 0
    assert stop.finish_reason == "stop" and past[0].output_text.startswith(stop.output_text)


def test_the_natural_stop_is_none_where_it_cannot_be_measured():
    assert natural_stop([5, 6, 2, 7], STOP, 4) == (3, 1)
    assert natural_stop([5, 6, 7], STOP, 3) == (None, 0)         # no stop token: nothing past it
    assert natural_stop([], STOP, 3) == (None, None)             # no token ids from the engine
    assert natural_stop([5, 2], None, 2) == (None, None)         # the model's stop tokens unknown


def test_engines_ask_for_token_ids_and_know_the_model_stop_tokens(tmp_path):
    assert get_engine({"engine": "vllm", "model": "m"}).output_extras() == {"return_token_ids": True}
    assert get_engine({"engine": "sglang", "model": "m"}).output_extras() == {}
    assert get_engine({"engine": "external", "base_url": "http://x:1", "flavor": "openai"}).output_extras() == {}
    plan = get_engine({"engine": "vllm", "model": "m", "profile": "gpu"}).launch_plan(8000, 16)
    assert "--enable-prompt-tokens-details" in plan.argv
    model = tmp_path / "model"
    model.mkdir()
    write_json(model / "generation_config.json", {"eos_token_id": [7, 9]})
    write_json(model / "tokenizer_config.json", {"eos_token": "<|end|>",
                                                 "added_tokens_decoder": {"3": {"content": "<|end|>"}}})
    assert get_engine({"engine": "vllm", "model": str(model)}).stop_token_ids() == {3, 7, 9}
    assert get_engine({"engine": "vllm", "model": "org/hub-id"}).stop_token_ids() is None
    assert get_engine({"engine": "external", "base_url": "http://x:1", "stop_token_ids": [2]}).stop_token_ids() == {2}


# -- through cells and the summary ---------------------------------------------------------------------
def measure(tmp_path, servers: dict, prompts, req: dict, concurrencies=(1,), repeats=2):
    """Cells of every server (name -> fake server) as the workflow writes them, and the summary over them."""
    cells, reqs, launches = [], [], []
    for name, srv in servers.items():
        cfg = {"engine": "external", "base_url": srv.base_url, "flavor": "vllm", "stop_token_ids": [2]}
        lp = tmp_path / "servers" / name / "r1" / "launch.json"
        write_json(lp, launch_record(name, {"method": "eagle3", "model": "d", "num_speculative_tokens": 3}
                                     if name != "baseline" else None).to_json())
        launches.append(str(lp))
        for r in range(1, repeats + 1):
            for c in concurrencies:
                d = tmp_path / "cells" / name / "s" / f"r{r}"
                d.mkdir(parents=True, exist_ok=True)
                a = cell_args(tmp_path, "http://unused", prompts, req)
                a[a.index("--server") + 1] = json.dumps(cfg)
                a[a.index("--name") + 1] = name
                a[a.index("--concurrency") + 1] = str(c)
                a[a.index("--out") + 1] = str(d / f"c{c}.json")
                a[a.index("--requests-out") + 1] = str(d / f"c{c}.requests.parquet")
                a += ["--repeat", str(r)]
                assert cell_main(a) == 0
                cells.append(str(d / f"c{c}.json"))
                reqs.append(str(d / f"c{c}.requests.parquet"))
    out = tmp_path / "summary"
    cfgs = {n: {"engine": "vllm", "model": "m"} for n in servers}
    assert decide_main(["--baseline", "baseline", "--settings", json.dumps({"bootstrap": 200}), "--servers",
                        json.dumps(cfgs), "--cells", *cells, "--requests", *reqs, "--launches", *launches,
                        "--suites", "s", "--out-dir", str(out)]) == 0
    assert summary_main(["--cells", *cells, "--out-dir", str(out)]) == 0
    return out, (out / "summary.md").read_text()


NATURAL = {**REQ, "passes": 1, "max_tokens": 10, "ignore_eos": False}
TEXTS = [f"question {i} about the file" for i in range(6)]


@pytest.mark.slow
def test_greedy_outputs_agree_and_the_summary_says_so(tmp_path, fake_server):
    kw = dict(words=True, eos_at=lambda p: 3 + len(p) % 5, ttft=0.002, itl=0.002, tokens=10)
    servers = {"baseline": fake_server(**kw), "spec": fake_server(**kw, spec={"k": 3, "accept": 1})}
    out, md = measure(tmp_path, servers, prompts_file(tmp_path, TEXTS), NATURAL, concurrencies=(1, 2))
    stop = json.loads((out / "stopping.json").read_text())
    agree = {a["concurrency"]: a for a in stop["agreement"]}
    assert set(agree) == {1, 2}
    for a in agree.values():
        assert a["compared"] == 12 and a["identical"] == 12 and a["differ"] == 0 and a["ignore_eos"] is False
        assert a["baseline_floor"] == {"compared": 6, "identical": 6}
    assert ("**spec** on `s` at c=1,2: the same tokens as `baseline` in all 24 requests compared (the baseline "
            "against its own first repeat: 12 of 12 identical); both did the same work") in md
    assert "compare like with like" in md and "diverge" not in md
    assert all(p["past_stop_tokens"] == 0 for p in stop["past_stop"])


@pytest.mark.slow
def test_a_server_whose_outputs_diverge_is_reported_by_the_summary(tmp_path, fake_server):
    kw = dict(words=True, eos_at=7, ttft=0.002, itl=0.002, tokens=10)
    lossy = fake_server(**kw, diverge=lambda p: 2 if "question 1" in p or "question 4" in p else None)
    servers = {"baseline": fake_server(**kw), "spec": lossy}
    out, md = measure(tmp_path, servers, prompts_file(tmp_path, TEXTS), NATURAL)
    agree = json.loads((out / "stopping.json").read_text())["agreement"]
    for a in agree:
        assert a["compared"] == 12 and a["differ"] == 4 and a["identical"] == 8 and a["same_length"] == 4
        assert a["first_divergence"]["min"] == 2 and a["first_divergence"]["max"] == 2
        assert {e["prompt_id"] for e in a["examples"]} == {"s-1", "s-4"}
    assert ("**spec** on `s` at c=1: **outputs diverge from `baseline`'s in 4 of 12 requests**, first differing at "
            "token 2–2 (median 2)") in md
    assert "compare them per token: TPOT" in md


@pytest.mark.slow
def test_tokens_past_the_natural_stop_are_counted_and_warned_about(tmp_path, fake_server):
    kw = dict(words=True, eos_at=4, ttft=0.002, itl=0.002, tokens=10)
    servers = {"baseline": fake_server(**kw), "spec": fake_server(**kw, spec={"k": 3, "accept": 1})}
    out, md = measure(tmp_path, servers, prompts_file(tmp_path, TEXTS), {**NATURAL, "ignore_eos": True})
    past = {p["server"]: p for p in json.loads((out / "stopping.json").read_text())["past_stop"]}
    for p in past.values():   # 10 tokens each, the model's end at the 5th: 5 past it in every request
        assert p["requests"] == 12 and p["output_tokens"] == 120 and p["past_stop_tokens"] == 60
        assert p["share"] == pytest.approx(0.5) and p["warn"] and p["ignore_eos"] is True
    assert ("**warning**: `s`: 60 of 120 output tokens (50%) of `baseline` were decoded after the model's own "
            "end-of-sequence token, in 12 of 12 requests (requests.ignore_eos: true) (`spec` 50%)") in md
    cell = json.loads((tmp_path / "cells" / "spec" / "s" / "r1" / "c1.json").read_text())
    assert cell["past_stop_tokens"] == 30 and cell["past_stop_share"] == pytest.approx(0.5)
    assert any("after the model's own end-of-sequence token" in w for w in cell["warnings"])


@pytest.mark.slow
def test_session_suites_in_the_summary(tmp_path, fake_server):
    """A session suite through cells and the summary: its sessions, prefix-cache hits and TTFT by turn,
    the session throughput against the baseline, and turns that diverge counted once per session."""
    kw = dict(words=True, eos_at=3, ttft=0.002, itl=0.002, tokens=6, cache=True)
    servers = {"baseline": fake_server(**kw), "spec": fake_server(**kw, spec={"k": 3, "accept": 1})}
    ss = [session(i, [f"SYS agent\nU{i} start\n", f"\nTOOL{i} one\n", f"\nTOOL{i} two\n"]) for i in range(4)]
    out, md = measure(tmp_path, servers, sessions_file(tmp_path, ss), {**NATURAL, "max_tokens": 6},
                      concurrencies=(2,))
    stop = json.loads((out / "stopping.json").read_text())
    spec = [x for x in stop["sessions"] if x["server"] == "spec"]
    assert {x["concurrency"] for x in spec} == {2}
    for x in spec:
        assert x["sessions"] == 8 and x["completed"] == 8 and x["turns_sent"] == 24 and x["cut_short"] == {}
        assert x["prefix_cache_hit_share"] > 0.3 and set(x["ttft_ms_by_turn"]) == {"0", "1", "2"}
        assert x["paired_sessions"] == 4 and x["session_throughput"]["value"] > 0
    assert "## Sessions" in md and "| spec | s | 2 | 8 (8 / 0) | 24 (0, 0) |" in md
    ctx = json.loads((out / "context.json").read_text())
    assert ctx and {r["suite"] for r in ctx} == {"s"} and all(r["units"] <= 4 for r in ctx)
