"""A cell with and without a neighbour: what the interference accounting reads, and what the neighbour costs.

A neighbour is a busy loop at the lowest priority (`nice -n 19`), optionally pinned to one core
(`--pin`), busy a fraction `duty` of every 100 ms (1.0: a whole core). It is started by this script in
a session of its own, so it is neither the server's process nor the load generator's: exactly what a
cell must count as interference.

Modes:

- `proc` (no server; seconds, runs anywhere): the accounting's readings of this machine as it is, then
  with a neighbour at each duty: what the sampler reads (foreign cores, the neighbour's own share, the
  sampler's cost). The readings a threshold is chosen from.
- `fake` (a scripted server, tests/fakeserver.py, started by the cell step through the watchdog in its
  own process group, as a real one is; about a minute): the plumbing. Cells without and with a
  neighbour: the server's CPU is never counted, the neighbour's is, the cell is flagged, a
  `remeasure` cell keeps the re-measurement, and the summary's "Machine quietness" section says so.
- `vllm` (the REAL embedded baseline, vLLM CPU serving SmolLM2-135M as the default config does; run it
  only on a quiet machine): the same cells against the real engine, at every duty of `--duties`,
  between two quiet cells (drift bracket), then a `remeasure` cell whose neighbour leaves during it.
  Its dose-response (neighbour CPU read -> throughput and TPOT lost) is what the default
  `requests.interference_threshold` should be checked against.

    .venv/bin/python bench/interference.py proc [--seconds 5] [--duties 0.05 0.2 1.0] [--pin 1]
    .venv/bin/python bench/interference.py fake
    .venv/bin/python bench/interference.py vllm --results results [--duties 0.05 0.2 1.0] [--pin 1]
        [--concurrency 1] [--suite train_holdout]
    .venv/bin/python bench/interference.py vllm --from-cells bench/out/interference-vllm-<id> --duties 0.2 1.0
        (the report again from a run's kept cells, with the --duties and --concurrency it ran with)

`vllm` needs a results tree of the default run (results/models/smollm2-135m and
results/prompts/<suite>.jsonl); it starts its own server session (state in bench/out/interference-state,
never the workflow's) and stops it at the end. Time: about 60 s for the server, then per cell about 50 s
quiet and 50-110 s with a neighbour at c=1 (16 prompts x 24 tokens): about 7 minutes with the default
`--duties 1.0`, 11 with `--duties 0.05 0.2 1.0`. Writes bench/out/interference-<mode>.json (every cell's
reading and figures, the dose-response table) and bench/out/interference-<mode>.txt (the report).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "workflow"))

from specmatch.measuring.interference import NvidiaSmi, Owners, Sampler  # noqa: E402
from specmatch.records import CellResult, Prompt  # noqa: E402

OUT = REPO / "bench" / "out"
NEIGHBOUR = ("import time\nd, period = {duty}, 0.1\nwhile True:\n    t = time.perf_counter()\n"
             "    while time.perf_counter() - t < d * period:\n        pass\n"
             "    if d < 1:\n        time.sleep((1 - d) * period)\n")


class Neighbour:
    """A busy loop at nice 19 (optionally pinned), in its own session; `lifetime_s` ends it by itself."""

    def __init__(self, duty: float, pin: int | None = None, lifetime_s: float | None = None):
        self.duty, self.pin, self.lifetime_s = duty, pin, lifetime_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Neighbour":
        if self.duty <= 0:
            return self
        argv = (["timeout", str(self.lifetime_s)] if self.lifetime_s else []) + ["nice", "-n", "19"]
        argv += (["taskset", "-c", str(self.pin)] if self.pin is not None else [])
        argv += [sys.executable, "-c", NEIGHBOUR.format(duty=self.duty)]
        self.proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL)
        time.sleep(0.3)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, 15)
            except ProcessLookupError:
                pass
            self.proc.wait(10)


# -- proc: the accounting alone ----------------------------------------------------------------------------
def proc_mode(a) -> dict:
    rows = []
    for duty in [0.0] + list(a.duties):
        with Neighbour(duty, a.pin) as n:
            s = Sampler(Owners(), interval_s=1.0, gpu=NvidiaSmi())
            with s:
                time.sleep(a.seconds)
            r = s.result(a.threshold)
            seen = s.processes().get(n.proc.pid) if n.proc else None
        rows.append({"duty": duty, "neighbour_cores": round(seen[2], 4) if seen else 0.0,
                     "neighbour_counted_as": seen[0] if seen else None, "reading": r.to_json()})
    return {"mode": "proc", "seconds": a.seconds, "pin": a.pin, "rows": rows}


def proc_report(res: dict) -> list[str]:
    lines = [f"Accounting readings, {res['seconds']:g} s windows, this machine as it is"
             + (f", neighbour pinned to CPU {res['pin']}" if res["pin"] is not None else "") + ":", "",
             "| neighbour duty | neighbour read (cores) | foreign | other | unattributed | steal share | kernel | "
             "sampler share | flagged |", "|---|---|---|---|---|---|---|---|---|"]
    for row in res["rows"]:
        r = row["reading"]
        lines.append(f"| {row['duty']:g} | {row['neighbour_cores']:.3f} | {r['foreign_cpu_cores']:.3f} | "
                     f"{r['other_cpu_cores']:.3f} | {r['unattributed_cpu_cores']:.3f} | {r['steal_share']:.4f} | "
                     f"{r['kernel_cpu_cores']:.3f} | {r['sampler_core_share']:.4f} | {r['flagged']} |")
        lines.append("|  | top: " + ", ".join(f"{o['comm']} {o['cpu_cores']:.3f}" for o in r["top"]) + " |||||||| ")
    return lines


# -- cells through the cell step ---------------------------------------------------------------------------
def run_cell(name: str, server: dict, prompts: Path, c: int, req: dict, out: Path, state: Path, log: Path) -> dict:
    cmd = [sys.executable, "-m", "specmatch", "cell", "--name", name, "--server", json.dumps(server), "--suite", "s",
           "--prompts", str(prompts), "--concurrency", str(c), "--repeat", "1", "--max-batch", "256",
           "--requests", json.dumps(req), "--out", str(out), "--requests-out", str(out.with_suffix(".requests.parquet")),
           "--state-dir", str(state), "--server-log", str(log)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow")}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if r.returncode != 0:
        raise SystemExit(f"cell failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return json.loads(out.read_text())


def cell_plan(duties: list[float]) -> list[tuple[str, float]]:
    """The cells' order in `cells_mode` (label, neighbour duty): quiet, each duty, quiet again."""
    return [("quiet", 0.0)] + [(f"duty {d:g}", d) for d in duties] + [("quiet again", 0.0)]


