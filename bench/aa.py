"""A/A on the real engine: the embedded baseline against an identical copy of itself, K times.

Every verdict is a claim that two servers differ; when the two servers are the same configuration
(a distinct name, the same vLLM CPU build, model and flags), every "pays", "loses" or crossover is a
false claim, so the share of such verdicts over K independent runs of the whole workflow measures
the decision rules' false-call rate on this machine's real noise (run-to-run drift, neighbours,
memory layout), not on a model of it. The nominal rate at the default 90% confidence is 10% of
verdicts (pays + loses); "equivalent" is the right answer.

Each run is the real workflow (`snakemake --cores all`) in one work folder: the first run builds the
embedded model, the demo training data, inspection and prompts; every later run deletes the server
launches, cells, rounds, recommendation and summary first, so each run measures both servers in fresh
sessions, repeats interleaved as in a normal run. `--repeats 2:3` runs the sequential design (another
repeat only where a verdict is still inconclusive: its optional stopping is part of what is tested).
Each run's summary, rounds and raw cells are kept under `<workdir>/aa/run<k>/`, so
`--reanalyse` can count the claims again with the current analysis code on the same measurements.

    .venv/bin/python bench/aa.py [--runs 8] [--workdir /tmp/specmatch-aa] [--repeats 2 | 2:3]
        [--model results/models/smollm2-135m] [--reanalyse]
        [--neighbour-every 2 [--neighbour-on 60 --neighbour-off 120] [--on-interference remeasure|flag]]

`--model` reuses an already built embedded model folder (a symlink), saving its ~90 s build.

With `--neighbour-every K`, every K-th run has a neighbour (a busy loop at `nice -n 19`, one core)
switched on for `--neighbour-on` seconds and off for `--neighbour-off`, over and over, for the whole run:
cells it overlaps are flagged (requests.on_interference: remeasure re-measures them once in their session;
flag only flags them). The report then counts the false claims with and without the new handling:
every claim, and the claims made unannounced (resting on no flagged cell, deciding.explaining.interference): a
claim that rests on a flagged cell is announced in the summary ("Machine quietness").
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def config(suite_size: int, concurrency: list[int], repeats) -> dict:
    """The default config's data and requests; two identical servers; no drafter, no controls."""
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    srv = {"engine": "vllm", "model": "results/models/smollm2-135m"}
    cfg["servers"] = {"baseline": dict(srv), "baseline_copy": dict(srv)}
    cfg["models"]["eagle3"] = {}
    cfg["suites"] = {"train_holdout": {**cfg["suites"]["train_holdout"], "size": suite_size}}
    cfg.pop("traffic", None)   # its mixes name the default's other suites
    cfg["concurrency"] = concurrency
    cfg["repeats"] = repeats
    cfg["summary"] = {**cfg["summary"], "recommend_suites": ["train_holdout"], "controls": {"configured_off": False}}
    return cfg


