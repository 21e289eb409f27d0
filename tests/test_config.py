import copy

import pytest
import yaml

from builders import KSWEEP_CONFIG, REPO, shipped_config
from specmatch.config import deep_merge, load, validate
from specmatch.files import SpecmatchError


def base():
    """The shipped config with an n-gram server of one k (builders.shipped_config): these tests edit `servers.ngram`."""
    return shipped_config(ngram=4)


def test_shipped_config_is_valid_and_gets_defaults():
    """The embedded default: a baseline and one EAGLE-3 server on held-out rows stratified by source
    and the encyclopedic control, two traffic profiles (one verified), steady-state cells at c=16."""
    cfg = load(REPO / "config.yaml")
    assert cfg["baseline"] == "baseline" and set(cfg["servers"]) == {"baseline", "eagle3"}
    assert cfg["servers"]["eagle3"]["host"] == "127.0.0.1" and cfg["servers"]["eagle3"]["startup_timeout_s"] == 1200
    assert cfg["servers"]["eagle3"]["speculative"]["num_speculative_tokens"] == 3
    suites = cfg["suites"]
    assert suites["train_holdout"]["holdout"] == "only" and suites["train_holdout"]["min_per_source"] >= 2
    assert suites["train_holdout"]["max_prompt_tokens"] + cfg["requests"]["max_tokens"] <= 2048   # served context
    assert "agent_sessions" not in suites   # resources/configs/cpu_sessions.yaml (time budget)
    assert suites["generic"]["kind"] == "file"
    assert [n for n, p in cfg["traffic"].items() if p.get("verify")] == ["generic_heavy", "long_context"] and len(cfg["traffic"]) >= 3
    assert "agent_sessions/sessions.jsonl" in cfg["dataset"]["holdout"]["files"]
    assert cfg["requests"]["request_rate"] is None and cfg["requests"]["min_requests_per_worker"] == 2
    assert cfg["requests"]["passes"] == 1 and cfg["repeats"]["min"] >= 2 and cfg["repeats"]["max"] >= cfg["repeats"]["min"]
    assert cfg["summary"]["min_effect"] == 0.05 and cfg["summary"]["verify_recommendation"] is True


def test_shipped_sessions_config_is_the_default_with_live_agent_sessions():
    cfg, default = load(REPO / "resources/configs/cpu_sessions.yaml"), load(REPO / "config.yaml")
    s = cfg["suites"]["agent_sessions"]
    assert s["kind"] == "session" and s["answers"] == "live" and s["size"] >= max(cfg["concurrency"])
    assert s["holdout"] == "only" and s["ignore_eos"] is False
    assert {k: v for k, v in cfg["suites"].items() if k != "agent_sessions"} == default["suites"]
    # and the cache arm, which needs a session suite (summary.controls.prefix_cache)
    assert cfg["summary"]["controls"] == {**default["summary"]["controls"], "prefix_cache": True}
    cfg["summary"]["controls"] = default["summary"]["controls"]
    assert {k: v for k, v in cfg.items() if k != "suites"} == {k: v for k, v in default.items() if k != "suites"}


