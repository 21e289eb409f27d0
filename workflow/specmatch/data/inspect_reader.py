"""The fast reader of the inspect step: one unit of work (a file, or a line-aligned byte range of a
large uncompressed JSON Lines file) read into per-schema statistics, located skipped rows and the
unit's rows of the cut table (records.Cut as plain tuples; inspect_pass makes them file-wide).

Tokenized JSON Lines rows (the EAGLE-3 training format) are checked and measured without building
Python objects per token: msgspec decodes each row with its arrays left as raw JSON (still checking
the syntax), and numpy parses the arrays. Any batch that is not plainly well-formed goes through the
exact row-by-row path, which locates the problem; both report exactly the same (tests/test_inspect.py).
"""
from __future__ import annotations

import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import msgspec
import numpy as np

from . import readers
from ..files import SpecmatchError
from .rows import ChatTemplate, flat, ids_key, is_holdout, mask_of, normalise_messages, row_cuts, row_schema, \
    spans_from_mask

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
            elif bytes(r.labels) != b"null":
                lab_ids = _ints(r.labels)
                if lab_ids is None or lab_ids.size != n:
                    return False
                spans, kind = spans_from_mask((lab_ids != -100).astype(np.uint8).tobytes()), "labels"
            else:
                spans, kind = self.template.spans_in_array(ids), "none"
            parsed.append((r, ids, spans, kind))
        st, tpl, tpl_set = self.res.stats["tokenized"], self.tpl_ids, self.tpl_set
        src, path = self.u.source, str(self.u.df.path)
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
