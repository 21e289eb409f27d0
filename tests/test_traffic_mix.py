"""Traffic mixes, the data side: a stratified training suite (a floor per source, each source's
training share recorded), profiles resolved against the sources inspection found (an unknown name is
an error that names it and what exists), the config's own checks, and a verifying suite drawn with
the profile's mix."""
import json
from collections import Counter

import pytest

from builders import make_root, shipped_config
from specmatch.config import suite_concurrency, validate
from specmatch.data.inspection import inspect_root
from specmatch.data.inspection import main as inspection_main
from specmatch.data.prompts import allocate, main as prompts_main, traffic_suite, training_suite
from specmatch.data.rows import ChatTemplate
from specmatch.data.traffic import main as traffic_main, resolve, resolve_mix, step_config, with_traffic_suites
from specmatch.files import SpecmatchError
from specmatch.records import SuiteMatch, TrafficProfiles


def test_minimum_allocation_floors_small_sources_and_keeps_the_rest_proportional():
    demo = {"code_instruct": 64, "code_explain": 36, "agent_traces": 24, "python_docs": 48, "reasoning": 20}
    assert allocate(16, demo) == {"code_instruct": 5, "code_explain": 3, "agent_traces": 2, "python_docs": 4,
                                  "reasoning": 2}
    got = allocate(16, demo, minimum=3)
    assert sum(got.values()) == 16 and min(got.values()) == 3 and got["code_instruct"] == 4
    big = allocate(100, {"a": 90, "b": 8, "c": 2}, minimum=10)
    assert big == {"a": 80, "b": 10, "c": 10}   # the rest follows the weights of the unfloored sources
    assert allocate(10, {"a": 1, "b": 0}, minimum=2) == {"a": 10, "b": 0}  # zero weight: no floor


def test_stratified_suite_records_each_source_share_of_the_training_mix(tmp_path, tok, tok_dir):
    root = make_root(tmp_path, tok, {"big": 60, "small": 6})
    m, cuts = inspect_root(root, str(tok_dir))
    spec = {"size": 12, "seed": 0, "weighting": "mix", "min_per_source": 4}
    prompts, match = training_suite("t", spec, m, cuts, ChatTemplate.of(tok))
    assert Counter(p.source for p in prompts) == {"big": 8, "small": 4}   # mix alone would give 11 / 1
    assert match.min_per_source == 4
    assert match.strata["big"] == {"kind": "source", "prompts": 8, "training_share": pytest.approx(60 / 66)}
    assert match.strata["small"]["training_share"] == pytest.approx(6 / 66)
    with pytest.raises(SpecmatchError, match=r"suites\.t\.min_per_source: 7 prompts x 2 sources .* suites\.t\.size \(12\)"):
        training_suite("t", {**spec, "min_per_source": 7}, m, cuts, ChatTemplate.of(tok))


def test_an_unknown_source_is_an_error_that_names_it_and_what_exists():
    sources, files = {"agent": 0.25, "chat": 0.75}, ["generic"]
    with pytest.raises(SpecmatchError) as e:
        resolve_mix("traffic.prod.mix", {"agents": 0.5, "generic": 0.5}, sources, files)
    msg = str(e.value)
    assert "traffic.prod.mix: 'agents' is neither a training source nor a file suite" in msg
    assert "agent, chat" in msg and "file suites: generic" in msg and "training_mix" in msg
    mix = resolve_mix("w", {"training_mix": 0.6, "generic": 0.4}, sources, files)
    assert mix == pytest.approx({"agent": 0.15, "chat": 0.45, "generic": 0.4})
    assert resolve_mix("w", {"agent": 3, "chat": 1, "generic": 0}, sources, files) == {"agent": 0.75, "chat": 0.25}
    with pytest.raises(SpecmatchError, match="both a training source and a file suite"):
        resolve_mix("w", {"chat": 1}, sources, ["chat"])


