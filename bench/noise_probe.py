"""The noise's structure measured directly on the real engine, in about ten minutes (run on a quiet machine).

The embedded baseline (vLLM CPU serving SmolLM2-135M in float32, as the default config serves it) in two
server sessions. In each session, short cells at c=1 and c=16 alternate, and a neighbour (a busy loop at
`nice -n 19`, one core) runs during half of them in an ABBA pattern (so the neighbour is not confounded
with time in the session). Every cell goes through the cell step (so it carries its interference
reading) and is preceded by two calibration probes that a covariate adjustment (CUPED) could use:

- `machine`: a fixed CPU workload in this process (float32 matrix products on every core for
  `--probe-s`), in GFLOP/s: the machine's speed at that moment, blind to the server;
- `server`: one fixed request to the server (a 32-token completion at c=1), its time per output token:
  the server's speed at that moment (its session's state included).

From these it reports, per concurrency: the cell-to-cell SD of log throughput within a session (cell +
drift), the difference between the two sessions (session), the drift within each session (the slope
of log throughput on time), the neighbour's effect (log ratio, with the interference the cells read),
and how much of the within-session variance each probe would remove as a covariate (rho^2, the
CUPED variance reduction). `noise_structure.py` decomposes the same cells with its mixed model.

    .venv/bin/python bench/noise_probe.py --results results [--cells 2] [--pin 1] [--probe-s 1.0]
    .venv/bin/python bench/noise_probe.py --reanalyse bench/out/noise_probe.json
    .venv/bin/python bench/noise_probe.py --fake --cells 1     # the plumbing, against a scripted server

Needs a default run's results tree (results/models/smollm2-135m, results/prompts/train_holdout.jsonl).
Time: 2 server starts (about 60 s each) and, per session, `--cells` x (c=1 quiet, c=1 neighbour, c=16
quiet, c=16 neighbour): c=1 cells of 8 prompts (about 25 s quiet, 45 s with the neighbour), c=16 cells of
2 passes of the 16 prompts (about 15 / 25 s): about 9-10 minutes at `--cells 2`. Writes
bench/out/noise_probe.json (every cell: session, time, concurrency, neighbour, throughput, interference,
probes) and bench/out/noise_probe.txt.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "workflow"))
sys.path.insert(0, str(REPO / "bench"))

from interference import Neighbour, prompts_file  # noqa: E402

OUT = REPO / "bench" / "out"


def machine_probe(seconds: float, n: int = 256) -> float:
    """GFLOP/s of float32 n x n matrix products for `seconds` (numpy's BLAS on every core it uses)."""
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    b = a.T.copy()
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        done += 1
    return 2 * n ** 3 * done / (time.perf_counter() - t0) / 1e9


def server_probe(base_url: str, model: str, tokens: int = 32) -> float | None:
    """Time per output token (ms) of one fixed completion streamed at c=1 (after its first token)."""
    import requests

    body = {"model": model, "prompt": "Count from one to fifty in words, separated by commas:", "max_tokens": tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    first = None
    with requests.post(base_url + "/v1/completions", json=body, stream=True, timeout=120) as r:
        if r.status_code != 200:
            return None
        for line in r.iter_lines():
            if line.startswith(b"data: ") and b'"text"' in line and first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    return (end - first) / (tokens - 1) * 1000 if first else None


def plan(cells: int) -> list[tuple[int, bool]]:
    """(concurrency, neighbour) in order: c=1 and c=16 alternate, the neighbour ABBA within each."""
    out = []
    for k in range(cells):
        nb = [False, True] if k % 2 == 0 else [True, False]
        for a in nb:
            out += [(1, a), (16, a)]
    return out


def measure(a) -> dict:
    from specmatch.serving.server import Manager

    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="noise-probe-", dir=OUT))
    if a.fake:   # the plumbing only: a scripted server started through the watchdog, as a real one is
        exe = work / "fakepython"
        exe.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO}/tests/fakeserver.py --tokens 24 --ttft 0.02 "
                       "--itl 0.01 \"$@\"\n")
        exe.chmod(0o755)
        server = {"engine": "vllm", "model": "fake", "python": str(exe), "profile": "gpu", "startup_timeout_s": 30}
        prompts_all = prompts_file(work / "all.jsonl", [f"probe prompt {i}" for i in range(16)])
    else:
        model = a.results / "models" / "smollm2-135m"
        prompts_all = a.results / "prompts" / "train_holdout.jsonl"
        if not model.exists() or not prompts_all.exists():
            raise SystemExit(f"needs {model} and {prompts_all} (a default run's results tree: --results)")
        server = {"engine": "vllm", "model": str(model.resolve()), "dtype": "float32"}
    lines = prompts_all.read_text().splitlines()
    p8 = work / "p8.jsonl"
    p8.write_text("\n".join(lines[:8]) + "\n")
    p16 = work / "p16.jsonl"
    p16.write_text("\n".join(lines[:16]) + "\n")
    base = {"endpoint": "completions", "warmup": 2, "max_tokens": 24, "temperature": 0.0, "ignore_eos": True,
            "seed": 0, "timeout_s": 300, "max_failure_fraction": 0.0, "on_interference": "flag"}
    state = work / "state"
    rows = []
    t_start = time.time()
    try:
        for session in (1, 2):
            for i, (c, nb) in enumerate(plan(a.cells)):
                req = {**base, "passes": 1 if c == 1 else 2}
                prompts = p8 if c == 1 else p16
                cur = Manager(state).read_current()
                probes = {}
                if cur and cur.get("session") == f"r{session}":
                    with Neighbour(1.0 if nb else 0.0, a.pin):
                        probes = {"machine_gflops": machine_probe(a.probe_s),
                                  "server_tpot_ms": server_probe(cur["base_url"], server["model"])}
                t0 = time.time()
                with Neighbour(1.0 if nb else 0.0, a.pin):
                    cell = run_cell_session(server, prompts, c, req, work / f"s{session}-{i}-c{c}.json", state,
                                            work / "server.log", session)
                if not probes:   # the session's first cell started the server: probe after it instead
                    cur = Manager(state).read_current()
                    with Neighbour(1.0 if nb else 0.0, a.pin):
                        probes = {"machine_gflops": machine_probe(a.probe_s),
                                  "server_tpot_ms": server_probe(cur["base_url"], server["model"]),
                                  "after_cell": True}
                rows.append({"session": session, "index": i, "concurrency": c, "neighbour": nb,
                             "started_at": cell["started_at"], "t": cell["started_at"] - t_start,
                             "wall_s": round(time.time() - t0, 1), "throughput": cell["output_throughput"],
                             "median_tpot_ms": cell["median_tpot_ms"], "duration": cell["duration"],
                             "interference": cell["interference"], "probes": probes})
                print(f"session {session} cell {i}: c={c} neighbour={nb}: {cell['output_throughput']:.2f} tok/s, "
                      f"foreign {cell['interference']['foreign_cpu_cores']:.2f} cores, probes {probes}", flush=True)
            Manager(state).stop_current("noise probe: next session")
    finally:
        Manager(state).stop_current("noise probe done")
    return {"rows": rows, "seconds": round(time.time() - t_start, 1), "pin": a.pin, "cells_per_kind": a.cells,
            "probe_s": a.probe_s}


