"""Launch records: the engine's own start-up warnings, read from real vLLM 0.32 CPU logs (recorded by
a default run: the baseline, and an n-gram server with a batch-size schedule)."""
import json
from pathlib import Path

from specmatch.serving.launch import engine_warnings
from specmatch.records import LaunchRecord
from specmatch.serving.server import START_MARKER

FIX = Path(__file__).parent / "fixtures" / "vllm"


def test_warnings_of_a_real_vllm_start_up():
    base = engine_warnings(FIX / "startup_cpu_0.32_baseline.log")
    spec = engine_warnings(FIX / "startup_cpu_0.32_ngram_off_above_4.log")
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
    assert engine_warnings(log, {"HF_TOKEN": "hf_abcdef123"}) == ["token <redacted> rejected", "plain form"]
    assert engine_warnings(tmp_path / "absent.log") == [] and engine_warnings(None) == []


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