def test_the_training_mix_is_always_a_profile(tmp_path, tok, tok_dir):
    root = make_root(tmp_path, tok, {"a": 30, "b": 10})
    m, _ = inspect_root(root, str(tok_dir))
    suites = {"t": {"kind": "training"}, "generic": {"kind": "file"}}
    got = resolve({}, suites, "t", m)
    assert [p.name for p in got.profiles] == ["training_mix"] and got.files == ["generic"]
    assert got.profiles[0].mix == pytest.approx({"a": 0.75, "b": 0.25}) and got.sources == got.profiles[0].mix
    got = resolve({"heavy": {"mix": {"b": 1, "generic": 1}, "verify": True}}, suites, "t", m)
    heavy = got.profile("heavy")
    assert heavy.mix == {"b": 0.5, "generic": 0.5} and heavy.verify and heavy.suite == "traffic_heavy"
    assert TrafficProfiles.from_json(json.loads(json.dumps(got.to_json()))) == got


@pytest.mark.slow
def test_config_checks_what_the_config_alone_shows():
    cfg = shipped_config()
    ok = validate({**cfg, "traffic": {"gen": {"mix": {"training_mix": 0.6, "generic": 0.4}, "verify": True}}})
    assert ok["traffic"]["gen"]["verify"] and ok["traffic"]["gen"]["seed"] == 1
    assert validate(cfg)["traffic"] == {}   # the default: no profile beyond the implicit training mix
    for traffic, msg in (
            ({"training_mix": {"mix": {"generic": 1}}}, "traffic.training_mix: the training mix is always a profile"),
            ({"x": {"mix": {"train_holdout": 1}}}, "'train_holdout' is a training suite"),
            ({"x": {"mix": {"generic": 0}}}, "every weight is zero"),
            ({"x": {"mix": {"generic": 1}, "verify": True, "size": 4}}, "traffic.x.size: 4 prompts"),
            ({"x": {"mix": {"generic": 1}, "verify": True, "concurrency": [2]}},
             r"traffic.x.concurrency: \[2\] not in concurrency \[1, 16\]"),
            ({"x": {"mix": {"generic": -1}}}, "traffic.x.mix.generic"),
            ({"x": {"mix": {"generic": 1}, "verify": "same_prompts", "concurrency": [1, 16]}},
             "verify: same_prompts checks the step model, which only c > 1 uses"),
            ({"x": {"mix": {"generic": 1}, "verify": "other"}}, "traffic.x.verify")):
        with pytest.raises(SpecmatchError, match=msg):
            validate({**cfg, "traffic": traffic})


def test_a_verified_profile_becomes_an_ordinary_suite_on_the_grid():
    cfg = shipped_config()
    cfg["servers"]["eagle3"]["suites"] = ["train_holdout"]
    cfg = validate({**cfg, "traffic": {"gen": {"mix": {"training_mix": 0.6, "generic": 0.4}, "verify": True},
                                       "agents": {"mix": {"agent_traces": 1}}}})
    out = with_traffic_suites(cfg)
    assert list(out["suites"]) == ["train_mix", "train_holdout", "generic", "traffic_gen"]
    spec = out["suites"]["traffic_gen"]
    assert spec["kind"] == "traffic" and spec["basis"] == "train_holdout" and spec["size"] == 16
    assert spec["training"]["holdout"] == "only" and spec["files"] == {"generic": {"path": "resources/prompts/generic.jsonl"}}
    assert spec["exclude"] == ["generic", "train_holdout"]   # the estimation suites, never redrawn
    assert all("traffic_gen" in s["suites"] for n, s in out["servers"].items() if n.startswith("eagle3@"))
    assert with_traffic_suites(validate(shipped_config())) == validate(shipped_config())   # nothing verified
    # a profile verified under load only: its suite is measured there, and drawn as without the key
    cfg["traffic"]["gen"]["concurrency"] = [16]
    spec16 = with_traffic_suites(cfg)["suites"]["traffic_gen"]
    assert spec16["concurrency"] == [16] and {k: v for k, v in spec16.items() if k != "concurrency"} == spec
    assert suite_concurrency(with_traffic_suites(cfg), "traffic_gen") == [16]
    assert suite_concurrency(with_traffic_suites(cfg), "generic") == [1, 16]
    # ... and the traffic step never reruns for it (its config leaves the cells' choice out)
    unset = {**cfg, "traffic": {**cfg["traffic"], "gen": {k: v for k, v in cfg["traffic"]["gen"].items()
                                                          if k != "concurrency"}}}
    assert step_config(cfg) == step_config(unset)
    # verify: same_prompts: drawn from the estimation suites' prompts, measured above c = 1 unless told
    cfg["traffic"]["gen"] = {**cfg["traffic"]["gen"], "verify": "same_prompts"}
    del cfg["traffic"]["gen"]["concurrency"]
    sp = with_traffic_suites(cfg)["suites"]["traffic_gen"]
    assert sp["same_prompts"] and sp["concurrency"] == [16] and sp["exclude"] == ["generic", "train_holdout"]
    fresh = {**shipped_config(), "traffic": {"gen": {"mix": {"training_mix": 1}, "verify": "same_prompts"}}}
    assert validate(fresh)["traffic"]["gen"]["verify"] == "same_prompts"
    with pytest.raises(SpecmatchError, match="only c > 1 uses"):
        validate({**fresh, "concurrency": [1]})


