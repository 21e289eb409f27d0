"""Inspection rate against the physical floor (`wc -l`) and a plain `json.loads` loop, side by side.

Builds a tokenized JSONL file (default ~200 MB: rows of 2,000 token ids with loss_mask, like EAGLE-3
training rows), then times, in one run on the same warm file:
  wc -l            the disk/page-cache floor
  json.loads loop  the cheapest Python that parses every row (no statistics at all)
  specmatch        readers + SourceInspector: parse, validate, full statistics
and reports the ratios and specmatch's peak memory (RSS, measured in a child process).

    .venv/bin/python bench/inspect_rate.py [--mb 200] [--tokens 2000]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
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
from specmatch import readers
from specmatch.inspect import SourceInspector, template_token_ids
from specmatch.tokenizer import load_tokenizer
tok = load_tokenizer({tok!r})
ins = SourceInspector("bench", Path({path!r}), template_token_ids(tok), tok, 0.0)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t0 = time.perf_counter()
ins.add_file(readers.sniff(Path({path!r})))
dt = time.perf_counter() - t0
s = ins.summary()
print(json.dumps({{"seconds": dt, "rows": s["rows"], "tokens": s["tokens"],
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "base_mb": base}}))
"""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=int, default=200)
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--tokenizer", default=str(REPO / "results" / "models" / "smollm2-135m"))
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tokenized_data.jsonl"
        rows = build(path, a.mb, a.tokens)
        size = path.stat().st_size / 1e6
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
        t_wc, _ = timed(lambda: subprocess.run(["wc", "-l", str(path)], capture_output=True, check=True))
        t_json, n = timed(lambda: json_loop(path))
        child = subprocess.run([sys.executable, "-c", CHILD.format(pkg=str(REPO / "workflow"), tok=a.tokenizer,
                                                                 path=str(path))],
                               capture_output=True, text=True, check=True)
        sm = json.loads(child.stdout.strip().splitlines()[-1])
        assert n == rows == sm["rows"]
        print(f"file: {size:.0f} MB, {rows} rows x {a.tokens} tokens")
        print(f"{'method':<16}{'seconds':>9}{'MB/s':>9}{'rows/s':>10}")
        for name, t in (("wc -l", t_wc), ("json.loads loop", t_json), ("specmatch", sm["seconds"])):
            print(f"{name:<16}{t:>9.2f}{size / t:>9.1f}{rows / t:>10.0f}")
        print(f"ratios: specmatch/json.loads = {sm['seconds'] / t_json:.2f}x time, "
              f"specmatch/wc -l = {sm['seconds'] / t_wc:.1f}x time")
        print(f"specmatch peak RSS: {sm['maxrss_mb']:.0f} MB for a {size:.0f} MB file, of which "
              f"{sm['base_mb']:.0f} MB before reading (interpreter, polars, tokenizer): the reading itself "
              f"adds {sm['maxrss_mb'] - sm['base_mb']:.0f} MB (one 16 MB batch parsed, plus per-row integers)")


if __name__ == "__main__":
    main()
