"""Interference accounting: whose CPU is whose (the server's threads and children, the load generator's
threads: never a neighbour; a separate busy process: a neighbour), /proc parsing, the sampler's
arithmetic on synthetic /proc trees (processes born, exiting, pids reused), and nvidia-smi's CSV."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from specmatch.measuring.interference import (CLK_TCK, NvidiaSmi, Owners, Sampler, listener_pids, parse_compute_apps,
                                              parse_pid_stat, parse_proc_stat, parse_throttle)
from specmatch.records import Interference


# -- parsing ------------------------------------------------------------------------------------------
def stat_line(pid, comm, ppid=1, pgrp=None, session=None, utime=0, stime=0, flags=0x400000, nice=0, start=100,
              state="S"):
    """A /proc/<pid>/stat line (proc(5): 52 fields) with the fields the sampler reads set."""
    f = [str(pid), f"({comm})", state, str(ppid), str(pgrp or pid), str(session or pgrp or pid), "0", "-1", str(flags),
         "0", "0", "0", "0", str(utime), str(stime), "0", "0", "20", str(nice), "1", "0", str(start)]
    return " ".join(f + ["0"] * 30) + "\n"


def test_pid_stat_comm_with_spaces_and_parentheses():
    """The command name ends at the LAST ")": a process may call itself `a) R 1 (b` to fool a parser that
    splits on spaces or stops at the first parenthesis."""
    text = stat_line(4242, "evil) R 1 (x", ppid=7, pgrp=9, session=11, utime=123, stime=45, nice=19, start=999)
    st = parse_pid_stat(text)
    assert (st.pid, st.comm, st.state, st.ppid, st.pgrp, st.session) == (4242, "evil) R 1 (x", "S", 7, 9, 11)
    assert (st.utime, st.stime, st.ticks, st.nice, st.starttime) == (123, 45, 168, 19, 999)
    assert parse_pid_stat(stat_line(5, "kworker/0:1", flags=0x00208040)).kernel_thread
    assert parse_pid_stat(stat_line(6, "tmux: server (1)")).comm == "tmux: server (1)"
    with pytest.raises(ValueError):
        parse_pid_stat("12 no parentheses here")


def test_pid_stat_of_this_process():
    with open(f"/proc/{os.getpid()}/stat") as fh:
        st = parse_pid_stat(fh.read())
    assert st.pid == os.getpid() and st.ppid == os.getppid() and st.pgrp == os.getpgrp() and st.state in "RS"


def test_proc_stat_totals_steal_and_cpus():
    text = ("cpu  100 5 50 1000 7 3 2 40 10 0\ncpu0 50 5 25 500 3 1 1 20 5 0\ncpu1 50 0 25 500 4 2 1 20 5 0\n"
            "intr 1 2 3\nctxt 99\nbtime 1700000000\n")
    c = parse_proc_stat(text)
    assert c.cpus == 2 and c.busy == 155 and c.steal == 40 and c.total == 100 + 5 + 50 + 1000 + 7 + 3 + 2 + 40
    old = parse_proc_stat("cpu  10 0 5 100\ncpu0 10 0 5 100\n")   # a kernel before iowait: 4 columns
    assert old.busy == 15 and old.steal == 0 and old.cpus == 1
    with pytest.raises(ValueError):
        parse_proc_stat("intr 1\n")


# -- nvidia-smi's CSV -----------------------------------------------------------------------------------
# Constructed from NVIDIA's documentation: nvidia-smi(1) ("--query-compute-apps": the fields pid, gpu_uuid,
# used_memory, whose column header is `used_gpu_memory [MiB]`; "--format=csv": a header line of the fields
# with their units in brackets, then one comma-separated line per item; "[N/A]" / "[Not Supported]" where a
# value is unavailable) and the NVML API reference, nvmlClocksThrottleReasons (GpuIdle 0x1,
# ApplicationsClocksSetting 0x2, SwPowerCap 0x4, HwSlowdown 0x8, SyncBoost 0x10, SwThermalSlowdown 0x20,
# HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80, DisplayClockSetting 0x100), the mask nvidia-smi prints as
# clocks_throttle_reasons.active (clocks_event_reasons.active in newer drivers).
APPS = ("pid, gpu_uuid, used_gpu_memory [MiB]\n"
        "4107, GPU-5cd3e1a4-8e8e-5f0a-9f4c-6b0e1c2d3e4f, 30622 MiB\n"
        "5120, GPU-5cd3e1a4-8e8e-5f0a-9f4c-6b0e1c2d3e4f, [N/A]\n")
THROTTLE = ("uuid, clocks_throttle_reasons.active\n"
            "GPU-5cd3e1a4-8e8e-5f0a-9f4c-6b0e1c2d3e4f, 0x0000000000000004\n"
            "GPU-0b6f2a1c-1111-2222-3333-444455556666, 0x0000000000000061\n")


def test_compute_apps_csv():
    apps = parse_compute_apps(APPS)
    assert [(a.pid, a.used_memory_mib) for a in apps] == [(4107, 30622.0), (5120, None)]
    assert apps[0].gpu_uuid == "GPU-5cd3e1a4-8e8e-5f0a-9f4c-6b0e1c2d3e4f"
    assert parse_compute_apps("pid, gpu_uuid, used_gpu_memory [MiB]\n") == []   # no compute process
    with pytest.raises(ValueError):
        parse_compute_apps("pid, used_gpu_memory [MiB]\n1, 2, 3\n")


def test_throttle_reasons_csv():
    got = parse_throttle(THROTTLE)
    assert got["GPU-5cd3e1a4-8e8e-5f0a-9f4c-6b0e1c2d3e4f"] == ["sw_power_cap"]
    assert got["GPU-0b6f2a1c-1111-2222-3333-444455556666"] == ["gpu_idle", "sw_thermal_slowdown", "hw_thermal_slowdown"]
    newer = parse_throttle("uuid, clocks_event_reasons.active\nGPU-x, 0x8000000000000008\n")
    assert newer["GPU-x"] == ["hw_slowdown", "bit_0x8000000000000000"]
    assert parse_throttle("uuid, clocks_throttle_reasons.active\nGPU-y, [Not Supported]\n") == {"GPU-y": []}


class RecordedSmi(NvidiaSmi):
    """nvidia-smi answering recorded text (the parser's input above); `fields` the query fields it knows."""

    def __init__(self, apps: str, throttle: str, fields=("clocks_throttle_reasons.active",)):
        super().__init__(exe="nvidia-smi")
        self.apps, self.throttle_text, self.fields, self.calls = apps, throttle, fields, []

    def _run(self, args):
        self.calls.append(args[0])
        if args[0].startswith("--query-compute-apps"):
            return self.apps
        field = args[0].split(",")[-1]
        return self.throttle_text if field in self.fields else None   # an unknown field: nvidia-smi fails


# -- the sampler on a synthetic /proc --------------------------------------------------------------------
class FakeProc:
    """A /proc tree in a folder: `stat` and `<pid>/stat`, rewritten between scans; a clock the test moves."""

    def __init__(self, root):
        self.root, self.now = root, 0.0
        self.procs: dict[int, str] = {}
        self.cpu = [0] * 10

    def set(self, pid, **kw):
        self.procs[pid] = stat_line(pid, **kw)

    def write(self):
        for d in self.root.iterdir():
            if d.is_dir() and d.name.isdigit() and int(d.name) not in self.procs:
                (d / "stat").unlink()
                d.rmdir()
        for pid, line in self.procs.items():
            (self.root / str(pid)).mkdir(exist_ok=True)
            (self.root / str(pid) / "stat").write_text(line)
        (self.root / "stat").write_text("cpu  " + " ".join(map(str, self.cpu)) + "\ncpu0 0 0 0 0\ncpu1 0 0 0 0\n")


def test_sampler_arithmetic_on_synthetic_proc(tmp_path):
    """Over 10 s: the server (group 500: its leader, an engine worker in its group, a child that left the
    group but descends from it), the load generator (pid 700 and its child) and the workflow running it
    (its ancestors: Snakemake and its job shell) are never counted; a kernel
    thread is reported apart; a neighbour counts its delta; a process born between scans counts all its CPU;
    one that exits keeps what was seen; a reused pid is a new process; /proc/stat's busy time that no
    process accounts for is unattributed; steal is a share of all CPU time."""
    fp = FakeProc(tmp_path)
    fp.set(500, comm="vllm serve", pgrp=500, session=500, utime=1000)
    fp.set(501, comm="EngineCore_0", ppid=500, pgrp=500, session=500, utime=5000)
    fp.set(502, comm="escaped", ppid=501, pgrp=502, session=502, utime=10)
    fp.set(650, comm="snakemake", utime=900)
    fp.set(651, comm="bash", ppid=650, utime=5)
    fp.set(700, comm="python -m specmatch", ppid=651, utime=300)
    fp.set(701, comm="nvidia-smi", ppid=700, pgrp=701, utime=1)
    fp.set(2, comm="kthreadd", flags=0x00208040, ppid=0)
    fp.set(30, comm="kworker/1:2", ppid=2, flags=0x04208060, utime=0, stime=50)
    fp.set(900, comm="yes", nice=19, utime=100)
    fp.set(901, comm="cron job", utime=40, start=50)
    fp.cpu = [1000, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    fp.write()
    s = Sampler(Owners(server_groups={500}, server_pids={500}, own_pids={700}), proc=tmp_path,
                gpu=NvidiaSmi.absent(), clock=lambda: fp.now)
    s._scan()
    fp.now = 5.0
    fp.set(501, comm="EngineCore_0", ppid=500, pgrp=500, session=500, utime=5000 + 5 * CLK_TCK)
    fp.set(502, comm="escaped", ppid=501, pgrp=502, session=502, utime=10 + 2 * CLK_TCK)
    fp.set(700, comm="python -m specmatch", ppid=651, utime=300 + CLK_TCK)
    fp.set(650, comm="snakemake", utime=900 + CLK_TCK // 5)
    fp.set(701, comm="nvidia-smi", ppid=700, pgrp=701, utime=1 + CLK_TCK // 10)
    fp.set(30, comm="kworker/1:2", ppid=2, flags=0x04208060, stime=50 + CLK_TCK)
    fp.set(900, comm="yes", nice=19, utime=100 + 2 * CLK_TCK)
    fp.set(950, comm="make", utime=CLK_TCK // 2, start=4000)             # born since the first scan
    del fp.procs[901]                                                     # exited
    fp.write()
    s._scan()
    fp.now = 10.0
    fp.set(900, comm="yes", nice=19, utime=100 + 4 * CLK_TCK)
    fp.set(901, comm="reused pid", utime=CLK_TCK // 4, start=9000)        # a new process with an old pid
    del fp.procs[950]
    # the machine's busy time: everything the processes above used (14.05 s) plus 0.5 s nobody accounts for
    used = (5 + 2 + 1 + 0.1 + 0.2 + 1 + 4 + 0.5 + 0.25) * CLK_TCK
    fp.cpu = [int(1000 + used + 0.5 * CLK_TCK), 0, 0, 100 * CLK_TCK, 0, 0, 0, int(0.2 * CLK_TCK), 0, 0]
    fp.write()
    s._scan()
    r = s.result(threshold_cores=0.1)
    assert r.window_s == pytest.approx(10.0) and r.samples == 3
    assert r.server_cpu_cores == pytest.approx((5 + 2) / 10, abs=1e-3)
    assert r.load_generator_cpu_cores == pytest.approx(1.1 / 10, abs=2e-3)
    assert r.kernel_cpu_cores == pytest.approx(0.1, abs=1e-3)
    assert r.workflow_cpu_cores == pytest.approx(0.02, abs=1e-3)   # Snakemake, the load generator's ancestor
    assert r.other_cpu_cores == pytest.approx((4 + 0.5 + 0.25) / 10, abs=2e-3)
    assert r.other_cpu_peak_cores == pytest.approx(0.5, abs=2e-3)   # the first interval: yes 0.4 + make 0.1
    assert r.unattributed_cpu_cores == pytest.approx(0.05, abs=3e-3)
    assert r.steal_cores == pytest.approx(0.02, abs=1e-3) and 0 < r.steal_share < 0.01
    assert r.foreign_cpu_cores == pytest.approx(0.475 + 0.02 + 0.05, abs=5e-3)
    assert [o.comm for o in r.top] == ["yes", "make", "reused pid"] and r.top[0].pid == 900 and r.top[0].nice == 19
    assert r.processes_born == 2 and r.processes_exited == 2
    assert r.flagged and "yes 0.40" in r.why[0] and r.gpu is not None and not r.gpu.available
    quiet = s.result(threshold_cores=1.0)
    assert not quiet.flagged and quiet.why == []
    assert Interference.from_json(r.to_json()) == r


def test_gpu_tenants_and_slowdowns_flag_the_cell(tmp_path):
    fp = FakeProc(tmp_path)
    fp.set(4107, comm="vllm serve", pgrp=4107)
    fp.set(5120, comm="train.py", pgrp=5120)
    fp.cpu = [0] * 10
    fp.write()
    smi = RecordedSmi(APPS, THROTTLE)
    s = Sampler(Owners(server_groups={4107}, own_pids={1}), proc=tmp_path, gpu=smi, clock=lambda: fp.now)
    s._scan()
    fp.now = 1.0
    s._scan()
    r = s.result(threshold_cores=0.1)
    assert r.gpu.available and r.gpu.server_processes == 1
    assert [(p.pid, p.comm, p.visible) for p in r.gpu.other_processes] == [(5120, "train.py", True)]
    assert r.gpu.throttle_reasons == ["hw_thermal_slowdown", "sw_power_cap", "sw_thermal_slowdown"]
    assert r.gpu.slowdowns == ["hw_thermal_slowdown", "sw_thermal_slowdown"]
    assert r.flagged and any("train.py (pid 5120" in w for w in r.why) and any("slowed down" in w for w in r.why)
    # a driver that only knows the older field name: the newer one is tried first, then remembered
    assert smi.calls[1:3] == ["--query-gpu=uuid,clocks_event_reasons.active",
                              "--query-gpu=uuid,clocks_throttle_reasons.active"]
    fp.procs.clear()
    fp.set(4107, comm="vllm serve", pgrp=4107)
    fp.write()
    quiet = Sampler(Owners(server_groups={4107}), proc=tmp_path, gpu=RecordedSmi(
        "pid, gpu_uuid, used_gpu_memory [MiB]\n4107, GPU-a, 100 MiB\n",
        "uuid, clocks_throttle_reasons.active\nGPU-a, 0x0000000000000001\n"), clock=lambda: fp.now)
    quiet._scan()
    r = quiet.result(threshold_cores=0.1)
    assert r.gpu.available and not r.gpu.other_processes and r.gpu.throttle_reasons == [] and not r.flagged
    none = Sampler(Owners(), proc=tmp_path, gpu=NvidiaSmi.absent(), clock=lambda: fp.now)
    none._scan()
    g = none.result(0.1).gpu
    assert not g.available and "nvidia-smi not found" in g.reason


def test_no_proc_is_recorded_as_not_available(tmp_path):
    s = Sampler(Owners(), proc=tmp_path / "nothing").start()
    s.stop()
    r = s.result(0.1)
    assert not r.available and "not Linux" in r.reason and not r.flagged


# -- real processes ------------------------------------------------------------------------------------
BUSY = "import time\nt = time.time() + {secs}\nwhile time.time() < t: pass\n"

SERVER = """import os, subprocess, sys, threading, time
child = subprocess.Popen([sys.executable, "-c", {busy!r}])
def spin():
    t = time.time() + {secs}
    while time.time() < t: pass
threading.Thread(target=spin, daemon=True).start()
print(child.pid, flush=True)
child.wait()
"""


def busy_thread(secs: float) -> threading.Thread:
    def spin():
        t = time.time() + secs
        while time.time() < t:
            pass
    th = threading.Thread(target=spin, daemon=True)
    th.start()
    return th


@pytest.mark.slow
def test_server_children_and_load_generator_threads_are_never_neighbours(tmp_path):
    """A fake server in its own process group (as the watchdog starts one) runs a busy thread and spawns a
    busy child; the load generator (this process) runs a busy thread; a neighbour started outside both
    (its own session, reparented away from this process) spins too. Only the neighbour is interference."""
    secs = 2.5
    server = subprocess.Popen([sys.executable, "-c", SERVER.format(busy=BUSY.format(secs=secs), secs=secs)],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    engine_child = int(server.stdout.readline())
    pidfile = tmp_path / "neighbour.pid"
    # `setsid -f` forks and exits: the neighbour's parent is not this process, its session not the server's
    subprocess.run(["setsid", "-f", sys.executable, "-c",
                    f"import os; open({str(pidfile)!r}, 'w').write(str(os.getpid()))\n" + BUSY.format(secs=secs)],
                   check=True)
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text():
            break
        time.sleep(0.02)
    neighbour = int(pidfile.read_text())
    try:
        time.sleep(0.2)
        sampler = Sampler(Owners(server_groups={server.pid}, server_pids={server.pid}), interval_s=0.25,
                          gpu=NvidiaSmi.absent())
        with sampler:
            th = busy_thread(1.5)
            th.join()
        r = sampler.result(threshold_cores=0.1)
    finally:
        server.wait(10)
    whose = sampler.processes()
    assert whose[engine_child][0] == "server" and whose[server.pid][0] == "server"
    assert whose[os.getpid()][0] == "self" and whose[neighbour][0] == "other"
    if os.getppid() > 1:   # what runs this test, as Snakemake runs a cell (pid 1 is never the workflow's)
        assert whose[os.getppid()][0] == "workflow"
    assert not {engine_child, server.pid, os.getpid()} & {o.pid for o in r.top}
    # busy processes share the cores with whatever else runs here (a loaded CI box: a dozen others): a part
    # (the record rounds its figures to 4 decimals: a CI run read 0.6268 against the neighbour's 0.626839)
    assert whose[neighbour][2] > 0.03 and r.other_cpu_cores >= whose[neighbour][2] - 1e-4
    assert whose[engine_child][2] > 0.03 and r.server_cpu_cores >= whose[engine_child][2] + whose[server.pid][2] - 1e-3
    assert r.load_generator_cpu_cores > 0.03   # this process's busy thread (and the sampler)
    assert r.flagged
    # the sampler's own CPU: a scan costs a few ms, so at its default 1 s interval (stretched to stay under
    # 0.5% of a core when scans cost more) it stays well under 1% of a core in a cell of any length
    assert r.sampler_cpu_s / r.samples < 0.01


@pytest.mark.slow
def test_short_lived_processes_do_not_break_the_sampler():
    """Processes that start and end between scans (pid races): the sampler keeps going and counts them."""
    sampler = Sampler(Owners(own_pids=set()), interval_s=0.05, budget=1.0, gpu=NvidiaSmi.absent())
    with sampler:
        for _ in range(20):
            subprocess.run(["true"])            # gone long before the next scan
            subprocess.run(["sleep", "0.12"])   # seen by a scan or two, then gone
    r = sampler.result(threshold_cores=10.0)
    assert r.available and r.samples >= 10 and r.processes_born >= 1 and r.processes_exited >= 1 and not r.flagged


def test_listener_pids_finds_the_process_serving_a_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        assert os.getpid() in listener_pids(s.getsockname()[1])
    assert listener_pids(1) == set() or os.getpid() not in listener_pids(1)


# -- which verdicts rest on flagged cells; the summary's section ------------------------------------------
def _cells_and_verdicts():
    from builders import cell_result
    from specmatch.records import Decision, EarlierMeasurement, Offender, Verdict

    def reading(foreign, flagged):
        return Interference(available=True, window_s=10, samples=11, foreign_cpu_cores=foreign,
                            other_cpu_cores=foreign, threshold_cores=0.1, flagged=flagged,
                            top=[Offender(pid=9, comm="yes", cpu_cores=foreign, nice=19)] if flagged else [],
                            why=[f"{foreign:.2f} cores used by others (other processes {foreign:.2f}) > threshold 0.1"]
                            if flagged else [], sampler_core_share=0.002)

    cells = {}
    for server in ("baseline", "eagle", "eagle@k=3"):
        for c in (1, 16):
            for r in (1, 2):
                cells[(server, "train", c, r)] = cell_result(server, c, repeat=r, interference=reading(0.01, False))
    cells[("baseline", "train", 1, 1)] = cell_result("baseline", 1, repeat=1, interference=reading(0.93, True))
    cells[("eagle", "train", 16, 2)] = cell_result(
        "eagle", 16, repeat=2, output_throughput=40.0, interference=reading(0.02, False),
        earlier=[EarlierMeasurement(interference=reading(0.8, True), started_at=1.0, duration=2.0,
                                    output_throughput=21.0)])

    def v(server, c, verdict, metric="output_throughput", against=""):
        return Verdict(server=server, suite="train", concurrency=c, metric=metric, verdict=verdict, speedup=1.2,
                       lo=1.1, hi=1.3, confidence=0.9, repeats=2, against=against)
    verdicts = [v("eagle", 1, Decision.PAYS), v("eagle", 16, Decision.LOSES), v("eagle", 1, Decision.INCONCLUSIVE, "tpot"),
                v("eagle", 1, Decision.PAYS, against="eagle@k=3")]
    return cells, verdicts


def test_verdicts_resting_on_flagged_cells_are_named():
    from specmatch.deciding.explaining.interference import claims_on_flagged, flagged_basis

    cells, verdicts = _cells_and_verdicts()
    basis = flagged_basis(verdicts, cells, "baseline")
    assert basis == {("eagle", "train", 1, "output_throughput", ""): [("baseline", "train", 1, 1)],
                     ("eagle", "train", 1, "tpot", ""): [("baseline", "train", 1, 1)]}
    # c=16 was re-measured clean: no verdict rests on its discarded measurement; against another server than
    # the baseline, the baseline's flagged cell is not its basis
    claims = claims_on_flagged(verdicts, cells, "baseline")
    assert [(v.concurrency, v.metric, keys) for v, keys in claims] == [(1, "output_throughput",
                                                                       [("baseline", "train", 1, 1)])]
    cells[("eagle@k=3", "train", 1, 2)].interference.flagged = True
    assert flagged_basis(verdicts[3:], cells, "baseline") == {
        ("eagle", "train", 1, "output_throughput", "eagle@k=3"): [("eagle@k=3", "train", 1, 2)]}


def test_machine_quietness_section_and_verdict_note():
    from specmatch.deciding.explaining.interference import flagged_claims
    from specmatch.reporting.interference import quietness, section, verdict_note

    cells, verdicts = _cells_and_verdicts()
    claims = flagged_claims(verdicts, cells, "baseline")   # what the decide step records in analysis.json
    q = quietness(cells, verdicts, claims)
    assert q.sampled == 12 and q.flagged == [("baseline", "train", 1, 1)] and q.worst[1] == 0.93
    assert q.remeasured == [("eagle", "train", 16, 2)] and q.remeasured_clean == 1
    text = "\n".join(section(cells, verdicts, claims))
    assert "## Machine quietness" in text and "exceeds 0.10 cores" in text
    assert "- flagged: baseline / train / r1 / c=1: 0.93 cores used by others" in text
    assert "- re-measured: eagle / train / r2 / c=16: first 21.0 tok/s with 0.80 foreign cores (yes 0.80), kept 40.0" \
        in text
    assert "**eagle** on `train` at c=1 (output_throughput): pays 1.20x [1.10, 1.30] rests on baseline / train / r1 / c=1" \
        in text
    assert "c=16 (output_throughput)" not in text
    assert "c=1" in verdict_note(claims, "eagle", "train")
    assert verdict_note(claims, "eagle", "train", "tpot") == ""   # inconclusive: no claim
    for c in cells.values():
        c.interference = None   # cells from before readings were recorded: no section
    assert section(cells, verdicts, claims) == []


@pytest.mark.slow
def test_the_interference_bench_runs_its_fake_mode_end_to_end(tmp_path):
    """bench/interference.py fake (a scripted server through the watchdog, cells with and without a
    neighbour, a re-measured cell) runs to its report: the summary's section is rendered from its cells.
    (Its report call went stale once when the section's signature changed, after the real-engine cells
    had been measured.)"""
    repo = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, str(repo / "bench" / "interference.py"), "fake", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, cwd=repo)
    assert out.returncode == 0, out.stderr[-2000:]
    text = (tmp_path / "interference-fake.txt").read_text()
    assert "## Machine quietness" in text and "flagged: duty 1" in text and "re-measured: remeasure" in text
