"""Session-to-session noise of the real engine, by server environment (run on a quiet machine).

The A/A runs on this machine moved a cell up to 1.8x between two server sessions of the same
configuration with no neighbour (foreign CPU under 0.03 cores): a session-wide state, not the cell.
One candidate is how the engine's OpenMP threads wait: vLLM CPU's model worker runs in the engine
core's process (VLLM_ENABLE_V1_MULTIPROCESSING=0, the default config's choice), where vLLM sets no
OpenMP environment, so Intel OpenMP's threads spin 200 ms after every parallel region (its default
KMP_BLOCKTIME) on the same 2 cores the API server needs for every token it streams. vLLM's own
multiprocess path sets KMP_BLOCKTIME=5 and KMP_TPAUSE=0 for that reason (vllm/utils/ompmultiprocessing.py).

Variants are server `env` overrides (the config's `servers.<name>.env`). Sessions alternate between
variants (A B C A B C ...), each session a fresh server with one c=1 cell (8 prompts) and one c=16
cell (the 16 prompts twice), every cell through the cell step. Reported per variant and concurrency:
the geometric mean throughput and the SD of log throughput between sessions (each session has one
cell of each kind, so this is session + cell noise together: what a repeat's variance is).

    .venv/bin/python bench/session_env.py --results results [--sessions 3] [--variants default blocktime omp1]

Needs a default run's results tree (results/models/smollm2-135m, results/prompts/train_holdout.jsonl).
Time: per session about 35 s of start-up and 30-40 s of cells: about 11 minutes for 3 variants x 3.
Writes bench/out/session_env.json and bench/out/session_env.txt.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "workflow"))
sys.path.insert(0, str(REPO / "bench"))

from noise_probe import run_cell_session  # noqa: E402

OUT = REPO / "bench" / "out"
# what Snakemake gives the launch job (threads: the whole machine) is OMP_NUM_THREADS = the cores
VARIANTS = {
    "default": {"OMP_NUM_THREADS": "2"},
    "blocktime": {"OMP_NUM_THREADS": "2", "KMP_BLOCKTIME": "5", "KMP_TPAUSE": "0"},
    "blocktime0": {"OMP_NUM_THREADS": "2", "KMP_BLOCKTIME": "0"},
    "omp1": {"OMP_NUM_THREADS": "1"},
}


def measure(a) -> dict:
    from specmatch.serving.server import Manager

    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="session-env-", dir=OUT))
    model = a.results / "models" / "smollm2-135m"
    prompts_all = a.results / "prompts" / "train_holdout.jsonl"
    if not model.exists() or not prompts_all.exists():
        raise SystemExit(f"needs {model} and {prompts_all} (a default run's results tree: --results)")
    lines = prompts_all.read_text().splitlines()
    p8, p16 = work / "p8.jsonl", work / "p16.jsonl"
    p8.write_text("\n".join(lines[:8]) + "\n")
    p16.write_text("\n".join(lines[:16]) + "\n")
    base = {"endpoint": "completions", "warmup": 2, "max_tokens": 24, "temperature": 0.0, "ignore_eos": True,
            "seed": 0, "timeout_s": 300, "max_failure_fraction": 0.0, "on_interference": "flag"}
    state = work / "state"
    rows, t_start, session = [], time.time(), 0
    try:
        for k in range(a.sessions):
            for v in a.variants:
                session += 1
                server = {"engine": "vllm", "model": str(model.resolve()), "dtype": "float32", "env": VARIANTS[v]}
                t0 = time.time()
                for c, prompts in ((1, p8), (16, p16)):
                    req = {**base, "passes": 1 if c == 1 else 2}
                    cell = run_cell_session(server, prompts, c, req, work / f"s{session}-c{c}.json", state,
                                            work / f"s{session}.server.log", session)
                    rows.append({"variant": v, "session": session, "concurrency": c,
                                 "throughput": cell["output_throughput"], "median_tpot_ms": cell["median_tpot_ms"],
                                 "foreign_cpu_cores": cell["interference"]["foreign_cpu_cores"],
                                 "flagged": cell["interference"]["flagged"]})
                    print(f"session {session} ({v}) c={c}: {cell['output_throughput']:.2f} tok/s, median TPOT "
                          f"{cell['median_tpot_ms']:.0f} ms, foreign {cell['interference']['foreign_cpu_cores']:.2f} "
                          f"cores", flush=True)
                Manager(state).stop_current("session_env: next session")
                rows[-1]["session_s"] = round(time.time() - t0, 1)
    finally:
        Manager(state).stop_current("session_env done")
    return {"rows": rows, "seconds": round(time.time() - t_start, 1), "variants": {v: VARIANTS[v] for v in a.variants}}


def analyse(res: dict) -> list[str]:
    rows = res["rows"]
    lines = [f"Server sessions by environment: {len({r['session'] for r in rows})} sessions, {res['seconds']:.0f} s",
             "", "| variant | env | c | sessions | throughput (geo mean) | SD of log throughput between sessions | "
             "median TPOT (mean) | foreign CPU (max) |", "|---|---|---|---|---|---|---|---|"]
    for v, env in res["variants"].items():
        for c in (1, 16):
            here = [r for r in rows if r["variant"] == v and r["concurrency"] == c]
            if not here:
                continue
            logs = [math.log(r["throughput"]) for r in here]
            sd = statistics.stdev(logs) if len(logs) > 1 else float("nan")
            lines.append(f"| {v} | {' '.join(f'{k}={x}' for k, x in env.items())} | {c} | {len(here)} | "
                         f"{math.exp(statistics.mean(logs)):.1f} tok/s | {100 * sd:.1f}% | "
                         f"{statistics.mean(r['median_tpot_ms'] for r in here):.0f} ms | "
                         f"{max(r['foreign_cpu_cores'] for r in here):.2f} |")
    lines += ["", "Per session: " + "; ".join(
        f"{r['session']} {r['variant']} c={r['concurrency']} {r['throughput']:.1f}" for r in rows)]
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=REPO / "results")
    p.add_argument("--sessions", type=int, default=3, help="sessions per variant")
    p.add_argument("--variants", nargs="+", default=["default", "blocktime", "omp1"], choices=list(VARIANTS))
    p.add_argument("--reanalyse", type=Path, help="a session_env.json to report again (no measuring)")
    a = p.parse_args()
    res = json.loads(a.reanalyse.read_text()) if a.reanalyse else measure(a)
    if not a.reanalyse:
        (OUT / "session_env.json").write_text(json.dumps(res, indent=1))
    text = "\n".join(analyse(res))
    (OUT / "session_env.txt").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
