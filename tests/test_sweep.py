"""k sweeps in the config (specmatch.sweep): one server per listed value, named so a person reads them."""
import copy
import json
import re

import pytest

from builders import REPO
from specmatch.files import SpecmatchError
from specmatch.sweep import Sweep, expand, member_of, sweep_of, sweeps

BASE = {"engine": "vllm", "model": "/m"}
EAGLE3 = {"engine": "vllm", "model": "/m", "suites": ["a"],
          "speculative": {"method": "eagle3", "model": "/d", "num_speculative_tokens": [1, 2, 3, 5]}}


def test_a_listed_k_expands_to_one_ordinary_server_per_value_in_place():
    servers = {"base": BASE, "eagle3": EAGLE3, "ngram": {"engine": "vllm", "model": "/m", "speculative": {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}}}
    before = copy.deepcopy(servers)
    out = expand(servers)
    assert list(out) == ["base", "eagle3@k=1", "eagle3@k=2", "eagle3@k=3", "eagle3@k=5", "ngram"]
    assert servers == before                       # the config is not changed
    assert out["base"] is servers["base"] and out["ngram"] is servers["ngram"]
    for k in (1, 2, 3, 5):
        cfg = out[f"eagle3@k={k}"]
        assert cfg == {**EAGLE3, "speculative": {**EAGLE3["speculative"], "num_speculative_tokens": k}}
    # members share nothing mutable
    out["eagle3@k=1"]["speculative"]["model"] = "x"
    assert out["eagle3@k=2"]["speculative"]["model"] == "/d"


def test_adding_a_value_leaves_every_other_member_as_it_was():
    """A member's config holds nothing of the list, so its launches, cells and caches stay."""
    one = expand({"eagle3": EAGLE3})
    more = expand({"eagle3": {**EAGLE3, "speculative": {**EAGLE3["speculative"],
                                                         "num_speculative_tokens": [5, 1, 8, 2, 3]}}})
    assert set(more) - set(one) == {"eagle3@k=8"}
    for name, cfg in one.items():
        assert json.dumps(more[name], sort_keys=True) == json.dumps(cfg, sort_keys=True)


def test_names_read_back_and_are_plain_path_components():
    out = expand({"my.eagle-3_x": EAGLE3})
    for name in out:
        assert re.fullmatch(r"[A-Za-z0-9_.@=-]+", name) and "/" not in name
        assert sweep_of(name) is not None and sweep_of(name)[0] == "my.eagle-3_x"
    assert sweep_of("eagle3@k=2") == ("eagle3", 2)
    assert sweep_of("eagle3") is None and sweep_of("eagle3@k=2__off") is None
    assert sweep_of("eagle3@k=2__recommended") is None and sweep_of("eagle3@draft=8") is None
    assert sweep_of("eagle3@k=") is None and sweep_of("a@b@k=2") is None
    m = member_of("tree@draft=8")
    assert (m.parent, m.label, m.value) == ("tree", "draft", 8)


def test_the_sweep_record():
    (sw,) = sweeps({"base": BASE, "eagle3": EAGLE3})
    assert isinstance(sw, Sweep)
    assert (sw.parent, sw.engine, sw.field, sw.label, sw.values) == ("eagle3", "vllm", "num_speculative_tokens",
                                                                       "k", [1, 2, 3, 5])
    assert sw.members == ["eagle3@k=1", "eagle3@k=2", "eagle3@k=3", "eagle3@k=5"]
    assert sw.ks() == {1: "eagle3@k=1", 2: "eagle3@k=2", 3: "eagle3@k=3", 5: "eagle3@k=5"}
    assert Sweep.from_json(json.loads(json.dumps(sw.to_json()))) == sw
    assert sweeps({"base": BASE}) == []


SG = {"engine": "sglang", "model": "/m", "speculative": {"method": "eagle3", "model": "/d", "eagle_topk": 1}}


def sg(**spec):
    return {**SG, "speculative": {**SG["speculative"], **spec}}


def test_sglang_num_steps_sweep_sets_the_draft_tokens_it_needs():
    out = expand({"sg": sg(num_steps=[1, 3, 5])})
    assert list(out) == ["sg@k=1", "sg@k=3", "sg@k=5"]
    assert [(c["speculative"]["num_steps"], c["speculative"]["num_draft_tokens"]) for c in out.values()] == \
        [(1, 2), (3, 4), (5, 6)]
    # a larger topk: num_draft_tokens as written, or paired with num_steps
    out = expand({"t": sg(eagle_topk=4, num_steps=[2, 3], num_draft_tokens=8)})
    assert [c["speculative"]["num_draft_tokens"] for c in out.values()] == [8, 8]
    out = expand({"t": sg(eagle_topk=4, num_steps=[2, 3], num_draft_tokens=[6, 8])})
    got = [(c["speculative"]["num_steps"], c["speculative"]["num_draft_tokens"]) for c in out.values()]
    assert got == [(2, 6), (3, 8)]
    # a tree's size at fixed steps
    out = expand({"t": sg(eagle_topk=4, num_steps=3, num_draft_tokens=[6, 10])})
    assert list(out) == ["t@draft=6", "t@draft=10"] and sweep_of("t@draft=6") is None
    (sw,) = sweeps({"t": sg(eagle_topk=4, num_steps=3, num_draft_tokens=[6, 10])})
    assert sw.field == "num_draft_tokens" and sw.label == "draft" and sw.ks() == {}


