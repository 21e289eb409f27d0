"""The root pass of the inspect step: every source under `dataset.root` planned into units, read
(in several processes with `--workers`), and gathered into the manifest and the cut table.

Each top-level entry of the root is a source (a folder read recursively, or a single file). Large
uncompressed JSON Lines files are split into line-aligned byte ranges and, like separate files, read
by several processes (inspect_reader.UnitReader each); memory stays bounded by one batch per process.
Here the units' row and line numbers become file-wide, rows without an `id` get theirs (with their
holdout flag), the per-source summaries and shares are computed, and the checks that fail the step
run: too many malformed rows, token ids outside the vocabulary, no chat-template special token in
any tokenized row (the data was probably tokenized with another tokenizer).
"""
from __future__ import annotations

import gc
import os
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import polars as pl

from . import readers
from ..files import SpecmatchError, sha256_file
from ..records import CUT_SCHEMA, Manifest, SourceSummary, location
from ..stats import describe
from .inspect_reader import SchemaStats, Unit, UnitReader, UnitResult
from .rows import ChatTemplate, is_holdout
from .tokenizer import load_tokenizer, resolve_tokenizer_dir

MAX_LOCATIONS = 5
CHUNK_BYTES = 8 << 20  # uncompressed JSON Lines files are read in line-aligned ranges of this size


# -- the whole root -------------------------------------------------------------------------
_CTX: dict = {}


def _run_unit(k: int) -> UnitResult:
    """Worker entry point: the context (tokenizer, template) is inherited from the parent by fork."""
    c = _CTX
    return UnitReader(c["units"][k], c["template"], c["tpl_ids"], c["holdout"]).run()


def plan_units(sources: list[tuple[str, Path, list[readers.DataFile]]], root: Path, chunk: int) -> list[Unit]:
    """Files in order; large uncompressed JSON Lines files as line-aligned byte ranges."""
    units = []
    for name, _src, files in sources:
        for df in files:
            rel = str(df.path.relative_to(root)) if df.path.is_relative_to(root) else str(df.path)
            if df.format != "jsonl" or df.compression != "none" or df.bytes <= chunk:
                units.append(Unit(name, rel, df))
                continue
            with open(df.path, "rb") as fh:
                start = 0
                while start < df.bytes:
                    end = df.bytes
                    if start + chunk < df.bytes:
                        fh.seek(start + chunk - 1)
                        fh.readline()  # to the end of the line that holds the range's last byte
                        end = fh.tell()
                    units.append(Unit(name, rel, df, start, end))
                    start = end
    return units


def template_token_ids(tok) -> list[int]:
    """Ids of the special tokens the chat template writes (e.g. <|im_start|>), to recognise the tokenizer."""
    tpl = getattr(tok, "chat_template", None) or ""
    if isinstance(tpl, dict):
        tpl = " ".join(tpl.values())
    specials = set(tok.all_special_tokens) | set(getattr(tok, "added_tokens_encoder", {}) or {})
    ids = []
    for s in sorted(specials):
        if s and s in tpl:
            tid = tok.convert_tokens_to_ids(s)
            if isinstance(tid, int) and tid >= 0:
                ids.append(tid)
    return sorted(set(ids))