def test_a_verifying_suite_is_drawn_with_the_mix(tmp_path, tok, tok_dir):
    root = make_root(tmp_path, tok, {"a": 40, "b": 40})
    out = tmp_path / "out"
    assert inspection_main(["--root", str(root), "--tokenizer", str(tok_dir), "--out", str(out / "m.json"),
                            "--cuts", str(out / "cuts.parquet"), "--holdout", json.dumps({"fraction": 0.5})]) == 0
    ctl = tmp_path / "generic.jsonl"
    ctl.write_text("".join(json.dumps({"prompt": f"Question {i}?", "category": "misc"}) + "\n" for i in range(30)))
    spec = {"kind": "traffic", "profile": "p", "mix": {"a": 1, "generic": 1}, "size": 10, "seed": 1,
            "basis": "t", "training": {"holdout": "only", "turn": "last"}, "files": {"generic": {"path": str(ctl)}}}
    common = ["--manifest", str(out / "m.json"), "--tokenizer", str(tok_dir), "--cuts", str(out / "cuts.parquet")]
    assert prompts_main(["--suite", "traffic_p", "--spec", json.dumps(spec), "--out", str(out / "p.jsonl"),
                         "--match", str(out / "p.match.json"), *common]) == 0
    rows = [json.loads(x) for x in (out / "p.jsonl").read_text().splitlines()]
    assert Counter(r["source"] for r in rows) == {"a": 5, "generic": 5}   # a file's rows are one stratum
    assert all(r["holdout"] for r in rows) and [r["id"] for r in rows] == [f"traffic_p-{i:05d}" for i in range(10)]
    match = SuiteMatch.from_json(json.loads((out / "p.match.json").read_text()))
    assert match.kind == "traffic" and match.strata["generic"]["share"] == 0.5 and match.strata["a"]["prompts"] == 5
    again = tmp_path / "again.jsonl"
    assert prompts_main(["--suite", "traffic_p", "--spec", json.dumps(spec), "--out", str(again),
                         "--match", str(tmp_path / "again.match.json"), *common]) == 0
    assert again.read_text() == (out / "p.jsonl").read_text()   # seeded
    # the estimation suites' prompts are never drawn again: a basis suite and the file suite
    basis_spec = {"kind": "training", "size": 6, "weighting": "mix", "turn": "last", "holdout": "only", "seed": 0}
    assert prompts_main(["--suite", "t", "--spec", json.dumps(basis_spec), "--out", str(out / "t.jsonl"),
                         "--match", str(out / "t.match.json"), *common]) == 0
    gen_spec = {"kind": "file", "path": str(ctl), "size": 20, "seed": 0}
    assert prompts_main(["--suite", "generic", "--spec", json.dumps(gen_spec), "--out", str(out / "generic.jsonl"),
                         "--match", str(out / "generic.match.json"), "--manifest", str(out / "m.json"),
                         "--tokenizer", str(tok_dir)]) == 0
    est = [json.loads(x) for f in ("t", "generic") for x in (out / f"{f}.jsonl").read_text().splitlines()]
    assert prompts_main(["--suite", "traffic_p", "--spec", json.dumps({**spec, "exclude": ["generic", "t"]}),
                         "--out", str(out / "d.jsonl"), "--match", str(out / "d.match.json"), *common,
                         "--exclude", str(out / "t.jsonl"), str(out / "generic.jsonl")]) == 0
    drawn = [json.loads(x) for x in (out / "d.jsonl").read_text().splitlines()]
    key = lambda r: (r["file"], r["row"]) if r["row"] is not None else (r["file"], r["line"])  # noqa: E731
    assert len(drawn) == 10 and not {key(r) for r in drawn} & {key(r) for r in est}
    assert {key(r) for r in rows} & {key(r) for r in est}   # without the exclusion they overlapped
    dm = SuiteMatch.from_json(json.loads((out / "d.match.json").read_text()))
    # candidates left out: the basis rows of the mix's sources, and every line the file suite drew
    assert dm.disjoint_from == {"generic": 20, "t": sum(r["suite"] == "t" and r["source"] == "a" for r in est)}
    assert "disjoint from the prompts of generic, t" in dm.verdict and dm.skipped["generic: drawn by the estimation suite generic"] == 20
    # the same file named two ways (relative in one suite, absolute in the other) is one file
    import os
    rel = json.loads((out / "generic.jsonl").read_text().splitlines()[0])["file"]
    assert rel == str(ctl)
    here = os.getcwd()
    try:
        os.chdir(ctl.parent)
        assert prompts_main(["--suite", "generic", "--spec", json.dumps({**gen_spec, "path": ctl.name}),
                             "--out", str(out / "generic_rel.jsonl"), "--match", str(out / "g.match.json"),
                             "--manifest", str(out / "m.json"), "--tokenizer", str(tok_dir)]) == 0
        assert prompts_main(["--suite", "traffic_p", "--spec", json.dumps({**spec, "exclude": ["generic"]}),
                             "--out", str(out / "r.jsonl"), "--match", str(out / "r.match.json"), *common,
                             "--exclude", str(out / "generic_rel.jsonl")]) == 0
    finally:
        os.chdir(here)
    got = {r["line"] for r in map(json.loads, (out / "r.jsonl").read_text().splitlines()) if r["row"] is None}
    used = {r["line"] for r in map(json.loads, (out / "generic_rel.jsonl").read_text().splitlines())}
    assert got and not got & used
    # a pool the exclusion empties falls short, and says so
    assert prompts_main(["--suite", "traffic_p", "--spec", json.dumps({**spec, "size": 24, "exclude": ["generic", "t"]}),
                         "--out", str(out / "e.jsonl"), "--match", str(out / "e.match.json"), *common,
                         "--exclude", str(out / "t.jsonl"), str(out / "generic.jsonl")]) == 0
    em = SuiteMatch.from_json(json.loads((out / "e.match.json").read_text()))
    assert em.shortfall["generic"] == {"wanted": 12, "available": 10} and "fell short: generic" in em.verdict
    bad = {**spec, "mix": {"c": 1}}
    assert prompts_main(["--suite", "traffic_p", "--spec", json.dumps(bad), "--out", str(again),
                         "--match", str(tmp_path / "again.match.json"), *common]) == 1
    # the traffic step: the same check right after inspection, for every profile
    cfg = {"traffic": {"p": {"mix": {"zz": 1}}}, "suites": {"t": {"kind": "training"}}, "basis": "t"}
    assert traffic_main(["--config", json.dumps(cfg), "--manifest", str(out / "m.json"),
                         "--out", str(out / "traffic.json")]) == 1
    cfg["traffic"]["p"]["mix"] = {"b": 1}
    assert traffic_main(["--config", json.dumps(cfg), "--manifest", str(out / "m.json"),
                         "--out", str(out / "traffic.json")]) == 0
    got = TrafficProfiles.from_json(json.loads((out / "traffic.json").read_text()))
    assert [p.name for p in got.profiles] == ["training_mix", "p"]
    # verify: same_prompts: the mix drawn from the estimation suites' own prompts, ids kept; a stratum
    # allocated more than its suite holds sends each of its prompts as evenly often as it can
    assert prompts_main(["--suite", "traffic_p", "--spec", json.dumps({**spec, "size": 16, "same_prompts": True,
                                                                        "exclude": ["generic", "t"]}),
                         "--out", str(out / "s.jsonl"), "--match", str(out / "s.match.json"), *common,
                         "--exclude", str(out / "t.jsonl"), str(out / "generic.jsonl")]) == 0
    same = [json.loads(x) for x in (out / "s.jsonl").read_text().splitlines()]
    by_id = {r["id"]: r for r in est}
    assert len(same) == 16 and all(r["id"] in by_id and r["text"] == by_id[r["id"]]["text"] for r in same)
    assert Counter(r["source"] for r in same) == {"a": 8, "generic": 8} and all(r["suite"] == "traffic_p" for r in same)
    a_est = [r["id"] for r in est if r["suite"] == "t" and r["source"] == "a"]
    counts = Counter(r["id"] for r in same if r["source"] == "a")
    assert set(counts) == set(a_est) and max(counts.values()) - min(counts.values()) <= 1
    assert len({r["id"] for r in same if r["source"] == "generic"}) == 8   # enough: never twice
    sm = SuiteMatch.from_json(json.loads((out / "s.match.json").read_text()))
    assert sm.same_prompts == {"from": {"generic": 8, "t": 8}, "repeated": {"a": {"wanted": 8, "prompts": len(a_est)}}}
    assert "from the estimation suites' own prompts" in sm.verdict and sm.disjoint_from is None


