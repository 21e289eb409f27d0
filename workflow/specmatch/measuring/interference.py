"""What else used the machine while a cell measured: other processes' CPU, steal, the GPU's other tenants.

A neighbour at the lowest priority (`nice -n 19`, one busy core) halved vLLM CPU's throughput on a
2-core machine: the engine's threads synchronise at every step, so a neighbour that takes a core even
briefly stretches every step, and the scheduler's priorities do not protect it. A cell therefore
records, from /proc, what it could not control, and says when that was more than a threshold.

Whose CPU is whose. Every process is one of
- the **server**: its process group or session (the managed server runs under its watchdog in a session
  of its own, serving/server.py; the engine's workers inherit it), or a descendant of it;
- the **load generator**: this process (all its threads, this sampler's included: /proc/<pid>/stat sums
  a process's threads), its descendants, and the server's watchdog;
- the **workflow**: the load generator's ancestors (the shell Snakemake runs a job in, Snakemake itself,
  which polls its jobs at about 2% of a core during a cell), pid 1 excepted: the harness every cell runs
  under alike, reported apart and never counted as a neighbour;
- **kernel** threads (PF_KTHREAD): reported, never counted as a neighbour (they do the loopback network
  and the page cache work of the cell itself);
- **other**: everything else. Its CPU is the interference.

How it is counted. A background thread lists /proc at a fixed interval and keeps, per process (keyed by
pid and start time, so a reused pid is a new process), the CPU it used between scans; a process first
seen after the previous scan was born in between, and all of its CPU counts. A process that exits
between two scans loses its last interval's CPU (its parent is credited on reaping, as cutime, which
is not read); /proc/stat's totals catch what per-process sampling misses (such short-lived processes,
processes we may not read): `unattributed` = the machine's busy time (user + nice + system) minus every
sampled process's. Steal (a hypervisor giving the vCPU to another guest) comes from /proc/stat.
`foreign_cpu_cores` = other + steal + unattributed (when positive) is what the threshold applies to.

The sampler's own cost is measured (its thread's CPU time) and kept under `budget` of a core by
lengthening the interval when a scan is expensive (a machine with thousands of processes). It runs only
during the measured part of a cell, never the warm-up.

GPUs: where `nvidia-smi` is on PATH, every `gpu_interval_s` the compute processes (pid, used memory)
and the clock event (throttle) reasons; a compute process outside the server and the load generator is
another tenant of the GPU, a thermal or hardware slowdown is a machine not at its normal speed. Where
there is no nvidia-smi, the GPU reading says so (not available) and nothing is flagged from it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..records import GpuInterference, GpuProcess, Interference, Offender

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PF_KTHREAD = 0x00200000      # include/linux/sched.h: a kernel thread
TOP = 5                      # offenders listed per cell


# -- /proc parsing ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PidStat:
    """The fields of /proc/<pid>/stat this module reads (proc(5), fields 1-22); times in clock ticks."""
    pid: int
    comm: str
    state: str
    ppid: int
    pgrp: int
    session: int
    flags: int
    utime: int
    stime: int
    nice: int
    starttime: int

    @property
    def ticks(self) -> int:
        return self.utime + self.stime

    @property
    def kernel_thread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)


def parse_pid_stat(text: str) -> PidStat:
    """One /proc/<pid>/stat line. The command name (field 2) is in parentheses and may itself hold
    spaces and parentheses (a process may name itself anything, e.g. `evil) R 1 1`), so it runs from
    the first "(" to the LAST ")"; the fields after it are space-separated."""
    head, close, rest = text.rpartition(")")
    pid_text, opened, comm = head.partition("(")
    if not close or not opened:
        raise ValueError(f"not a /proc/<pid>/stat line: {text[:80]!r}")
    f = rest.split()
    if len(f) < 20:
        raise ValueError(f"/proc/<pid>/stat line with {len(f) + 2} fields, expected at least 22: {text[:80]!r}")
    # f[0] is field 3 (state): field n is f[n - 3]
    return PidStat(pid=int(pid_text), comm=comm, state=f[0], ppid=int(f[1]), pgrp=int(f[2]), session=int(f[3]),
                   flags=int(f[6]), utime=int(f[11]), stime=int(f[12]), nice=int(f[16]), starttime=int(f[19]))


CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")


@dataclass(frozen=True)
class CpuTimes:
    """The aggregate `cpu` line of /proc/stat (clock ticks summed over every CPU) and the CPU count."""
    user: int = 0
    nice: int = 0
    system: int = 0
    idle: int = 0
    iowait: int = 0
    irq: int = 0
    softirq: int = 0
    steal: int = 0
    guest: int = 0
    guest_nice: int = 0
    cpus: int = 0

    @property
    def busy(self) -> int:
        """Time processes ran (guest time is already inside user and nice, proc(5))."""
        return self.user + self.nice + self.system

    @property
    def total(self) -> int:
        return self.user + self.nice + self.system + self.idle + self.iowait + self.irq + self.softirq + self.steal

    def minus(self, other: "CpuTimes") -> "CpuTimes":
        return CpuTimes(*(getattr(self, k) - getattr(other, k) for k in CPU_FIELDS), cpus=self.cpus)


def parse_proc_stat(text: str) -> CpuTimes:
    """/proc/stat's `cpu` line (older kernels give fewer columns: the missing ones are 0) and the
    number of `cpuN` lines (the online CPUs)."""
    agg, cpus = None, 0
    for line in text.splitlines():
        if line.startswith("cpu "):
            vals = [int(x) for x in line.split()[1:]][:len(CPU_FIELDS)]
            agg = vals + [0] * (len(CPU_FIELDS) - len(vals))
        elif line.startswith("cpu") and line[3:4].isdigit():
            cpus += 1
    if agg is None:
        raise ValueError("/proc/stat has no aggregate `cpu` line")
    return CpuTimes(*agg, cpus=cpus)


def cpu_quota_cores(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """This cgroup's CPU limit in cores (cgroup v2 `cpu.max`: "quota period", or "max"), None without one."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def affinity_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 0


