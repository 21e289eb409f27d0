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

    python -m specmatch inspect --root DIR --tokenizer TOK --out manifest.json --cuts cuts.parquet
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import time
import warnings
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import jsonschema
import msgspec
import numpy as np
import polars as pl
import yaml

from . import readers
from .. import steps
from ..files import SCHEMAS_DIR, SpecmatchError, atomic_path, sha256_file, write_json, write_text
from ..provenance import Recorder
from ..records import CUT_SCHEMA, Manifest, SourceSummary, location
from .rows import ChatTemplate, flat, ids_key, is_holdout, mask_of, normalise_messages, row_cuts, row_schema, \
    spans_from_mask
from ..stats import describe
from .tokenizer import load_tokenizer, resolve_tokenizer_dir

MAX_LOCATIONS = 5
CHUNK_BYTES = 8 << 20  # uncompressed JSON Lines files are read in line-aligned ranges of this size
TOOL_ROLES = {"tool"}


# -- per-schema statistics ----------------------------------------------------------------------
@dataclass
class SchemaStats:
    rows: int = 0
    tokens: int = 0
    prompt: list = field(default_factory=list)
    completion: list = field(default_factory=list)
    assistant_tokens: int = 0
    turns: list = field(default_factory=list)
    tool_rows: int = 0
    rows_with_template_tokens: int = 0
    max_token_id: int = -1
    min_token_id: int = 1 << 62
    mask_kinds: Counter = field(default_factory=Counter)

    def merge(self, o: "SchemaStats") -> None:
        self.rows += o.rows
        self.tokens += o.tokens
        self.prompt += o.prompt
        self.completion += o.completion
        self.assistant_tokens += o.assistant_tokens
        self.turns += o.turns
        self.tool_rows += o.tool_rows
        self.rows_with_template_tokens += o.rows_with_template_tokens
        self.max_token_id = max(self.max_token_id, o.max_token_id)
        self.min_token_id = min(self.min_token_id, o.min_token_id)
        self.mask_kinds.update(o.mask_kinds)

    def add_spans(self, n_tokens: int, spans: list, assistant: int) -> None:
        self.rows += 1
        self.tokens += n_tokens
        self.assistant_tokens += assistant
        self.turns.append(len(spans))
        if spans:
            s, e = spans[-1]
            self.prompt.append(s)
            self.completion.append(e - s)
        else:
            self.prompt.append(None)
            self.completion.append(None)


# -- one unit of work: a file, or a byte range of a large uncompressed JSON Lines file ----------
@dataclass
class Unit:
    source: str
    relfile: str          # path relative to the root (row ids and holdout files refer to it)
    df: readers.DataFile
    start: int = 0
    end: int | None = None


@dataclass
class UnitResult:
    rows: int = 0
    lines: int = 0                                # physical lines (JSON Lines ranges)
    schemas: Counter = field(default_factory=Counter)
    stats: dict = field(default_factory=lambda: defaultdict(SchemaStats))
    skipped: list = field(default_factory=list)   # (reason, line, row) relative to the unit
    cuts: list = field(default_factory=list)      # records.Cut field tuples, line/row relative to the unit,
                                                  # row_id and holdout None for rows without an `id`
    uncut: Counter = field(default_factory=Counter)  # usable rows with nothing to cut at, by reason
    fast_batches: int = 0


class _RawRow(msgspec.Struct):
    """A tokenized row with its arrays left as undecoded JSON (msgspec still checks the syntax)."""
    input_ids: msgspec.Raw
    loss_mask: msgspec.Raw = msgspec.Raw(b"null")
    labels: msgspec.Raw = msgspec.Raw(b"null")
    id: msgspec.Raw = msgspec.Raw(b"null")


_DECODE = msgspec.json.Decoder(_RawRow)
_MASK_JUNK = b"[], \t\r\n"
_TO_BITS = bytes.maketrans(b"01", b"\x00\x01")


