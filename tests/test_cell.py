"""One cell run by hand against a scripted server: failures fail the job without a complete-looking file."""
import json

import polars as pl
import pytest
import yaml

from builders import REPO, REQ, cell_args, prompt, prompts_file
from specmatch.measuring.cell import check_load, main, plan_requests
from specmatch.config import load, passes_for, requests_settings, validate
from specmatch.files import SpecmatchError
from specmatch.records import CellResult, Interference, RequestSettings


def test_failures_over_the_bound_fail_the_cell(tmp_path, fake_server):
    srv = fake_server(tokens=8, ttft=0.005, itl=0.001)
    p = prompts_file(tmp_path, ["ok one", "ok two", "FAIL500 three"])
    assert main(cell_args(tmp_path, srv.base_url, p, REQ)) == 2
    assert not (tmp_path / "c2.json").exists() and not (tmp_path / "c2.requests.parquet").exists()
    partial = json.loads((tmp_path / "c2.failed.json").read_text())
    assert partial["failed"] == 2 and partial["completed"] == 4 and partial["failure_reasons"] == {"http": 2}
    recs = pl.read_parquet(tmp_path / "c2.failed.requests.parquet")
    assert recs.height == 6 and recs.filter(~pl.col("ok"))["error"].str.contains("HTTP 500").all()


def test_tolerated_failures_are_counted(tmp_path, fake_server):
    srv = fake_server(tokens=8, ttft=0.005, itl=0.001, spec={"k": 2, "accept": 1})
    p = prompts_file(tmp_path, ["ok one", "ok two", "FAIL500 three"])
    assert main(cell_args(tmp_path, srv.base_url, p, {**REQ, "max_failure_fraction": 0.5})) == 0
    cell = json.loads((tmp_path / "c2.json").read_text())
    assert cell["failed"] == 2 and cell["completed"] == 4 and cell["total_output_tokens"] == 32
    assert cell["cache_reset"] == "ok" and srv.resets == 1
    assert cell["spec_decode_acceptance_rate"] == 0.5  # from the /metrics delta over this cell only
    assert (tmp_path / "c2.json.prov.json").exists()


def test_same_prompt_order_for_every_server():
    prompts = [prompt(i, f"t{i}") for i in range(5)]
    a = plan_requests(prompts, 3, seed=3)
    assert a == plan_requests(prompts, 3, seed=3) and len(a) == 15
    for k in range(3):  # every prompt exactly once per pass, passes in order
        assert sorted(p.id for p, kk in a[5 * k:5 * k + 5] if kk == k) == [f"s-{i}" for i in range(5)]
    assert [p.id for p, _ in a[:5]] != [p.id for p, _ in a[5:10]]  # each pass in its own seeded order


@pytest.mark.slow
def test_every_concurrency_measures_the_whole_suite_and_never_the_warmup(tmp_path, fake_server):
    """Defect 6: each concurrency measured a different subset of the suite, and when n + warmup
    exceeded the suite, warm-up prompts were measured again after the cache reset."""
    srv = fake_server(tokens=4, ttft=0.001, itl=0.001)
    p = prompts_file(tmp_path, [f"prompt {i}" for i in range(5)])
    req = {**REQ, "passes": 1, "warmup": 3}
    for c in ("1", "4"):
        a = cell_args(tmp_path, srv.base_url, p, req)
        a[a.index("--concurrency") + 1] = c
        a[a.index("--out") + 1] = str(tmp_path / f"c{c}.json")
        a[a.index("--requests-out") + 1] = str(tmp_path / f"c{c}.requests.parquet")
        assert main(a) == 0
        recs = pl.read_parquet(tmp_path / f"c{c}.requests.parquet")
        assert sorted(recs["prompt_id"].to_list()) == [f"s-{i}" for i in range(5)]
        cell = json.loads((tmp_path / f"c{c}.json").read_text())
        assert cell["num_prompts"] == 5 and cell["warmup_requests"] == 3
    # per cell: three warm-up requests (prompts of their own), then the reset, then the suite
    assert srv.events == (["warmup"] * 3 + ["reset"] + ["request"] * 5) * 2


