"""The server manager: reuse, restart, start-up failures with the log tail, and the watchdog."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from builders import REPO
from specmatch.files import SpecmatchError
from specmatch.serving.server import Manager, group_alive, pid_alive


def engine_python(tmp_path: Path, body: str) -> str:
    """An executable standing in for an engine's python: it gets the real vLLM argv."""
    exe = tmp_path / f"fakepython_{abs(hash(body))}"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    return str(exe)


def fake_vllm(tmp_path: Path, config_source: str) -> Path:
    """A folder for PYTHONPATH holding a package `vllm` whose `vllm.config` is `config_source`: what
    the engine's speculative-key check imports, without vLLM's 12 s."""
    fake = tmp_path / "fake"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("")
    (fake / "vllm" / "config.py").write_text(config_source)
    return fake


@pytest.fixture
def fake_python(tmp_path):
    # tagged with the test's folder, so a test finds its own servers among other tests' (fakeservers_of)
    return engine_python(tmp_path, f'SPECMATCH_FAKE_TAG={tmp_path} exec {sys.executable} {REPO}/tests/fakeserver.py '
                                   '--tokens 4 "$@"')


def fakeservers_of(tmp_path) -> list[int]:
    """Live fake servers started through this test's fake_python (scripts/test.sh runs two test
    processes: the other one's servers are not this test's)."""
    out = subprocess.run(["pgrep", "-f", "fakeserver.py"], capture_output=True, text=True).stdout.split()
    mine = []
    for pid in map(int, out):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (FileNotFoundError, PermissionError):
            continue
        if f"SPECMATCH_FAKE_TAG={tmp_path}".encode() in env:
            mine.append(pid)
    return mine


def cfg(python, **kw):
    return {"engine": "vllm", "model": "m", "python": python, "profile": "gpu", "startup_timeout_s": 30,
            "idle_timeout_s": 600, **kw}


