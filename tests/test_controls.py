"""The controls that explain a speedup: configured-off servers (`<server>__off`) derived from the config,
and control suites whose prompts are as long as the training mix's (`length_like`)."""
import copy
import json

import pytest
import yaml

from builders import KSWEEP_CONFIG, copy_workflow, job_counts, run, shipped_config, snakemake_cmd
from specmatch.config import recommendation_suites, validate
from specmatch.controls import CACHE, OFF, cache_arm_plan, control_plan, with_controls
from specmatch.files import SpecmatchError
from specmatch.data.prompts import LIST_HEAD, file_suite
from specmatch.records import Prompt
from specmatch.data.rows import ChatTemplate


def default():
    """The shipped config (its eagle3 k sweep) with an n-gram server of one k beside it."""
    return validate(shipped_config(ngram=4))


def test_the_default_controls_every_speculative_server_on_the_recommendation_suite():
    # the default measures none (its time budget); switched on, every speculative server gets one
    assert not [n for n in with_controls(default())["servers"] if n.endswith(OFF)]
    raw = default()
    raw["summary"]["controls"] = {"configured_off": True, "servers": ["ngram"]}
    assert {n for n in with_controls(copy.deepcopy(raw))["servers"] if n.endswith(OFF)} == {"ngram__off"}
    raw["summary"]["controls"]["servers"] = None
    cfg = with_controls(raw)
    offs = {n: s for n, s in cfg["servers"].items() if n.endswith(OFF)}
    assert set(offs) == {"ngram__off", "eagle3@k=5__off"}   # the eagle3 sweep's control: its largest k
    for name, srv in offs.items():
        parent = cfg["servers"][name[: -len(OFF)]]
        # the parent's configuration exactly, drafting nothing at every batch size up to the launch's cap
        assert srv["speculative"] == {**parent["speculative"], "num_speculative_tokens_per_batch_size": [[1, 256, 0]]}
        assert {k: v for k, v in srv.items() if k not in ("speculative", "suites")} == \
            {k: v for k, v in parent.items() if k not in ("speculative", "suites")}
        # the recommendation suites the parent is measured on
        assert srv["suites"] == (["train_holdout"] if name == "ngram__off" else ["train_holdout", "train_mix"])
    assert "ngram_off_above_4" not in cfg["servers"]  # the hand-written control it replaces


def test_controls_follow_the_config():
    cfg = default()
    cfg["summary"]["controls"] = {"configured_off": True, "servers": ["eagle3@k=5"], "suites": ["generic"]}
    cfg["concurrency"] = [1, 512]
    cfg["suites"]["generic"]["size"] = 512
    extra, why = control_plan(cfg)
    assert list(extra) == ["eagle3@k=5__off"] and extra["eagle3@k=5__off"]["suites"] == ["generic"]
    assert extra["eagle3@k=5__off"]["speculative"]["num_speculative_tokens_per_batch_size"] == [[1, 512, 0]]
    cfg["summary"]["controls"] = {"configured_off": False}
    assert with_controls(cfg)["servers"].keys() == cfg["servers"].keys()
    # a server restricted to other suites gets no control there, and says why
    cfg["summary"]["controls"] = {"configured_off": True, "suites": ["train_mix"]}
    cfg["servers"]["ngram"]["suites"] = ["generic"]
    extra, why = control_plan(cfg)
    assert "ngram__off" not in extra and "train_mix" in why["ngram"]


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["servers"].update(x__off={"engine": "vllm", "model": "m"}), "names ending in __off"),
    (lambda c: c["summary"]["controls"].update(servers=["nope"]), "summary.controls.servers: 'nope'"),
    (lambda c: c["summary"]["controls"].update(servers=["baseline"]), "is the baseline"),
    (lambda c: c["summary"]["controls"].update(suites=["nope"]), "summary.controls.suites: 'nope'"),
])
@pytest.mark.slow
def test_bad_controls_name_the_key(mutate, message):
    cfg = copy.deepcopy(default())
    cfg["summary"]["controls"]["configured_off"] = True
    mutate(cfg)
    with pytest.raises(SpecmatchError, match=message):
        with_controls(cfg)


