"""Inspect a drafter's training root in one pass: describe the whole mix and write the cut table.

Each top-level entry of `dataset.root` is a source (a folder read recursively, or a single file).
Every data file is recognised by content (readers.py) and every row read once (rows.py decides
what it means). Per source the manifest gives rows, tokens, prompt/completion length
distributions (prompt = everything before the last assistant turn, completion = that turn),
assistant turns, tool use, and the source's share of rows and tokens. In the same pass every
assistant turn of every row becomes a row of the **cut table** (`cuts.parquet`, records.Cut):
prompt extraction samples from it and reads back only the rows it chose.

Nothing is dropped silently: malformed rows are counted with their reason and first `file:line`
locations; more than `max_malformed_fraction` of them fails the step. Token ids outside the
tokenizer's vocabulary, or a chat template whose special tokens appear in no row, fail with a
message saying the data was probably tokenized with another tokenizer.

Speed: tokenized JSON Lines rows (the EAGLE-3 training format) are checked and measured without
building Python objects per token (msgspec skips over the arrays, numpy parses them per batch);
any batch that is not plainly well-formed goes through the exact row-by-row path, which locates
the problem. Large uncompressed files are split into line-aligned byte ranges and, like separate
files, read by several processes (`--workers`); memory stays bounded by one batch per process.

The step is this module; its parts are the fast reader (inspect_reader: one file or byte range),
the root pass (inspect_pass: units, workers, the manifest and the cut table), the report
(inspect_report: report.md and the mix chart) and the cut table's I/O (cuts, which the steps that
read the table import instead of this one).

    python -m specmatch inspect --root DIR --tokenizer TOK --out manifest.json --cuts cuts.parquet
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jsonschema
import yaml

from .. import steps
from ..files import SCHEMAS_DIR, SpecmatchError, write_json, write_text
from ..provenance import Recorder
from ..records import Manifest
from .cuts import write_cuts
from .inspect_pass import inspect_root
from .inspect_report import mix_chart, render_report

MANIFEST_SCHEMA = SCHEMAS_DIR / "manifest.schema.yaml"


def check_manifest(manifest: Manifest) -> dict:
    """The manifest's JSON form, checked against workflow/schemas/manifest.schema.yaml (a manifest that
    breaks its schema is a bug here, never written)."""
    obj = manifest.to_json()
    schema = yaml.safe_load(MANIFEST_SCHEMA.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        raise SpecmatchError("the manifest breaks its schema (a bug in specmatch.data.inspection):\n  " + "\n  ".join(
            f"{'.'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message}" for e in errors[:10]))
    return obj


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", required=True, type=Path)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", required=True, type=Path, help="manifest.json")
    p.add_argument("--cuts", required=True, type=Path, help="cuts.parquet: one row per assistant turn")
    p.add_argument("--report", type=Path, help="report.md")
    p.add_argument("--chart", type=Path, help="mix.png (the training mix by source)")
    p.add_argument("--holdout", default="{}", help="dataset.holdout as JSON: which rows the drafter never saw")
    p.add_argument("--max-malformed-fraction", type=float, default=0.0)
    p.add_argument("--workers", type=int, default=1, help="processes reading files (or parts of large files)")


def execute(a: argparse.Namespace) -> int:
    holdout = json.loads(a.holdout)
    manifest, cuts = inspect_root(a.root, a.tokenizer, a.max_malformed_fraction, holdout, a.workers)
    write_json(a.out, check_manifest(manifest))
    write_cuts(a.cuts, cuts)
    outputs = [a.out, a.cuts]
    if a.chart:
        mix_chart(manifest, a.chart)
        outputs.append(a.chart)
    if a.report:
        write_text(a.report, render_report(manifest, a.chart))
        outputs.append(a.report)
    Recorder("inspect", manifest.training_files(), {"root": str(a.root), "tokenizer": a.tokenizer, "holdout": holdout,
                                                    "max_malformed_fraction": a.max_malformed_fraction}).write(outputs)
    print(f"inspected {manifest.total_rows} rows in {len(manifest.sources)} sources "
          f"({manifest.total_skipped} skipped, {manifest.cuts} cuts) in {manifest.seconds} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    return steps.main("inspect", __doc__, arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