def cells_mode(a, server: dict, prompts: Path, work: Path, req: dict, quiet_first=True) -> dict:
    state = work / "state"
    from specmatch.serving.server import Manager

    cells = []
    try:
        plan = cell_plan(a.duties)
        for i, (label, duty) in enumerate(plan):
            for c in a.concurrency:
                t0 = time.time()
                with Neighbour(duty, a.pin) as n:
                    cell = run_cell("baseline", server, prompts, c, {**req, "on_interference": "flag"},
                                    work / f"cell{i}-c{c}.json", state, work / "server.log")
                    pid = n.proc.pid if n.proc else None
                seen = next((o for o in cell["interference"]["top"] if o["pid"] == pid), None)
                cells.append({"label": label, "duty": duty, "concurrency": c, "wall_s": round(time.time() - t0, 1),
                              "neighbour_in_top": seen is not None, "neighbour_cores": seen["cpu_cores"] if seen else None,
                              "cell": cell})
                print(f"{label} c={c}: {cell['output_throughput']:.2f} tok/s, foreign "
                      f"{cell['interference']['foreign_cpu_cores']:.3f} cores (server {cell['interference']['server_cpu_cores']:.2f}, "
                      f"neighbour {seen['cpu_cores'] if seen else '-'}), flagged {cell['interference']['flagged']}",
                      flush=True)
        # a neighbour that leaves during the cell: flagged first, clean when re-measured
        c = a.concurrency[0]
        quiet = [x["cell"]["duration"] for x in cells if x["duty"] == 0 and x["concurrency"] == c]
        life = a.warmup_s + 1.2 * statistics.mean(quiet)
        t0 = time.time()
        with Neighbour(max(a.duties), a.pin, lifetime_s=life):
            cell = run_cell("baseline", server, prompts, c, {**req, "on_interference": "remeasure"},
                            work / "remeasure.json", state, work / "server.log")
        cells.append({"label": f"remeasure (neighbour for {life:.0f} s)", "duty": max(a.duties), "concurrency": c,
                      "wall_s": round(time.time() - t0, 1), "cell": cell})
        print(f"remeasure c={c}: kept {cell['output_throughput']:.2f} tok/s, earlier "
              f"{[e['output_throughput'] for e in cell['earlier']]}", flush=True)
    finally:
        Manager(state).stop_current("bench done")
    return {"cells": cells}


