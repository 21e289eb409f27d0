"""Adding an engine is its adapter and the registry, nothing else (issue 43, item 4).

A fake engine, defined here and nowhere in the package, is registered in ENGINES for the length of a
test. With nothing else changed, the config accepts a server of it and expands its k sweep, its launch
plan, conda environment, configured-off control and sweepable key are its adapter's, and the
recommend, decide and summary steps write and print a recommendation in the adapter's own terms: the
deciding stage hands it an engine-neutral schedule (records.Schedule) and the report prints what the
adapter rendered (records.Deployment), no other engine's syntax.
"""
import copy
import json

import numpy as np
import pytest

from builders import decide_and_render, launch_record, shipped_config, write_cells
from specmatch.calibration.simulate import experiment
from specmatch.config import load_schema, validate
from specmatch.files import SpecmatchError, write_json
from specmatch.records import Acceptance, Deployment, Schedule
from specmatch.serving.engines import ENGINES, Engine, LaunchPlan, get_engine
from specmatch.serving.engines.base import sweep_values

BY_BATCH = "drafts_by_batch"   # the fake engine's own key for k per batch size


class FakeEngine(Engine):
    """An engine specmatch has never heard of: its own flags, keys, environment and acceptance."""
    name = "fake"
    flavor = "fake"
    label = "Fake"
    deployment_noun = "the Fake setting above"
    sweep_fields = {"drafts": "k"}
    packages = ("fake-engine",)
    acceptance_definition = "Fake: length = 1 + accepted / steps"

    @classmethod
    def launch_max_batch(cls, max_concurrency: int) -> int:
        return max(32, max_concurrency)

    @classmethod
    def conda_env(cls, cfg: dict) -> str:
        return "fake-env"

    def launch_plan(self, port: int, max_batch: int) -> LaunchPlan:
        spec = self.cfg.get("speculative") or {}
        argv = [self.python(), "-m", "fake_engine", "--model", self.cfg["model"], "--port", str(port),
                "--batch", str(max_batch)] + (["--drafts-config", json.dumps(spec, sort_keys=True)] if spec else [])
        return LaunchPlan(argv, {"FAKE": "1"}, self.cfg.get("host", "127.0.0.1"), port)

    @classmethod
    def sweep(cls, where: str, spec: dict, listed: list[str]):
        values = sweep_values(f"{where}.drafts", spec["drafts"])
        return "drafts", "k", values, [{"drafts": v} for v in values]

    def configured_off(self, max_batch: int):
        return {**copy.deepcopy(self.cfg["speculative"]), BY_BATCH: [[1, max_batch, 0]]}, None

    def own_k(self, spec: dict) -> int:
        return int(spec.get("drafts") or 0)

    def server_k(self, spec: dict, batch: int) -> int:
        bands = spec.get(BY_BATCH)
        if not bands:
            return self.own_k(spec)
        return next((k for lo, hi, k in bands if lo <= batch <= hi), bands[-1][2])

    def mixed_schedule(self, spec: dict) -> bool:
        ks = {k for _, _, k in spec.get(BY_BATCH) or []}
        return 0 in ks and any(ks)

    def render(self, schedule: Schedule, spec: dict, version=None, new: bool = True) -> Deployment:
        if not schedule.top:
            return Deployment(self.name, note="Fake: serve it without --drafts-config")
        out = {**copy.deepcopy(spec), "drafts": schedule.top, BY_BATCH: schedule.bands}
        bands = ",".join(f"{lo}-{hi}:{k}" for lo, hi, k in schedule.bands)
        return Deployment(self.name, out, flag=f"Fake: `--drafts-by-batch {bands}`" if new else None,
                          note="Fake: drafts per batch band, as fake_engine reads them")

    def figures(self, requests, steps, drafted, accepted, tokens) -> Acceptance:
        return Acceptance(requests, steps, drafted, accepted, tokens,
                          accepted / drafted if accepted is not None and drafted else None,
                          1 + accepted / steps if accepted is not None and steps else None)


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setitem(ENGINES, "fake", FakeEngine)
    return FakeEngine


def fake_server(**spec) -> dict:
    return {"engine": "fake", "model": "/m", **({"speculative": spec} if spec else {})}


def config(**servers) -> dict:
    cfg = shipped_config(path="config.yaml")
    cfg["servers"] = servers
    cfg["baseline"] = "base"
    return cfg


def test_the_config_accepts_a_registered_engine_only(fake):
    assert "fake" in load_schema()["$defs"]["server"]["properties"]["engine"]["enum"]
    cfg = validate(config(base=fake_server(), spec=fake_server(method="ngram", drafts=3)))
    assert cfg["servers"]["spec"]["engine"] == "fake"
    # what the config checks of an engine that launches (a model; no endpoint address) holds for it too
    with pytest.raises(SpecmatchError, match="servers.spec.model: required for engine fake"):
        validate(config(base=fake_server(), spec={"engine": "fake", "speculative": {"method": "ngram", "drafts": 3}}))
    with pytest.raises(SpecmatchError, match="servers.spec.base_url: only for engine external"):
        validate(config(base=fake_server(), spec={**fake_server(), "base_url": "http://h"}))
    # a name the registry does not hold is refused by the schema
    with pytest.raises(SpecmatchError, match="servers.spec.engine"):
        validate(config(base=fake_server(), spec={**fake_server(), "engine": "unknown"}))


def test_unregistered_it_is_unknown():
    with pytest.raises(SpecmatchError, match="servers.base.engine"):
        validate(config(base=fake_server(), spec=fake_server(method="ngram", drafts=3)))


