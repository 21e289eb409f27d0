"""Inspection rate against the physical floor (`wc -l`) and a plain `json.loads` loop, side by side.

Builds a tokenized JSONL file (default ~200 MB: rows of 2,000 token ids with loss_mask, like EAGLE-3
training rows), then times, in one run on the same warm file:
  wc -l            the disk/page-cache floor
  json.loads loop  the cheapest Python that parses every row (no statistics at all)
  specmatch        inspection: parse, validate, full statistics and the cut table, with one process
                   and with one per CPU (the file is read in line-aligned ranges)
and reports the ratios and specmatch's peak memory (RSS, measured in a child process).

    .venv/bin/python bench/inspect_rate.py [--mb 200] [--tokens 2000]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "workflow"))


def build(path: Path, mb: int, tokens: int) -> int:
    rng = random.Random(0)
    rows = 0
    with open(path, "w") as fh:
        while fh.tell() < mb * 1_000_000:
            p = rng.randint(tokens // 4, tokens * 3 // 4)
            ids = [1] + [rng.randrange(3, 49000) for _ in range(tokens - 2)] + [2]
            fh.write(json.dumps({"input_ids": ids, "loss_mask": [0] * p + [1] * (tokens - p)}) + "\n")
            rows += 1
    return rows


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def json_loop(path: Path) -> int:
    n = 0
    with open(path) as fh:
        for line in fh:
            json.loads(line)
            n += 1
    return n


CHILD = """
import sys, time, resource, json
sys.path.insert(0, {pkg!r})
from pathlib import Path
from specmatch.data.inspect_pass import inspect_root
from specmatch.data.tokenizer import load_tokenizer
load_tokenizer({tok!r})
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t0 = time.perf_counter()
m, cuts = inspect_root(Path({root!r}), {tok!r}, workers={workers})
dt = time.perf_counter() - t0
peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps({{"seconds": dt, "rows": m.total_rows, "tokens": m.total_tokens, "cuts": cuts.height,
                  "maxrss_mb": peak / 1024, "base_mb": base}}))
"""


def specmatch(root: Path, tok: str, workers: int) -> dict:
    child = subprocess.run([sys.executable, "-c", CHILD.format(pkg=str(REPO / "workflow"), tok=tok, root=str(root),
                                                             workers=workers)],
                           capture_output=True, text=True, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=int, default=200)
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--tokenizer", default=str(REPO / "results" / "models" / "smollm2-135m"))
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeat", type=int, default=3, help="best of this many runs of each method")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "prepared" / "bench" / "tokenized_data.jsonl"
        path.parent.mkdir(parents=True)
        rows = build(path, a.mb, a.tokens)
        size = path.stat().st_size / 1e6
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
        # best of --repeat, the methods interleaved: this machine's neighbours come and go
        t_wc = t_json = float("inf")
        runs: dict[int, dict] = {}
        for _ in range(a.repeat):
            t_wc = min(t_wc, timed(lambda: subprocess.run(["wc", "-l", str(path)], capture_output=True,
                                                          check=True))[0])
            t, n = timed(lambda: json_loop(path))
            t_json = min(t_json, t)
            for w in (1, a.workers):
                r = specmatch(path.parent.parent, a.tokenizer, w)
                if w not in runs or r["seconds"] < runs[w]["seconds"]:
                    runs[w] = r
        assert all(n == rows == r["rows"] for r in runs.values())
        print(f"file: {size:.0f} MB, {rows} rows x {a.tokens} tokens; {os.cpu_count()} CPUs")
        print(f"{'method':<26}{'seconds':>9}{'MB/s':>9}{'rows/s':>10}{'vs json.loads':>15}")
        table = [("wc -l", t_wc), ("json.loads loop", t_json)]
        table += [(f"specmatch, {w} process{'es' if w > 1 else ''}", r["seconds"]) for w, r in runs.items()]
        for name, t in table:
            print(f"{name:<26}{t:>9.2f}{size / t:>9.1f}{rows / t:>10.0f}{t_json / t:>14.2f}x")
        for w, r in runs.items():
            print(f"specmatch ({w} process{'es' if w > 1 else ''}): {t_json / r['seconds']:.2f}x faster than the "
                  f"json.loads loop, {r['seconds'] / t_wc:.1f}x the time of wc -l; peak RSS {r['maxrss_mb']:.0f} MB "
                  f"per process, {r['base_mb']:.0f} MB before reading (interpreter, tokenizer): reading adds "
                  f"{r['maxrss_mb'] - r['base_mb']:.0f} MB for a {size:.0f} MB file; {r['cuts']} cuts written")


if __name__ == "__main__":
    main()