def test_shipped_ksweep_config_is_the_k_sweep_with_the_in_sample_suite():
    cfg = load(REPO / KSWEEP_CONFIG)
    assert cfg["servers"]["eagle3@k=3"]["host"] == "127.0.0.1"   # the k sweep, expanded
    assert cfg["servers"]["eagle3@k=5"]["startup_timeout_s"] == 1200 and "eagle3" not in cfg["servers"]
    assert cfg["servers"]["eagle3@k=5"]["speculative"]["num_speculative_tokens"] == 5
    assert cfg["suites"]["train_mix"]["turn"] == "last" and cfg["suites"]["train_mix"]["holdout"] == "exclude"
    assert cfg["summary"]["recommend_suites"] == ["train_holdout", "train_mix"]


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["servers"]["ngram"]["speculative"].update(method="magic"), "servers.ngram.speculative.method"),
    (lambda c: c.update(concurrency=[0]), "concurrency.0"),
    (lambda c: c.update(baseline="nope"), "baseline: 'nope' is not a server"),
    (lambda c: c["servers"]["baseline"].update(speculative={"method": "ngram"}), "the baseline must not speculate"),
    (lambda c: c["servers"]["eagle3"]["speculative"].pop("model"), "servers.eagle3.speculative.model"),
    (lambda c: c["servers"]["eagle3"]["speculative"].update(num_speculative_tokens=[3, 0]),
     "servers.eagle3.speculative.num_speculative_tokens.1: 0 is less than the minimum of 1"),
    (lambda c: c["servers"].update(ext={"engine": "external"}), "servers.ext.base_url"),
    (lambda c: c["servers"].update(ext={"engine": "external", "base_url": "10.0.0.5:8000"}), "servers.ext.base_url"),
    (lambda c: c["servers"]["baseline"].update(max_batch=64), "servers.baseline.max_batch: only for engine external"),
    (lambda c: c["servers"].update(ext={"engine": "external", "base_url": "http://h:1", "max_batch": 0}),
     "servers.ext.max_batch: 0 is less than the minimum of 1"),
    (lambda c: c["suites"]["generic"].pop("path"), "suites.generic.path"),
    (lambda c: c["suites"]["generic"].update(length_like="generic"),
     "suites.generic.length_like: 'generic' is not a training suite (training suites: train_mix"),
    (lambda c: c.update(typo_key=1), "Additional properties are not allowed ('typo_key'"),
    (lambda c: c["requests"].update(temperature="hot"), "requests.temperature"),
    (lambda c: c["suites"]["generic"].update(size=4), "suites.generic.size: 4 prompts x 1 pass(es) cannot keep concurrency 16 busy"),
    (lambda c: c["summary"].update(recommend_metric="goodput"), "goodput needs summary.slo"),
    (lambda c: c["summary"].update(recommend_suites=["nope"]), "summary.recommend_suites: 'nope' is not a suite"),
    (lambda c: c["servers"].update(x__recommended={"engine": "vllm", "model": "m"}), "the workflow's own"),
    (lambda c: c.update(repeats=0), "repeats"),
    (lambda c: c["servers"]["ngram"].update(suites=["nope"]), "servers.ngram.suites: 'nope' is not a suite"),
    (lambda c: c["servers"]["ngram"].update(suites=["nope"], speculative={"method": "ngram",
                                                                          "num_speculative_tokens": [2, 4]}),
     "servers.ngram.suites: 'nope' is not a suite"),   # a sweep's error names the key the user wrote
    (lambda c: c["servers"]["baseline"].update(suites=["generic"]), "servers.baseline.suites: the baseline is compared"),
    (lambda c: c["servers"]["ngram"].update(suites=[]), "servers.ngram.suites"),
    (lambda c: c["suites"]["generic"].update(concurrency=[2]),
     "suites.generic.concurrency: [2] not in concurrency [1, 16] (a suite is measured at a part of the grid)"),
    (lambda c: c["suites"]["train_holdout"].update(concurrency=[16]),
     "suites.train_holdout.concurrency: train_holdout is a recommendation suite, measured at every concurrency"),
    (lambda c: c["suites"]["generic"].update(concurrency=[]), "suites.generic.concurrency"),
    (lambda c: c.update(step_cost={"concurrency": [4], "repeats": 3}),
     "step_cost.repeats: 3 sessions, but the design measures every cell in 2"),
    # a file suite a declared mix weighs, and the basis suite even with no mix declared (the training mix
    # is always predicted from it), keep the whole grid
    (lambda c: (c.update(traffic={"g": {"mix": {"training_mix": 0.6, "generic": 0.4}}}),
                c["suites"]["generic"].update(concurrency=[16])),
     "suites.generic.concurrency: generic is a stratum of the traffic mix `g`"),
    (lambda c: (c["summary"].update(recommend_suites=["generic"]), c["suites"]["train_mix"].update(concurrency=[16])),
     "suites.train_mix.concurrency: train_mix is the traffic basis suite"),
])
@pytest.mark.slow
def test_bad_config_names_the_key(mutate, message):
    cfg = copy.deepcopy(base())
    mutate(cfg)
    with pytest.raises(SpecmatchError) as e:
        validate(cfg, "my.yaml")
    assert message in str(e.value)
    assert "my.yaml" in str(e.value)


def test_a_suite_measured_at_part_of_the_grid_keeps_busy_only_there():
    """`suites.<name>.concurrency`: a 4-prompt control measured at c=1 only is valid (it never meets c=16);
    the suites are listed at their own concurrencies, the others at the whole grid."""
    from specmatch.config import suite_concurrency

    cfg = copy.deepcopy(base())
    cfg["suites"]["generic"].update(concurrency=[1], size=4)
    got = validate(cfg)
    assert suite_concurrency(got, "generic") == [1] and suite_concurrency(got, "train_holdout") == [1, 16]


def test_the_map_suite_is_the_one_the_stepcost_step_maps():
    """config.step_cost_suite falls back as the stepcost step does (the first recommendation suite: the
    configured ones, else the first training suite), not to the first suite listed."""
    from specmatch.config import step_cost_suite

    cfg = validate(copy.deepcopy(base()))
    cfg["summary"]["recommend_suites"] = []
    cfg["suites"] = {"generic": cfg["suites"]["generic"], **{k: v for k, v in cfg["suites"].items() if k != "generic"}}
    assert next(iter(cfg["suites"])) == "generic" and step_cost_suite(cfg) == "train_mix"