def test_its_sweep_launch_environment_and_control_are_the_adapters(fake):
    from specmatch import pipeline
    from specmatch.controls import control_plan, why_no_control
    from specmatch.sweep import sweeps

    cfg = config(base=fake_server(), spec=fake_server(method="ngram", drafts=[1, 2, 4]))
    cfg["summary"] = {"controls": {"configured_off": True}}
    cfg = validate(cfg)
    # the sweepable key is the adapter's: one member per value, named as every sweep's members are
    assert [n for n in cfg["servers"] if n != "base"] == ["spec@k=1", "spec@k=2", "spec@k=4"]
    assert cfg["servers"]["spec@k=2"]["speculative"] == {"method": "ngram", "drafts": 2}
    (sw,) = sweeps({"spec": fake_server(method="ngram", drafts=[1, 2, 4])})
    assert (sw.engine, sw.field, sw.label, sw.ks()) == ("fake", "drafts", "k", {1: "spec@k=1", 2: "spec@k=2",
                                                                                4: "spec@k=4"})
    with pytest.raises(SpecmatchError, match="not supported for engine fake; it sweeps drafts"):
        sweeps({"spec": fake_server(method="ngram", num_speculative_tokens=[1, 2])})
    # launch: its plan, its environment, its batch
    srv = cfg["servers"]["spec@k=2"]
    plan = get_engine(srv).launch_plan(8123, 64)
    assert plan.argv[1:3] == ["-m", "fake_engine"] and plan.env == {"FAKE": "1"} and plan.base_url.endswith(":8123")
    assert pipeline.launch_env(srv) == "fake-env"
    # the configured-off control: the adapter's own "configured, drafting nothing", for the sweep's largest k
    extra, why = control_plan(cfg)
    assert why == {} and list(extra) == ["spec@k=4__off"]
    assert extra["spec@k=4__off"]["speculative"] == {"method": "ngram", "drafts": 4,
                                                     BY_BATCH: [[1, FakeEngine.launch_max_batch(max(cfg["concurrency"])), 0]]}
    assert why_no_control(srv) is None and why_no_control(fake_server()) == "it does not speculate"
    # a schedule that mixes plain and speculative steps is the adapter's to recognise
    from specmatch.deciding.explaining.attribution import mixed_schedule
    assert mixed_schedule(extra["spec@k=4__off"]["speculative"]) is False
    assert mixed_schedule({"drafts": 3, BY_BATCH: [[1, 4, 3], [5, 32, 0]]}) is True


@pytest.mark.slow
def test_a_recommendation_for_it_is_decided_neutrally_and_rendered_by_its_adapter(fake, tmp_path):
    """The recommend step derives `spec__recommended` with the adapter's config; decide and summary write
    and print the adapter's own lines, and no other engine's syntax appears."""
    from specmatch.deciding.recommend import main as recommend_main

    cells = experiment(np.random.default_rng(0), {1: 1.5, 4: 1.2, 16: 0.6}, repeats=3, session_sd=0.01, cell_sd=0.01)
    for res, _ in cells:
        res.flavor = "fake"
    spec = {"method": "ngram", "drafts": 3}
    cfgs = {"baseline": fake_server(), "spec": {**fake_server(**spec), "suites": ["s"]}}
    cp, rp = write_cells(tmp_path, cells)
    lp = []
    for name, cfg in cfgs.items():
        p = tmp_path / "servers" / name / "r1" / "launch.json"
        write_json(p, launch_record(name, cfg.get("speculative"), engine="fake", flavor="fake", max_batch=32,
                                    config=cfg, engine_versions={"fake-engine": "1.0"}).to_json())
        lp.append(str(p))
    common = ["--baseline", "baseline", "--settings", json.dumps({"bootstrap": 300}), "--servers", json.dumps(cfgs),
              "--requests", *rp, "--launches", *lp, "--suites", "s"]
    rec_dir = tmp_path / "recommend"
    assert recommend_main([*common, "--cells", *cp, "--out", str(rec_dir / "servers.json"),
                           "--recommendations", str(rec_dir / "recommendations.json")]) == 0
    [rec] = json.loads((rec_dir / "recommendations.json").read_text())
    schedule = Schedule.from_json(rec["schedule"])
    assert rec["action"] == "schedule" and schedule.max_batch == 32 and schedule.bands[0][:1] == [1]
    assert schedule.bands[0][2] == 3 and schedule.bands[-1][1:] == [32, 0]   # its own k where it pays, off above
    deploy = Deployment.from_json(rec["deploy"])
    assert deploy.engine == "fake" and deploy.speculative == {**spec, BY_BATCH: schedule.bands}
    assert deploy.flag == "Fake: `--drafts-by-batch " + ",".join(f"{a}-{b}:{k}" for a, b, k in schedule.bands) + "`"
    derived = json.loads((rec_dir / "servers.json").read_text())["servers"]
    assert derived["spec__recommended"]["config"] == {"engine": "fake", "model": "/m", "speculative": deploy.speculative}

    out = tmp_path / "summary"
    decide_and_render(out, [*common, "--recommendations", str(rec_dir / "recommendations.json"),
                            "--derived", str(rec_dir / "servers.json")], cp)
    [decided] = json.loads((out / "recommendations.json").read_text())
    assert decided["schedule"] == rec["schedule"] and decided["deploy"] == rec["deploy"]
    md = (out / "summary.md").read_text()
    assert deploy.flag in md and deploy.note in md
    assert "--speculative-config" not in md and "vLLM:" not in md and "SGLang:" not in md
