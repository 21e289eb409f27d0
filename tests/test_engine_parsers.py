"""Every launch argv the adapters build, checked by the engines' own code, without a GPU.

SGLang: its pinned releases' server-side code (scripts/setup-parsers.sh): 0.5.23's own argument
parser and validation (ServerArgs.from_cli_args) run on each argv; 0.5.10 is checked by its source
(the flags the adapter emits for it, and the meta_info keys it emits). vLLM: the CPU build shares
the GPU build's argument parser, EngineArgs and speculative-config validation, so every GPU argv
goes through them, and batch-size schedules through vLLM's own schedule validation.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from builders import REPO, vllm_check, vllm_installed
from specmatch.serving.engines import get_engine
from specmatch.serving.engines.sglang import ACCEPTED_KEYS, HISTOGRAM_KEYS, PROPOSED_KEYS
from specmatch.files import SpecmatchError

PARSERS = REPO / ".parsers"
SG_NEW, SG_OLD = PARSERS / "sglang-0.5.23", PARSERS / "sglang-0.5.10"


def sglang_run(argvs: list[list[str]]) -> dict:
    """SGLang's own parser and validation on `argvs`, in one process of the pinned release:
    {"results": one per argv, "options": its parser's option strings}."""
    if not (SG_NEW / ".done").exists():
        pytest.skip("the pinned SGLang release is not installed (scripts/test.sh runs scripts/setup-parsers.sh)")
    env = {"PYTHONPATH": str(SG_NEW), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, str(REPO / "tests" / "engines" / "sglang_check.py")],
                       input=json.dumps(argvs), capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def sglang_plan(spec=None, version="0.5.23", **kw):
    cfg = {"engine": "sglang", "model": "/models/target", "sglang_version": version, **kw}
    if spec:
        cfg["speculative"] = spec
    return get_engine(cfg).launch_plan(port=30000, max_batch=256)


EAGLE3 = {"method": "eagle3", "model": "/models/drafter", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
SGLANG_CASES = {
    "baseline": (None, {}),
    "eagle3 topk 1": (EAGLE3, {}),
    "eagle3 topk 4": ({**EAGLE3, "eagle_topk": 4, "num_draft_tokens": 8}, {}),
    "eagle3 spec v2": ({**EAGLE3, "spec_v2": True}, {}),
    "eagle": ({**EAGLE3, "method": "eagle"}, {}),
    "standalone": ({"method": "standalone", "model": "/models/small", "num_steps": 3, "eagle_topk": 1,
                    "num_draft_tokens": 4}, {}),
    "ngram": ({"method": "ngram"}, {}),
    "tensor parallel": (EAGLE3, {"tensor_parallel_size": 8}),
    "float32": (EAGLE3, {"dtype": "float32"}),
    "max running requests": (EAGLE3, {"max_running_requests": 512}),
    "adaptive": ({**EAGLE3, "adaptive": True}, {}),
    "adaptive with its config": ({**EAGLE3, "adaptive": "/configs/adaptive.json"}, {}),
}


def deployment_plans() -> list:
    """The launch plans of the original deployment config (resources/configs/sglang_eagle3_8gpu.yaml)."""
    from specmatch.config import validate

    cfg = validate(yaml.safe_load((REPO / "resources" / "configs" / "sglang_eagle3_8gpu.yaml").read_text()))
    return [get_engine({**srv, "sglang_version": "0.5.23"}).launch_plan(30000, 256) for srv in cfg["servers"].values()]


@pytest.fixture(scope="module")
def sglang():
    """Every argv the SGLang tests check, through SGLang 0.5.23's own code in one process (importing it
    takes seconds): {"plans", "results"} by case name (SGLANG_CASES, "old flag", "deployment <i>"), and
    the parser's "options"."""
    plans = {name: sglang_plan(spec, **kw) for name, (spec, kw) in SGLANG_CASES.items()}
    plans["old flag"] = sglang_plan(EAGLE3, version="0.5.10")  # what the adapter used to emit for every release
    plans.update({f"deployment {i}": p for i, p in enumerate(deployment_plans())})
    out = sglang_run([p.argv[3:] for p in plans.values()])
    assert len(out["results"]) == len(plans)  # one parse per launch, none dropped
    return {"plans": plans, "results": dict(zip(plans, out["results"])), "options": out["options"]}


@pytest.mark.slow  # the engine's own code in a subprocess: several seconds (once for the module)
def test_every_sglang_argv_parses_and_validates_with_sglang_itself(sglang):
    plans = {name: sglang["plans"][name] for name in SGLANG_CASES}
    results = {name: sglang["results"][name] for name in SGLANG_CASES}
    for name, res in results.items():
        assert "error" not in res, (name, res)
        assert res["validation"] == "ok", (name, res["validation"])
        parsed = res["parsed"]
        assert parsed["model_path"] == "/models/target" and parsed["cuda_graph_max_bs_decode"] >= 256
        assert parsed["max_running_requests"] >= 256
    assert results["eagle3 topk 1"]["parsed"]["speculative_algorithm"] == "EAGLE3"
    assert results["float32"]["parsed"]["dtype"] == "float32" and results["baseline"]["parsed"]["dtype"] == "auto"
    assert results["eagle3 topk 4"]["parsed"]["speculative_eagle_topk"] == 4
    assert results["standalone"]["parsed"]["speculative_algorithm"] == "STANDALONE"
    assert results["ngram"]["parsed"]["speculative_algorithm"] == "NGRAM"
    assert results["tensor parallel"]["parsed"]["tp_size"] == 8
    assert results["max running requests"]["parsed"]["max_running_requests"] == 512
    assert results["adaptive"]["parsed"]["speculative_adaptive"] is True
    assert results["adaptive with its config"]["parsed"]["speculative_adaptive_config"] == "/configs/adaptive.json"
    assert plans["eagle3 spec v2"].env["SGLANG_ENABLE_SPEC_V2"] == "True"


@pytest.mark.slow  # the engine's own code in a subprocess (the module's one)
def test_the_old_flag_is_ambiguous_to_current_sglang(sglang):
    """What the adapter used to emit for every release: SGLang 0.5.23 refuses it, so a speculative
    server launched by specmatch would not have started."""
    assert "--cuda-graph-max-bs" in sglang["plans"]["old flag"].argv[3:]
    res = sglang["results"]["old flag"]
    assert "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode" in res["error"]


def test_older_release_gets_the_flags_its_source_defines():
    if not (SG_OLD / ".done").exists():
        pytest.skip("the older pinned SGLang release is not installed (scripts/setup-parsers.sh)")
    source = (SG_OLD / "sglang" / "srt" / "server_args.py").read_text()
    for spec, kw in SGLANG_CASES.values():
        if spec and spec.get("adaptive"):
            with pytest.raises(SpecmatchError, match="has no --speculative-adaptive"):
                sglang_plan(spec, version="0.5.10", **kw)
            continue
        for arg in sglang_plan(spec, version="0.5.10", **kw).argv[3:]:
            if arg.startswith("--"):
                assert f'"{arg}"' in source, arg


@pytest.mark.slow  # the engine's own code in a subprocess (the module's one)
def test_the_original_deployment_config_launches_on_sglang(sglang):
    results = [res for name, res in sglang["results"].items() if name.startswith("deployment ")]
    assert len(results) >= 2  # the baseline and at least one speculative server
    for res in results:
        assert "error" not in res and res["validation"] == "ok", res
        assert res["parsed"]["tp_size"] == 8


def test_unsupported_or_missing_sglang_is_a_clear_error_before_anything_starts(tmp_path):
    with pytest.raises(SpecmatchError, match="older than specmatch supports"):
        sglang_plan(EAGLE3, version="0.4.9")
    with pytest.raises(SpecmatchError, match="adapts only with eagle_topk 1"):
        sglang_plan({**EAGLE3, "eagle_topk": 4, "num_draft_tokens": 8, "adaptive": True})
    with pytest.raises(SpecmatchError, match="sglang is not installed in"):
        get_engine({"engine": "sglang", "model": "m", "python": sys.executable}).launch_plan(1, 8)


def _meta_keys(source: str) -> set[str]:
    import re

    return set(re.findall(r'meta_info\["(spec_[a-z_]+)"\]', source))


@pytest.mark.parametrize("release", ["0.5.23", "0.5.10"])
def test_meta_info_keys_we_read_are_the_ones_sglang_emits(release):
    """A renamed acceptance key must fail here rather than silently give acceptance 1.0."""
    d = PARSERS / f"sglang-{release}"
    if not (d / ".done").exists():
        pytest.skip("pinned SGLang release not installed (scripts/setup-parsers.sh)")
    emitted = _meta_keys((d / "sglang" / "srt" / "managers" / "tokenizer_manager.py").read_text())
    assert "spec_verify_ct" in emitted
    counts = {"spec_verify_ct", *ACCEPTED_KEYS, *PROPOSED_KEYS, *HISTOGRAM_KEYS, "spec_accept_length",
              "spec_accept_rate"}
    import re

    family = re.compile(r"spec_(verify_ct|accept|num_correct|num_proposed|accepted|draft_token|correct_drafts)")
    unknown = {k for k in emitted if family.match(k) and k not in counts}
    assert not unknown, f"SGLang {release} emits acceptance counts specmatch does not read: {unknown}"
    if release == "0.5.23":
        assert {"spec_num_correct_drafts", "spec_num_proposed_drafts"} <= emitted


# -- vLLM: the GPU profile through vLLM's own parser and validation ------------------------------
def vllm_plan(cfg, max_batch=256):
    return get_engine({"engine": "vllm", "profile": "gpu", **cfg}).launch_plan(30000, max_batch)


# only the tests that run vLLM's own code skip without it (a module-level importorskip skipped the
# SGLang tests above too, silently, on a machine without vLLM)
needs_vllm = pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed (scripts/setup.sh installs it)")


@needs_vllm
@pytest.mark.slow  # vLLM's engine-config validation of every argv: half a minute
def test_every_vllm_gpu_argv_passes_vllms_own_checks(tiny_target, tmp_path, tok):
    from specmatch.training.drafter import Budget, checkpoint_config

    head = tmp_path / "eagle3"
    head.mkdir()
    cfg = json.loads((tiny_target / "config.json").read_text())
    (head / "config.json").write_text(json.dumps(checkpoint_config(cfg, Budget(draft_vocab=64), [1, 2, 3])))
    t = str(tiny_target)
    cases = {
        "tensor parallel": ({"model": t, "tensor_parallel_size": 8}, None),
        "float32": ({"model": t, "dtype": "float32"}, None),
        "eagle3 with a drafter": ({"model": t, "speculative": {"method": "eagle3", "model": str(head),
                                                               "num_speculative_tokens": 3}}, "eagle3"),
        "draft model": ({"model": t, "speculative": {"method": "draft_model", "model": t,
                                                     "num_speculative_tokens": 3}}, "draft_model"),
        "ngram schedule": ({"model": t, "speculative": {"method": "ngram", "num_speculative_tokens": 4,
                                                        "prompt_lookup_max": 4, "num_speculative_tokens_per_batch_size":
                                                        [[1, 4, 4], [5, 256, 0]]}}, "ngram"),
    }
    for name, (cfg_, method) in cases.items():
        plan = vllm_plan(cfg_, 512)
        args, spec, _ = vllm_check(plan.argv[3:])
        assert args.max_num_seqs == 512 and "-O0" not in plan.argv, name
        if name == "tensor parallel":
            assert args.tensor_parallel_size == 8
        assert args.dtype == ("float32" if name == "float32" else "auto"), name
        if method:
            assert spec.method == method and spec.num_speculative_tokens in (3, 4), name
    bad = vllm_plan({"model": t, "speculative": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                                                 "num_speculative_tokens_per_batch_size": [[2, 4, 4]]}})
    with pytest.raises(ValueError, match="must start at 1"):
        vllm_check(bad.argv[3:])


@needs_vllm
@pytest.mark.slow  # vLLM's own parser and validation, on the tiny target
def test_the_vllm_gpu_example_config_passes_vllms_own_checks(tiny_target):
    from specmatch.config import validate

    cfg = validate(yaml.safe_load((REPO / "resources" / "configs" / "vllm_gpu_eagle3.yaml").read_text()))
    for name, srv in cfg["servers"].items():
        plan = get_engine(srv).launch_plan(30000, max(cfg["concurrency"]))
        argv = plan.argv[3:]
        argv[argv.index("--model") + 1] = str(tiny_target)  # the example's paths are on the user's cluster
        spec = srv.get("speculative")
        if spec and spec["method"] == "eagle3":
            sc = json.loads(argv[argv.index("--speculative-config") + 1])
            sc["method"], sc["model"] = "ngram", None  # the drafter is the user's; its schedule and k are ours
            sc = {k: v for k, v in sc.items() if v is not None} | {"prompt_lookup_max": 4}
            argv[argv.index("--speculative-config") + 1] = json.dumps(sc)
        args, _, _ = vllm_check(argv)
        assert args.tensor_parallel_size == 8, name


@needs_vllm
@pytest.mark.slow  # the engine's own code in a subprocess: several seconds
def test_a_renamed_schedule_key_is_refused_clearly(tmp_path):
    """An open vLLM proposal renames the schedule key (speculative_token_schedule): the adapter says
    which key this vLLM reads instead of launching a server that ignores it. (Both configs are checked
    against one reading of vLLM's fields, kept in a state folder as before launches.)"""
    eng = get_engine({"engine": "vllm", "model": "m", "speculative": {
        "method": "ngram", "num_speculative_tokens": 4, "speculative_token_schedule": [[1, 4, 4]]}})
    with pytest.raises(SpecmatchError, match="speculative.speculative_token_schedule: vLLM .* its batch-size schedule "
                                             "is num_speculative_tokens_per_batch_size"):
        eng.validate(tmp_path)
    get_engine({"engine": "vllm", "model": "m", "speculative": {
        "method": "ngram", "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 4, 4]]}}
               ).validate(tmp_path)


def test_vllms_speculative_fields_are_read_once_per_vllm(tmp_path, monkeypatch):
    """validate() imports vLLM in the server's python (about 10 s) before every launch; with the server
    state folder the answer is kept, keyed by the interpreter and vLLM's own speculative config module,
    so a change of that module (an upgrade) reads it again."""
    from specmatch.serving.engines import vllm as vllm_engine

    env = tmp_path / "venv"
    module = env / "lib" / "python3.11" / "site-packages" / "vllm" / "config" / "speculative.py"
    module.parent.mkdir(parents=True)
    module.write_text("class SpeculativeConfig: ...\n")
    python = str(env / "bin" / "python")
    reads = []

    def read(py):
        reads.append(py)
        return "0.32.0", frozenset({"method", "num_speculative_tokens"}), ""

    monkeypatch.setattr(vllm_engine, "_read_speculative_fields", read)
    state = tmp_path / "state"
    first = vllm_engine.speculative_fields(python, state)
    assert first == ("0.32.0", frozenset({"method", "num_speculative_tokens"}), "")
    assert vllm_engine.speculative_fields(python, state) == first and len(reads) == 1
    module.write_text("class SpeculativeConfig: ...  # upgraded\n")
    vllm_engine.speculative_fields(python, state)
    assert len(reads) == 2
    vllm_engine.speculative_fields(python, None)            # no state folder: nothing kept
    vllm_engine.speculative_fields(str(tmp_path / "elsewhere" / "python"), state)   # no venv layout
    assert len(reads) == 4


@needs_vllm
@pytest.mark.slow  # vLLM's own parser and SpeculativeConfig on the tiny target
def test_forced_acceptance_keys_are_vllms_own(tiny_target, tmp_path):
    """The keys a step-cost map at fixed acceptance would set (Engine.forced_acceptance) are read by vLLM's
    own SpeculativeConfig: synthetic rejection sampling at that mean acceptance length, per-position rates
    resolved from it. The CPU build refuses synthetic sampling at the first request: the refusal is in its
    own source, and the CPU profile offers no keys."""
    from specmatch.training.drafter import Budget, checkpoint_config
    import vllm

    head = tmp_path / "eagle3"
    head.mkdir()
    cfg = json.loads((tiny_target / "config.json").read_text())
    (head / "config.json").write_text(json.dumps(checkpoint_config(cfg, Budget(draft_vocab=64), [1, 2, 3])))
    keys, _ = get_engine({"engine": "vllm", "model": "/m", "profile": "gpu"}).forced_acceptance(2.5)
    plan = vllm_plan({"model": str(tiny_target), "speculative": {"method": "eagle3", "model": str(head),
                                                                 "num_speculative_tokens": 3, **keys}})
    _, spec, _ = vllm_check(plan.argv[3:])
    # vLLM consolidates the length into per-position rates whose sum is the accepted tokens a step
    assert spec.rejection_sample_method == "synthetic" and len(spec.synthetic_acceptance_rates) == 3
    assert 1 + sum(spec.synthetic_acceptance_rates) == pytest.approx(2.5)
    cpu_src = (Path(vllm.__file__).parent / "utils" / "cpu_triton_utils.py").read_text()
    assert "Synthetic acceptance not supported with CPU sampling" in cpu_src
    assert get_engine({"engine": "vllm", "model": "/m", "profile": "cpu"}).forced_acceptance()[0] is None


@pytest.mark.parametrize("release", ["sglang-0.5.23"])
def test_forced_acceptance_environment_is_sglangs_own(release):
    """SGLang's simulated acceptance: the variables its environment declares and the token mode its
    speculative code accepts (read from the pinned release's source)."""
    root = PARSERS / release
    if not (root / ".done").exists():
        pytest.skip("pinned SGLang release not installed (scripts/setup-parsers.sh)")
    env = get_engine({"engine": "sglang", "model": "/m"}).forced_acceptance(2.0)[0]["env"]
    environ = (root / "sglang" / "srt" / "environ.py").read_text()
    utils = (root / "sglang" / "srt" / "speculative" / "spec_utils.py").read_text()
    for name in env:
        assert f"    {name} = Env" in environ, name
    assert '"real-draft-token"' in utils and env["SGLANG_SIMULATE_ACC_TOKEN_MODE"] == "real-draft-token"


@needs_vllm
@pytest.mark.slow  # vLLM's engine-config validation: seconds per argv
def test_the_cache_arm_turns_vllms_block_drop_off_and_nothing_else(tiny_target, tmp_path, tok):
    """vLLM's own SpeculativeConfig from the arm's argv: the block drop off (use_eagle_block_drop False)
    with the drafter still on (use_eagle True, the same method and k); the original keeps it on. For
    every method vLLM names (its SpeculativeMethod literal), the adapter offers the arm exactly where
    vLLM would drop a block (use_eagle_block_drop of that method; a model's MTP type is read as mtp)."""
    import typing

    from specmatch.training.drafter import Budget, checkpoint_config
    from vllm.config import speculative as vspec

    head = tmp_path / "eagle3"
    head.mkdir()
    cfg = json.loads((tiny_target / "config.json").read_text())
    (head / "config.json").write_text(json.dumps(checkpoint_config(cfg, Budget(draft_vocab=64), [1, 2, 3])))
    server = {"engine": "vllm", "model": str(tiny_target),
              "speculative": {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3}}
    arm, why = get_engine(server).prefix_cache_kept()
    assert why is None
    _, original, _ = vllm_check(vllm_plan({"model": server["model"], "speculative": server["speculative"]}).argv[3:])
    _, kept, _ = vllm_check(vllm_plan({"model": server["model"], "speculative": arm}).argv[3:])
    assert original.use_eagle_block_drop() and not kept.use_eagle_block_drop()
    assert kept.use_eagle() and (kept.method, kept.num_speculative_tokens) == (original.method, 3)

    def names(t) -> set:
        args = typing.get_args(t)
        return {t} if not args else set().union(*(names(a) for a in args))

    for method in sorted(names(vspec.SpeculativeMethod)):
        probe = object.__new__(vspec.SpeculativeConfig)
        probe.method, probe.disable_eagle_block_drop = ("mtp" if method.endswith("_mtp") else method), False
        offered = get_engine({**server, "speculative": {"method": method}}).prefix_cache_kept()[0] is not None
        assert offered == probe.use_eagle_block_drop(), method


@pytest.mark.slow  # the engine's own code in a subprocess (the module's one)
def test_sglang_has_no_server_argument_that_keeps_eagles_cache_loss_off(sglang):
    """The SGLang adapter says there is no opt-out: none of the pinned release's own server arguments
    names both speculation (or EAGLE) and the cache, besides the draft model's own KV settings."""
    flags = sglang["options"]
    assert "--disable-radix-cache" in flags and "--speculative-algorithm" in flags   # the parser was read
    both = [f for f in flags if ("spec" in f or "eagle" in f) and ("cache" in f or "radix" in f or "drop" in f)
            and f not in ("--speculative-draft-kv-cache-dtype",)]
    assert both == []
    assert get_engine({"engine": "sglang", "model": "m", "sglang_version": "0.5.23",
                       "speculative": {"method": "EAGLE3", "model": "d"}}).prefix_cache_kept()[0] is None


@pytest.mark.slow
def test_the_cache_salt_is_a_field_of_each_engines_own_requests():
    """The field a session suite's later passes are salted with (Engine.cache_salt_field) is one the
    engine's own request models declare and carry to the prefix cache: vLLM's chat and completion
    requests (installed) and its block hashing; SGLang's OpenAI requests and its radix cache's key (the
    pinned release's source)."""
    import vllm
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    field = get_engine({"engine": "vllm", "model": "m"}).cache_salt_field()[0]
    for req in (ChatCompletionRequest, CompletionRequest):
        assert field in req.model_fields, req.__name__
    # the value each pass sends passes vLLM's own validation (no '@', '/', '\\', NUL; at most 128 characters)
    from specmatch.measuring.sessions import pass_salt

    body = {"model": "m", "max_tokens": 4, field: pass_salt(12)}
    assert getattr(ChatCompletionRequest(**body, messages=[{"role": "user", "content": "x"}]), field) == pass_salt(12)
    assert getattr(CompletionRequest(**body, prompt="x"), field) == pass_salt(12)
    hashing = (Path(vllm.__file__).parent / "v1" / "core" / "kv_cache_utils.py").read_text()
    assert f"request.{field}" in hashing
    if not (SG_NEW / ".done").exists():
        pytest.skip("the pinned SGLang release is not installed (scripts/test.sh runs scripts/setup-parsers.sh)")
    field = get_engine({"engine": "sglang", "model": "m"}).cache_salt_field()[0]
    protocol = (SG_NEW / "sglang" / "srt" / "entrypoints" / "openai" / "protocol.py").read_text()
    radix = (SG_NEW / "sglang" / "srt" / "mem_cache" / "radix_cache.py").read_text()
    assert protocol.count(f"    {field}: Optional[") >= 2 and f'"{field}"' in radix
