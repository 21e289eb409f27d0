"""How a training row is read: its schema, its loss mask, its assistant turns, its messages.

The one place that decides what a row means, shared by inspection (which counts rows and writes
one cut per assistant turn) and prompt extraction (which reads back only the rows it sampled):

- schema: `tokenized` (`input_ids`, with `loss_mask`, or `labels` with -100, or neither; SpecForge's
  nested `[[...]]` too), `conversations` (`messages`/`conversations`, role/content or ShareGPT
  from/value, tools), `text` (a pre-rendered chat transcript);
- the assistant spans of a tokenized row: from its mask, or, with no mask, from the chat
  template's assistant header (the template's own generation prompt) up to the end-of-turn token;
- roles: one table maps every dialect (ShareGPT `gpt`/`human`/`observation`, ...) to
  system/user/assistant/tool;
- messages back from rendered text: `ChatTemplate` learns each role's header and footer by rendering
  probe conversations with the tokenizer's own template, so any template whose turns are delimited
  (ChatML, Llama-3, Gemma, Zephyr, ...) splits exactly; one it cannot split is a clear error.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np
import polars as pl

from ..files import SpecmatchError

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
         "system": "system", "tool": "tool", "function": "tool", "observation": "tool", "ipython": "tool",
         "function_response": "tool", "function_call": "assistant"}


def flat(x):
    """SpecForge stores ids and masks as [1, L]: the one row inside."""
    return x[0] if isinstance(x, list) and x and isinstance(x[0], list) else x


def role_of(turn: dict) -> str:
    """A turn's role in OpenAI terms; ShareGPT's `from: human/gpt` is mapped so both formats cut alike."""
    r = turn.get("role", turn.get("from"))
    return ROLES.get(r, r)


def content_of(turn: dict) -> str:
    c = turn.get("content", turn.get("value"))
    if isinstance(c, list):  # multimodal-style content parts: their text
        c = "".join(p.get("text", "") for p in c if isinstance(p, dict))
    return c or ""


def normalise_messages(conv: list[dict], system: str | None = None) -> list[dict]:
    """Messages in role/content form (tool calls kept); a row-level `system` goes first."""
    out = []
    for t in conv:
        m = {"role": role_of(t), "content": content_of(t)}
        if t.get("tool_calls"):
            m["tool_calls"] = t["tool_calls"]
        out.append(m)
    if system and (not out or out[0]["role"] != "system"):
        out.insert(0, {"role": "system", "content": system})
    return out


def tools_of(row: dict):
    tools = row.get("tools")
    if isinstance(tools, str):
        try:
            return json.loads(tools)
        except json.JSONDecodeError:
            return None
    return tools


def row_schema(row: dict) -> tuple[str | None, str | None]:
    """(schema, problem) of one parsed row; a problem names the field at fault."""
    if "input_ids" in row:
        ids = row["input_ids"]
        if not isinstance(ids, list) or not ids:
            return None, "field input_ids: expected a non-empty list of token ids"
        if isinstance(ids[0], list):  # SpecForge writes [1, L]
            if len(ids) != 1:
                return None, f"field input_ids: nested rows must have shape [1, L], got [{len(ids)}, ...]"
            ids = ids[0]
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            return None, "field input_ids: expected integers"
        for mk in ("loss_mask", "labels"):
            if mk in row and row[mk] is not None:
                m = flat(row[mk])
                if not isinstance(m, list) or len(m) != len(ids):
                    got = len(m) if isinstance(m, list) else type(m).__name__
                    return None, f"field {mk}: length {got} does not match input_ids length {len(ids)}"
                if not all(isinstance(t, int) and not isinstance(t, bool) for t in m):
                    return None, f"field {mk}: expected integers"
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


def mask_of(row: dict) -> tuple[list[int] | None, str]:
    """The row's assistant mask (1 = trained token) and where it came from: loss_mask, labels, none."""
    if row.get("loss_mask") is not None:
        return [1 if v else 0 for v in flat(row["loss_mask"])], "loss_mask"
    if row.get("labels") is not None:
        return [0 if t == -100 else 1 for t in flat(row["labels"])], "labels"
    return None, "none"


def spans_from_mask(mask) -> list[tuple[int, int]]:
    """[start, end) of every run of ones: one span per assistant turn."""
    b = bytes(1 if v else 0 for v in mask) if not isinstance(mask, (bytes, bytearray)) else mask
    spans, i, n = [], b.find(1), len(b)
    while i >= 0:
        j = b.find(0, i)
        j = n if j < 0 else j
        spans.append((i, j))
        i = b.find(1, j) if j < n else -1
    return spans


