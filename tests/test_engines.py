"""Command building for every engine, and response parsing on recorded real responses."""
import json
from pathlib import Path

import pytest

from builders import cell_result
from specmatch.measuring import summary
from specmatch.serving.engines import ENGINES, get_engine, redact_argv, redact_env
from specmatch.serving.engines.base import as_text
from specmatch.serving.engines.sglang import parse_meta_info, running_cap
from specmatch.files import SpecmatchError
from specmatch.serving.engines.prometheus import parse_prometheus
from specmatch.records import Acceptance, CellAcceptance, CellResult, RequestRecord

FIX = Path(__file__).parent / "fixtures"


def test_vllm_cpu_argv_and_env():
    eng = get_engine({"engine": "vllm", "model": "m", "python": "/venv/bin/python", "profile": "cpu",
                      "speculative": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                                      "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 256, 0]]},
                      "args": ["--seed", 1], "env": {"MY_TOKEN": "s3cret"}})
    plan = eng.launch_plan(port=8123, max_batch=16)
    assert plan.argv[:8] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m",
                             "--host", "127.0.0.1", "--port"]
    spec = json.loads(plan.argv[plan.argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 4, 4], [5, 256, 0]]
    assert "--enable-per-request-metrics" in plan.argv
    assert plan.argv[plan.argv.index("--per-request-spec-decode-metrics") + 1] == "summary"
    assert "-O0" in plan.argv and "--max-num-seqs" not in plan.argv
    assert plan.argv[-2:] == ["--seed", "1"]
    assert plan.env["VLLM_CPU_KVCACHE_SPACE"] and plan.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert plan.base_url == "http://127.0.0.1:8123"
    assert redact_env(plan.env)["MY_TOKEN"] == "<redacted>"


def test_vllm_gpu_argv_high_concurrency_and_tp():
    plan = get_engine({"engine": "vllm", "model": "big", "profile": "gpu", "tensor_parallel_size": 8,
                       "speculative": {"method": "eagle3", "model": "d", "num_speculative_tokens": 3}}
                      ).launch_plan(port=1, max_batch=512)
    assert "-O0" not in plan.argv and "VLLM_CPU_KVCACHE_SPACE" not in plan.env
    assert plan.argv[plan.argv.index("--tensor-parallel-size") + 1] == "8"
    assert plan.argv[plan.argv.index("--max-num-seqs") + 1] == "512"


def test_dtype_reaches_both_engines_and_is_left_to_them_when_unset():
    """`dtype` is the engines' own `--dtype` (the embedded default serves float32: this CPU class
    emulates bfloat16); unset, no flag, so the engine's default stands."""
    for cfg in ({"engine": "vllm", "model": "m"}, {"engine": "sglang", "model": "m", "sglang_version": "0.5.23"}):
        a = get_engine({**cfg, "dtype": "float32"}).launch_plan(port=1, max_batch=16).argv
        assert a[a.index("--dtype") + 1] == "float32"
        assert "--dtype" not in get_engine(cfg).launch_plan(port=1, max_batch=16).argv


