"""Prompt extraction at scale: decode and sample a suite from 100k tokenized training rows.

Builds a 100k-row tokenized JSONL root (ChatML-like rows: system+user prompt, assistant completion,
loss_mask on the completion, 5 sources of different sizes), inspects it (which writes the cut
table), then times the training suite extraction once inspection has run (read the cut table,
filter, dedup, stratified sample, read back only the sampled rows, decode them, split their
messages) and reports it beside a plain `json.loads` pass over the same files as the reference.

    .venv/bin/python bench/prompts_rate.py [--rows 100000] [--size 1000]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "workflow"))


def build(root: Path, rows: int) -> None:
    rng = random.Random(0)
    shares = {"swe_agent": 0.4, "tool_calls": 0.25, "code_instruct": 0.2, "reasoning": 0.1, "chat": 0.05}
    for src, share in shares.items():
        d = root / src
        d.mkdir(parents=True)
        with open(d / "tokenized_data.jsonl", "w") as fh:
            for i in range(int(rows * share)):
                p, c = rng.randint(100, 700), rng.randint(30, 300)
                ids = [1] + [rng.randrange(3, 49000) for _ in range(p - 1)] + [rng.randrange(3, 49000) for _ in range(c - 1)] + [2]
                fh.write(json.dumps({"id": f"{src}-{i}", "input_ids": ids, "loss_mask": [0] * p + [1] * c}) + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--size", type=int, default=1000)
    p.add_argument("--tokenizer", default=str(REPO / "results" / "models" / "smollm2-135m"))
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    a = p.parse_args()
    from specmatch.data.cuts import read_cuts, write_cuts
    from specmatch.data.inspect_pass import inspect_root
    from specmatch.data.prompts import training_suite
    from specmatch.data.rows import ChatTemplate
    from specmatch.data.tokenizer import load_tokenizer

    tok = load_tokenizer(a.tokenizer)
    template = ChatTemplate.of(tok)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "prepared"
        build(root, a.rows)
        size = sum(f.stat().st_size for f in root.rglob("*.jsonl")) / 1e6
        t0 = time.perf_counter()
        for f in root.rglob("*.jsonl"):
            with open(f) as fh:
                for line in fh:
                    json.loads(line)
        t_json = time.perf_counter() - t0
        t0 = time.perf_counter()
        manifest, cuts = inspect_root(root, a.tokenizer, holdout={"fraction": 0.05}, workers=a.workers)
        t_inspect = time.perf_counter() - t0
        write_cuts(Path(d) / "cuts.parquet", cuts)
        t0 = time.perf_counter()
        rows, match = training_suite("bench", {"size": a.size, "seed": 0, "turn": "last", "weighting": "mix",
                                               "max_prompt_tokens": 4096}, manifest,
                                     read_cuts(Path(d) / "cuts.parquet"), template)
        t_suite = time.perf_counter() - t0
        print(f"root: {a.rows} rows, {size:.0f} MB in 5 sources")
        print(f"json.loads pass over all rows: {t_json:6.2f} s")
        print(f"inspect (statistics + cut table, {a.workers} processes): {t_inspect:6.2f} s  "
              f"({t_json / t_inspect:.2f}x faster than the json pass)")
        print(f"suite of {len(rows)} (from {cuts.height} cuts: filter, dedup, sample, read back, decode, split): "
              f"{t_suite:6.2f} s")
        print(f"suite source TVD vs mix: {match.source_tvd_vs_training_mix:.4f}")


if __name__ == "__main__":
    main()