def prepare(workdir: Path, model: Path | None, cfg: dict) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "workflow", "resources", "profiles", "envs", "config.yaml"):
        dst = workdir / name
        if dst.exists():
            continue
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "demo"))
        else:
            shutil.copy2(src, dst)
    if model is not None and not (workdir / "results/models/smollm2-135m").exists():
        (workdir / "results/models").mkdir(parents=True, exist_ok=True)
        os.symlink(model.resolve(), workdir / "results/models/smollm2-135m")
    (workdir / "aa.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def claims(workdir: Path, cells_dir: Path | None = None) -> dict:
    """What one run's summary claims about baseline_copy against baseline, and which of its verdicts rest
    on flagged cells (keys "server/suite/c/metric")."""
    verdicts = json.loads((workdir / "results/summary/verdicts.json").read_text())
    mine = [v for v in verdicts if v["server"] == "baseline_copy"]
    recs = json.loads((workdir / "results/summary/recommendations.json").read_text())
    md = (workdir / "results/summary/summary.md").read_text()
    crossings = [line for line in md.splitlines() if line.startswith("- **baseline_copy**")
                 and ("stops paying at" in line or "starts paying at" in line)]
    return {"verdicts": mine, "recommendations": recs, "crossovers": crossings,
            "on_flagged": on_flagged(mine, cells_dir or workdir / "results/cells")}


def on_flagged(verdicts: list[dict], cells_dir: Path) -> list[str]:
    """The verdicts (as "server/suite/c/metric") that rest on flagged cells (deciding.explaining.interference)."""
    sys.path.insert(0, str(REPO / "workflow"))
    from specmatch.deciding.explaining.interference import flagged_basis
    from specmatch.records import CellResult, Verdict

    cells = {}
    for p in cells_dir.glob("*/*/r*/c*.json"):
        if p.name.count(".") == 1:
            c = CellResult.from_json(json.loads(p.read_text()))
            cells[(c.server, c.suite, c.concurrency, c.repeat)] = c
    basis = flagged_basis([Verdict.from_json(v) for v in verdicts], cells, "baseline")
    return [f"{k[0]}/{k[1]}/{k[2]}/{k[3]}" for k in basis]


class Neighbour:
    """A nice-19 busy loop switched on for `on` seconds and off for `off`, over and over, in a thread."""

    def __init__(self, on: float, off: float):
        import threading

        self.on, self.off = on, off
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.seconds_on = 0.0

    def run(self) -> None:
        code = "while True:\n    pass\n"
        while not self.stop.is_set():
            p = subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", code], start_new_session=True)
            t0 = time.time()
            self.stop.wait(self.on)
            p.terminate()
            p.wait(10)
            self.seconds_on += time.time() - t0
            self.stop.wait(self.off)

    def __enter__(self) -> "Neighbour":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(30)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/specmatch-aa"))
    p.add_argument("--model", type=Path, default=REPO / "results/models/smollm2-135m")
    p.add_argument("--suite-size", type=int, default=18,
                   help="train_holdout's size (the default's: at least min_per_source 3 x 6 demo sources)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--repeats", default="2:3", help="R (fixed) or MIN:MAX (the sequential design, as the default)")
    p.add_argument("--reanalyse", action="store_true",
                   help="count the claims of the kept runs again with the current analysis code (no measuring)")
    p.add_argument("--neighbour-every", type=int, default=0, help="every K-th run has a neighbour (0: none)")
    p.add_argument("--neighbour-on", type=float, default=60.0)
    p.add_argument("--neighbour-off", type=float, default=120.0)
    p.add_argument("--on-interference", choices=["remeasure", "flag"], default=None,
                   help="requests.on_interference for every run (default: the config's)")
    a = p.parse_args()
    repeats = ({"min": int(a.repeats.split(":")[0]), "max": int(a.repeats.split(":")[1])} if ":" in a.repeats
               else int(a.repeats))
    if a.reanalyse:
        return report([reanalyse(d) for d in sorted((a.workdir / "aa").glob("run*"), key=lambda d: int(d.name[3:]))],
                      a.workdir, "reanalysed")
    model = a.model if a.model and a.model.exists() else None
    cfg = config(a.suite_size, a.concurrency, repeats)
    if a.on_interference:
        cfg["requests"]["on_interference"] = a.on_interference
    prepare(a.workdir, model, cfg)
    exe = Path(sys.executable).parent / "snakemake"
    base = [str(exe), "--cores", "all", "--configfile", "aa.yaml"]
    runs = []
    for k in range(1, a.runs + 1):
        t0 = time.time()
        for d in MEASURED:
            shutil.rmtree(a.workdir / d, ignore_errors=True)
        noisy = bool(a.neighbour_every) and k % a.neighbour_every == 0
        with (Neighbour(a.neighbour_on, a.neighbour_off) if noisy else contextlib.nullcontext()):
            r = subprocess.run(base, cwd=a.workdir, capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout[-3000:], r.stderr[-3000:], file=sys.stderr)
            print(f"run {k} failed", file=sys.stderr)
            return 1
        keep = a.workdir / "aa" / f"run{k}"
        if keep.exists():
            shutil.rmtree(keep)
        shutil.copytree(a.workdir / "results/summary", keep)
        for d in ("results/cells", "results/rounds"):
            if (a.workdir / d).exists():
                shutil.copytree(a.workdir / d, keep / Path(d).name)
        shutil.copy2(a.workdir / "aa.yaml", keep / "aa.yaml")
        got = claims(a.workdir)
        got["neighbour"] = noisy
        (keep / "claims.json").write_text(json.dumps({"neighbour": noisy, "on_flagged": got["on_flagged"]}))
        runs.append(got)
        wrong = [v for v in got["verdicts"] if v["verdict"] in ("pays", "loses")]
        print(f"run {k}: {time.time() - t0:.0f} s; {len(got['verdicts'])} verdicts, {len(wrong)} claim a difference "
              + ("(" + ", ".join(f"{v['metric']} c={v['concurrency']} {v['verdict']} {v['speedup']:.3f}x "
                                 f"[{v['lo']:.3f}, {v['hi']:.3f}]" for v in wrong) + ")" if wrong else "")
              + f"; {len(got['crossovers'])} crossover(s)" + (f"; neighbour; {len(got['on_flagged'])} verdict(s) rest "
                                                                  "on flagged cells" if noisy else ""), flush=True)
    return report(runs, a.workdir, "measured")


MEASURED = ("results/servers", "results/cells", "results/rounds", "results/recommend", "results/summary")


def reanalyse(run: Path) -> dict:
    """One kept run's claims from its raw cells, with the analysis code as it is now."""
    import polars as pl

    sys.path.insert(0, str(REPO / "workflow"))
    from specmatch.deciding.analysis import analyse
    from specmatch.deciding.reading.measurements import Settings
    from specmatch.records import CellResult

    cfg = yaml.safe_load((run / "aa.yaml").read_text())
    cells = [(CellResult.from_json(json.loads(p.read_text())), pl.read_parquet(p.with_name(p.stem + ".requests.parquet")))
             for p in sorted(run.glob("cells/*/*/r*/c*.json")) if p.name.count(".") == 1]
    s = Settings.of({**cfg["summary"], "repeats": cfg["repeats"]})
    an = analyse(cells, "baseline", s)
    mine = [v.to_json() for v in an.verdicts if v.server == "baseline_copy"]
    cross = [x for k, xs in an.crossovers.items() if k[0] == "baseline_copy" for x in xs]
    kept = json.loads((run / "claims.json").read_text()) if (run / "claims.json").exists() else {}
    return {"verdicts": mine, "recommendations": [], "crossovers": cross, "neighbour": kept.get("neighbour", False),
            "on_flagged": on_flagged(mine, run / "cells")}


def report(runs: list[dict], workdir: Path, how: str) -> int:
    n = sum(len(g["verdicts"]) for g in runs)
    bad = sum(1 for g in runs for v in g["verdicts"] if v["verdict"] in ("pays", "loses"))
    eq = sum(1 for g in runs for v in g["verdicts"] if v["verdict"] == "equivalent")
    any_run = sum(1 for g in runs if any(v["verdict"] in ("pays", "loses") for v in g["verdicts"]) or g["crossovers"])
    rate = bad / n if n else float("nan")
    se = math.sqrt(rate * (1 - rate) / n) if n else float("nan")
    by_metric: dict = {}
    for g in runs:
        for v in g["verdicts"]:
            m = by_metric.setdefault(v["metric"], [0, 0])
            m[0] += 1
            m[1] += v["verdict"] in ("pays", "loses")
    print(f"\nA/A on the real engine ({how}): {len(runs)} runs, {n} verdicts of baseline_copy against baseline")
    print(f"claims a difference (pays or loses): {bad}/{n} = {rate:.1%} ± {se:.1%} (nominal at most "
          f"{1 - 0.9:.0%} at 90% confidence); equivalent: {eq}/{n}")
    print("by metric: " + ", ".join(f"{m} {b}/{t}" for m, (t, b) in sorted(by_metric.items())))
    print(f"runs with any false claim (a verdict or a crossover): {any_run}/{len(runs)}")
    recs = sum(len(g["recommendations"]) for g in runs)
    print(f"recommendations: {recs} (the copy does not speculate, so none is made for it)")
    split = {}
    for label, group in (("with a neighbour", [g for g in runs if g.get("neighbour")]),
                         ("quiet", [g for g in runs if not g.get("neighbour")])):
        m = sum(len(g["verdicts"]) for g in group)
        if not m:
            continue
        claimed = [(g, v) for g in group for v in g["verdicts"] if v["verdict"] in ("pays", "loses")]
        hidden = [1 for g, v in claimed if f"{v['server']}/{v['suite']}/{v['concurrency']}/{v['metric']}"
                  not in set(g.get("on_flagged", []))]
        r_all, r_hid = len(claimed) / m, len(hidden) / m
        split[label] = {"runs": len(group), "verdicts": m, "claims": len(claimed), "unannounced": len(hidden),
                        "rate": r_all, "rate_unannounced": r_hid,
                        "se": math.sqrt(r_all * (1 - r_all) / m), "se_unannounced": math.sqrt(r_hid * (1 - r_hid) / m)}
        print(f"{label}: {len(group)} runs, {m} verdicts: false claims {len(claimed)}/{m} = {r_all:.1%} ± "
              f"{split[label]['se']:.1%}; unannounced (resting on no flagged cell) {len(hidden)}/{m} = {r_hid:.1%} ± "
              f"{split[label]['se_unannounced']:.1%}")
    (workdir / "aa" / f"summary-{how}.json").write_text(json.dumps(
        {"runs": len(runs), "verdicts": n, "false_claims": bad, "rate": rate, "se": se, "equivalent": eq,
         "by_metric": by_metric, "runs_with_any_claim": any_run, "by_neighbour": split}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