def test_the_expanded_sglang_members_launch():
    from specmatch.serving.engines import get_engine

    launched = []
    for name, cfg in expand({"sg": sg(num_steps=[1, 3])}).items():
        argv = get_engine({**cfg, "sglang_version": "0.5.23"}).launch_plan(30000, 64).argv
        k = sweep_of(name)[1]
        assert argv[argv.index("--speculative-num-steps") + 1] == str(k)
        assert argv[argv.index("--speculative-num-draft-tokens") + 1] == str(k + 1)
        launched.append(k)
    assert launched == [1, 3]


@pytest.mark.parametrize("servers, field, what", [
    ({"e": {**EAGLE3, "speculative": {"method": "eagle3", "num_speculative_tokens": []}}},
     "servers.e.speculative.num_speculative_tokens", "at least one value"),
    ({"e": {**EAGLE3, "speculative": {"method": "eagle3", "num_speculative_tokens": [2, 0]}}},
     "servers.e.speculative.num_speculative_tokens", "k = 0 is the baseline"),
    ({"e": {**EAGLE3, "speculative": {"method": "eagle3", "num_speculative_tokens": [2, 2]}}},
     "servers.e.speculative.num_speculative_tokens", "listed twice"),
    ({"e": {**EAGLE3, "speculative": {"method": "eagle3", "num_speculative_tokens": [2, "3"]}}},
     "servers.e.speculative.num_speculative_tokens", "not a whole number"),
    ({"e": {**EAGLE3, "speculative": {"method": "eagle3", "num_speculative_tokens": [2, 3],
                                      "num_speculative_tokens_per_batch_size": [[1, 4, 3]]}}},
     "servers.e.speculative.num_speculative_tokens", "cannot be combined"),
    ({"e": {**EAGLE3, "speculative": {"method": "eagle3", "num_steps": [2, 3]}}},
     "servers.e.speculative.num_steps", "not supported for engine vllm"),
    ({"s": sg(num_steps=[2, 3], num_draft_tokens=5)}, "servers.s.speculative.num_draft_tokens", "num_steps + 1"),
    ({"s": sg(num_steps=[2, 3], num_draft_tokens=[3, 5])}, "servers.s.speculative.num_draft_tokens",
     "must be num_steps + 1"),
    ({"s": sg(eagle_topk=4, num_steps=[2, 3])}, "servers.s.speculative.num_draft_tokens", "required with eagle_topk 4"),
    ({"s": sg(eagle_topk=4, num_steps=[2, 3], num_draft_tokens=[6])}, "servers.s.speculative.num_draft_tokens",
     "1 values for 2"),
    ({"s": sg(num_steps=3, num_draft_tokens=[4, 6])}, "servers.s.speculative.num_draft_tokens",
     "sweep num_steps instead"),
    ({"s": {**SG, "speculative": {"method": "eagle3", "num_steps": [2, 3]}}}, "servers.s.speculative.eagle_topk",
     "required"),
    ({"s": sg(num_steps=[2, 3], adaptive=True)}, "servers.s.speculative", "adaptive"),
    ({"x": {"engine": "external", "base_url": "http://h", "speculative": {"num_speculative_tokens": [1, 2]}}},
     "servers.x.speculative.num_speculative_tokens", "engine external"),
    ({"e@k=2": BASE, "e": {**EAGLE3, "speculative": {"method": "eagle3", "num_speculative_tokens": [2]}}},
     "servers.e@k=2", "sweep member"),
])
def test_errors_name_the_config_field(servers, field, what):
    with pytest.raises(SpecmatchError) as exc:
        expand(servers, "config.yaml: ")
    msg = str(exc.value)
    assert msg.startswith(f"config.yaml: {field}:") and what in msg, msg


def test_the_workflow_wildcards_take_member_names():
    """The rules' {server} wildcard is unconstrained: a member's name is one path component, as is
    every suffix the workflow adds to it."""
    rules = "\n".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    blocks = re.findall(r"wildcard_constraints:\n((?:\s{8}.*\n)+)", rules)
    assert blocks, "no wildcard_constraints block found: the check below would see nothing"
    for block in blocks:
        assert not re.search(r"^\s*server\s*=", block, re.M), block