def test_a_suite_too_small_for_the_concurrency_is_an_error(tmp_path, fake_server):
    srv = fake_server(tokens=4)
    a = cell_args(tmp_path, srv.base_url, prompts_file(tmp_path, ["a"]), {**REQ, "passes": 1})
    assert main(a) == 1 and not (tmp_path / "c2.json").exists()


@pytest.mark.slow
def test_a_server_that_dies_mid_cell_is_named_with_its_exit_status(tmp_path, capsys):
    """Defect 12: the only message was "32 of 32 requests failed ... stream cut short"."""
    import sys

    exe = tmp_path / "fakepython"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {REPO}/tests/fakeserver.py --tokens 8 --ttft 0.01 --itl 0.01 "$@"\n')
    exe.chmod(0o755)
    server = {"engine": "vllm", "model": "m", "python": str(exe), "profile": "gpu", "startup_timeout_s": 30}
    p = prompts_file(tmp_path, ["fine", "DIE now", "fine too"])
    a = cell_args(tmp_path, "http://unused", p, {**REQ, "passes": 1, "timeout_s": 5})
    a[a.index("--server") + 1] = json.dumps(server)
    a += ["--server-log", str(tmp_path / "server.log")]
    assert main(a) == 2
    err = capsys.readouterr().err
    assert "server ext (pid" in err and "died: exit status 7" in err and "server.log" in err
    assert not (tmp_path / "c2.json").exists()