def test_sglang_eagle3_argv_sets_running_cap():
    cfg = {"engine": "sglang", "model": "T", "tensor_parallel_size": 8, "sglang_version": "0.5.23",
           "speculative": {"method": "eagle3", "model": "D", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4,
                           "spec_v2": True}}
    plan = get_engine(cfg).launch_plan(port=30000, max_batch=256)
    a = plan.argv
    assert a[1:3] == ["-m", "sglang.launch_server"]
    assert a[a.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert a[a.index("--speculative-draft-model-path") + 1] == "D"
    assert [a[a.index(f) + 1] for f in ("--speculative-num-steps", "--speculative-eagle-topk",
                                        "--speculative-num-draft-tokens")] == ["3", "1", "4"]
    assert a[a.index("--max-running-requests") + 1] == "256" and a[a.index("--cuda-graph-max-bs-decode") + 1] == "256"
    assert a[a.index("--tensor-parallel-size") + 1] == "8"
    assert plan.env["SGLANG_ENABLE_SPEC_V2"] == "True"
    assert running_cap(1) == 64 and running_cap(65) == 128


@pytest.mark.parametrize("spec, msg", [
    ({"method": "eagle3", "model": "D", "num_steps": 3}, "all set, or none"),
    ({"method": "eagle3", "model": "D", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 3}, r"num_steps \+ 1 = 4"),
    ({"method": "eagle3", "model": "D", "num_steps": 3, "eagle_topk": 4, "num_draft_tokens": 8, "spec_v2": True},
     "requires eagle_topk 1"),
])
def test_sglang_rejects_inconsistent_spec(spec, msg):
    with pytest.raises(SpecmatchError, match=msg):
        get_engine({"engine": "sglang", "model": "T", "speculative": spec, "sglang_version": "0.5.23"}).launch_plan(1, 8)


def test_external_reads_key_from_env(monkeypatch):
    eng = get_engine({"engine": "external", "base_url": "http://h:1/", "api_key_env": "SM_KEY", "flavor": "sglang"})
    assert not eng.launches and eng.base_url() == "http://h:1"
    with pytest.raises(SpecmatchError, match="SM_KEY"):
        eng.api_key()
    monkeypatch.setenv("SM_KEY", "k")
    assert eng.api_key() == "k"
    assert eng.protocol("completions") == "sglang-generate"


def test_redact_argv():
    assert redact_argv(["x", "--api-key", "abc", "--hf-token=zzz"]) == ["x", "--api-key", "<redacted>",
                                                                        "--hf-token=<redacted>"]


def test_vllm_counters_from_recorded_metrics():
    text = (FIX / "vllm" / "metrics_ngram_cpu_0.32.0.prom").read_text()
    eng = get_engine({"engine": "vllm", "model": "m"})
    c = eng.counters(text)
    assert c["drafts"] == 2.0 and c["draft_tokens"] == 8.0 and c["accepted_tokens"] == 0.0
    assert sorted(c["accepted_per_pos"]) == [0, 1, 2, 3]
    after = {**c, "drafts": 12.0, "draft_tokens": 48.0, "accepted_tokens": 20.0,
             "accepted_per_pos": {0: 10.0, 1: 6.0, 2: 4.0, 3: 0.0}}
    cell = with_acceptance(eng.cell_acceptance(c, after, []))
    assert cell.acceptance_source.startswith("server counters")
    assert cell.spec_decode_num_drafts == 10 and cell.spec_decode_num_draft_tokens == 40
    assert cell.spec_decode_num_accepted_tokens == 20
    assert cell.spec_decode_acceptance_rate == pytest.approx(20 / 40)
    assert cell.spec_decode_acceptance_length == pytest.approx(1 + 20 / 10)
    assert cell.spec_decode_per_position_acceptance_rates == pytest.approx([1.0, 0.6, 0.4, 0.0])
    assert parse_prometheus('a{b="c"} 1.5\n# x\n')[("a", (("b", "c"),))] == 1.5


def test_vllm_per_request_metrics_from_recorded_stream():
    sse = (FIX / "vllm" / "stream_completions_ngram_cpu_0.32.0.sse").read_text()
    events = [json.loads(l[6:]) for l in sse.splitlines() if l.startswith("data: ") and l != "data: [DONE]"]
    final = events[-1]
    assert final["usage"]["completion_tokens"] == 24
    acc = get_engine({"engine": "vllm", "model": "m"}).parse_request_acceptance(final)
    assert acc == Acceptance(requests=1, num_spec_steps=2, num_draft_tokens=8, num_accepted_tokens=0, output_tokens=None,
                             acceptance_rate=0.0, acceptance_length=1.0)


def test_sglang_meta_info_recorded_examples():
    ex = json.loads((FIX / "sglang" / "meta_info_examples.json").read_text())
    old = parse_meta_info(ex["v1_verify_only"])
    assert old.acceptance_length == pytest.approx(256 / 101) and old.num_accepted_tokens is None
    assert old.num_spec_steps == 101 and old.output_tokens == 256
    new = parse_meta_info(ex["newer_build"])
    assert new.acceptance_length == pytest.approx(128 / 30)
    assert new.num_accepted_tokens == 98 and new.num_draft_tokens == 120
    assert new.acceptance_rate == pytest.approx(0.8167)
    recs = [record(old, 256), record(new, 128)]
    cell = with_acceptance(get_engine({"engine": "sglang", "model": "m"}).cell_acceptance({}, {}, recs))
    assert cell.spec_decode_acceptance_length == pytest.approx((256 + 128) / (101 + 30))
    assert cell.spec_decode_acceptance_rate is None  # the old build reports no draft counts
    assert parse_meta_info({"completion_tokens": 5}) is None


def record(acc: Acceptance, out: int, source="s", holdout=False) -> RequestRecord:
    """A request that reported `acc` (as client.RequestRun copies it)."""
    return RequestRecord(0, "p", source, holdout, output_tokens=out, ok=True, num_spec_steps=acc.num_spec_steps,
                         num_accepted_tokens=acc.num_accepted_tokens, num_draft_tokens=acc.num_draft_tokens,
                         acceptance_length=acc.acceptance_length, acceptance_rate=acc.acceptance_rate)


def with_acceptance(acc: CellAcceptance) -> CellResult:
    """A cell with the engine's acceptance reading set, as the cell step writes it (read back from its JSON)."""
    cell = cell_result()
    cell.set_acceptance(acc)
    return CellResult.from_json(cell.to_json())


def test_one_acceptance_definition_per_engine_for_cell_source_and_holdout():
    """The cell, every prompt source and the held-out rows use the engine's own definition (defect:
    SGLang rows carrying only verify steps and completion tokens read 1.00 per source)."""
    sg = get_engine({"engine": "sglang", "model": "m"})
    recs = [record(parse_meta_info({"spec_verify_ct": 101, "completion_tokens": 256}), 256, "code", True)]
    cell = with_acceptance(sg.cell_acceptance({}, {}, recs))
    by_src = summary.acceptance_by_group(sg, recs, lambda r: r.source)
    by_hold = summary.acceptance_by_group(sg, recs, lambda r: "held_out" if r.holdout else "seen")
    assert cell.spec_decode_acceptance_length == pytest.approx(2.53, abs=0.01)
    assert by_src["code"]["acceptance_length"] == pytest.approx(2.53, abs=0.01)
    assert by_hold["held_out"]["acceptance_length"] == pytest.approx(2.53, abs=0.01)


def test_vllm_without_metrics_endpoint_keeps_vllms_definition():
    """Defect: with /metrics unreadable the cell fell back to SGLang's formula on vLLM's per-request
    data: 64 tokens over 10 steps with 5 accepted gave 6.4 instead of 1.5."""
    v = get_engine({"engine": "vllm", "model": "m"})
    rec = record(Acceptance(1, 10, 40, 5, None, None, None), 64)
    cell = with_acceptance(v.cell_acceptance({}, {}, [rec]))
    assert cell.spec_decode_acceptance_length == pytest.approx(1.5)
    assert cell.spec_decode_acceptance_rate == pytest.approx(5 / 40)
    assert cell.spec_decode_per_position_acceptance_rates is None
    assert "per-request" in cell.acceptance_source and "1 + accepted / drafts" in cell.acceptance_source
    nothing = with_acceptance(v.cell_acceptance({}, {}, [RequestRecord(0, "p", "s", False, output_tokens=4, ok=True)]))
    assert nothing.acceptance_source is None and nothing.spec_decode_acceptance_length is None


def test_the_launch_batch_is_the_engine_adapters_rule():
    """The largest batch a server is launched for, one rule per engine (the workflow, the configured-off
    controls and the recommendation all ask the adapter)."""
    assert [ENGINES["vllm"].launch_max_batch(c) for c in (1, 256, 300)] == [256, 256, 300]
    assert [ENGINES["sglang"].launch_max_batch(c) for c in (1, 64, 65, 300)] == [64, 64, 128, 512]
    assert ENGINES["external"].launch_max_batch(300) == 0


def test_argv_items_and_env_values_are_rendered_as_written():
    assert [as_text(v) for v in ("2048", "0", "1e3", "0.10", 2048, 0, 0.9, 2048.0, 1e-05, 10**20)] == \
        ["2048", "0", "1e3", "0.10", "2048", "0", "0.9", "2048.0", "1e-05", "100000000000000000000"]
    for engine, extra in (("vllm", {}), ("sglang", {"sglang_version": "0.5.23"})):
        plan = get_engine({"engine": engine, "model": "m", "python": "/venv/bin/python", **extra,
                           "args": ["--max-num-batched-tokens", 2048, "--mem-fraction", 0.85, "--n", "2048"],
                           "env": {"CUDA_VISIBLE_DEVICES": 0, "SCI": "1e3"}}).launch_plan(port=1, max_batch=16)
        assert plan.argv[-6:] == ["--max-num-batched-tokens", "2048", "--mem-fraction", "0.85", "--n", "2048"]
        assert plan.env["CUDA_VISIBLE_DEVICES"] == "0" and plan.env["SCI"] == "1e3"


@pytest.mark.parametrize("value", [True, None, [1, 2], {"a": 1}])
def test_an_argv_item_without_one_spelling_is_refused(value):
    """`str()` made True "True" and None "None"; a process must never get a spelling nobody wrote."""
    with pytest.raises(SpecmatchError, match=r"args\[1\]"):
        get_engine({"engine": "vllm", "model": "m", "args": ["--flag", value]}).launch_plan(port=1, max_batch=16)
    with pytest.raises(SpecmatchError, match="env.X"):
        get_engine({"engine": "vllm", "model": "m", "env": {"X": value}}).launch_plan(port=1, max_batch=16)


def test_the_schema_names_exactly_the_registered_engines():
    """Adding an engine is its adapter and the registry: the config schema's list is the registry's, and
    the schema file keeps no list of its own to fall out of step."""
    import yaml

    from builders import REPO
    from specmatch.config import load_schema

    def engine(schema):
        servers = schema["properties"]["servers"]["additionalProperties"]
        if "$ref" in servers:
            servers = schema["$defs"][servers["$ref"].rsplit("/", 1)[-1]]
        return servers["properties"]["engine"]

    assert engine(load_schema())["enum"] == list(ENGINES)
    assert "enum" not in engine(yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text()))


def test_the_vllm_profile_follows_the_devices_not_slurms_variable(tmp_path, monkeypatch):
    """Inside a SLURM allocation that asked for GPUs, CUDA_VISIBLE_DEVICES is set whatever the node has:
    the profile follows the NVIDIA device files (unless the variable hides them all) or the config."""
    from specmatch.serving.engines import vllm

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert not vllm.cuda_visible(tmp_path)                        # set by SLURM, no device: the CPU build
    (tmp_path / "nvidia0").touch()
    assert vllm.cuda_visible(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not vllm.cuda_visible(tmp_path)                        # every GPU hidden
    monkeypatch.setattr(vllm, "cuda_visible", lambda dev=None: False)
    assert get_engine({"engine": "vllm", "model": "m"}).profile() == "cpu"
    assert get_engine({"engine": "vllm", "model": "m", "profile": "gpu"}).profile() == "gpu"