def kept_cells(a, work: Path) -> dict:
    """`res["cells"]` again from a cells run's kept files (its folder under bench/out), in the plan's order
    (`--duties` and `--concurrency` as that run had them): for a run whose report was not written. The
    neighbour is recognised as the nice-19 process among the cell's top others (its pid was not kept)."""
    plan = cell_plan(a.duties)
    cells = []
    for i, (label, duty) in enumerate(plan):
        for c in a.concurrency:
            path = work / f"cell{i}-c{c}.json"
            if not path.exists():
                raise SystemExit(f"{path}: missing (were --duties {a.duties} and --concurrency {a.concurrency} "
                                 "that run's?)")
            cell = json.loads(path.read_text())
            seen = next((o for o in cell["interference"]["top"] if o.get("nice") == 19), None) if duty else None
            cells.append({"label": label, "duty": duty, "concurrency": c, "wall_s": None,
                          "neighbour_in_top": seen is not None,
                          "neighbour_cores": seen["cpu_cores"] if seen else None, "cell": cell})
    if (work / "remeasure.json").exists():
        cells.append({"label": "remeasure", "duty": max(a.duties), "concurrency": a.concurrency[0], "wall_s": None,
                      "cell": json.loads((work / "remeasure.json").read_text())})
    return {"cells": cells, "from_cells": str(work)}


def dose_response(res: dict) -> list[dict]:
    out = []
    for c in sorted({x["concurrency"] for x in res["cells"]}):
        here = [x for x in res["cells"] if x["concurrency"] == c and not x["label"].startswith("remeasure")]
        quiet = [x["cell"] for x in here if x["duty"] == 0]
        q_thr = statistics.mean(x["output_throughput"] for x in quiet)
        q_tpot = statistics.mean(x["median_tpot_ms"] for x in quiet)
        for x in here:
            cell, i = x["cell"], x["cell"]["interference"]
            out.append({"label": x["label"], "concurrency": c, "duty": x["duty"],
                        "foreign_cpu_cores": i["foreign_cpu_cores"], "other_cpu_cores": i["other_cpu_cores"],
                        "neighbour_cores": x.get("neighbour_cores"), "server_cpu_cores": i["server_cpu_cores"],
                        "workflow_cpu_cores": i.get("workflow_cpu_cores"),
                        "top": [(o["comm"], o["cpu_cores"], o["nice"]) for o in i["top"][:3]],
                        "throughput": cell["output_throughput"], "throughput_vs_quiet": cell["output_throughput"] / q_thr,
                        "median_tpot_ms": cell["median_tpot_ms"], "tpot_vs_quiet": cell["median_tpot_ms"] / q_tpot,
                        "flagged": i["flagged"], "sampler_core_share": i["sampler_core_share"]})
    return out