def inspect_root(root: Path, tokenizer_spec: str, max_malformed_fraction: float = 0.0, holdout: dict | None = None,
                 workers: int = 1, chunk_bytes: int = CHUNK_BYTES) -> tuple[Manifest, pl.DataFrame]:
    """The manifest of the root and its cut table (one Cut per assistant turn of every usable row)."""
    t0 = time.time()
    root = Path(root)
    tok = load_tokenizer(tokenizer_spec)
    vocab = len(tok)
    tpl_ids = template_token_ids(tok)
    src_paths, ignored = readers.list_sources(root)
    sources = []
    for src in src_paths:
        files, ign = readers.discover(src)
        ignored.extend(ign)
        if not files:
            raise SpecmatchError(f"source {src}: no readable data file (expected .jsonl/.json[.gz|.zst], "
                                 ".parquet or .arrow files; found "
                                 + (", ".join(Path(i.path).name for i in ign[:5]) or "nothing") + ")")
        sources.append((readers.source_name(src), src, files))
    units = plan_units(sources, root, chunk_bytes)
    hashes: dict[str, str] = {}
    hasher = threading.Thread(target=lambda: hashes.update(
        {str(df.path): sha256_file(df.path) for _n, _s, files in sources for df in files}), daemon=True)
    hasher.start()  # file hashes (hashlib releases the GIL) while the rows are read
    _CTX.update(units=units, template=ChatTemplate.of(tok), tpl_ids=np.asarray(tpl_ids, dtype=np.int64),
                holdout=holdout or {})
    try:
        if workers > 1 and len(units) > 1:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the tokenizer is shared by fork
            gc.freeze()  # the children's collector leaves the parent's objects (and their pages) alone
            with ProcessPoolExecutor(min(workers, len(units)), mp_context=get_context("fork")) as pool:
                results = list(pool.map(_run_unit, range(len(units))))
        else:
            results = [_run_unit(k) for k in range(len(units))]
    finally:
        _CTX.clear()
        gc.unfreeze()
    hasher.join()
    summaries, parts = [], []
    for name, src, files in sources:
        mine = [(u, r) for u, r in zip(units, results) if u.source == name]
        summaries.append(source_summary(name, src, files, mine, hashes, parts, holdout or {}))
    manifest = finish(root, tokenizer_spec, resolve_tokenizer_dir(tokenizer_spec), tok, vocab, tpl_ids, summaries,
                      ignored, max_malformed_fraction)
    cuts = pl.concat(parts) if parts else pl.DataFrame(schema=CUT_SCHEMA)
    manifest.cuts = cuts.height
    manifest.seconds = round(time.time() - t0, 2)
    return manifest, cuts


def place_cuts(part: pl.DataFrame, u: Unit, row0: int, line0: int, holdout: dict) -> pl.DataFrame:
    """A unit's cuts with file-wide row and line numbers, and the id and holdout flag of rows that
    carry no `id` (their id is "<file relative to root>:<line>", or ":#<row>" outside JSON Lines)."""
    part = part.with_columns(pl.col("row") + row0, pl.col("line") + line0)
    missing = part["row_id"].is_null()
    if not missing.any():
        return part
    where = pl.when(pl.col("line").is_not_null()).then(pl.col("line").cast(pl.String)) \
        .otherwise(pl.lit("#") + pl.col("row").cast(pl.String))
    part = part.with_columns(pl.col("row_id").fill_null(pl.lit(u.relfile + ":") + where))
    flags = {rid: is_holdout(u.source, u.relfile, rid, holdout)
             for rid in part.filter(pl.col("holdout").is_null())["row_id"].unique().to_list()} \
        if (holdout.get("fraction") or holdout.get("files")) else {}
    return part.with_columns(pl.col("holdout").fill_null(
        pl.col("row_id").replace_strict(flags, default=False, return_dtype=pl.Boolean)))


