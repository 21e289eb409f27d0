#!/usr/bin/env python3
"""Are the report's files the same before and after a change? Re-decide and re-render a stored results
tree with two versions of the code and compare every file under results/summary byte by byte.

The stored tree's inputs (cells, launch records, prompt match reports, the recommend step's records,
round plans) are linked read-only into two fresh working folders; each version runs the decide step and
then the summary step there with the exact arguments Snakemake used for the stored run (the
`python -m specmatch decide ...` and `... summary ...` lines of COMMANDS, e.g. from
`snakemake -n -p --forcerun decide`), and writes its own results/summary. Then every file but the
provenance sidecars is compared: identical bytes, the same JSON with keys in another order, or
different (a diff is shown).

    python scripts/same_outputs.py --results /work/results-run0 --commands /work/results-run0/COMMANDS.txt
        --rev REV [--after-rev REV] [--work /tmp/same_outputs] [--key-order-ok recommendations.json]

`--rev` is the code before the change (extracted with `git archive`: no worktree is added); the code
after is this checkout as it is, or --after-rev. Exit status 0 when every file is identical (or differs
only in key order where --key-order-ok allows it) and the stored tree's own summary is reproduced by
`before`; 1 otherwise.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INPUTS = ("cells", "servers", "prompts", "recommend", "rounds", "inspect", "stepcost")   # what the steps read


def step_command(commands: Path, step: str) -> list[str]:
    """The stored run's `python -m specmatch <step>` arguments (its first such line)."""
    for line in commands.read_text().splitlines():
        line = line.strip()
        if f"specmatch {step} " in line:
            argv = shlex.split(line.split(" > ", 1)[0])
            return argv[argv.index(step) + 1:]
    raise SystemExit(f"{commands}: no `python -m specmatch {step}` command")


def extract(rev: str, dst: Path) -> Path:
    """The code at `rev`, extracted into `dst` (git archive: no worktree, no checkout)."""
    if not (dst / "workflow" / "specmatch").exists():
        dst.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "workflow"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dst)], input=archive, check=True)
    return dst


def workdir(results: Path, dst: Path) -> Path:
    """A folder whose results/ links the stored inputs and has an empty results/summary."""
    if dst.exists():
        shutil.rmtree(dst)
    (dst / "results" / "summary").mkdir(parents=True)
    for name in INPUTS:
        if (results / name).exists():
            os.symlink((results / name).resolve(), dst / "results" / name)
    return dst


def run(argv: list[str], cwd: Path, package: Path, log: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(package), "MPLBACKEND": "Agg"}
    with open(log, "a") as fh:
        fh.write("$ " + shlex.join(argv) + "\n")
        fh.flush()
        r = subprocess.run(argv, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise SystemExit(f"{shlex.join(argv[:4])} ... failed ({r.returncode}); see {log}")


def files(folder: Path) -> dict[str, Path]:
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.endswith(".prov.json") and ".partial" not in p.name}


def compare(a: Path, b: Path) -> tuple[str, list[str]]:
    """identical | key order | differs, with a short diff for text."""
    x, y = a.read_bytes(), b.read_bytes()
    if x == y:
        return "identical", []
    if a.suffix == ".json":
        try:
            if json.loads(x) == json.loads(y):
                return "key order", []
        except ValueError:
            pass
    if a.suffix in (".md", ".csv", ".json"):
        diff = list(difflib.unified_diff(x.decode().splitlines(), y.decode().splitlines(), "before", "after",
                                         lineterm="", n=0))
        return "differs", diff[:40]
    return "differs", [f"{len(x)} bytes before, {len(y)} after"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, required=True, help="a stored results/ tree")
    p.add_argument("--commands", type=Path, required=True, help="the commands Snakemake ran for it")
    p.add_argument("--rev", required=True, help="the code before the change")
    p.add_argument("--after-rev", help="the code after the change (default: this checkout as it is)")
    p.add_argument("--work", type=Path, default=Path("/tmp/same_outputs"))
    p.add_argument("--key-order-ok", nargs="*", default=[], help="files whose JSON may differ in key order only")
    a = p.parse_args(argv)
    py = sys.executable
    steps = [(step, step_command(a.commands, step)) for step in ("decide", "summary")]
    base = extract(a.rev, a.work / f"code-{a.rev}")
    new = extract(a.after_rev, a.work / f"code-{a.after_rev}") if a.after_rev else REPO
    before, after = workdir(a.results, a.work / "before"), workdir(a.results, a.work / "after")
    log = a.work / "steps.log"
    log.write_text("")
    for folder, code in ((before, base), (after, new)):
        for step, args in steps:
            run([py, "-m", "specmatch", step, *args], folder, code / "workflow", log)
    ok = True
    stored = files(a.results / "summary")
    first, second = files(before / "results" / "summary"), files(after / "results" / "summary")
    print(f"{'file':<40} before vs stored   after vs before")
    for name in sorted(set(first) | set(second)):
        if name not in first:
            print(f"{name:<40} {'':<18} new (after only)")
            continue
        if name not in second:
            print(f"{name:<40} {'':<18} MISSING after")
            ok = False
            continue
        vs_stored = compare(stored[name], first[name])[0] if name in stored else "not stored"
        got, diff = compare(first[name], second[name])
        print(f"{name:<40} {vs_stored:<18} {got}")
        for line in diff:
            print("    " + line)
        ok &= vs_stored == "identical" and (got == "identical" or (got == "key order" and name in a.key_order_ok))
    print("SAME" if ok else "DIFFERENT", f"(logs: {log})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