def test_sglang_and_external_servers_cannot_express_the_control():
    cfg = copy.deepcopy(default())
    cfg["servers"]["sg"] = {"engine": "sglang", "model": "m", "speculative": {"method": "eagle3", "model": "d"}}
    cfg["summary"]["controls"] = {"configured_off": True}  # every speculative server
    extra, why = control_plan(cfg)
    assert "sg__off" not in extra and "SGLang" in why["sg"]


def test_recommendation_suites_without_a_training_suite_stand_on_the_first_suite():
    cfg = default()
    assert recommendation_suites(cfg) == ["train_holdout", "train_mix"]
    cfg["summary"]["recommend_suites"] = None
    assert recommendation_suites(cfg) == ["train_mix"]
    cfg["suites"] = {k: v for k, v in cfg["suites"].items() if v["kind"] == "file"}
    assert recommendation_suites(cfg) == ["generic"]


@pytest.mark.slow
def test_the_default_workflow_measures_the_controls_and_the_long_control(tmp_path):
    """A dry run of the shipped default with every speculative server controlled and the long
    encyclopedic control added back (the default leaves both out for its time budget): the controls
    are launched and measured on the recommendation suite only, the long encyclopedic control is built
    from train_holdout's prompts, and the old hand-written schedule server is gone."""
    wd = copy_workflow(tmp_path)
    cfg = yaml.safe_load((wd / KSWEEP_CONFIG).read_text())
    cfg["summary"]["controls"] = {"configured_off": True}
    cfg["suites"]["generic_long"] = {"kind": "file", "path": "resources/prompts/generic.jsonl", "size": 16,
                                     "seed": 0, "length_like": "train_holdout"}
    (wd / "full.yaml").write_text(yaml.safe_dump(cfg))
    out = run(snakemake_cmd() + ["-n", "--cores", "2", "--configfile", "full.yaml"], wd).stdout
    counts = job_counts(out)
    assert counts["launch"] == 8 and counts["prompts"] == 4
    # baseline 4 suites, the eagle3 sweep's two members 4 each, its control (of its largest k) on the two
    # recommendation suites; x 2 concurrencies x 2 repeats (the sequential design's minimum; the round
    # after them adds a third repeat where verdicts stay open)
    assert counts["cell"] == (4 + 4 + 4 + 2) * 2 * 2 and counts["sequential_round"] == 1
    assert "results/cells/eagle3@k=5__off/train_holdout/r2/c16.json" in out
    assert "results/cells/eagle3@k=5__off/train_mix/r1/c1.json" in out and "eagle3@k=3__off" not in out
    assert "results/cells/eagle3@k=3/generic/r2/c16.json" in out
    assert "results/cells/eagle3@k=5__off/generic/" not in out and "ngram_off_above_4" not in out
    assert "--like results/prompts/train_holdout.jsonl" in out
    # the round plans the k sweep's undecided choices on the suites its k is decided on
    assert "--suites train_holdout train_mix --out results/rounds/r2.json" in out