@pytest.mark.slow
def test_shipped_example_configs_validate_and_build():
    from specmatch.serving.engines import get_engine

    files = sorted((REPO / "resources" / "configs").glob("*.yaml"))
    assert files, "no example config found"
    planned = []
    for f in files:
        cfg = load(f)
        assert cfg["servers"], f.name
        for name, srv in cfg["servers"].items():
            if srv["engine"] == "sglang":
                srv = {**srv, "sglang_version": "0.5.23"}  # planned here, where SGLang is not installed
            plan = get_engine(srv).launch_plan(port=30000, max_batch=max(cfg["concurrency"]))
            assert plan.argv and plan.host == "127.0.0.1", (f.name, name)
            if srv["engine"] == "sglang":
                assert plan.argv[plan.argv.index("--max-running-requests") + 1] == "256"
            planned.append(srv["engine"])
    assert {"vllm", "sglang"} <= set(planned), planned   # both engines' examples were planned


# -- argv items and environment values reach the process exactly as written ----------------------
VERBATIM = """
args: [--max-num-batched-tokens, 2048, --max-num-seqs, "2048", --x, "1e3", --gpu-memory-utilization, 0.9,
       --y, 2048.0, --z, "007"]
env: {CUDA_VISIBLE_DEVICES: 0, QUOTED: "0", SCI: "1e3", FRACTION: 0.9, LIST: "0,1", ZERO_PADDED: "007"}
"""
ARGV_AS_WRITTEN = ["--max-num-batched-tokens", "2048", "--max-num-seqs", "2048", "--x", "1e3",
                   "--gpu-memory-utilization", "0.9", "--y", "2048.0", "--z", "007"]
ENV_AS_WRITTEN = {"CUDA_VISIBLE_DEVICES": "0", "QUOTED": "0", "SCI": "1e3", "FRACTION": "0.9", "LIST": "0,1",
                  "ZERO_PADDED": "007"}


def launched(cfg: dict, server: str):
    from specmatch.serving.engines import get_engine

    srv = {**cfg["servers"][server], "python": "/venv/bin/python"}
    if srv["engine"] == "sglang":
        srv["sglang_version"] = "0.5.23"
    return get_engine(srv).launch_plan(port=30000, max_batch=16)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_args_and_env_from_a_config_file_launch_as_written(tmp_path, engine):
    """`"2048"` launched vLLM with 2048.0 (refused), `"0"` set CUDA_VISIBLE_DEVICES=0.0 (no GPU)."""
    cfg = base()
    cfg["servers"]["ngram"].update(yaml.safe_load(VERBATIM), engine=engine)
    if engine == "sglang":
        cfg["servers"]["ngram"]["speculative"] = {"method": "ngram"}
    path = tmp_path / "my.yaml"
    path.write_text(yaml.safe_dump(cfg))
    loaded = load(path)
    srv = loaded["servers"]["ngram"]
    assert srv["args"][1] == 2048 and srv["args"][3] == "2048" and srv["args"][5] == "1e3"  # types kept
    assert srv["env"]["QUOTED"] == "0" and srv["env"]["CUDA_VISIBLE_DEVICES"] == 0
    plan = launched(loaded, "ngram")
    assert plan.argv[-len(ARGV_AS_WRITTEN):] == ARGV_AS_WRITTEN
    assert {k: plan.env[k] for k in ENV_AS_WRITTEN} == ENV_AS_WRITTEN


@pytest.mark.slow
def test_args_and_env_from_snakemake_config_overrides_launch_as_written():
    """`snakemake --config` hands nested values over as text (YAML BaseLoader): text stays text."""
    from snakemake.cli import parse_config

    over = parse_config(["servers={ngram: {args: [--max-num-batched-tokens, 2048, --x, 1e3, --y, '0.9'], "
                         "env: {CUDA_VISIBLE_DEVICES: 0, SCI: 1e3}, port: 8000, startup_timeout_s: '60'}}"])
    assert over["servers"]["ngram"]["args"][1] == "2048"  # what Snakemake gives us
    cfg = validate(deep_merge(base(), over))
    srv = cfg["servers"]["ngram"]
    assert srv["port"] == 8000 and srv["startup_timeout_s"] == 60.0  # typed keys are still coerced
    plan = launched(cfg, "ngram")
    assert plan.argv[-6:] == ["--max-num-batched-tokens", "2048", "--x", "1e3", "--y", "0.9"]
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0" and plan.env["SCI"] == "1e3"


def test_every_string_or_number_field_keeps_text_as_written():
    """The audit: every schema field that accepts text or a number (today argv items and env values)
    keeps text as it is, whatever it looks like."""
    from specmatch.config import _coerce, load_schema

    schema = load_schema()
    found = []

    def walk(node, where):
        if isinstance(node, dict):
            types = node.get("type")
            if isinstance(types, list) and "string" in types and len(types) > 1:
                found.append(where)
                for text in ("2048", "0", "1e3", "0.9", "true", "null", " 7 "):
                    assert _coerce(node, text, schema) == text, (where, text)
            for k, v in node.items():
                walk(v, f"{where}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}[{i}]")

    walk(schema, "schema")
    assert any(".args." in w for w in found) and any(".env." in w for w in found), found