def run_cell_session(server, prompts, c, req, out, state, log, session) -> dict:
    """The cell step at repeat `session` (a fresh server session per repeat)."""
    import subprocess

    cmd = [sys.executable, "-m", "specmatch", "cell", "--name", "baseline", "--server", json.dumps(server), "--suite",
           "s", "--prompts", str(prompts), "--concurrency", str(c), "--repeat", str(session), "--max-batch", "256",
           "--requests", json.dumps(req), "--out", str(out), "--requests-out", str(out.with_suffix(".requests.parquet")),
           "--state-dir", str(state), "--server-log", str(log)]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "workflow")},
                       cwd=REPO)
    if r.returncode != 0:
        raise SystemExit(f"cell failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return json.loads(out.read_text())


# -- analysis ------------------------------------------------------------------------------------------
def analyse(res: dict) -> list[str]:
    rows = res["rows"]
    lines = [f"Noise probe: {len(rows)} cells in 2 sessions, {res['seconds']:.0f} s", ""]
    for c in sorted({r["concurrency"] for r in rows}):
        lines += [f"### c={c}", ""]
        here = [r for r in rows if r["concurrency"] == c]
        quiet = [r for r in here if not r["neighbour"]]
        noisy = [r for r in here if r["neighbour"]]
        for name, group in (("quiet", quiet), ("neighbour", noisy)):
            by = {s: [math.log(r["throughput"]) for r in group if r["session"] == s] for s in (1, 2)}
            within = [statistics.variance(v) for v in by.values() if len(v) > 1]
            w = statistics.mean(within) if within else float("nan")
            means = [statistics.mean(v) for v in by.values() if v]
            between = (means[0] - means[1]) ** 2 / 2 - w / statistics.mean(len(v) for v in by.values()) \
                if len(means) == 2 else float("nan")
            lines.append(f"- {name}: within-session SD {100 * math.sqrt(w):.1f}% (cell + drift), session SD "
                         f"{100 * math.sqrt(max(between, 0)):.1f}% (from 2 sessions: one degree of freedom), "
                         f"mean {math.exp(statistics.mean(math.log(r['throughput']) for r in group)):.2f} tok/s, "
                         f"foreign CPU {statistics.mean(r['interference']['foreign_cpu_cores'] for r in group):.2f} "
                         f"cores, {sum(r['interference']['flagged'] for r in group)}/{len(group)} flagged")
        if quiet and noisy:
            eff = (statistics.mean(math.log(r["throughput"]) for r in noisy)
                   - statistics.mean(math.log(r["throughput"]) for r in quiet))
            lines.append(f"- the neighbour's effect on throughput: {100 * (math.exp(eff) - 1):+.1f}%")
        for s in (1, 2):
            q = [r for r in quiet if r["session"] == s]
            if len(q) > 2:
                t = np.array([r["t"] for r in q])
                yv = np.array([math.log(r["throughput"]) for r in q])
                slope = np.polyfit(t / 60, yv, 1)[0]
                lines.append(f"- session {s} drift (quiet cells): {100 * slope:+.2f}% per minute")
        # CUPED: how much of the within-session variance (neighbour included) each probe explains
        y = np.array([math.log(r["throughput"]) for r in here])
        sess = np.array([r["session"] for r in here])
        yc = y - np.array([y[sess == s].mean() for s in sess])
        for probe in ("machine_gflops", "server_tpot_ms"):
            x = np.array([math.log(r["probes"].get(probe) or float("nan")) for r in here])
            if np.isfinite(x).sum() > 3:
                ok = np.isfinite(x)
                xc = x - np.array([np.nanmean(x[(sess == s) & ok]) for s in sess])
                rho = float(np.corrcoef(xc[ok], yc[ok])[0, 1])
                lines.append(f"- probe {probe}: correlation with the cell's log throughput (within session) "
                             f"{rho:+.2f}: as a covariate it would remove {rho * rho:.0%} of that variance")
        lines.append("")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=REPO / "results")
    p.add_argument("--cells", type=int, default=2, help="cells of each kind (c x neighbour) per session")
    p.add_argument("--pin", type=int, default=None, help="pin the neighbour to this CPU")
    p.add_argument("--probe-s", type=float, default=1.0)
    p.add_argument("--reanalyse", type=Path, help="a noise_probe.json to analyse again (no measuring)")
    p.add_argument("--fake", action="store_true", help="a scripted server instead of vLLM: checks the plumbing")
    a = p.parse_args()
    res = json.loads(a.reanalyse.read_text()) if a.reanalyse else measure(a)
    lines = analyse(res)
    from specmatch.files import write_json, write_text

    name = "noise_probe" + ("-fake" if a.fake else "")
    if not a.reanalyse:
        write_json(OUT / f"{name}.json", res)
    write_text(OUT / f"{name}.txt", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