def wait_dead(pid, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if not pid_alive(pid) and not group_alive(pid):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow  # starts, reuses and restarts a fake server: about 6 s
def test_reuse_then_restart_on_config_change(tmp_path, fake_python):
    m = Manager(tmp_path / "state")
    a = m.attach("a", cfg(fake_python), 8, tmp_path / "a.log", session="r1")
    assert not a.reused and a.startup_s is not None
    assert requests.get(a.base_url + "/health", timeout=5).status_code == 200
    assert a.base_url.startswith("http://127.0.0.1:")
    again = m.attach("a", cfg(fake_python), 8, tmp_path / "a.log", session="r1")
    assert again.reused and again.pid == a.pid
    fresh = m.attach("a", cfg(fake_python), 8, tmp_path / "a.log", session="r2")  # a new repeat: a new session
    assert not fresh.reused and fresh.pid != a.pid and wait_dead(a.pid, 5)
    a = fresh
    b = m.attach("b", cfg(fake_python, args=["--seed", "1"]), 8, tmp_path / "b.log", session="r2")
    assert not b.reused and b.pid != a.pid
    assert wait_dead(a.pid, 5), "the replaced server must be gone before the new one starts"
    assert m.read_current()["name"] == "b"
    stopped = m.stop_current()
    assert stopped["pid"] == b.pid and wait_dead(b.pid, 30)
    assert m.read_current() is None


@pytest.mark.slow
def test_startup_crash_reports_log_tail(tmp_path):
    py = engine_python(tmp_path, 'echo "CUDA out of memory: boom" >&2; exit 3')
    m = Manager(tmp_path / "state")
    with pytest.raises(SpecmatchError) as e:
        m.attach("x", cfg(py), 8, tmp_path / "x.log")
    assert "exit status 3" in str(e.value) and "boom" in str(e.value) and "x.log" in str(e.value)
    assert m.read_current() is None


@pytest.mark.slow
def test_startup_timeout_kills_and_reports(tmp_path):
    py = engine_python(tmp_path, 'echo "loading weights..."; exec sleep 600')
    m = Manager(tmp_path / "state")
    with pytest.raises(SpecmatchError) as e:
        m.attach("slow", cfg(py, startup_timeout_s=2), 8, tmp_path / "s.log")
    assert "not healthy after 2 s" in str(e.value) and "loading weights" in str(e.value)
    out = subprocess.run(["pgrep", "-f", f"{py}"], capture_output=True, text=True).stdout
    assert not out.strip()


@pytest.mark.slow
def test_watchdog_stops_server_when_owner_dies(tmp_path, fake_python, monkeypatch):
    owner = subprocess.Popen(["sleep", "600"])
    monkeypatch.setenv("SPECMATCH_OWNER_PID", str(owner.pid))
    monkeypatch.setenv("PYTHONPATH", str(REPO / "workflow"))
    m = Manager(tmp_path / "state")
    a = m.attach("a", cfg(fake_python), 8, tmp_path / "a.log")
    time.sleep(1.5)
    assert pid_alive(a.pid)
    owner.kill()
    owner.wait()
    assert wait_dead(a.pid, 30), "watchdog did not stop the server after its owner died"
    deadline = time.time() + 10  # the watchdog forgets the server right after the group is gone
    while m.read_current() is not None and time.time() < deadline:
        time.sleep(0.1)
    assert m.read_current() is None


@pytest.mark.slow  # starts a fake server and waits for the watchdog to stop it: a few seconds
def test_watchdog_idle_timeout(tmp_path, fake_python, monkeypatch):
    """A server whose lease nobody touched for longer than its idle timeout is stopped. The timeout (30 s)
    outlasts any start-up on a busy machine; the lease is then made that old rather than waited out."""
    monkeypatch.delenv("SPECMATCH_OWNER_PID", raising=False)
    m = Manager(tmp_path / "state")
    a = m.attach("a", cfg(fake_python, idle_timeout_s=30), 8, tmp_path / "a.log")
    assert pid_alive(a.pid)
    old = time.time() - 60
    os.utime(m.lease, (old, old))
    assert wait_dead(a.pid, 30)
    assert "idle for" in (tmp_path / "state" / "watchdog.log").read_text()


@pytest.mark.slow  # starts a fake server and waits for its death to be recorded: about 5 s
def test_a_server_that_dies_is_reported_with_its_exit_status_and_log(tmp_path, fake_python):
    """Defect: when the server died mid-cell the only message was "32 of 32 requests failed ... stream
    cut short". Its watchdog (its parent) records how it ended; the manager says so, with the log."""
    import signal

    m = Manager(tmp_path / "state")
    a = m.attach("a", cfg(fake_python), 8, tmp_path / "a.log")
    assert m.death_notice(a) is None
    os.killpg(a.pid, signal.SIGKILL)
    assert wait_dead(a.pid, 10)
    notice = m.death_notice(a)
    assert "server a (pid" in notice and "killed by signal 9 (SIGKILL)" in notice
    assert "a.log" in notice and "=== specmatch: starting a" in notice


@pytest.mark.slow  # two fake servers' start-ups and 3.5 s of scripted checks
def test_the_engines_own_check_runs_beside_the_start_up_and_a_refusal_stops_the_server(tmp_path, fake_python,
                                                                                       monkeypatch):
    """vLLM's speculative keys are read by importing vLLM (about 12 s): beside the server's own start-up,
    whose imports leave a core idle. A key it does not know stops the server before anything is measured,
    as soon as the check says so; a check slower than the start-up is waited for."""
    from specmatch.serving.engines import vllm as vllm_engine

    def fields(delay, known):
        def read(python, cache_dir=None):
            time.sleep(delay)
            return "0.32.0", frozenset(known), ""
        return read

    spec = {"method": "eagle3", "model": "d", "num_speculative_tokens": 3, "speculative_token_schedule": [[1, 4, 3]]}
    m = Manager(tmp_path / "state")
    monkeypatch.setattr(vllm_engine, "speculative_fields", fields(1.0, {"method", "model", "num_speculative_tokens"}))
    t0 = time.time()
    with pytest.raises(SpecmatchError, match="speculative.speculative_token_schedule: vLLM 0.32.0 has no such"):
        m.attach("s", cfg(fake_python, speculative=spec), 8, tmp_path / "s.log")
    assert m.read_current() is None
    assert not fakeservers_of(tmp_path), "the refused server must be stopped"
    assert time.time() - t0 < 20

    known = {"method", "model", "num_speculative_tokens", "speculative_token_schedule"}
    monkeypatch.setattr(vllm_engine, "speculative_fields", fields(2.5, known))
    t0 = time.time()
    a = m.attach("s", cfg(fake_python, speculative=spec), 8, tmp_path / "s2.log", session="r2")
    assert time.time() - t0 >= 2.5 and a.startup_s >= 2.5  # healthy only once the check has passed
    assert requests.get(a.base_url + "/health", timeout=5).status_code == 200
    assert fakeservers_of(tmp_path), "a live server of this test is found (what the refusal's check looks for)"
    m.stop_current()
    assert wait_dead(a.pid, 30)


@pytest.mark.slow
def test_the_engines_check_does_not_outlive_the_process_that_started_it(tmp_path):
    """The speculative-key check imports vLLM in a child python (about 12 s, in a thread beside the
    start-up). When the process that started it ends (a killed Snakemake, or a launch that failed
    otherwise and exits), the child ends with it instead of importing on alone."""
    fake = fake_vllm(tmp_path,   # an import that takes a minute, telling its pid first
                     f"import os, time\nopen({str(tmp_path / 'child.pid')!r}, 'w').write(str(os.getpid()))\n"
                     "time.sleep(60)\n")
    python = engine_python(tmp_path, f'PYTHONPATH={fake} exec {sys.executable} "$@"')
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import sys, time; sys.path.insert(0, {str(REPO / 'workflow')!r})\n"
                               "from specmatch.serving.server import Check\n"
                               "from specmatch.serving.engines.vllm import _read_speculative_fields\n"
                               f"Check(_read_speculative_fields, {python!r})\n"
                               "time.sleep(60)\n"])
    pid_file = tmp_path / "child.pid"
    deadline = time.time() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    assert pid_alive(child)
    parent.kill()
    parent.wait()
    assert wait_dead(child, 5), "the check's child outlived the process that started it"