@pytest.mark.slow
def test_length_like_composes_control_prompts_as_long_as_the_training_suites(tmp_path, tok):
    tpl = ChatTemplate.of(tok)
    qs = tmp_path / "q.jsonl"
    qs.write_text("".join(json.dumps({"id": f"q{i}", "category": "history",
                                      "prompt": f"What happened in the year {1000 + i} in Europe and in Asia?"}) + "\n"
                          for i in range(40)))
    like = [Prompt(f"t-{i}", "train", "code", "f", i, None, f"r{i}", 0, 1, "x", None, n, 10, True)
            for i, n in enumerate([40, 120, 300, 5000])]
    prompts, match = file_suite("long", {"path": str(qs), "size": 6, "seed": 0, "length_like": "train"}, tpl, None,
                                like)
    assert len(prompts) == 6
    for p, target in zip(prompts, [40, 120, 300, 5000, 40, 120]):
        assert p.prompt_tokens == len(tpl.tok(p.text, add_special_tokens=False)["input_ids"])
        content = p.messages[0]["content"]
        assert content.startswith(LIST_HEAD) and p.text == tpl.render(p.messages)
        if target <= 300:  # as long as the target, within one question's length
            assert target <= p.prompt_tokens < target + 30 or content.count("\n") == 2
    assert prompts[3].prompt_tokens < 5000  # the file runs out of questions: counted, never hidden
    assert match.length_match["shorter_than_target"] == 1 and match.shortfall
    assert match.length_like == "train" and match.kind == "file" and not match.training
    again, _ = file_suite("long", {"path": str(qs), "size": 6, "seed": 0, "length_like": "train"}, tpl, None, like)
    assert [p.text for p in again] == [p.text for p in prompts]  # seeded
    with pytest.raises(SpecmatchError, match="no prompts"):
        file_suite("long", {"path": str(qs), "size": 6, "length_like": "train"}, tpl, None, [])


def with_sessions(prefix_cache: bool = True, **controls):
    raw = shipped_config(ngram=4)
    raw["suites"]["sess"] = {"kind": "session", "size": 16, "max_turns": 2, "seed": 0}
    raw["summary"]["controls"] = {"configured_off": False, "prefix_cache": prefix_cache, **controls}
    return validate(raw)


@pytest.mark.slow
def test_the_cache_arm_is_the_server_with_its_engines_opt_out_on_the_session_suites_only():
    cfg = with_controls(with_sessions())
    arms = {n: s for n, s in cfg["servers"].items() if n.endswith(CACHE)}
    # the eagle3 sweep's member of the largest k (as its control) drops a block; n-gram drafting drops
    # none (vLLM: EAGLE-like methods only)
    assert set(arms) == {"eagle3@k=5" + CACHE}
    for name, srv in arms.items():
        parent = cfg["servers"][name[: -len(CACHE)]]
        assert srv["speculative"] == {**parent["speculative"], "disable_eagle_block_drop": True}
        assert srv["suites"] == ["sess"]
        assert {k: v for k, v in srv.items() if k not in ("speculative", "suites")} == \
            {k: v for k, v in parent.items() if k not in ("speculative", "suites")}
    _, why = cache_arm_plan(with_sessions())
    assert "drops no prefix-cache block for method 'ngram'" in why["ngram"]
    assert not cache_arm_plan(with_sessions(prefix_cache=False))[0]
    # no session suite: nothing to measure it on, said so
    raw = with_sessions()
    del raw["suites"]["sess"]
    extra, why = cache_arm_plan(raw)
    assert not extra and "no session suite" in why["eagle3@k=5"]


def test_sglang_and_external_servers_have_no_cache_opt_out():
    cfg = with_sessions(servers=["sg", "ext"])
    cfg["servers"]["sg"] = {"engine": "sglang", "model": "m", "speculative": {"method": "EAGLE3", "model": "d"}}
    cfg["servers"]["ext"] = {"engine": "external", "base_url": "http://127.0.0.1:9", "model": "m",
                             "speculative": {"method": "eagle3", "model": "d"}, "reads_as": "vllm"}
    extra, why = cache_arm_plan(cfg)
    assert not extra and "SGLang" in why["sg"] and "external endpoint" in why["ext"]


def test_an_arm_name_in_the_config_is_refused():
    cfg = with_sessions()
    cfg["servers"]["x" + CACHE] = dict(cfg["servers"]["baseline"])
    with pytest.raises(SpecmatchError, match="__keepcache are the workflow's own"):
        with_controls(cfg)
