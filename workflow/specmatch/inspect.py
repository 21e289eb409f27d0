"""Inspect a drafter's training root and describe the whole mix, failing loudly on what it cannot read.

Each top-level entry of `dataset.root` is a source (a folder read recursively, or a single file).
Every data file is recognised by content (readers.py), its rows' schema detected (tokenized,
conversations, text), and per source we report rows, tokens, prompt/completion length distributions
(from `loss_mask`/`labels` where present: the prompt is everything before the last assistant span,
the completion is that span), assistant turns, and the source's share of rows and tokens.

Nothing is dropped silently: malformed rows are counted with their reason and first `file:line`
locations; more than `max_malformed_fraction` of them fails the step. Token ids outside the
tokenizer's vocabulary, or a chat template whose special tokens appear in no row, fail with a
message saying the data was probably tokenized with another tokenizer.

    python -m specmatch.inspect --root DIR --tokenizer TOK --out results/inspect/manifest.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from . import readers
from .io import SpecmatchError, sha256_file, write_json, write_text
from .stats import describe

SCHEMAS = ("tokenized", "conversations", "text")
MAX_LOCATIONS = 5


def row_schema(row: dict) -> tuple[str | None, str | None]:
    """(schema, problem) of one parsed row."""
    if "input_ids" in row:
        ids = row["input_ids"]
        if not isinstance(ids, list) or not ids:
            return None, "field input_ids: expected a non-empty list of token ids"
        if isinstance(ids[0], list):  # SpecForge writes [1, L]
            if len(ids) != 1:
                return None, f"field input_ids: nested rows must have shape [1, L], got [{len(ids)}, ...]"
            ids = ids[0]
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids[:64]):
            return None, "field input_ids: expected integers"
        for mk in ("loss_mask", "labels"):
            if mk in row and row[mk] is not None:
                m = row[mk]
                if isinstance(m, list) and m and isinstance(m[0], list):
                    m = m[0]
                if not isinstance(m, list) or len(m) != len(ids):
                    got = len(m) if isinstance(m, list) else type(m).__name__
                    return None, f"field {mk}: length {got} does not match input_ids length {len(ids)}"
        return "tokenized", None
    for key in ("conversations", "messages"):
        if key in row:
            conv = row[key]
            if not isinstance(conv, list) or not conv:
                return None, f"field {key}: expected a non-empty list of turns"
            for i, turn in enumerate(conv):
                if not isinstance(turn, dict):
                    return None, f"field {key}[{i}]: expected an object"
                role = turn.get("role", turn.get("from"))
                content = turn.get("content", turn.get("value"))
                if not isinstance(role, str):
                    return None, f"field {key}[{i}].role: missing (expected role/content or from/value)"
                if content is not None and not isinstance(content, (str, list)):
                    return None, f"field {key}[{i}].content: expected a string"
            return "conversations", None
    if "text" in row:
        if not isinstance(row["text"], str):
            return None, "field text: expected a string"
        return "text", None
    return None, "no input_ids, conversations, messages or text field"


ASSISTANT_ROLES = {"assistant", "gpt", "model", "function_call"}
TOOL_ROLES = {"tool", "function", "observation", "ipython", "function_response"}


def _flat(x):
    return x[0] if isinstance(x, list) and x and isinstance(x[0], list) else x


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


def tokenized_stats(ids_lists, masks: list | None, template_ids: list[int]) -> pl.DataFrame:
    """Per-row token statistics, vectorised with polars (rows may be 100k x 20k tokens).

    `ids_lists` is a list of token-id lists, or a polars frame with columns ids and mask."""
    if isinstance(ids_lists, pl.DataFrame):
        df = ids_lists
    else:
        df = pl.DataFrame({"ids": ids_lists, "mask": masks if masks is not None else [None] * len(ids_lists)},
                          schema={"ids": pl.List(pl.Int64), "mask": pl.List(pl.Int64)})
    n = pl.col("ids").list.len()
    m = pl.col("mask")
    starts = m.list.eval((pl.element() != 0) & (pl.element().shift(1).fill_null(0) == 0))
    exprs = [
        n.alias("tokens"),
        pl.col("ids").list.max().alias("max_id"),
        pl.col("ids").list.min().alias("min_id"),
        m.list.sum().alias("assistant_tokens"),
        starts.list.sum().alias("turns"),
        (n - 1 - starts.list.reverse().list.arg_max()).alias("last_start"),
    ]
    if template_ids:
        exprs.append(pl.col("ids").list.eval(pl.element().is_in(template_ids)).list.any().alias("has_tpl"))
    else:
        exprs.append(pl.lit(True).alias("has_tpl"))
    out = df.select(exprs)
    out = out.with_columns(
        pl.when(pl.col("turns") > 0).then(pl.col("last_start")).otherwise(None).alias("prompt_tokens"))
    ones_before = (df.with_columns(out["prompt_tokens"].fill_null(0).alias("ps"))
                   .select(m.list.head(pl.col("ps")).list.sum().alias("b"))["b"])
    out = out.with_columns((pl.col("assistant_tokens") - ones_before).alias("completion_tokens"))
    out = out.with_columns(pl.when(pl.col("turns") > 0).then(pl.col("completion_tokens")).otherwise(None))
    return out


def fast_tokenized_frame(batch: readers.Batch, with_id: bool = False) -> tuple[pl.DataFrame, str] | None:
    """Parse and check a whole JSON Lines batch of tokenized rows in polars (no Python per row).

    Returns (frame with columns ids, mask[, id], mask kind), or None, which sends the batch to the
    exact row-by-row path that locates every problem (bad JSON, missing fields, length mismatch)."""
    import io as _io

    try:  # an explicit schema from the first row: twice as fast as inference, and strict
        first = json.loads(batch.raw[0])
        ids0 = first.get("input_ids")
        if not (isinstance(ids0, list) and ids0):
            return None
        # loss_mask and labels are always in the schema, shaped like input_ids: a mask that only
        # later rows carry is then seen (and its gaps send the batch to the exact path)
        shape = pl.List(pl.List(pl.Int64)) if isinstance(ids0[0], list) else pl.List(pl.Int64)
        schema = {"input_ids": shape, "loss_mask": shape, "labels": shape}
        if with_id and "id" in first:
            schema["id"] = pl.Int64 if isinstance(first["id"], int) else pl.String
        frame = pl.read_ndjson(_io.BytesIO(b"".join(batch.raw)), schema=schema)
    except Exception:  # bad JSON, wrong types, other schemas: the exact path will say which row
        return None
    cols = set(frame.columns)
    if frame.height != len(batch.raw):
        return None

    def flat(col):
        dt = frame.schema[col]
        if isinstance(dt, pl.List) and isinstance(dt.inner, pl.List):
            if frame.select((pl.col(col).list.len() != 1).any()).item():
                return None
            return pl.col(col).list.first()
        if isinstance(dt, pl.List) and dt.inner.is_integer():
            return pl.col(col)
        return None

    ids = flat("input_ids")
    if ids is None:
        return None
    kind, mask = "none", pl.lit(None, dtype=pl.List(pl.Int64))
    if "loss_mask" in cols and frame["loss_mask"].null_count() < frame.height:
        kind, mask = "loss_mask", flat("loss_mask")
    elif "labels" in cols and frame["labels"].null_count() < frame.height:
        lab = flat("labels")
        kind, mask = "labels", None if lab is None else lab.list.eval((pl.element() != -100).cast(pl.Int64))
    if mask is None:
        return None
    exprs = [ids.cast(pl.List(pl.Int64)).alias("ids"), mask.cast(pl.List(pl.Int64)).alias("mask")]
    if with_id and "id" in cols:
        exprs.append(pl.col("id").cast(pl.String))
    sub = frame.select(exprs)
    bad = sub.select((pl.col("ids").is_null() | (pl.col("ids").list.len() == 0) |
                      ((pl.col("mask").list.len() != pl.col("ids").list.len()) if kind != "none"
                       else pl.lit(False)) | (pl.col("mask").is_null() if kind != "none" else pl.lit(False))
                      ).any()).item()
    if bad:
        return None
    return sub, kind


class SourceInspector:
    def __init__(self, name: str, path: Path, template_ids: list[int], tokenizer, malformed_limit: float):
        self.name, self.path = name, path
        self.template_ids = template_ids
        self.tokenizer = tokenizer
        self.files: list[dict] = []
        self.by_schema: dict[str, SchemaStats] = defaultdict(SchemaStats)
        self.skipped: Counter = Counter()
        self.skipped_at: dict[str, list[str]] = defaultdict(list)
        self.rows_seen = 0

    def skip(self, reason: str, location: str) -> None:
        self.skipped[reason] += 1
        if len(self.skipped_at[reason]) < MAX_LOCATIONS:
            self.skipped_at[reason].append(location)

    def _fast_tokenized(self, batch: readers.Batch) -> str | None:
        """Handle a whole JSON Lines batch of tokenized rows in polars; None = use the exact path."""
        got = fast_tokenized_frame(batch)
        if got is None:
            return None
        frame, kind = got
        self._add_tokenized(frame, None, [kind] * frame.height)
        return kind

    def add_file(self, df: readers.DataFile) -> None:
        schemas = Counter()
        rows = 0
        for batch in readers.iter_batches(df, raw=True):
            if batch.raw is not None:
                if self._fast_tokenized(batch):
                    rows += len(batch.raw)
                    schemas["tokenized"] += len(batch.raw)
                    continue
                batch.parse()
            rows += len(batch.rows)
            tok_ids, tok_masks, mask_kind = [], [], []
            convs, texts = [], []
            for i, row in enumerate(batch.rows):
                loc = batch.locations[i]
                if row is None:
                    self.skip(batch.errors.get(i, "unparseable row"), loc)
                    continue
                schema, problem = row_schema(row)
                if problem:
                    self.skip(problem, loc)
                    continue
                schemas[schema] += 1
                if schema == "tokenized":
                    tok_ids.append(_flat(row["input_ids"]))
                    if row.get("loss_mask") is not None:
                        tok_masks.append(_flat(row["loss_mask"]))
                        mask_kind.append("loss_mask")
                    elif row.get("labels") is not None:
                        tok_masks.append([0 if t == -100 else 1 for t in _flat(row["labels"])])
                        mask_kind.append("labels")
                    else:
                        tok_masks.append(None)
                        mask_kind.append("none")
                elif schema == "conversations":
                    convs.append(row)
                else:
                    texts.append(row["text"])
            if tok_ids:
                self._add_tokenized(tok_ids, tok_masks, mask_kind)
            if convs:
                self._add_conversations(convs)
            if texts:
                self._add_texts(texts)
        self.rows_seen += rows
        if rows == 0:
            raise SpecmatchError(f"{df.path}: no rows (expected training rows in {df.format})")
        self.files.append({"path": str(df.path), "bytes": df.bytes, "format": df.format,
                           "compression": df.compression, "hf_dataset": df.hf_dataset,
                           "schemas": dict(schemas), "rows": rows, "sha256": sha256_file(df.path)})

    def _add_tokenized(self, ids, masks, kinds) -> None:
        st = self.by_schema["tokenized"]
        out = tokenized_stats(ids, masks, self.template_ids)
        st.rows += out.height
        st.tokens += int(out["tokens"].sum())
        st.assistant_tokens += int(out["assistant_tokens"].fill_null(0).sum())
        st.prompt.extend(out["prompt_tokens"].to_list())
        st.completion.extend(out["completion_tokens"].to_list())
        st.turns.extend(out["turns"].fill_null(0).to_list())
        st.rows_with_template_tokens += int(out["has_tpl"].sum())
        st.max_token_id = max(st.max_token_id, int(out["max_id"].max()))
        st.min_token_id = min(st.min_token_id, int(out["min_id"].min()))
        st.mask_kinds.update(kinds)

    def _content(self, turn) -> str:
        c = turn.get("content", turn.get("value"))
        if isinstance(c, list):  # multimodal-style content parts
            c = "".join(p.get("text", "") for p in c if isinstance(p, dict))
        return c or ""

    def _add_conversations(self, rows) -> None:
        st = self.by_schema["conversations"]
        prompts, completions = [], []
        for row in rows:
            conv = row.get("conversations", row.get("messages"))
            roles = [t.get("role", t.get("from")) for t in conv]
            idx = [i for i, r in enumerate(roles) if r in ASSISTANT_ROLES]
            st.turns.append(len(idx))
            if any(r in TOOL_ROLES for r in roles) or row.get("tools") or any(t.get("tool_calls") for t in conv):
                st.tool_rows += 1
            if idx:
                last = idx[-1]
                prompts.append("\n".join(self._content(t) for t in conv[:last]) + (row.get("system") or ""))
                completions.append(self._content(conv[last]) + json.dumps(conv[last].get("tool_calls") or ""))
            else:
                prompts.append("\n".join(self._content(t) for t in conv))
                completions.append(None)
        p_len = self._count(prompts)
        c_len = self._count([c for c in completions if c is not None])
        it = iter(c_len)
        c_full = [next(it) if c is not None else None for c in completions]
        st.rows += len(rows)
        st.prompt.extend(p_len)
        st.completion.extend(c_full)
        st.tokens += sum(p_len) + sum(c for c in c_full if c)
        st.assistant_tokens += sum(c for c in c_full if c)

    def _add_texts(self, texts) -> None:
        st = self.by_schema["text"]
        lens = self._count(texts)
        st.rows += len(texts)
        st.tokens += sum(lens)
        st.prompt.extend([None] * len(texts))
        st.completion.extend([None] * len(texts))
        st.turns.extend([0] * len(texts))

    def _count(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        enc = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return [len(e) for e in enc]

    def summary(self) -> dict:
        per_schema = {}
        for schema, st in self.by_schema.items():
            per_schema[schema] = {
                "rows": st.rows, "tokens": st.tokens, "assistant_tokens": st.assistant_tokens,
                "prompt_tokens": describe(st.prompt), "completion_tokens": describe(st.completion),
                "turns": describe(st.turns), "rows_with_tool_use": st.tool_rows,
                "token_counts": "exact" if schema == "tokenized" else "message contents only (template tokens not counted)",
            }
            if schema == "tokenized":
                per_schema[schema].update({
                    "mask": dict(st.mask_kinds), "max_token_id": st.max_token_id, "min_token_id": st.min_token_id,
                    "rows_with_template_tokens": st.rows_with_template_tokens})
        skipped_total = sum(self.skipped.values())
        out = {
            "name": self.name, "path": str(self.path), "files": self.files,
            "rows": sum(s.rows for s in self.by_schema.values()),
            "rows_seen": self.rows_seen,
            "tokens": sum(s.tokens for s in self.by_schema.values()),
            "skipped": {"total": skipped_total,
                        "reasons": [{"reason": r, "count": c, "first_locations": self.skipped_at[r]}
                                    for r, c in self.skipped.most_common()]},
            "schemas": sorted(per_schema),
            "mixed_schemas": len(per_schema) > 1,
            "by_schema": per_schema,
        }
        if len(per_schema) == 1:  # only then is a single distribution meaningful
            only = next(iter(per_schema.values()))
            for k in ("prompt_tokens", "completion_tokens", "turns"):
                out[k] = only[k]
        return out


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


def inspect_root(root: Path, tokenizer_spec: str, max_malformed_fraction: float = 0.0) -> dict:
    from .tokenizer import load_tokenizer, resolve_tokenizer_dir

    t0 = time.time()
    tok = load_tokenizer(tokenizer_spec)
    vocab = len(tok)
    tpl_ids = template_token_ids(tok)
    sources, ignored = readers.list_sources(Path(root))
    results = []
    for src in sources:
        files, ign = readers.discover(src)
        ignored.extend(ign)
        if not files:
            raise SpecmatchError(f"source {src}: no readable data file (expected .jsonl/.json[.gz|.zst], "
                                 ".parquet or .arrow files; found "
                                 + (", ".join(Path(i.path).name for i in ign[:5]) or "nothing") + ")")
        insp = SourceInspector(readers.source_name(src), src, tpl_ids, tok, max_malformed_fraction)
        for df in files:
            insp.add_file(df)
        results.append(insp.summary())
    total_rows = sum(s["rows"] for s in results)
    total_tokens = sum(s["tokens"] for s in results)
    problems = []
    for s in results:
        s["share_rows"] = s["rows"] / total_rows if total_rows else 0.0
        s["share_tokens"] = s["tokens"] / total_tokens if total_tokens else 0.0
        seen = s["rows_seen"]
        frac = s["skipped"]["total"] / seen if seen else 1.0
        if s["skipped"]["total"] and frac > max_malformed_fraction:
            first = s["skipped"]["reasons"][0]
            problems.append(f"source {s['name']}: {s['skipped']['total']} of {seen} rows malformed "
                            f"({frac:.1%} > allowed {max_malformed_fraction:.1%}); first: {first['reason']} at "
                            + ", ".join(first["first_locations"]))
        if s["rows"] == 0:
            problems.append(f"source {s['name']} ({s['path']}): no usable rows")
        t = s["by_schema"].get("tokenized")
        if t and (t["max_token_id"] >= vocab or t["min_token_id"] < 0):
            bad = t["max_token_id"] if t["max_token_id"] >= vocab else t["min_token_id"]
            problems.append(f"source {s['name']}: token id {bad} is outside the vocabulary of {tokenizer_spec} "
                            f"(size {vocab}); the data was probably tokenized with another tokenizer")
    tok_rows = sum(s["by_schema"].get("tokenized", {}).get("rows", 0) for s in results)
    tpl_rows = sum(s["by_schema"].get("tokenized", {}).get("rows_with_template_tokens", 0) for s in results)
    if tok_rows and tpl_ids and tpl_rows == 0:
        names = [tok.convert_ids_to_tokens(i) for i in tpl_ids]
        problems.append(f"no tokenized row contains any chat-template special token of {tokenizer_spec} "
                        f"({', '.join(names)}); the data was probably tokenized with another tokenizer")
    if problems:
        raise SpecmatchError("inspection failed:\n  " + "\n  ".join(problems))
    return {
        "root": str(root),
        "tokenizer": {"spec": tokenizer_spec, "path": str(resolve_tokenizer_dir(tokenizer_spec)),
                      "class": type(tok).__name__, "vocab_size": vocab,
                      "template_special_tokens": [tok.convert_ids_to_tokens(i) for i in tpl_ids]},
        "total_rows": total_rows,
        "total_tokens": total_tokens,
        "total_skipped": sum(s["skipped"]["total"] for s in results),
        "max_malformed_fraction": max_malformed_fraction,
        "sources": results,
        "ignored": [{"path": i.path, "reason": i.reason} for i in ignored],
        "seconds": round(time.time() - t0, 2),
    }


def render_report(manifest: dict, chart: Path | None) -> str:
    lines = [f"# Training data: {manifest['root']}", "",
             f"{manifest['total_rows']:,} rows, {manifest['total_tokens']:,} tokens in "
             f"{len(manifest['sources'])} sources; tokenizer `{manifest['tokenizer']['spec']}` "
             f"(vocabulary {manifest['tokenizer']['vocab_size']:,}); {manifest['total_skipped']} rows skipped.", ""]
    if chart:
        lines += [f"![training mix]({chart.name})", ""]
    lines += ["| source | files | rows | share of rows | tokens | share of tokens | schema | prompt p50/p90/p99 | completion p50/p90/p99 | turns p50 | skipped |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]

    def pct(d):
        return "/".join(f"{d[k]:.0f}" for k in ("p50", "p90", "p99")) if d else "—"

    for s in manifest["sources"]:
        lines.append(f"| {s['name']} | {len(s['files'])} | {s['rows']:,} | {s['share_rows']:.1%} | {s['tokens']:,} | "
                     f"{s['share_tokens']:.1%} | {'+'.join(s['schemas'])}{' (mixed)' if s['mixed_schemas'] else ''} | "
                     f"{pct(s.get('prompt_tokens'))} | {pct(s.get('completion_tokens'))} | "
                     f"{(s.get('turns') or {}).get('p50', 0):.0f} | {s['skipped']['total']} |")
    if manifest["ignored"]:
        lines += ["", "Ignored (not data):", ""] + [f"- `{i['path']}`: {i['reason']}" for i in manifest["ignored"]]
    skipped = [(s["name"], r) for s in manifest["sources"] for r in s["skipped"]["reasons"]]
    if skipped:
        lines += ["", "Skipped rows:", ""] + [f"- {n}: {r['count']} x {r['reason']} (e.g. {', '.join(r['first_locations'])})"
                                               for n, r in skipped]
    return "\n".join(lines) + "\n"


def mix_chart(manifest: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s["name"] for s in manifest["sources"]]
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(names)))
    y = np.arange(len(names))
    ax.barh(y - 0.2, [s["share_rows"] * 100 for s in manifest["sources"]], 0.4, label="rows")
    ax.barh(y + 0.2, [s["share_tokens"] * 100 for s in manifest["sources"]], 0.4, label="tokens")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel("share of the training mix (%)")
    ax.legend(loc="lower right")
    ax.set_title("Training mix by source")
    fig.tight_layout()
    from .io import atomic_path

    with atomic_path(path, ".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specmatch.inspect", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True, type=Path)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", required=True, type=Path, help="manifest.json")
    p.add_argument("--report", type=Path, help="report.md (the mix chart is written beside it)")
    p.add_argument("--max-malformed-fraction", type=float, default=0.0)
    a = p.parse_args(argv)
    try:
        manifest = inspect_root(a.root, a.tokenizer, a.max_malformed_fraction)
    except SpecmatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    write_json(a.out, manifest)
    outputs = [a.out]
    if a.report:
        chart = a.report.with_name("mix.png")
        mix_chart(manifest, chart)
        write_text(a.report, render_report(manifest, chart))
        outputs += [a.report, chart]
    from .provenance import Recorder

    files = [{"path": f["path"], "sha256": f["sha256"], "bytes": f["bytes"]}
             for s in manifest["sources"] for f in s["files"]]
    Recorder("inspect", files, {"root": str(a.root), "tokenizer": a.tokenizer,
                                "max_malformed_fraction": a.max_malformed_fraction}).write(outputs)
    print(f"inspected {manifest['total_rows']} rows in {len(manifest['sources'])} sources "
          f"({manifest['total_skipped']} skipped) in {manifest['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