def cells_report(res: dict) -> list[str]:
    from specmatch.reporting.interference import section

    lines = ["| cell | c | neighbour duty | neighbour read | server cores | foreign cores | top others | tok/s | "
             "vs quiet | median TPOT ms | vs quiet | flagged |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for d in res["dose_response"]:
        nb = f"{d['neighbour_cores']:.3f}" if d.get("neighbour_cores") is not None else "—"
        lines.append(f"| {d['label']} | {d['concurrency']} | {d['duty']:g} | {nb} | {d['server_cpu_cores']:.2f} | "
                     f"{d['foreign_cpu_cores']:.3f} | "
                     + ", ".join(f"{n} {x:.2f} (nice {k})" for n, x, k in d["top"]) + f" | {d['throughput']:.2f} | "
                     f"{d['throughput_vs_quiet']:.2f} | {d['median_tpot_ms']:.1f} | {d['tpot_vs_quiet']:.2f} | "
                     f"{d['flagged']} |")
    cells = {}
    for i, x in enumerate(res["cells"]):
        c = CellResult.from_json(x["cell"])
        cells[(f"{x['label']}", "s", c.concurrency, i + 1)] = c
    lines += ["", "What the summary's section says of these cells:"] + section(cells, [], [])
    return lines


# -- main --------------------------------------------------------------------------------------------------
def prompts_file(path: Path, texts: list[str]) -> Path:
    with open(path, "w") as fh:
        for i, t in enumerate(texts):
            p = Prompt(id=f"p-{i}", suite="s", source="bench", file="bench", line=i + 1, row=None, row_id=str(i),
                       turn=0, turns=1, text=t, messages=[{"role": "user", "content": t}], prompt_tokens=8,
                       reference_completion_tokens=24, holdout=False)
            fh.write(json.dumps(p.to_json()) + "\n")
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["proc", "fake", "vllm"])
    p.add_argument("--seconds", type=float, default=5.0, help="proc: each reading's window")
    p.add_argument("--duties", type=float, nargs="+", default=[1.0], help="neighbour duty cycles (1.0: a whole core)")
    p.add_argument("--pin", type=int, default=None, help="pin the neighbour to this CPU (taskset)")
    p.add_argument("--threshold", type=float, default=None, help="default: the schema's requests.interference_threshold")
    p.add_argument("--results", type=Path, default=REPO / "results", help="vllm: the default run's results tree")
    p.add_argument("--suite", default="train_holdout")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1])
    p.add_argument("--warmup-s", type=float, default=15.0, help="vllm: the remeasure neighbour's head start")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--from-cells", type=Path, default=None,
                   help="fake/vllm: report a run's kept cells (its bench/out/interference-<mode>-* folder) again, "
                        "measuring nothing")
    a = p.parse_args()
    if a.threshold is None:
        import yaml
        schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
        a.threshold = schema["properties"]["requests"]["properties"]["interference_threshold"]["default"]
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if a.mode == "proc":
        res = proc_mode(a)
        lines = proc_report(res)
    elif a.from_cells:
        res = kept_cells(a, a.from_cells)
        res.update(mode=a.mode, pin=a.pin, threshold=a.threshold)
        res["dose_response"] = dose_response(res)
        lines = cells_report(res)
    else:
        work = Path(tempfile.mkdtemp(prefix=f"interference-{a.mode}-", dir=a.out))
        req = {"endpoint": "completions", "passes": 1, "warmup": 2, "max_tokens": 24, "temperature": 0.0,
               "ignore_eos": True, "seed": 0, "timeout_s": 300, "max_failure_fraction": 0.0,
               "interference_threshold": a.threshold}
        if a.mode == "fake":
            exe = work / "fakepython"
            exe.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO}/tests/fakeserver.py --tokens 24 --ttft 0.02 "
                           "--itl 0.01 \"$@\"\n")
            exe.chmod(0o755)
            server = {"engine": "vllm", "model": "m", "python": str(exe), "profile": "gpu", "startup_timeout_s": 30}
            prompts = prompts_file(work / "s.jsonl", [f"bench prompt {i}" for i in range(16)])
            a.warmup_s = 0.5
        else:
            model = a.results / "models" / "smollm2-135m"
            prompts = a.results / "prompts" / f"{a.suite}.jsonl"
            if not model.exists() or not prompts.exists():
                raise SystemExit(f"vllm mode needs {model} and {prompts} (a default run's results tree: --results)")
            server = {"engine": "vllm", "model": str(model.resolve()), "dtype": "float32"}
        res = cells_mode(a, server, prompts, work, req)
        res.update(mode=a.mode, pin=a.pin, threshold=a.threshold, server=server)
        res["dose_response"] = dose_response(res)
        lines = cells_report(res)
    res["seconds"] = round(time.time() - t0, 1)
    from specmatch.files import write_json, write_text

    write_json(a.out / f"interference-{a.mode}.json", res)
    head = [f"bench/interference.py {a.mode}: {res['seconds']:.0f} s, threshold {a.threshold:g} cores", ""]
    write_text(a.out / f"interference-{a.mode}.txt", "\n".join(head + lines) + "\n")
    print("\n".join(head + lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
