"""Does a covariate adjustment (deciding.adjust, CUPED-style) pay, and is it safe? A/A and power by simulation.

Synthetic runs with a time axis: a baseline and a second server (identical: A/A; or truly `--speedup`
faster), repeats in fresh sessions ordered as the workflow orders them (run_order.py: servers alternate
within repeats, ABBA), each session `--startup` seconds then its cells (one per suite and concurrency).
A cell's log speed is the sum of its session's effect (`--session-sd`), a slow drift over the run
(`--drift` per minute, linear), a time-varying neighbour (on for `--neighbour-on` s, off for
`--neighbour-off` s, from a random phase, slowing what runs while it is on by `--neighbour-cost` in log
speed) and the cell's own (`--cell-sd`); requests vary around it (`--request-cv`). Each cell carries its
start time, its interference reading (foreign cores: the neighbour's share while on, plus reading
noise) and a calibration probe: the machine's log speed at the cell's start (drift and neighbour) plus
`--probe-noise`, or (`--probe tracks-nothing`) noise alone.

Each run is analysed as measured and adjusted for each covariate; the report gives, per treatment,
the share of throughput verdicts that claim a difference (A/A: false claims, nominal 10% at 90%
confidence) or are decided (with a true speedup: the power), with Monte-Carlo standard errors.

    nice -n 19 .venv/bin/python bench/adjust_sim.py [--experiments 200] [--speedup 1.0] [--repeats 2]
        [--drift 0.002] [--neighbour-cost 0.3] [--probe tracks|tracks-nothing] [--out bench/out/adjust_sim]

A few minutes per 200 experiments (each analysed four times, 200 bootstrap resamples).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "workflow"))

from specmatch.calibration.simulate import cell  # noqa: E402
from specmatch.deciding.adjust import adjust  # noqa: E402
from specmatch.deciding.analysis import Settings, analyse  # noqa: E402
from specmatch.records import Decision, Interference  # noqa: E402

TREATMENTS = (None, "time", "probe", "interference")


def run(rng: np.random.Generator, a) -> list:
    """The cells of one synthetic run."""
    servers = ["baseline", "spec"]
    suites = [f"s{i}" for i in range(a.suites)]
    cs = (1, 16)
    prompts = 16
    out = np.full(prompts, 24.0)
    difficulty = {u: rng.lognormal(0.0, 0.3, prompts) for u in suites}
    phase = rng.uniform(0, a.neighbour_on + a.neighbour_off)
    cells = []
    t = 0.0

    def neighbour_on(at: float) -> bool:
        if a.neighbour_cost <= 0:
            return False
        return (at + phase) % (a.neighbour_on + a.neighbour_off) < a.neighbour_on

    for r in range(1, a.repeats + 1):
        for server in (servers if r % 2 else servers[::-1]):
            t += a.startup
            session = rng.normal(0.0, a.session_sd)
            for u in suites:
                for c in cs:
                    dur = a.cell_s * (1.0 if c == 1 else 0.5)
                    mid = t + dur / 2
                    on = neighbour_on(mid)
                    machine = a.drift * (t / 60.0) - (a.neighbour_cost if on else 0.0)
                    speed = math.exp(session + machine + rng.normal(0.0, a.cell_sd))
                    k = a.speedup if server == "spec" else 1.0
                    tpot = 0.1 * (1 + 0.15 * (c - 1)) * difficulty[u] / speed / k
                    noise = rng.lognormal(0.0, a.request_cv, prompts)
                    ttft = 0.2 * noise / speed
                    e2e = ttft + tpot * (out - 1) * noise
                    res, req = cell(server, u, c, r, e2e, ttft, out, [f"{u}-{i}" for i in range(prompts)])
                    res.started_at = t
                    at_start = a.drift * (t / 60.0) - (a.neighbour_cost if neighbour_on(t) else 0.0)
                    res.probe_log_speed = (rng.normal(0.0, a.probe_noise) + (at_start if a.probe == "tracks" else 0.0))
                    foreign = (0.5 if on else 0.0) + abs(rng.normal(0.0, 0.01))
                    res.interference = Interference(available=True, foreign_cpu_cores=foreign, flagged=foreign > 0.05)
                    cells.append((res, req))
                    t += dur + 10.0
    return cells


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiments", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speedup", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--suites", type=int, default=2)
    p.add_argument("--startup", type=float, default=60.0)
    p.add_argument("--cell-s", type=float, default=40.0)
    p.add_argument("--session-sd", type=float, default=0.03)
    p.add_argument("--cell-sd", type=float, default=0.02)
    p.add_argument("--request-cv", type=float, default=0.05)
    p.add_argument("--drift", type=float, default=0.0, help="log speed per minute")
    p.add_argument("--neighbour-on", type=float, default=120.0)
    p.add_argument("--neighbour-off", type=float, default=240.0)
    p.add_argument("--neighbour-cost", type=float, default=0.0, help="log speed lost while the neighbour is on")
    p.add_argument("--probe", choices=["tracks", "tracks-nothing"], default="tracks")
    p.add_argument("--probe-noise", type=float, default=0.02)
    p.add_argument("--bootstrap", type=int, default=200)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "adjust_sim")
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    s = Settings(bootstrap=a.bootstrap)
    counts = {str(t): {"claims": 0, "decided": 0, "verdicts": 0, "width": []} for t in TREATMENTS}
    t0 = time.time()
    for _ in range(a.experiments):
        cells = run(rng, a)
        for tr in TREATMENTS:
            adj, _info = adjust(cells, tr)
            an = analyse(adj, "baseline", s)
            for v in an.verdicts:
                if v.metric != "output_throughput":
                    continue
                c = counts[str(tr)]
                c["verdicts"] += 1
                c["claims"] += v.verdict in (Decision.PAYS, Decision.LOSES)
                c["decided"] += v.verdict != Decision.INCONCLUSIVE
                if v.lo and v.hi:
                    c["width"].append(math.log(v.hi / v.lo))
    lines = [f"{a.experiments} runs ({time.time() - t0:.0f} s), speedup {a.speedup:g}, {a.repeats} repeats, "
             f"session sd {a.session_sd:g}, cell sd {a.cell_sd:g}, drift {a.drift:g}/min, neighbour cost "
             f"{a.neighbour_cost:g} ({a.neighbour_on:g} s on / {a.neighbour_off:g} s off), probe {a.probe} "
             f"(noise {a.probe_noise:g})", "",
             "| adjustment | throughput verdicts | claim a difference | decided | median log interval width |",
             "|---|---|---|---|---|"]
    res = {"args": vars(a) | {"out": str(a.out)}, "treatments": {}}
    for tr, c in counts.items():
        n = c["verdicts"]
        cl, de = c["claims"] / n, c["decided"] / n
        w = float(np.median(c["width"])) if c["width"] else float("nan")
        res["treatments"][tr] = {"verdicts": n, "claims": cl, "claims_se": math.sqrt(cl * (1 - cl) / n),
                                 "decided": de, "decided_se": math.sqrt(de * (1 - de) / n), "median_width": w}
        lines.append(f"| {tr if tr != 'None' else 'none'} | {n} | {cl:.1%} ± {math.sqrt(cl * (1 - cl) / n):.1%} | "
                     f"{de:.1%} ± {math.sqrt(de * (1 - de) / n):.1%} | {w:.3f} |")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{a.out}-{a.speedup:g}-{a.probe}-d{a.drift:g}-n{a.neighbour_cost:g}"
    Path(f"{tag}.json").write_text(json.dumps(res, indent=1))
    Path(f"{tag}.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