def ids_key(ids) -> str:
    """Identity of a token sequence (the dedup key of a tokenized prompt), whatever held it."""
    return hashlib.sha256(np.ascontiguousarray(ids, dtype=np.int64)).hexdigest()[:16]


def messages_key(messages: list[dict], tools) -> str:
    blob = json.dumps([messages, tools], sort_keys=True, ensure_ascii=False).encode()
    return hashlib.blake2b(blob, digest_size=8).hexdigest()


def is_holdout(source: str, relfile: str, row_id: str, holdout: dict) -> bool:
    """Whether the drafter never saw this row: its file is listed, or a hash of (source, row id)
    falls in the held-out fraction (stable across runs and independent of row order)."""
    files = set(holdout.get("files") or [])
    if files and (relfile in files or relfile.rsplit("/", 1)[-1] in files):
        return True
    frac = holdout.get("fraction") or 0.0
    if frac <= 0:
        return False
    h = int(hashlib.sha256(f"{source}\0{row_id}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return h < frac


# -- the chat template ------------------------------------------------------------------------
_PROBES = {"system": "QZXS1", "user": "QZXU1", "assistant": "QZXA1", "user2": "QZXU2", "tool": "QZXT1"}


@dataclass
class ChatTemplate:
    """The tokenizer's chat template, learnt from probe renders.

    `header[role]`/`footer[role]` are the exact strings the template writes around a message's
    content; `prefix` is what it writes before the first message (BOS, ...); `header_ids` is the
    generation prompt (the assistant header) as token ids, which is where a tokenized row without
    a mask is cut; `end_id` ends an assistant turn."""
    tok: object
    header: dict
    footer: dict
    prefix: str
    header_ids: list
    end_id: int | None
    problem: str | None = None

    @classmethod
    def of(cls, tok) -> "ChatTemplate":
        end_id = tok.convert_tokens_to_ids(tok.eos_token) if tok.eos_token else None
        if not getattr(tok, "chat_template", None):
            return cls(tok, {}, {}, "", [], end_id, "the tokenizer has no chat template")

        def render(msgs, gen=False):
            return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

        P = _PROBES
        u = [{"role": "user", "content": P["user"]}]
        a = {"role": "assistant", "content": P["assistant"]}

        def between(text, x, y):
            return text[text.index(P[x]) + len(P[x]):text.index(P[y])]

        try:
            plain, gen = render(u), render(u, True)
            if not gen.startswith(plain) or gen == plain:
                raise ValueError("the generation prompt does not extend the conversation")
            header = {"assistant": gen[len(plain):]}
            header_ids = tok(header["assistant"], add_special_tokens=False)["input_ids"]
            # an assistant turn that is not the last (templates such as Qwen3 decorate only the last)
            uau = render(u + [a, {"role": "user", "content": P["user2"]}])
            ua_gap = between(uau, "user", "assistant")
            if not ua_gap.endswith(header["assistant"]):
                raise ValueError("an assistant turn does not start with the generation prompt")
            ua = render(u + [a])
            footer = {"user": ua_gap[:-len(header["assistant"])],
                      "assistant": ua[ua.index(P["assistant"]) + len(P["assistant"]):]}
            au_gap = between(uau, "assistant", "user2")
            if not au_gap.startswith(footer["assistant"]):
                raise ValueError("the assistant footer differs between turns")
            header["user"] = au_gap[len(footer["assistant"]):]
            su = render([{"role": "system", "content": P["system"]}] + u)
            su_gap = between(su, "system", "user")
            if not su_gap.endswith(header["user"]):
                raise ValueError("the user header differs after a system message")
            footer["system"] = su_gap[:-len(header["user"])]
            before = su[:su.index(P["system"])]
            # What precedes the system header is the document prefix (BOS): the split that makes the
            # system header look most like the user header (SmolLM2's BOS is also its turn marker)
            bos = tok.bos_token or ""
            splits = [""] + ([bos] if bos and before.startswith(bos) else [])
            prefix = max(splits, key=lambda pre: (len(os.path.commonprefix([before[len(pre):], header["user"]])),
                                                  -len(pre)))
            header["system"] = before[len(prefix):]
            try:  # not every template knows a tool role
                ut = render(u + [a, {"role": "tool", "content": P["tool"]}])
                at_gap = between(ut, "assistant", "tool")
                if at_gap.startswith(footer["assistant"]) and at_gap[len(footer["assistant"]):]:
                    header["tool"] = at_gap[len(footer["assistant"]):]
                    footer["tool"] = ut[ut.index(P["tool"]) + len(P["tool"]):]
            except Exception:  # noqa: BLE001 - jinja raises what the template raises
                pass
        except Exception as exc:  # noqa: BLE001
            return cls(tok, {}, {}, "", [], end_id, f"its turns are not delimited by per-role markers ({exc})")
        if len(set(header.values())) != len(header) or not all(header.values()):
            return cls(tok, header, footer, prefix, header_ids, end_id,
                       "two roles share a header, so messages cannot be told apart")
        return cls(tok, header, footer, prefix, header_ids, end_id)

    def spans_in_array(self, ids: np.ndarray) -> list[tuple[int, int]]:
        """Assistant spans of a tokenized row without a mask: after each assistant header, up to and
        including the end-of-turn token (as a loss mask would mark them)."""
        h = self.header_ids
        n, k = len(ids), len(h)
        if not k or n < k:
            return []
        hit = ids[:n - k + 1] == h[0]
        for j in range(1, k):
            hit &= ids[j:n - k + 1 + j] == h[j]
        ends = np.flatnonzero(ids == self.end_id) if self.end_id is not None else np.array([], dtype=np.int64)
        spans, pos = [], 0
        for i in np.flatnonzero(hit):
            if i < pos:
                continue
            start = int(i) + k
            j = np.searchsorted(ends, start)
            end = int(ends[j]) if j < len(ends) else n
            spans.append((start, min(n, end + 1)))
            pos = end
        return spans

    def split(self, text: str) -> list[dict]:
        """Messages of a rendered prompt (ending in the generation prompt, possibly followed by a
        prefill such as Qwen3's empty think block, which the template adds again), by the template's
        own markers. Raises SpecmatchError when the template or the text cannot be split exactly."""
        if self.problem:
            raise SpecmatchError(f"chat template: cannot split rendered prompts into messages: {self.problem}")
        pos = len(self.prefix) if self.prefix and text.startswith(self.prefix) else 0
        gen = self.header["assistant"]
        heads = sorted(self.header.items(), key=lambda kv: -len(kv[1]))
        msgs = []
        while pos < len(text):
            if text.startswith(gen, pos) and pos + len(gen) == len(text):
                return msgs
            role = next((r for r, h in heads if text.startswith(h, pos)), None)
            if role is None:
                raise SpecmatchError(f"chat template: no role header at character {pos} of a prompt "
                                     f"({text[pos:pos + 40]!r}); the rows were rendered with another template")
            start = pos + len(self.header[role])
            end = text.find(self.footer[role], start) if self.footer[role] else -1
            if end < 0 and role == "assistant":
                return msgs  # the generation prompt, with a prefill the data carried (e.g. an empty <think>)
            if end < 0:
                raise SpecmatchError(f"chat template: a {role} message at character {start} has no end marker "
                                     f"{self.footer[role]!r}")
            msgs.append({"role": role, "content": text[start:end]})
            pos = end + len(self.footer[role])
        return msgs  # a prompt that does not end in the generation prompt (e.g. a continuation)

    def render(self, messages: list[dict], tools=None) -> str:
        kwargs = {"tools": tools} if tools else {}
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)

    def render_ids(self, messages: list[dict], tools=None) -> list[int]:
        return self.tok(self.render(messages, tools), add_special_tokens=False)["input_ids"]


# -- the cuts of one row ----------------------------------------------------------------------
@dataclass
class RowCut:
    """One assistant turn of a row: the prompt is what precedes it."""
    turn: int
    turns: int
    prompt_tokens: int
    completion_tokens: int
    key: str


def tokenized_cuts(ids: list[int], spans: list[tuple[int, int]]) -> list[RowCut]:
    """One cut per assistant span: the prompt is every token before it (the training context the
    drafter saw), keyed by a hash of those ids so two rows with the same prompt are one prompt."""
    return [RowCut(t, len(spans), s, e - s, ids_key(ids[:s])) for t, (s, e) in enumerate(spans)]


def conversation_cuts(template: ChatTemplate, row: dict) -> list[RowCut]:
    """One cut per assistant message: its prompt is the conversation before it, rendered with the
    template (tools included), and counted in tokens exactly as it will be sent."""
    conv = normalise_messages(row.get("conversations", row.get("messages")), row.get("system"))
    tools = tools_of(row)
    idx = [k for k, m in enumerate(conv) if m["role"] == "assistant"]
    out = []
    for t, k in enumerate(idx):
        comp = conv[k]["content"] or json.dumps(conv[k].get("tool_calls") or "")
        out.append(RowCut(t, len(idx), len(template.render_ids(conv[:k], tools)),
                          len(template.tok(comp, add_special_tokens=False)["input_ids"]),
                          messages_key(conv[:k], tools)))
    return out


def row_cuts(template: ChatTemplate, row: dict, schema: str) -> tuple[list[RowCut], str | None]:
    """Every cut of a parsed row, or none and the reason (counted by the caller)."""
    if schema == "tokenized":
        ids = flat(row["input_ids"])
        mask, _kind = mask_of(row)
        spans = spans_from_mask(mask) if mask is not None else template.spans_in_array(np.asarray(ids))
        return (tokenized_cuts(ids, spans), None) if spans else ([], "no assistant turn in row")
    if schema == "conversations":
        cuts = conversation_cuts(template, row)
        return (cuts, None) if cuts else ([], "no assistant turn in row")
    ids = template.tok(row["text"], add_special_tokens=False)["input_ids"]
    spans = template.spans_in_array(np.asarray(ids))
    return (tokenized_cuts(ids, spans), None) if spans else ([], "text row has no assistant header to cut at")


def prompt_of(template: ChatTemplate, row: dict, schema: str, turn: int) -> tuple[list[int] | None, list | None, object]:
    """What precedes assistant turn `turn` of a row: (prompt ids, None, None) for tokenized and text
    rows, (None, messages, tools) for conversations."""
    if schema == "conversations":
        conv = normalise_messages(row.get("conversations", row.get("messages")), row.get("system"))
        idx = [k for k, m in enumerate(conv) if m["role"] == "assistant"]
        return None, conv[:idx[turn]], tools_of(row)
    ids, spans = ids_and_spans(template, row, schema)
    return ids[:spans[turn][0]], None, None


def ids_and_spans(template: ChatTemplate, row: dict, schema: str) -> tuple[list[int], list[tuple[int, int]]]:
    """A tokenized or text row's token ids and its assistant spans (from the loss mask where the row has
    one, else from the chat template's assistant headers)."""
    if schema == "tokenized":
        ids = flat(row["input_ids"])
        mask, _ = mask_of(row)
        return ids, spans_from_mask(mask) if mask is not None else template.spans_in_array(np.asarray(ids))
    ids = template.tok(row["text"], add_special_tokens=False)["input_ids"]
    return ids, template.spans_in_array(np.asarray(ids))


# -- a row as training reads it ----------------------------------------------------------------
def training_rows(cuts, seed: int):
    """The rows training may read: seen (not held-out) rows of the cut table (one cut per row), in
    the order a seed gives. The drafter reads them in this order and the regenerate step regenerates
    them in it, so both come from here."""
    seen = cuts.filter(~pl.col("holdout")).unique(["file", "row"], keep="first").sort(["file", "row"])
    if seen.is_empty():
        raise SpecmatchError("drafter: no training rows (every row is held out, or the cut table is empty)")
    order = np.random.default_rng(seed).permutation(seen.height)
    return seen[order.tolist()]


def row_ids_and_mask(row: dict, schema: str, template: "ChatTemplate") -> tuple[list[int], list[int]]:
    """A training row as the drafter sees it: its token ids and assistant mask (1 = trained token).
    Tokenized rows keep their ids and their mask (or, without one, the template's assistant spans);
    conversations are rendered with the chat template and text rows tokenized, both masked by the
    template's assistant spans (header excluded, end-of-turn token included)."""
    if schema == "tokenized":
        ids = list(flat(row["input_ids"]))
        mask, _ = mask_of(row)
        if mask is not None:
            return ids, mask
    else:
        text = row["text"] if schema == "text" else template.tok.apply_chat_template(
            normalise_messages(row.get("conversations", row.get("messages")), row.get("system")),
            tokenize=False, tools=tools_of(row))
        ids = template.tok(text, add_special_tokens=False)["input_ids"]
    mask = [0] * len(ids)
    for s, e in template.spans_in_array(np.asarray(ids)):
        mask[s:e] = [1] * (e - s)
    return ids, mask