def source_summary(name, path, files, results, hashes, cuts_out: list, holdout: dict) -> SourceSummary:
    """A source's manifest entry; appends its cut-table rows (row numbers made file-wide) to cuts_out."""
    by_schema: dict[str, SchemaStats] = defaultdict(SchemaStats)
    skipped, skipped_at, uncut = Counter(), defaultdict(list), Counter()
    per_file: dict[str, dict] = {}
    base: dict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))  # (rows, lines) before each unit
    for u, r in results:
        path = str(u.df.path)
        row0, line0 = base[path]
        f = per_file.setdefault(path, {"rows": 0, "schemas": Counter()})
        f["rows"] += r.rows
        f["schemas"].update(r.schemas)
        uncut.update(r.uncut)
        for schema, st in r.stats.items():
            by_schema[schema].merge(st)
        for reason, line, row in r.skipped:
            skipped[reason] += 1
            if len(skipped_at[reason]) < MAX_LOCATIONS:
                skipped_at[reason].append(location(path, None if line is None else line + line0, row + row0))
        if r.cuts:
            cuts_out.append(place_cuts(pl.DataFrame(r.cuts, schema=CUT_SCHEMA, orient="row"), u, row0, line0,
                                       holdout))
        base[path] = (row0 + r.rows, line0 + r.lines)
    out_files = []
    for df in files:
        f = per_file[str(df.path)]
        if f["rows"] == 0:
            raise SpecmatchError(f"{df.path}: no rows (expected training rows in {df.format})")
        out_files.append({"path": str(df.path), "bytes": df.bytes, "format": df.format,
                          "compression": df.compression, "hf_dataset": df.hf_dataset,
                          "schemas": dict(f["schemas"]), "rows": f["rows"], "sha256": hashes[str(df.path)]})
    per_schema = {}
    for schema, st in by_schema.items():
        per_schema[schema] = {
            "rows": st.rows, "tokens": st.tokens, "assistant_tokens": st.assistant_tokens,
            "prompt_tokens": describe(st.prompt), "completion_tokens": describe(st.completion),
            "turns": describe(st.turns), "rows_with_tool_use": st.tool_rows,
            "token_counts": "exact" if schema != "conversations" else "exact (rendered with the chat template)",
        }
        if schema == "tokenized":
            per_schema[schema].update({
                "mask": dict(st.mask_kinds), "max_token_id": st.max_token_id, "min_token_id": st.min_token_id,
                "rows_with_template_tokens": st.rows_with_template_tokens})
    # only with one row schema is a single distribution meaningful
    only = next(iter(per_schema.values())) if len(per_schema) == 1 else {}
    return SourceSummary(
        name=name, path=str(path), files=out_files,
        rows=sum(s.rows for s in by_schema.values()),
        rows_seen=sum(f["rows"] for f in out_files),
        tokens=sum(s.tokens for s in by_schema.values()),
        skipped={"total": sum(skipped.values()),
                 "reasons": [{"reason": r, "count": c, "first_locations": skipped_at[r]}
                             for r, c in skipped.most_common()]},
        rows_without_cut=dict(uncut.most_common()),
        schemas=sorted(per_schema),
        mixed_schemas=len(per_schema) > 1,
        by_schema=per_schema,
        prompt_tokens=only.get("prompt_tokens"), completion_tokens=only.get("completion_tokens"),
        turns=only.get("turns"))


def finish(root, tokenizer_spec, tok_dir, tok, vocab, tpl_ids, results: list[SourceSummary], ignored,
           max_malformed_fraction) -> Manifest:
    total_rows = sum(s.rows for s in results)
    total_tokens = sum(s.tokens for s in results)
    problems = []
    for s in results:
        s.share_rows = s.rows / total_rows if total_rows else 0.0
        s.share_tokens = s.tokens / total_tokens if total_tokens else 0.0
        seen = s.rows_seen
        frac = s.skipped["total"] / seen if seen else 1.0
        if s.skipped["total"] and frac > max_malformed_fraction:
            first = s.skipped["reasons"][0]
            problems.append(f"source {s.name}: {s.skipped['total']} of {seen} rows malformed "
                            f"({frac:.1%} > allowed {max_malformed_fraction:.1%}); first: {first['reason']} at "
                            + ", ".join(first["first_locations"]))
        if s.rows == 0:
            problems.append(f"source {s.name} ({s.path}): no usable rows")
        t = s.by_schema.get("tokenized")
        if t and (t["max_token_id"] >= vocab or t["min_token_id"] < 0):
            bad = t["max_token_id"] if t["max_token_id"] >= vocab else t["min_token_id"]
            problems.append(f"source {s.name}: token id {bad} is outside the vocabulary of {tokenizer_spec} "
                            f"(size {vocab}); the data was probably tokenized with another tokenizer")
    tok_rows = sum(s.by_schema.get("tokenized", {}).get("rows", 0) for s in results)
    tpl_rows = sum(s.by_schema.get("tokenized", {}).get("rows_with_template_tokens", 0) for s in results)
    if tok_rows and tpl_ids and tpl_rows == 0:
        names = [tok.convert_ids_to_tokens(i) for i in tpl_ids]
        problems.append(f"no tokenized row contains any chat-template special token of {tokenizer_spec} "
                        f"({', '.join(names)}); the data was probably tokenized with another tokenizer")
    if problems:
        raise SpecmatchError("inspection failed:\n  " + "\n  ".join(problems))
    return Manifest(
        root=str(root),
        tokenizer={"spec": tokenizer_spec, "path": str(tok_dir), "class": type(tok).__name__, "vocab_size": vocab,
                   "template_special_tokens": [tok.convert_ids_to_tokens(i) for i in tpl_ids]},
        total_rows=total_rows,
        total_tokens=total_tokens,
        total_skipped=sum(s.skipped["total"] for s in results),
        max_malformed_fraction=max_malformed_fraction,
        sources=results,
        ignored=[{"path": i.path, "reason": i.reason} for i in ignored],
    )
