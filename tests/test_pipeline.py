"""The workflow's plumbing (specmatch.pipeline), without Snakemake: result paths, the cells a sequential
design has measured after each round, and the settings the rules pass."""
import pytest

from specmatch import pipeline
from specmatch.records import PlannedCell, RoundPlan


def test_cell_and_launch_paths_are_one_template():
    key = ("eagle3@k=3", "train_mix", 2, 16)
    assert pipeline.cell_path(key) == "results/cells/eagle3@k=3/train_mix/r2/c16.json"
    assert pipeline.cell_path(key, "requests.parquet") == "results/cells/eagle3@k=3/train_mix/r2/c16.requests.parquet"
    fields = dict(zip(("server", "suite", "repeat", "concurrency"), key))
    assert pipeline.CELL_JSON.format(**fields) == pipeline.cell_path(key)          # the rule's output is the same file
    assert pipeline.CELL_REQUESTS.format(**fields) == pipeline.cell_path(key, "requests.parquet")
    assert pipeline.launch_path("b", 3) == pipeline.LAUNCH.format(server="b", repeat=3) == "results/servers/b/r3/launch.json"


def test_a_grid_is_listed_in_the_order_snakemakes_expand_gave():
    """The steps see their cells in this order (it fixes the analysis's server order), so the package's
    grid must list them exactly as `expand` over the same template did."""
    from snakemake.io import expand

    servers, suites, repeats, cs = ["b", "x"], ["u", "v"], [1, 2], [1, 16, 4]
    want = expand(pipeline.CELL + ".{ext}", server=servers, suite=suites, repeat=repeats, concurrency=cs, ext="json")
    assert pipeline.cell_paths(pipeline.grid_keys(servers, suites, repeats, cs)) == want
    assert pipeline.launch_paths(servers, repeats) == expand(pipeline.LAUNCH, server=servers, repeat=repeats)


def plan(k: int, nxt: list[tuple]) -> RoundPlan:
    return RoundPlan(k, {"min": 2, "max": 5}, "output_throughput", [],
                     [PlannedCell(s, u, c, k + 1) for s, u, c in nxt])


class Plans:
    """A plan reader that records which rounds were asked for (in the workflow: checkpoints run)."""

    def __init__(self, plans: dict):
        self.plans, self.asked = plans, []

    def __call__(self, k: int) -> RoundPlan:
        self.asked.append(k)
        return self.plans[k]


def test_rounds_stop_after_a_plan_that_continues_nothing():
    plans = Plans({2: plan(2, [("x", "u", 1), ("b", "u", 1)]), 3: plan(3, []), 4: plan(4, [("x", "u", 1)])})
    assert [k for k, _ in pipeline.rounds_before(5, 2, 5, plans)] == [2, 3]
    assert plans.asked == [2, 3]                      # round 4 never ran, so its plan is never asked for
    plans.asked.clear()
    assert list(pipeline.rounds_before(2, 2, 5, plans)) == [] and plans.asked == []   # nothing before `min`
    assert [k for k, _ in pipeline.rounds_before(3, 2, 5, plans)] == [2] and plans.asked == [2]


def test_rounds_end_at_the_designs_last_round():
    plans = Plans({k: plan(k, [("x", "u", 1)]) for k in range(2, 9)})
    assert [k for k, _ in pipeline.rounds_before(99, 2, 4, plans)] == [2, 3]   # repeat 4 is the last


def test_cells_through_a_round_are_every_cell_up_to_min_then_what_each_plan_added():
    plans = Plans({2: plan(2, [("x", "u", 4), ("b", "u", 4)]), 3: plan(3, [])})
    suites_of = {"b": ["u", "v"], "x": ["u"]}
    keys = pipeline.cell_keys_through(5, suites_of, [1, 4], 2, 5, plans)
    first = [(s, u, r, c) for s, us in suites_of.items() for u in us for r in (1, 2) for c in (1, 4)]
    assert keys == first + [("x", "u", 3, 4), ("b", "u", 3, 4)]
    assert pipeline.cell_keys_through(1, suites_of, [1, 4], 2, 5, plans) == [k for k in first if k[2] == 1]
    assert pipeline.launches_of(keys) == ["results/servers/b/r1/launch.json", "results/servers/b/r2/launch.json",
                                          "results/servers/b/r3/launch.json", "results/servers/x/r1/launch.json",
                                          "results/servers/x/r2/launch.json", "results/servers/x/r3/launch.json"]


def test_a_suite_measured_at_part_of_the_grid_has_only_those_cells():
    """`suites.<name>.concurrency` (config.suite_concurrency): the grid and the sequential design's first
    repeats list a suite's cells at its own concurrencies only; a round adds what its plan names."""
    per_suite = {"u": [1, 4], "v": [4]}
    assert pipeline.grid_keys(["b"], ["u", "v"], [1], per_suite) == [("b", "u", 1, 1), ("b", "u", 1, 4),
                                                                     ("b", "v", 1, 4)]
    plans = Plans({2: plan(2, [("x", "v", 4)]), 3: plan(3, [])})
    keys = pipeline.cell_keys_through(5, {"b": ["u", "v"], "x": ["v"]}, per_suite, 2, 5, plans)
    assert [k for k in keys if k[1] == "v"] == [("b", "v", 1, 4), ("b", "v", 2, 4), ("x", "v", 1, 4),
                                                ("x", "v", 2, 4), ("x", "v", 3, 4)]
    assert not [k for k in keys if k[1] == "v" and k[3] == 1]


