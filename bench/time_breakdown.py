"""Where a run's wall time goes: from its Snakemake log, its cells and launch records.

Reads the Snakemake log of one run (the `.snakemake/log/*.snakemake.log` of the run, or a copy) for every
job's rule, wildcards, start and end, and the run's results tree for what the jobs measured (a cell's
measured duration, and its re-measurements; a launch's server start-up time). Reports:

- the run's wall time from Snakemake's start to its last job, split into the time jobs ran (by rule;
  cells by server and concurrency, with their measured part apart from their overhead: warm-up, cache
  reset, metrics scrapes, the step's own Python start-up and, where a cell found no server, its start),
  Snakemake's own time before the first job (DAG), and the gaps between jobs where none ran
  (Snakemake's scheduling, checkpoints re-evaluated, job start-up);
- the slowest jobs.

    .venv/bin/python bench/time_breakdown.py --log /work/results-run0/snakemake.log --results /work/results-run0/results
        [--out bench/out/time_breakdown]

Writes `<out>.json` and `<out>.txt`. Seconds.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
RULE = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):$")
FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)")
DATE = re.compile(r"^\s*Date: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


@dataclass
class Job:
    jobid: int
    rule: str
    start: float
    end: float | None = None
    wildcards: dict = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return (self.end or self.start) - self.start


def parse_log(text: str) -> tuple[float | None, list[Job]]:
    """(Snakemake's start time, the jobs) from a Snakemake 8/9 log: a job starts at the `[date]` line before
    its `rule NAME:` block and ends at the `[date]` line before `Finished jobid: N`."""
    started = None
    jobs: dict[int, Job] = {}
    stamp = None
    pending: Job | None = None
    for line in text.splitlines():
        m = DATE.match(line)
        if m and started is None:
            started = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
            continue
        m = STAMP.match(line.strip())
        if m:
            stamp = dt.datetime.strptime(re.sub(" +", " ", m.group(1)), "%a %b %d %H:%M:%S %Y").timestamp()
            continue
        m = RULE.match(line.strip())
        if m and stamp is not None:
            pending = Job(-1, m.group(1), stamp)
            continue
        s = line.strip()
        if pending is not None and s.startswith("jobid:"):
            pending.jobid = int(s.split(":", 1)[1])
            jobs[pending.jobid] = pending
            continue
        if pending is not None and s.startswith("wildcards:"):
            pending.wildcards = dict(kv.split("=", 1) for kv in s.split(":", 1)[1].strip().split(", ") if "=" in kv)
            continue
        m = FINISHED.match(s)
        if m and stamp is not None and int(m.group(1)) in jobs:
            jobs[int(m.group(1))].end = stamp
    return started, sorted(jobs.values(), key=lambda j: j.start)


def busy_union(jobs: list[Job]) -> float:
    """Seconds during which at least one job ran."""
    total, cur_s, cur_e = 0.0, None, None
    for j in sorted(jobs, key=lambda j: j.start):
        e = j.end or j.start
        if cur_e is None or j.start > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = j.start, e
        else:
            cur_e = max(cur_e, e)
    return total + ((cur_e - cur_s) if cur_e is not None else 0.0)


def gaps(jobs: list[Job]) -> list[tuple[float, str, str]]:
    """(seconds, before, after) for every stretch with no job running."""
    out, cur_e, last = [], None, None
    for j in sorted(jobs, key=lambda j: j.start):
        if cur_e is not None and j.start > cur_e:
            out.append((j.start - cur_e, last.rule, j.rule))
        if cur_e is None or (j.end or j.start) > cur_e:
            cur_e, last = (j.end or j.start), j
    return out


def cell_record(results: Path, w: dict) -> dict | None:
    p = results / "cells" / w.get("server", "?") / w.get("suite", "?") / f"r{w.get('repeat', '?')}" / \
        f"c{w.get('concurrency', '?')}.json"
    return json.loads(p.read_text()) if p.exists() else None


def breakdown(log: Path, results: Path | None) -> dict:
    started, jobs = parse_log(log.read_text())
    if not jobs:
        raise SystemExit(f"{log}: no jobs found")
    end = max((j.end or j.start) for j in jobs)
    wall = end - (started or jobs[0].start)
    by_rule: dict = {}
    for j in jobs:
        r = by_rule.setdefault(j.rule, {"jobs": 0, "seconds": 0.0})
        r["jobs"] += 1
        r["seconds"] += j.seconds
    cells: dict = {}
    launches = []
    for j in jobs:
        if j.rule == "cell":
            key = f"{j.wildcards.get('server')} c={j.wildcards.get('concurrency')}"
            c = cells.setdefault(key, {"jobs": 0, "wall": 0.0, "measured": 0.0, "remeasured": 0.0, "started_server": 0})
            c["jobs"] += 1
            c["wall"] += j.seconds
            rec = cell_record(results, j.wildcards) if results else None
            if rec:
                c["measured"] += rec.get("duration") or 0.0
                c["remeasured"] += sum(e.get("duration") or 0.0 for e in rec.get("earlier") or [])
                c["started_server"] += not rec.get("server_reused", True)
        if j.rule == "launch" and results:
            p = results / "servers" / j.wildcards.get("server", "?") / f"r{j.wildcards.get('repeat', '?')}" / "launch.json"
            rec = json.loads(p.read_text()) if p.exists() else {}
            launches.append({"server": j.wildcards.get("server"), "repeat": j.wildcards.get("repeat"),
                             "job_s": j.seconds, "startup_s": rec.get("startup_s"),
                             "reused": rec.get("reused_running_server")})
    g = gaps(jobs)
    return {"log": str(log), "wall_s": wall, "before_first_job_s": jobs[0].start - started if started else None,
            "busy_s": busy_union(jobs), "gaps_s": sum(x for x, _, _ in g), "gaps": len(g),
            "largest_gaps": sorted(g, reverse=True)[:8], "by_rule": by_rule, "cells": cells, "launches": launches,
            "slowest": [asdict(j) for j in sorted(jobs, key=lambda j: -j.seconds)[:10]], "jobs": len(jobs)}


def report(b: dict) -> list[str]:
    m = lambda s: f"{s / 60:.1f} min"  # noqa: E731
    lines = [f"Run wall time {m(b['wall_s'])} ({b['jobs']} jobs): Snakemake before its first job "
             f"{b['before_first_job_s'] or 0:.0f} s; jobs running {m(b['busy_s'])}; no job running "
             f"{b['gaps_s']:.0f} s over {b['gaps']} gaps (Snakemake's scheduling between jobs)", "",
             "| rule | jobs | seconds | share of wall |", "|---|---|---|---|"]
    for rule, r in sorted(b["by_rule"].items(), key=lambda kv: -kv[1]["seconds"]):
        lines.append(f"| {rule} | {r['jobs']} | {r['seconds']:.0f} | {r['seconds'] / b['wall_s']:.0%} |")
    if b["cells"]:
        lines += ["", "| cells of | jobs | job seconds | measured | re-measured | overhead (job - measured) | "
                      "per cell: job / measured | started a server |", "|---|---|---|---|---|---|---|---|"]
        for key, c in sorted(b["cells"].items()):
            over = c["wall"] - c["measured"] - c["remeasured"]
            lines.append(f"| {key} | {c['jobs']} | {c['wall']:.0f} | {c['measured']:.0f} | {c['remeasured']:.0f} | "
                         f"{over:.0f} | {c['wall'] / c['jobs']:.1f} / {c['measured'] / c['jobs']:.1f} | "
                         f"{c['started_server']} |")
    if b["launches"]:
        lines += ["", "Launches (job seconds / the server's own start-up): " + ", ".join(
            f"{x['server']} r{x['repeat']} {x['job_s']:.0f}/{x['startup_s'] or 0:.0f}" for x in b["launches"])]
    lines += ["", "Largest gaps with no job running: " + ", ".join(f"{s:.0f} s ({a} -> {c})"
                                                                   for s, a, c in b["largest_gaps"])]
    lines += ["", "Slowest jobs: " + ", ".join(f"{j['rule']} {j['wildcards'] or ''} {j['end'] - j['start']:.0f} s"
                                               for j in b["slowest"])]
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--results", type=Path, default=None)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "time_breakdown")
    a = p.parse_args()
    b = breakdown(a.log, a.results)
    lines = report(b)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{a.out}.json").write_text(json.dumps(b, indent=1))
    Path(f"{a.out}.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