def test_suite_size_and_passes_have_one_rule_for_config_and_cell():
    """A suite's own passes override the config's (what every cell of it is sent with), and the config
    check and the cell's own check refuse the same suite: every cell sends each prompt once per pass."""
    cfg = load(REPO / "config.yaml")
    name = next(iter(cfg["suites"]))
    cfg["suites"][name]["passes"] = 3
    assert requests_settings(cfg, name) == {**cfg["requests"], "passes": 3}
    assert RequestSettings.from_json(requests_settings(cfg, name)).passes == 3
    cfg["suites"][name]["passes"] = None
    assert requests_settings(cfg, name) == cfg["requests"]
    highest = max(cfg["concurrency"])
    raw = yaml.safe_load((REPO / "config.yaml").read_text())
    raw["suites"][name].update(size=highest // 2, passes=2)
    validate(raw)  # 2 passes of half the concurrency keep it busy ...
    check_load(highest // 2, 2, highest, name)
    raw["suites"][name].update(size=highest // 2 - 1)
    with pytest.raises(SpecmatchError, match="cannot keep concurrency"):
        validate(raw)  # ... one prompt fewer does not, for the config and for the cell alike
    with pytest.raises(SpecmatchError, match="cannot keep concurrency"):
        check_load(highest // 2 - 1, 2, highest, name)


# -- interference: re-measure, flag or fail ----------------------------------------------------------------
def reading(flagged: bool, foreign: float = 0.0) -> Interference:
    return Interference(available=True, window_s=1.0, samples=2, other_cpu_cores=foreign, foreign_cpu_cores=foreign,
                        threshold_cores=0.1, flagged=flagged,
                        why=[f"{foreign:.2f} cores used by others (other processes {foreign:.2f}) > threshold 0.1"]
                        if flagged else [])


@pytest.fixture
def scripted_readings(monkeypatch):
    """The cell's sampler replaced by one that returns the given readings in turn (the accounting itself is
    tests/test_interference.py's): what the cell does with a flagged measurement."""
    import specmatch.measuring.cell as cell_module

    queue: list[Interference] = []
    windows = []

    class Scripted:
        def __init__(self, owners, **kw):
            self.owners = owners

        def __enter__(self):
            windows.append("start")
            return self

        def __exit__(self, *exc):
            windows.append("stop")

        def result(self, threshold):
            return queue.pop(0)

    monkeypatch.setattr(cell_module, "Sampler", Scripted)

    def set_readings(*rs):
        queue[:] = list(rs)
        return windows
    return set_readings


def run_c2(tmp_path, srv, req):
    p = prompts_file(tmp_path, ["one", "two", "three"])
    return main(cell_args(tmp_path, srv.base_url, p, req))


def test_a_flagged_cell_is_remeasured_once_and_the_remeasurement_kept(tmp_path, fake_server, scripted_readings):
    srv = fake_server(tokens=4, ttft=0.001, itl=0.001)
    windows = scripted_readings(reading(True, 0.9), reading(False, 0.01))
    assert run_c2(tmp_path, srv, {**REQ, "passes": 1, "on_interference": "remeasure"}) == 0
    cell = CellResult.from_json(json.loads((tmp_path / "c2.json").read_text()))
    assert not cell.flagged and cell.interference.foreign_cpu_cores == 0.01
    assert len(cell.earlier) == 1 and cell.earlier[0].interference.flagged
    assert cell.earlier[0].interference.foreign_cpu_cores == 0.9 and cell.earlier[0].output_throughput > 0
    assert cell.earlier[0].started_at < cell.started_at
    # the warm-up once, then each measurement after its own cache reset; the sampler only around measurements
    assert srv.events == ["reset"] + ["request"] * 3 + ["reset"] + ["request"] * 3
    assert windows == ["start", "stop", "start", "stop"]
    assert cell.completed == 3 and pl.read_parquet(tmp_path / "c2.requests.parquet").height == 3
    prov = json.loads((tmp_path / "c2.json.prov.json").read_text())
    assert prov["interference"]["remeasured"] == 1 and prov["interference"]["flagged"] is False


@pytest.mark.slow
def test_a_cell_still_flagged_after_its_remeasurement_stays_flagged(tmp_path, fake_server, scripted_readings, capsys):
    srv = fake_server(tokens=4, ttft=0.001, itl=0.001)
    scripted_readings(reading(True, 0.9), reading(True, 0.5))
    assert run_c2(tmp_path, srv, {**REQ, "passes": 1, "on_interference": "remeasure"}) == 0
    cell = CellResult.from_json(json.loads((tmp_path / "c2.json").read_text()))
    assert cell.flagged and cell.interference.foreign_cpu_cores == 0.5 and len(cell.earlier) == 1
    err = capsys.readouterr().err
    assert "re-measured" in err and "flagged (requests.on_interference: remeasure)" in err


@pytest.mark.slow
def test_flag_keeps_one_measurement_and_fail_fails_the_cell(tmp_path, fake_server, scripted_readings, capsys):
    srv = fake_server(tokens=4, ttft=0.001, itl=0.001)
    scripted_readings(reading(True, 0.9))
    assert run_c2(tmp_path, srv, {**REQ, "passes": 1, "on_interference": "flag"}) == 0
    cell = CellResult.from_json(json.loads((tmp_path / "c2.json").read_text()))
    assert cell.flagged and cell.earlier == [] and srv.events.count("reset") == 1
    (tmp_path / "c2.json").unlink()
    scripted_readings(reading(True, 0.9))
    assert run_c2(tmp_path, srv, {**REQ, "passes": 1, "on_interference": "fail"}) == 2
    assert not (tmp_path / "c2.json").exists() and (tmp_path / "c2.failed.json").exists()
    err = capsys.readouterr().err
    assert "was not this cell's own" in err and "0.90 cores used by others" in err and "on_interference: fail" in err
    scripted_readings(reading(False, 0.0))
    assert run_c2(tmp_path, srv, {**REQ, "passes": 1, "on_interference": "fail"}) == 0


def test_every_cell_records_its_interference(tmp_path, fake_server):
    """The real sampler, end to end: a reading with the window and the sampler's own cost in every cell."""
    srv = fake_server(tokens=8, ttft=0.002, itl=0.002)
    assert run_c2(tmp_path, srv, {**REQ, "passes": 2}) == 0
    cell = CellResult.from_json(json.loads((tmp_path / "c2.json").read_text()))
    i = cell.interference
    assert i.available and i.samples >= 2 and i.window_s > 0 and i.cores >= 1 and i.threshold_cores == 0.05
    assert i.sampler_cpu_s > 0 and i.gpu is not None


# -- cell length: min_requests_per_worker -------------------------------------------------------------------
def test_passes_for_gives_every_worker_enough_requests():
    assert passes_for(16, 1, None, 16) == 1            # unset: passes alone (existing configs unchanged)
    assert passes_for(16, 1, 2, 16) == 2 and passes_for(16, 1, 2, 1) == 1 and passes_for(16, 1, 2, 8) == 1
    assert passes_for(16, 3, 2, 16) == 3               # passes stays the minimum
    assert passes_for(10, 1, 3, 4) == 2 and passes_for(16, 1, 4, 16) == 4 and passes_for(5, 1, 1, 16) == 4


@pytest.mark.slow
def test_min_requests_per_worker_lengthens_only_the_cells_that_need_it(tmp_path, fake_server):
    srv = fake_server(tokens=4, ttft=0.001, itl=0.001)
    p = prompts_file(tmp_path, [f"prompt {i}" for i in range(5)])
    req = {**REQ, "passes": 1, "min_requests_per_worker": 2}
    for c, passes in (("1", 1), ("4", 2)):
        a = cell_args(tmp_path, srv.base_url, p, req)
        a[a.index("--concurrency") + 1] = c
        a[a.index("--out") + 1] = str(tmp_path / f"c{c}.json")
        a[a.index("--requests-out") + 1] = str(tmp_path / f"c{c}.requests.parquet")
        assert main(a) == 0
        cell = json.loads((tmp_path / f"c{c}.json").read_text())
        assert cell["passes"] == passes and cell["num_prompts"] == 5 * passes
        assert not any("one burst" in w for w in cell["warnings"])
        recs = pl.read_parquet(tmp_path / f"c{c}.requests.parquet")
        keys = sorted(zip(recs["prompt_id"].to_list(), recs["pass_index"].to_list()))
        assert keys == sorted((f"s-{i}", k) for i in range(5) for k in range(passes))
    # without the rule the same c=4 cell is one burst, and says so
    a = cell_args(tmp_path, srv.base_url, p, {**REQ, "passes": 1})
    a[a.index("--concurrency") + 1] = "4"
    assert main(a) == 0
    assert any("one burst" in w for w in json.loads((tmp_path / "c2.json").read_text())["warnings"])


@pytest.mark.slow
def test_min_requests_per_worker_in_the_config():
    raw = yaml.safe_load((REPO / "resources/configs/cpu_ksweep.yaml").read_text())
    assert validate(raw)["requests"]["min_requests_per_worker"] is None   # the schema's default
    assert validate(raw)["requests"]["on_interference"] == "remeasure"
    name = next(iter(raw["suites"]))
    highest = max(raw["concurrency"])
    raw["suites"][name]["size"] = highest // 2 - 1
    with pytest.raises(SpecmatchError, match="cannot keep concurrency"):
        validate(raw)
    raw["requests"]["min_requests_per_worker"] = 1   # each worker at least one request: enough passes
    cfg = validate(raw)
    assert requests_settings(cfg, name)["min_requests_per_worker"] == 1
    raw["requests"]["on_interference"] = "ignore"
    with pytest.raises(SpecmatchError, match="requests.on_interference"):
        validate(raw)


def test_warmup_requests_are_short_and_never_longer_than_the_measured_ones():
    from specmatch.measuring.cell import warmup_requests

    for endpoint, protocol in (("completions", "openai-completions"), ("chat", "openai-chat")):
        s = RequestSettings(endpoint=endpoint, max_tokens=24, use_reference_length=True)
        warm = warmup_requests(2, protocol, "m", s, {})
        assert [w.payload["max_tokens"] for w in warm] == [8, 8]
        assert [w.payload["max_tokens"] for w in warmup_requests(1, protocol, "m", RequestSettings(max_tokens=5), {})] == [5]
        assert warmup_requests(1, protocol, "m", RequestSettings(max_tokens=24, warmup_tokens=24), {})[0].payload["max_tokens"] == 24
    sg = warmup_requests(1, "sglang-generate", "m", RequestSettings(max_tokens=24), {})[0]
    assert sg.payload["sampling_params"]["max_new_tokens"] == 8