@pytest.mark.slow
def test_the_default_workflow_measures_a_verified_profile_on_the_whole_grid(tmp_path):
    """A dry run of the shipped k-sweep config with two profiles, one verified: the profiles are resolved right
    after inspection, the verified one gets an ordinary prompts job and the cells of every suite
    (baseline and both k-sweep members, both concurrencies, both repeats of the sequential minimum),
    and the decide step reads the profiles."""
    import yaml

    from builders import KSWEEP_CONFIG, copy_workflow, job_counts, run, snakemake_cmd

    wd = copy_workflow(tmp_path)
    cfg = yaml.safe_load((wd / KSWEEP_CONFIG).read_text())
    cfg["traffic"] = {"generic_heavy": {"mix": {"training_mix": 0.6, "generic": 0.4}, "verify": True},
                      "agentic": {"mix": {"agent_traces": 0.6, "code_instruct": 0.4}}}
    (wd / "traffic.yaml").write_text(yaml.safe_dump(cfg))
    out = run(snakemake_cmd() + ["-n", "--cores", "2", "--configfile", "traffic.yaml"], wd).stdout
    counts = job_counts(out)
    assert counts["traffic_profiles"] == 1 and counts["prompts"] == 4
    assert counts["cell"] == (4 + 4 + 4) * 2 * 2   # was (3 + 3 + 3) * 2 * 2 without the verified profile
    for x in ("baseline", "eagle3@k=3", "eagle3@k=5"):
        assert f"results/cells/{x}/traffic_generic_heavy/r2/c16.json" in out
    assert "--traffic results/prompts/traffic.json" in out and "results/summary/traffic.json" in out
    # the embedded default: baseline and eagle3 on train_holdout, generic and its verified profiles' suites
    # traffic_generic_heavy and traffic_long_context, plus the step-cost map's cells (both servers on
    # train_holdout at c=4 and 8)
    # (traffic_generic_heavy under load only: traffic.generic_heavy.concurrency [16])
    plain = run(snakemake_cmd() + ["-n", "--cores", "2"], wd).stdout
    assert job_counts(plain)["cell"] == 2 * (3 * 2 + 1) * 2 + 2 * 2 * 2 and job_counts(plain)["traffic_profiles"] == 1
    assert "results/cells/eagle3/train_holdout/r2/c4.json" in plain and job_counts(plain)["stepcost"] == 1
    assert "results/cells/eagle3/traffic_generic_heavy/r2/c16.json" in plain
    assert "results/cells/eagle3/traffic_generic_heavy/r2/c1.json" not in plain