# -- nvidia-smi ---------------------------------------------------------------------------------------
# NVML's clock event ("throttle") reasons, nvmlClocksThrottleReasons (docs.nvidia.com/deploy/nvml-api,
# group__nvmlClocksThrottleReasons): the bit values nvidia-smi prints as `clocks_throttle_reasons.active`
# (renamed `clocks_event_reasons.active` in newer drivers).
THROTTLE_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                 0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}
# reasons that mean the GPU ran below its normal speed for a reason outside the benchmark (heat, power
# delivery); a power cap under load and an idle GPU are normal operation and only recorded
SLOWDOWNS = {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
NOT_A_VALUE = ("[N/A]", "[Not Supported]", "[Insufficient Permissions]", "[Unknown Error]", "N/A")


def _csv_rows(text: str) -> list[dict]:
    """nvidia-smi `--format=csv` output: a header line of the queried fields (with units in brackets, e.g.
    `used_gpu_memory [MiB]`), then one comma-separated line per item."""
    lines = [x for x in text.splitlines() if x.strip()]
    if not lines:
        return []
    names = [h.strip().split(" [")[0] for h in lines[0].split(",")]
    rows = []
    for line in lines[1:]:
        vals = [v.strip() for v in line.split(",")]
        if len(vals) != len(names):
            raise ValueError(f"nvidia-smi CSV line with {len(vals)} values for {len(names)} fields: {line!r}")
        rows.append(dict(zip(names, vals)))
    return rows


def parse_compute_apps(text: str) -> list[GpuProcess]:
    """`nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv`. The memory column is named
    `used_gpu_memory [MiB]` whichever alias was queried and reads "512 MiB", or "[N/A]" where the driver
    cannot say (e.g. inside a container); a machine with no compute process prints the header alone."""
    out = []
    for row in _csv_rows(text):
        mem = row.get("used_gpu_memory") or row.get("used_memory") or ""
        mem = mem.split()[0] if mem and mem not in NOT_A_VALUE else None
        out.append(GpuProcess(pid=int(row["pid"]), gpu_uuid=row.get("gpu_uuid"),
                              used_memory_mib=float(mem) if mem is not None else None))
    return out


def parse_throttle(text: str) -> dict[str, list[str]]:
    """`nvidia-smi --query-gpu=uuid,clocks_throttle_reasons.active --format=csv` (or clocks_event_reasons):
    GPU uuid -> the names of the active reasons (from the hex bit mask; unknown bits as `bit_0x...`)."""
    out = {}
    for row in _csv_rows(text):
        raw = row.get("clocks_event_reasons.active") or row.get("clocks_throttle_reasons.active") or ""
        if raw in NOT_A_VALUE or not raw:
            out[row.get("uuid", "?")] = []
            continue
        mask = int(raw, 16)
        names = [name for bit, name in THROTTLE_BITS.items() if mask & bit]
        rest = mask & ~sum(THROTTLE_BITS)
        names += [f"bit_{1 << i:#x}" for i in range(64) if rest & (1 << i)]
        out[row.get("uuid", "?")] = names
    return out


class NvidiaSmi:
    """Reads the GPU's compute processes and clock event reasons with nvidia-smi (a child of this process:
    its CPU is the load generator's)."""
    QUERIES = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")

    def __init__(self, exe: str | None = None, timeout_s: float = 10.0):
        self.exe = exe or shutil.which("nvidia-smi")
        self.timeout_s = timeout_s
        self.reason_field: str | None = None

    @classmethod
    def absent(cls) -> "NvidiaSmi":
        """No GPU reading (a machine, or a test, that must not run nvidia-smi)."""
        out = cls()
        out.exe = None
        return out

    @property
    def available(self) -> bool:
        return self.exe is not None

    def _run(self, args: list[str]) -> str | None:
        try:
            r = subprocess.run([self.exe, *args], capture_output=True, text=True, timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout if r.returncode == 0 else None

    def compute_apps(self) -> list[GpuProcess] | None:
        out = self._run(["--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv"])
        return parse_compute_apps(out) if out is not None else None

    def throttle(self) -> dict[str, list[str]] | None:
        for q in ([self.reason_field] if self.reason_field else self.QUERIES):
            out = self._run([f"--query-gpu=uuid,{q}", "--format=csv"])
            if out is not None:
                self.reason_field = q
                return parse_throttle(out)
        return None


# -- whose process is it --------------------------------------------------------------------------------
@dataclass
class Owners:
    """What counts as ours: the server's process groups/sessions and pids (with their descendants), the
    load generator's pids (with theirs)."""
    server_groups: set = field(default_factory=set)   # pgids (== session ids for a managed server)
    server_pids: set = field(default_factory=set)
    own_pids: set = field(default_factory=lambda: {os.getpid()})

    def classify(self, procs: dict[int, PidStat]) -> dict[int, str]:
        """pid -> server | self | workflow | kernel | other, for one scan (ancestry through ppid within it)."""
        kind: dict[int, str] = {}
        for pid in self.own_pids:   # the load generator's ancestors: the workflow that runs it
            seen = set()
            up = procs[pid].ppid if pid in procs else 0
            while up > 1 and up in procs and up not in seen and up not in self.own_pids:
                seen.add(up)
                kind[up] = "workflow"
                up = procs[up].ppid

        def of(pid: int, depth: int = 0) -> str:
            if pid in kind:
                return kind[pid]
            st = procs.get(pid)
            if st is None or depth > 64:
                return "other"
            if st.kernel_thread:
                k = "kernel"
            elif pid in self.server_pids or st.pgrp in self.server_groups or st.session in self.server_groups:
                k = "server"
            elif pid in self.own_pids:
                k = "self"
            elif st.ppid > 1 and st.ppid in procs:
                parent = of(st.ppid, depth + 1)
                k = parent if parent in ("server", "self") else "other"
            else:
                k = "other"
            kind[pid] = k
            return k

        for pid in procs:
            of(pid)
        return kind


def listener_pids(port: int, proc: Path = Path("/proc")) -> set[int]:
    """The processes holding a listening TCP socket on `port` (an external server on this machine is not
    ours to start, but its CPU is not a neighbour's either). /proc/net/tcp{,6}: state 0A is LISTEN; the
    socket's inode is then found among the processes' file descriptors."""
    inodes = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])
    if not inodes:
        return set()
    wanted = {f"socket:[{i}]" for i in inodes}
    out = set()
    for d in os.listdir(proc):
        if not d.isdigit():
            continue
        try:
            fds = os.listdir(proc / d / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(proc / d / "fd" / fd) in wanted:
                    out.add(int(d))
                    break
            except OSError:
                continue
    return out


# -- the sampler ---------------------------------------------------------------------------------------
def _read(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


@dataclass
class _Acc:
    """One process's CPU over the window."""
    pid: int
    comm: str
    nice: int
    kind: str
    ticks: int = 0


class Sampler:
    """Samples /proc (and nvidia-smi) in a background thread between start() and stop().

        with Sampler(owners) as s:      # the measured part of a cell
            ...
        reading = s.result(threshold_cores)
    """

    def __init__(self, owners: Owners, interval_s: float = 1.0, budget: float = 0.005, proc: Path = Path("/proc"),
                 gpu: NvidiaSmi | None = None, gpu_interval_s: float = 5.0, clock=time.monotonic):
        self.owners, self.interval_s, self.budget = owners, interval_s, budget
        self.clock = clock
        self.proc = str(proc)
        self.gpu = gpu if gpu is not None else NvidiaSmi()
        self.gpu_interval_s = gpu_interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.available = Path(self.proc, "stat").exists()
        self._prev: dict[tuple[int, int], PidStat] = {}
        self._acc: dict[tuple[int, int], _Acc] = {}
        self._cpu0: CpuTimes | None = None
        self._cpu_prev: CpuTimes | None = None
        self._cpu_last: CpuTimes | None = None
        self._t0 = self._t_last = 0.0
        self._samples = 0
        self._unreadable = 0
        self._born = 0
        self._exited = 0
        self._peak = 0.0
        self._cost = 0.0
        self._interval_used = interval_s
        self._load0 = self._load1 = None
        self._gpu_samples = 0
        self._gpu_apps: dict[int, GpuProcess] = {}
        self._gpu_reasons: set[str] = set()
        self._gpu_t = 0.0
        self._gpu_server_pids: set[int] = set()

    # -- one scan ------------------------------------------------------------------------------------
    def _scan(self) -> None:
        c0 = time.thread_time()
        now = self.clock()
        cpu_text = _read(f"{self.proc}/stat")
        procs: dict[int, PidStat] = {}
        for d in os.listdir(self.proc):
            if not d.isdigit():
                continue
            text = _read(f"{self.proc}/{d}/stat")
            if text is None:   # exited since the listing, or not ours to read (hidepid)
                continue
            try:
                st = parse_pid_stat(text)
            except ValueError:
                self._unreadable += 1
                continue
            procs[st.pid] = st
        kinds = self.owners.classify(procs)
        cur = {(st.pid, st.starttime): st for st in procs.values()}
        first = not self._prev and self._samples == 0
        other_ticks = 0
        for key, st in cur.items():
            old = self._prev.get(key)
            if old is not None:
                d = st.ticks - old.ticks
            elif first:
                d = 0                    # the window starts here
            else:
                d = st.ticks             # born since the last scan: all of its CPU is in the window
                self._born += 1
            acc = self._acc.get(key)
            if acc is None:
                acc = self._acc[key] = _Acc(st.pid, st.comm, st.nice, kinds.get(st.pid, "other"))
            acc.comm, acc.nice = st.comm, st.nice
            if acc.kind == "other" and kinds.get(st.pid) in ("server", "self"):
                acc.kind = kinds[st.pid]   # e.g. a child seen before its parent was
            acc.ticks += max(0, d)
            if acc.kind == "other":
                other_ticks += max(0, d)
        if not first:
            self._exited += sum(1 for k in self._prev if k not in cur)
        self._prev = cur
        if cpu_text is not None:
            cpu = parse_proc_stat(cpu_text)
            if self._cpu0 is None:
                self._cpu0 = cpu
            self._cpu_last = cpu
        if not first and now > self._t_last:
            self._peak = max(self._peak, other_ticks / CLK_TCK / (now - self._t_last))
        if first:
            self._t0 = now
        self._t_last = now
        self._samples += 1
        if self.gpu.available and (first or now - self._gpu_t >= self.gpu_interval_s):
            self._gpu_scan(procs, kinds)
            self._gpu_t = now
        self._cost += time.thread_time() - c0

    def _gpu_scan(self, procs: dict[int, PidStat], kinds: dict[int, str]) -> None:
        apps = self.gpu.compute_apps()
        reasons = self.gpu.throttle()
        if apps is None and reasons is None:
            return
        self._gpu_samples += 1
        for app in apps or []:
            if kinds.get(app.pid) in ("server", "self"):
                self._gpu_server_pids.add(app.pid)
                continue
            seen = procs.get(app.pid)
            prev = self._gpu_apps.get(app.pid)
            mems = [m for m in (app.used_memory_mib, prev.used_memory_mib if prev else None) if m is not None]
            self._gpu_apps[app.pid] = GpuProcess(pid=app.pid, gpu_uuid=app.gpu_uuid, comm=seen.comm if seen else None,
                                                 visible=seen is not None, used_memory_mib=max(mems) if mems else None)
        for names in (reasons or {}).values():
            self._gpu_reasons.update(n for n in names if n != "gpu_idle")

    def _run(self) -> None:
        wait = self.interval_s
        while not self._stop.wait(wait):
            with self._lock:
                if self._stop.is_set():
                    break
                c = time.thread_time()
                self._scan()
                cost = time.thread_time() - c
            # keep the sampler under `budget` of a core: a scan that costs more stretches the interval
            wait = max(self.interval_s, cost / self.budget if self.budget > 0 else 0.0)
            self._interval_used = max(self._interval_used, wait)

    # -- the window ----------------------------------------------------------------------------------
    def start(self) -> "Sampler":
        if not self.available:
            return self
        self._load0 = _loadavg()
        with self._lock:
            self._scan()
        self._thread = threading.Thread(target=self._run, name="interference-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if not self.available or self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        with self._lock:
            self._scan()
        self._load1 = _loadavg()

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def processes(self) -> dict[int, tuple[str, str, float]]:
        """pid -> (whose: server | self | workflow | kernel | other, comm, mean cores over the window) for every process
        seen (a reused pid: its latest process)."""
        window = max(self._t_last - self._t0, 1e-9)
        return {a.pid: (a.kind, a.comm, a.ticks / CLK_TCK / window) for a in self._acc.values()}

    def result(self, threshold_cores: float) -> Interference:
        """The window's reading, flagged when foreign CPU exceeds `threshold_cores` (mean cores over the
        window), when another process computes on the GPU, or when the GPU slowed down for heat or power."""
        if not self.available:
            return Interference(available=False, reason=f"no {self.proc}/stat (not Linux): nothing was sampled",
                                threshold_cores=threshold_cores)
        window = max(self._t_last - self._t0, 1e-9)
        per = {k: 0 for k in ("server", "self", "workflow", "kernel", "other")}
        for acc in self._acc.values():
            per[acc.kind] += acc.ticks
        cores = {k: v / CLK_TCK / window for k, v in per.items()}
        d = self._cpu_last.minus(self._cpu0) if self._cpu_last and self._cpu0 else CpuTimes()
        busy = d.busy / CLK_TCK / window
        unattributed = busy - sum(cores.values())
        steal_share = d.steal / d.total if d.total > 0 else 0.0
        steal_cores = d.steal / CLK_TCK / window
        foreign = cores["other"] + steal_cores + max(0.0, unattributed)
        top = sorted((a for a in self._acc.values() if a.kind == "other" and a.ticks > 0),
                     key=lambda a: -a.ticks)[:TOP]
        gpu = self._gpu_reading()
        why = []
        if foreign > threshold_cores:
            parts = [f"other processes {cores['other']:.2f}"]
            if steal_cores > 0.005:
                parts.append(f"steal {steal_cores:.2f}")
            if unattributed > 0.005:
                parts.append(f"unattributed {unattributed:.2f}")
            why.append(f"{foreign:.2f} cores used by others ({', '.join(parts)}) > threshold {threshold_cores:g}"
                       + (f"; top: {', '.join(f'{a.comm} {a.ticks / CLK_TCK / window:.2f}' for a in top[:3])}"
                          if top else ""))
        if gpu is not None and gpu.available:
            visible = [p for p in gpu.other_processes if p.visible]
            if visible:
                why.append("other compute processes on the GPU: " + ", ".join(
                    f"{p.comm or '?'} (pid {p.pid}, {p.used_memory_mib or 0:.0f} MiB)" for p in visible))
            if gpu.slowdowns:
                why.append("GPU clocks slowed down: " + ", ".join(gpu.slowdowns))
        return Interference(
            available=True, window_s=round(window, 3), samples=self._samples,
            interval_s=round(self._interval_used, 3), cores=affinity_cores(), online_cores=d.cpus or os.cpu_count(),
            cpu_quota_cores=cpu_quota_cores(), other_cpu_cores=round(cores["other"], 4),
            other_cpu_peak_cores=round(self._peak, 4), unattributed_cpu_cores=round(unattributed, 4),
            steal_share=round(steal_share, 5), steal_cores=round(steal_cores, 4),
            foreign_cpu_cores=round(foreign, 4), kernel_cpu_cores=round(cores["kernel"], 4),
            irq_cpu_cores=round((d.irq + d.softirq) / CLK_TCK / window, 4),
            server_cpu_cores=round(cores["server"], 4), load_generator_cpu_cores=round(cores["self"], 4),
            workflow_cpu_cores=round(cores["workflow"], 4),
            loadavg_start=self._load0, loadavg_end=self._load1,
            processes_born=self._born, processes_exited=self._exited, unreadable=self._unreadable,
            top=[Offender(pid=a.pid, comm=a.comm, cpu_cores=round(a.ticks / CLK_TCK / window, 4), nice=a.nice)
                 for a in top],
            gpu=gpu, sampler_cpu_s=round(self._cost, 4), sampler_core_share=round(self._cost / window, 5),
            threshold_cores=threshold_cores, flagged=bool(why), why=why)

    def _gpu_reading(self) -> GpuInterference:
        if not self.gpu.available:
            return GpuInterference(available=False, reason="nvidia-smi not found: GPU tenants and clocks not read")
        if self._gpu_samples == 0:
            return GpuInterference(available=False, reason="nvidia-smi answered no query")
        reasons = sorted(self._gpu_reasons)
        return GpuInterference(available=True, samples=self._gpu_samples,
                               other_processes=sorted(self._gpu_apps.values(), key=lambda p: p.pid),
                               server_processes=len(self._gpu_server_pids), throttle_reasons=reasons,
                               slowdowns=[r for r in reasons if r in SLOWDOWNS])


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None