def _ints(raw) -> np.ndarray | None:
    """The integers of a JSON array (or of a [1, L] nested one) without a Python object per item;
    None for anything else (the exact path then says what is wrong). msgspec has checked the JSON
    syntax already; numpy's text reader refuses (warnings as errors) any element that is not an
    integer: a float, a string, a nested list, true/false/null. It reads ~12 KB rows in ~40 us, 4x
    a pure-numpy digit decoder and 6x json.loads (bench/inspect_rate.py)."""
    mv = memoryview(raw)
    if mv[:1] != b"[" or mv[-1:] != b"]":
        return None
    if mv[1:2] == b"[":
        if mv[-2:-1] != b"]" or bytes(mv).count(b"[") != 2:
            return None
        inner = bytes(mv[2:-2])
    else:
        inner = bytes(mv[1:-1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "string or file could not be read to its end": not integers
        try:
            arr = np.fromstring(inner, dtype=np.int64, sep=",")
        except (ValueError, DeprecationWarning):
            return None
    if not arr.size or arr.max() == _I64.max or arr.min() == _I64.min:  # strtoll saturates: beyond int64
        return None
    return arr


_I64 = np.iinfo(np.int64)


class UnitReader:
    """Reads one unit: stats, skipped rows and cuts, by the fast path where it applies."""

    def __init__(self, unit: Unit, template: ChatTemplate, template_ids: np.ndarray, holdout: dict):
        self.u, self.template, self.tpl_ids, self.holdout = unit, template, template_ids, holdout
        self.tpl_set = {int(t) for t in template_ids}
        self.res = UnitResult()

    def ident(self, value) -> tuple[str | None, bool | None]:
        """The row's id and holdout flag, when the row names itself; (None, None) otherwise: the
        fallback id needs the row's line in the whole file, which the parent knows."""
        if value is None:
            return None, None
        rid = str(value)
        return rid, is_holdout(self.u.source, self.u.relfile, rid, self.holdout)

    def skip(self, reason: str, b: readers.Batch, i: int) -> None:
        self.res.skipped.append((reason, b.lines[i] if b.lines is not None else None, b.first_row + i))

    def cut(self, b: readers.Batch, i: int, ident: tuple, schema: str, rc) -> tuple:
        """A records.Cut as a plain tuple of its fields (cheap to build, pickle and frame)."""
        return (self.u.source, str(self.u.df.path), b.first_row + i, b.lines[i] if b.lines else None,
                b.offsets[i] if b.offsets else None, ident[0], schema, rc.turn, rc.turns, rc.prompt_tokens,
                rc.completion_tokens, ident[1], rc.key)

    def run(self) -> UnitResult:
        df = self.u.df
        if df.format == "jsonl":
            tally: dict = {}
            for b in readers.jsonl_batches(df, self.u.start, self.u.end, tally):
                self.res.rows += len(b)
                if not self.fast(b):
                    self.exact(b.parse())
            self.res.lines = tally.get("lines", 0)
        else:
            for b in readers.iter_batches(df):
                self.res.rows += len(b)
                self.exact(b)
        return self.res

    # The fast path: a batch of tokenized JSON Lines rows, or False (nothing recorded).
    def fast(self, b: readers.Batch) -> bool:
        try:
            rows = [_DECODE.decode(line) for line in b.raw]
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
        return self._fast(b, rows, [])

    def _fast(self, b: readers.Batch, rows: list, parsed: list) -> bool:
        for r in rows:
            ids = _ints(r.input_ids)
            if ids is None:
                return False
            n = ids.size
            lm = bytes(r.loss_mask)
            if lm != b"null":
                if lm.lstrip()[:2] == b"[[" and lm.count(b"[") != 2:
                    return False
                bits = lm.translate(_TO_BITS, _MASK_JUNK)
                if len(bits) != n or bits.translate(None, b"\x00\x01"):
                    return False  # not a flat list of 0/1: the exact path handles (or rejects) it
                spans, kind = spans_from_mask(bits), "loss_mask"
            elif (lab := bytes(r.labels)) != b"null":
                lab_ids = _ints(r.labels)
                if lab_ids is None or lab_ids.size != n:
                    return False
                spans, kind = spans_from_mask((lab_ids != -100).astype(np.uint8).tobytes()), "labels"
            else:
                spans, kind = self.template.spans_in_array(ids), "none"
            parsed.append((r, ids, spans, kind))
        st, tpl, tpl_set = self.res.stats["tokenized"], self.tpl_ids, self.tpl_set
        src, path, rel = self.u.source, str(self.u.df.path), self.u.relfile
        for i, (r, ids, spans, kind) in enumerate(parsed):
            st.add_spans(ids.size, spans, sum(e - s for s, e in spans))
            st.mask_kinds[kind] += 1
            st.rows_with_template_tokens += bool(not tpl_set or int(ids[0]) in tpl_set or np.isin(ids, tpl).any())
            if not spans:
                self.res.uncut["no assistant turn in row"] += 1
                continue
            idv = bytes(r.id)
            rid, hold = self.ident(msgspec.json.decode(idv) if idv != b"null" else None)
            off = b.offsets[i] if b.offsets else None
            for t, (s, e) in enumerate(spans):
                self.res.cuts.append((src, path, b.first_row + i, b.lines[i], off, rid, "tokenized", t,
                                      len(spans), s, e - s, hold, ids_key(ids[:s])))
        every = np.concatenate([p[1] for p in parsed])
        st.max_token_id = max(st.max_token_id, int(every.max()))
        st.min_token_id = min(st.min_token_id, int(every.min()))
        self.res.schemas["tokenized"] += len(rows)
        self.res.fast_batches += 1
        return True

    # The exact path: row by row, every problem located.
    def exact(self, b: readers.Batch) -> None:
        for i, row in enumerate(b.rows):
            if row is None:
                self.skip(b.errors.get(i, "unparseable row"), b, i)
                continue
            schema, problem = row_schema(row)
            if problem:
                self.skip(problem, b, i)
                continue
            try:
                cuts, why = row_cuts(self.template, row, schema)
                self.measure(row, schema, cuts)
            except SpecmatchError as exc:
                self.skip(str(exc), b, i)
                continue
            except Exception as exc:  # noqa: BLE001 - a template that cannot render this row
                self.skip(f"chat template cannot render this row ({type(exc).__name__}: {str(exc)[:120]})", b, i)
                continue
            self.res.schemas[schema] += 1
            if why:
                self.res.uncut[why] += 1
            ident = self.ident(row.get("id"))
            self.res.cuts += [self.cut(b, i, ident, schema, rc) for rc in cuts]

    def measure(self, row: dict, schema: str, cuts) -> None:
        st = self.res.stats[schema]
        if schema == "tokenized":
            ids = flat(row["input_ids"])
            mask, kind = mask_of(row)
            spans = spans_from_mask(mask) if mask is not None else self.template.spans_in_array(np.asarray(ids))
            st.add_spans(len(ids), spans, sum(mask) if mask is not None else sum(e - s for s, e in spans))
            st.mask_kinds[kind] += 1
            st.rows_with_template_tokens += bool(self.tpl_ids.size == 0 or np.isin(ids, self.tpl_ids).any())
            st.max_token_id = max(st.max_token_id, max(ids))
            st.min_token_id = min(st.min_token_id, min(ids))
        elif schema == "conversations":
            conv = normalise_messages(row.get("conversations", row.get("messages")), row.get("system"))
            tok = self.template.tok
            text = tok.apply_chat_template(conv, tokenize=False)
            st.rows += 1
            st.tokens += len(tok(text, add_special_tokens=False)["input_ids"])
            st.turns.append(len(cuts))
            st.assistant_tokens += sum(c.completion_tokens for c in cuts)
            st.prompt.append(cuts[-1].prompt_tokens if cuts else None)
            st.completion.append(cuts[-1].completion_tokens if cuts else None)
            if any(m["role"] in TOOL_ROLES for m in conv) or row.get("tools") or any(m.get("tool_calls") for m in conv):
                st.tool_rows += 1
        else:
            ids = self.template.tok(row["text"], add_special_tokens=False)["input_ids"]
            spans = self.template.spans_in_array(np.asarray(ids))
            st.add_spans(len(ids), spans, sum(e - s for s, e in spans))


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


def write_cuts(path: Path, cuts: pl.DataFrame) -> None:
    with atomic_path(path, ".parquet") as tmp:
        cuts.write_parquet(tmp)


def read_cuts(path: Path) -> pl.DataFrame:
    """The cut table, checked against records.Cut (a table from another specmatch fails clearly)."""
    try:
        df = pl.read_parquet(path)
    except FileNotFoundError:
        raise SpecmatchError(f"{path}: cut table not found (run the inspect step)") from None
    if dict(df.schema) != CUT_SCHEMA:
        raise SpecmatchError(f"{path}: columns {dict(df.schema)} are not those of records.Cut {CUT_SCHEMA}; "
                             "rerun the inspect step")
    return df
def render_report(manifest: Manifest, chart: Path | None) -> str:
    lines = [f"# Training data: {manifest.root}", "",
             f"{manifest.total_rows:,} rows, {manifest.total_tokens:,} tokens in "
             f"{len(manifest.sources)} sources; tokenizer `{manifest.tokenizer['spec']}` "
             f"(vocabulary {manifest.tokenizer['vocab_size']:,}); {manifest.total_skipped} rows skipped.", ""]
    if chart:
        lines += [f"![training mix]({chart.name})", ""]
    lines += ["| source | files | rows | share of rows | tokens | share of tokens | schema | prompt p50/p90/p99 | completion p50/p90/p99 | turns p50 | skipped |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]

    def pct(d):
        return "/".join(f"{d[k]:.0f}" for k in ("p50", "p90", "p99")) if d else "—"

    for s in manifest.sources:
        lines.append(f"| {s.name} | {len(s.files)} | {s.rows:,} | {s.share_rows:.1%} | {s.tokens:,} | "
                     f"{s.share_tokens:.1%} | {'+'.join(s.schemas)}{' (mixed)' if s.mixed_schemas else ''} | "
                     f"{pct(s.prompt_tokens)} | {pct(s.completion_tokens)} | "
                     f"{(s.turns or {}).get('p50', 0):.0f} | {s.skipped['total']} |")
    if manifest.ignored:
        lines += ["", "Ignored (not data):", ""] + [f"- `{i['path']}`: {i['reason']}" for i in manifest.ignored]
    skipped = [(s.name, r) for s in manifest.sources for r in s.skipped["reasons"]]
    if skipped:
        lines += ["", "Skipped rows:", ""] + [f"- {n}: {r['count']} x {r['reason']} (e.g. {', '.join(r['first_locations'])})"
                                               for n, r in skipped]
    return "\n".join(lines) + "\n"


def mix_chart(manifest: Manifest, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s.name for s in manifest.sources]
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(names)))
    y = np.arange(len(names))
    ax.barh(y - 0.2, [s.share_rows * 100 for s in manifest.sources], 0.4, label="rows")
    ax.barh(y + 0.2, [s.share_tokens * 100 for s in manifest.sources], 0.4, label="tokens")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel("share of the training mix (%)")
    ax.legend(loc="lower right")
    ax.set_title("Training mix by source")
    fig.tight_layout()
    with atomic_path(path, ".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


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
    return steps.main("inspection", __doc__, arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