def test_the_engines_check_runs_behind_a_wrapper_that_does_not_exec(tmp_path):
    """An engine's python may be a wrapper script that starts python without `exec`, so the check's
    python is the shell's child, not ours: the check must still read the fields (the early exit is
    for a starting process that is gone, not for a different parent)."""
    from specmatch.serving.engines.vllm import _read_speculative_fields
    fake = fake_vllm(tmp_path, "import dataclasses\n@dataclasses.dataclass\nclass SpeculativeConfig:\n"
                               "    method: str = ''\n    num_speculative_tokens: int = 0\n")
    python = engine_python(tmp_path, f'PYTHONPATH={fake} {sys.executable} "$@"\nexit $?')
    version, fields, error = _read_speculative_fields(python)
    assert fields == {"method", "num_speculative_tokens"}, error


# -- SLURM: per-allocation state, and a cell that SLURM ends (tests/test_slurm.py runs the real one) --
def test_clean_allocations_removes_ended_ones_and_keeps_running_ones(tmp_path):
    from specmatch.serving.server import clean_allocations

    for name in ("vm-slurm7", "vm-slurm8", "vm-slurm9", "node2-slurm10", "vm"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "exit.json").write_text("{}")
    # 7 finished, 8 runs, 9 was cancelled, 10 is no longer listed (past MinJobAge): only 8 stays
    asked = []

    def states(ids):
        asked.append(sorted(ids))
        return {"7": "COMPLETED", "8": "RUNNING", "9": "CANCELLED"}

    lines = clean_allocations(tmp_path, states=states)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vm", "vm-slurm8"]
    assert asked == [["10", "7", "8", "9"]]
    assert lines[0].startswith("removed the server state of 3 ended SLURM allocation(s)")
    assert lines[1] == "kept the server state of SLURM allocation(s) still 8 RUNNING: each one's server ends with it"


def test_clean_allocations_keeps_everything_when_slurm_cannot_be_asked(tmp_path):
    from specmatch.serving.server import clean_allocations

    (tmp_path / "vm-slurm3").mkdir()

    def states(ids):
        raise FileNotFoundError("squeue")

    assert "cannot ask SLURM" in clean_allocations(tmp_path, states=states)[0]
    assert (tmp_path / "vm-slurm3").is_dir()
    assert clean_allocations(tmp_path / "none") == []


@pytest.mark.slow
def test_clean_allocations_waits_for_an_allocation_still_completing(tmp_path):
    from specmatch.serving.server import clean_allocations

    (tmp_path / "vm-slurm4").mkdir()
    answers = iter(["COMPLETING", "COMPLETED"])
    clean_allocations(tmp_path, wait_s=10, states=lambda ids: {"4": next(answers)})
    assert not (tmp_path / "vm-slurm4").exists()