def test_map_cells_are_in_the_first_sessions_step_cost_repeats_names():
    cfg = {"concurrency": [1, 16], "suites": {"u": {}}, "summary": {"recommend_suites": ["u"]},
           "step_cost": {"concurrency": [4, 8, 16]}}
    assert pipeline.map_keys(cfg, ["b", "x"], 2) == [(s, "u", r, c) for s in ("b", "x") for r in (1, 2) for c in (4, 8)]
    cfg["step_cost"]["repeats"] = 1
    assert pipeline.map_keys(cfg, ["b", "x"], 2) == [(s, "u", 1, c) for s in ("b", "x") for c in (4, 8)]
    cfg["step_cost"]["repeats"] = 5                  # never more sessions than the design's first round has
    assert len(pipeline.map_keys(cfg, ["b"], 2)) == 4


def test_a_fixed_design_reads_no_plan():
    def never(k):
        raise AssertionError("a fixed design has no rounds")

    keys = pipeline.cell_keys_through(3, {"b": ["u"]}, [1], 3, 3, never)
    assert keys == [("b", "u", 1, 1), ("b", "u", 2, 1), ("b", "u", 3, 1)]


@pytest.mark.parametrize("server, env", [
    ({"engine": "vllm", "model": "m"}, "vllm-cpu"),
    ({"engine": "vllm", "model": "m", "profile": "gpu"}, "vllm-gpu"),
    ({"engine": "vllm", "model": "m", "profile": "cpu"}, "vllm-cpu"),
    ({"engine": "sglang", "model": "m", "profile": "gpu"}, "sglang"),
    ({"engine": "external", "base_url": "http://127.0.0.1:1"}, "specmatch"),
])
def test_launch_env_is_the_engines(server, env):
    from builders import REPO

    assert pipeline.launch_env(server) == env
    assert (REPO / "envs" / f"{env}.yaml").exists()


def test_drafter_budget_is_every_key_but_what_is_passed_on_its_own():
    spec = {"target": "results/models/t", "aux_layers": [1, 2], "regenerate": {"enabled": True}, "steps": 50,
            "seed": 3, "lr": 0.01}
    assert pipeline.drafter_budget(spec) == {"steps": 50, "seed": 3, "lr": 0.01, "threads": 0}
    assert spec["target"] == "results/models/t"     # the config is not edited
    from dataclasses import fields

    from specmatch.training.drafter import Budget

    assert set(pipeline.drafter_budget({"target": "t", **{f.name: 1 for f in fields(Budget)}})) == {
        f.name for f in fields(Budget)}           # every budget key reaches the drafter, nothing else



@pytest.mark.slow
def test_a_sessions_launch_and_cells_share_the_default_runtime(tmp_path):
    """On a cluster a server session (its launch and cells) is one group, one allocation, and
    Snakemake asks for the sum of a group's runtimes: each job of a session gets an equal share of the
    default runtime (common.smk session_runtime), so a session asks for at most the default runtime
    however many cells it has; with no default runtime (local runs) none is asked for."""
    import re

    import yaml

    from builders import copy_workflow, run, snakemake_cmd

    wd = copy_workflow(tmp_path)
    cfg = {"dataset": {"root": "resources/demo/prepared", "tokenizer": "results/models/smollm2-135m"},
           "demo": {"enabled": True}, "models": {"embedded": {"enabled": True, "path": "results/models/smollm2-135m"}},
           "suites": {"a": {"kind": "file", "path": "resources/prompts/generic.jsonl", "size": 4},
                      "b": {"kind": "file", "path": "resources/prompts/generic.jsonl", "size": 8}},
           "servers": {"base": {"engine": "external", "base_url": "http://127.0.0.1:9"},
                       "one": {"engine": "external", "base_url": "http://127.0.0.1:9", "suites": ["a"]}},
           "baseline": "base", "concurrency": [1, 2, 4], "repeats": 1}
    (wd / "c.yaml").write_text(yaml.safe_dump(cfg))

    def runtimes(*extra):
        out = run(snakemake_cmd() + ["-n", "--configfile", "c.yaml", "--cores", "2", *extra], wd).stdout
        got = {}
        for block in out.split("\n\n"):
            m = re.search(r"rule (launch|cell):.*?wildcards: server=(\w+).*?resources: (.*)", block, re.S)
            if m:
                rt = re.search(r"\bruntime=(\d+)", m.group(3))
                got.setdefault((m.group(1), m.group(2)), set()).add(int(rt.group(1)) if rt else None)
        return got

    # base: 2 suites x 3 concurrencies = 6 cells + its launch share 700 min; one: 3 cells + launch
    assert runtimes("--default-resources", "runtime=700") == {
        ("launch", "base"): {100}, ("cell", "base"): {100}, ("launch", "one"): {175}, ("cell", "one"): {175}}
    assert set().union(*runtimes().values()) == {0}