def test_end_of_run_creates_no_state_folder_on_a_host_that_ran_no_server(tmp_path, monkeypatch):
    from specmatch.serving import server

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPECMATCH_STATE_DIR", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert server.end_of_run() == []
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_a_terminated_cell_says_why_in_its_log_and_dies_of_the_signal(tmp_path):
    """What a cell does when SLURM ends its allocation (SIGTERM to every process of the job): it says
    so on stderr (the cell's log) and dies of the signal, so nothing is written after it."""
    code = ("import os, sys, time\n"
            f"sys.path.insert(0, {str(REPO / 'workflow')!r})\n"
            "from specmatch.serving.server import LeaseKeeper, Manager\n"
            f"with LeaseKeeper(Manager({str(tmp_path / 'state')!r})):\n"
            "    print('measuring', flush=True)\n"
            "    time.sleep(60)\n"
            "print('result written')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "SPECMATCH_OWNER_PID")}
    err = terminated_while(code, "measuring", env)
    assert "specmatch: the cell was stopped by SIGTERM; it is aborted and writes no result" in err


def terminated_while(code: str, ready: str, env: dict) -> str:
    """Runs `code`, terminates it once it printed `ready`, checks it died of SIGTERM before writing its
    result; returns its stderr."""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    assert p.stdout.readline().strip() == ready
    p.terminate()
    out, err = p.communicate(timeout=30)
    assert p.returncode == -15 and "result written" not in out
    return err


def test_any_step_ended_by_slurm_says_why_even_while_it_loads(tmp_path):
    """`python -m specmatch` installs the notice before a step's imports: a step SLURM ends while it
    loads, or while its server starts, names the allocation and the cause (here from a stand-in
    squeue answering as SLURM 22.05 does after scancel) and dies of the signal."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text("#!/bin/sh\necho 'COMPLETING|None'\n")
    squeue.chmod(0o755)
    code = ("import sys, time\n"
            f"sys.path.insert(0, {str(REPO / 'workflow')!r})\n"
            "from specmatch.ending import announce_termination\n"
            "assert announce_termination('cell')\n"
            "print('loading', flush=True)\n"
            "time.sleep(60)\n"
            "print('result written')\n")
    env = {**os.environ, "SLURM_JOB_ID": "77", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    err = terminated_while(code, "loading", env)
    assert ("specmatch cell: stopped by SIGTERM: SLURM is ending allocation 77: cancelled (scancel) "
            "(squeue: COMPLETING None); it is aborted and writes no result") in err


@pytest.mark.slow
def test_the_entry_point_installs_the_notice_first_and_leaves_the_watchdog_its_own():
    probe = ("import runpy, signal, sys\n"
             f"sys.path.insert(0, {str(REPO / 'workflow')!r})\n"
             "sys.argv = ['specmatch', sys.argv[1], '--help']\n"
             "try:\n"
             "    runpy.run_module('specmatch', run_name='__main__')\n"
             "except SystemExit:\n"
             "    pass\n"
             "print('DEFAULT' if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else 'NOTICE', file=sys.stderr)\n")
    got = {step: subprocess.run([sys.executable, "-c", probe, step], capture_output=True, text=True,
                                timeout=60).stderr.strip().splitlines()[-1]
           for step in ("cell", "watchdog")}
    assert got == {"cell": "NOTICE", "watchdog": "DEFAULT"}
    # a handler someone else installed stays theirs
    code = ("import signal, sys\n"
            f"sys.path.insert(0, {str(REPO / 'workflow')!r})\n"
            "from specmatch.ending import announce_termination\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print(announce_termination('cell'), signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)\n")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60).stdout.split() == ["False", "True"]


@pytest.mark.slow
def test_a_jobs_snakemake_orphaned_inside_an_allocation_ends_with_what_it_started(tmp_path):
    """SLURM's linuxproc tracking loses a job's Snakemake once its parent shell has died of the
    allocation's SIGTERM, and Snakemake's SIGTERM handler can hang: the guard ends it (and its
    children) a grace after the parent's death, not before, and not while the parent lives."""
    err = tmp_path / "job.err"
    job = ("import os, signal, subprocess, sys, threading, time\n"
           f"sys.path.insert(0, {str(REPO / 'workflow')!r})\n"
           "from specmatch.ending import end_when_orphaned\n"
           "assert end_when_orphaned(grace_s=1.0, poll_s=0.1)\n"
           "lock = threading.Lock()\n"
           "lock.acquire()\n"
           "signal.signal(signal.SIGTERM, lambda *a: lock.acquire())  # a handler that never returns\n"
           "child = subprocess.Popen(['sleep', '300'])\n"
           "print(os.getpid(), child.pid, flush=True)\n"
           "time.sleep(300)\n")
    shell = ("import subprocess, sys, time\n"
             "subprocess.Popen([sys.executable, '-c', sys.argv[1]], stderr=open(sys.argv[2], 'w'))\n"
             "time.sleep(300)\n")
    env = {**os.environ, "SLURM_JOB_ID": "77"}
    p = subprocess.Popen([sys.executable, "-c", shell, job, str(err)], stdout=subprocess.PIPE, text=True, env=env)
    job_pid = child_pid = None
    try:
        job_pid, child_pid = map(int, p.stdout.readline().split())
        os.kill(job_pid, signal.SIGTERM)   # its handler hangs
        time.sleep(1.5)                    # past the grace while the parent lives: nothing happens
        assert pid_alive(job_pid) and pid_alive(child_pid)
        killed = time.time()
        p.kill()                           # the parent dies: the job is re-parented
        p.wait(10)
        time.sleep(0.3)                    # within the grace: still there
        alive = pid_alive(job_pid) and pid_alive(child_pid)
        # (a busy machine may wake this test only after the grace: then the guard may already have acted)
        assert alive or time.time() - killed >= 1.0
        deadline = time.time() + 15
        while (pid_alive(job_pid) or pid_alive(child_pid)) and time.time() < deadline:
            time.sleep(0.1)
        assert not pid_alive(job_pid) and not pid_alive(child_pid)
        assert "SLURM allocation 77 is being taken down; it ends now (SIGKILL)" in err.read_text()
    finally:
        if p.poll() is None:
            p.kill()
        for pid in (job_pid, child_pid):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_job_whose_parent_was_gone_before_the_guard_started_is_ended_too(tmp_path):
    code = ("import os, sys, time\n"
            f"sys.path.insert(0, {str(REPO / 'workflow')!r})\n"
            "if os.fork():\n"
            "    os._exit(0)          # the parent goes first: the child is re-parented\n"
            "time.sleep(0.5)\n"
            "from specmatch.ending import end_when_orphaned\n"
            "print(os.getpid(), flush=True)\n"
            "end_when_orphaned(grace_s=1.0, poll_s=0.1)\n"
            "time.sleep(300)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env={**os.environ, "SLURM_JOB_ID": "77"})
    pid = int(p.stdout.readline())
    try:
        deadline = time.time() + 15
        while pid_alive(pid) and time.time() < deadline:
            time.sleep(0.1)
        assert not pid_alive(pid)
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_the_workflow_arms_the_guard_only_in_a_jobs_snakemake_inside_an_allocation():
    """workflow/rules/common.smk passes Snakemake's `workflow.remote_exec` (ExecMode.REMOTE: the
    Snakemake that runs jobs inside an allocation) as `job`; the guard starts only there."""
    import snakemake.api  # noqa: F401  (snakemake.workflow alone is a circular import)
    from snakemake.workflow import Workflow

    assert isinstance(Workflow.__dict__.get("remote_exec"), property)
    assert "job=workflow.remote_exec" in (REPO / "workflow" / "rules" / "common.smk").read_text()
    code = ("import os, sys, threading\n"
            f"sys.path.insert(0, {str(REPO / 'workflow')!r})\n"
            "from specmatch.workflow_env import prepare\n"
            "prepare(sys.argv[1], conda=False, job=sys.argv[2] == 'job')\n"
            "print(any(t.name == 'specmatch-orphan-guard' for t in threading.enumerate()))\n")

    def armed(job: bool, slurm: bool) -> bool:
        env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"} | ({"SLURM_JOB_ID": "77"} if slurm else {})
        out = subprocess.run([sys.executable, "-c", code, str(REPO / "workflow"), "job" if job else "run"],
                             capture_output=True, text=True, env=env, timeout=60)
        return out.stdout.strip() == "True"

    assert armed(True, True) and not armed(True, False) and not armed(False, True)
