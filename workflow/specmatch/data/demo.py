"""Build the demo training root `prepared/<source>/...` from text that ships with every Python.

Why: the embedded default needs a drafter-training-like data tree without any download. Rows are
chat conversations (coding tasks from stdlib sources and docstrings, agent traces with tool calls,
reasoning chains, prose from the interpreter's help topics), rendered with the model's chat template
and tokenized the way EAGLE-3 training data is stored: `input_ids` plus `loss_mask` (1 on assistant
tokens). Sources differ in size and format (JSONL, gzip JSONL in a nested folder, Parquet), like a
real `synth_100k/prepared` root.

    python -m specmatch demo --tokenizer results/models/smollm2-135m --out resources/demo/prepared
"""
from __future__ import annotations

import argparse
import gzip
import importlib
import inspect as pyinspect
import json
import random
import sys
import textwrap
from pathlib import Path

import polars as pl

from .. import steps
from ..files import SpecmatchError, atomic_dir
from .tokenizer import load_tokenizer

CODE_MODULES = ["textwrap", "string", "posixpath", "shutil", "difflib", "heapq", "bisect", "functools",
                "json.encoder", "json.decoder", "csv", "fnmatch", "glob", "base64", "calendar",
                "colorsys", "fractions", "statistics", "ipaddress", "shlex", "tokenize", "urllib.parse",
                "email.utils", "html", "argparse", "configparser", "dataclasses", "copy", "pprint",
                "random", "gettext", "locale", "netrc", "quopri", "uu", "zipfile", "tarfile", "wave"]
SYSTEM_AGENT = ("You are a coding agent working in a Python repository. Use the tools to inspect files "
                "before answering. Tools: read_file(path), search(pattern).")
MAX_CHARS = 1400


def _functions():
    """(module, name, signature, docstring, source) of documented pure-Python stdlib functions."""
    out = []
    for modname in CODE_MODULES:
        try:
            mod = importlib.import_module(modname)
        except Exception:  # a module missing on this Python (e.g. uu removed in 3.13)
            continue
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or not pyinspect.isfunction(obj) or obj.__module__ != mod.__name__:
                continue
            doc = pyinspect.getdoc(obj)
            try:
                src = textwrap.dedent(pyinspect.getsource(obj))
                sig = str(pyinspect.signature(obj))
            except (OSError, TypeError, ValueError):
                continue
            if not doc or len(src) > MAX_CHARS or len(doc) < 40:
                continue
            out.append((modname, name, sig, doc, src))
    return out


def _topics():
    from pydoc_data.topics import topics

    return [(k, v.strip()) for k, v in sorted(topics.items()) if len(v.strip()) > 200]


def conversations(rows_per_source: dict[str, int], seed: int = 0) -> dict[str, list[dict]]:
    rng = random.Random(seed)
    funcs = _functions()
    topics = _topics()
    if not funcs or not topics:
        raise SpecmatchError("this Python has no stdlib sources or pydoc topics to build demo data from")
    out: dict[str, list[dict]] = {}

    def take(items, n):
        items = list(items)
        rng.shuffle(items)
        return [items[i % len(items)] for i in range(n)]

    n = rows_per_source.get("code_instruct", 0)
    out["code_instruct"] = [
        {"id": f"ci-{i}", "messages": [
            {"role": "user", "content": f"Write a Python function `{name}{sig}` for the `{mod}` module.\n\n"
                                        f"Specification:\n{doc[:MAX_CHARS // 2]}"},
            {"role": "assistant", "content": f"```python\n{src.rstrip()}\n```"}]}
        for i, (mod, name, sig, doc, src) in enumerate(take(funcs, n))]
    n = rows_per_source.get("code_explain", 0)
    out["code_explain"] = [
        {"id": f"ce-{i}", "messages": [
            {"role": "user", "content": f"What does this function from `{mod}` do?\n\n```python\n{src.rstrip()}\n```"},
            {"role": "assistant", "content": f"`{name}{sig}`: {doc[:MAX_CHARS // 2]}"}]}
        for i, (mod, name, sig, doc, src) in enumerate(take(funcs, n))]
    n = rows_per_source.get("agent_traces", 0)
    traces = []
    for i, (mod, name, sig, doc, src) in enumerate(take(funcs, n)):
        path = f"Lib/{mod.replace('.', '/')}.py"
        call1 = json.dumps({"name": "search", "arguments": {"pattern": f"def {name}("}})
        call2 = json.dumps({"name": "read_file", "arguments": {"path": path}})
        traces.append({"id": f"at-{i}", "messages": [
            {"role": "system", "content": SYSTEM_AGENT},
            {"role": "user", "content": f"A test fails around `{name}` in `{mod}`. Find it and explain its contract."},
            {"role": "assistant", "content": f"I'll locate the definition first.\n<tool_call>{call1}</tool_call>"},
            {"role": "tool", "content": f"{path}: def {name}{sig}:"},
            {"role": "assistant", "content": f"Found it in {path}. Reading the file.\n<tool_call>{call2}</tool_call>"},
            {"role": "tool", "content": src.rstrip()},
            {"role": "assistant", "content": f"`{name}{sig}` in `{path}`:\n\n{doc[:MAX_CHARS // 3]}\n\n"
                                             "The failing test should check this contract."}]})
    out["agent_traces"] = traces
    out["agent_sessions"] = agent_sessions(rows_per_source.get("agent_sessions", 0), funcs, rng)
    n = rows_per_source.get("python_docs", 0)
    out["python_docs"] = [
        {"id": f"pd-{i}", "messages": [
            {"role": "user", "content": f"Explain the Python language topic '{key}'."},
            {"role": "assistant", "content": text[:MAX_CHARS]}]}
        for i, (key, text) in enumerate(take(topics, n))]
    n = rows_per_source.get("reasoning", 0)
    rows = []
    for i in range(n):
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
        q = (f"A build farm runs {a} jobs per hour on each of {c} machines, and {b} jobs are queued. "
             "How many hours until the queue is empty, rounded up?")
        per_hour = a * c
        hours = -(-b // per_hour)
        ans = (f"Each hour the farm finishes {a} x {c} = {per_hour} jobs. {b} / {per_hour} = "
               f"{b / per_hour:.3f}, so rounding up it takes {hours} hour{'s' if hours != 1 else ''}.")
        rows.append({"id": f"rs-{i}", "messages": [{"role": "user", "content": q},
                                                   {"role": "assistant", "content": ans}]})
    out["reasoning"] = rows
    return {k: v for k, v in out.items() if v}


def agent_sessions(n: int, funcs: list, rng: random.Random) -> list[dict]:
    """Long agent sessions (opt-in: `demo.rows_per_source.agent_sessions`): the agent reads three to five
    functions of one module, one tool call a turn, each tool result a whole function's source, then
    states their contracts; 4-6 assistant turns whose contexts grow to 600-1,400 tokens (SmolLM2's
    tokenizer), the multi-turn traffic session suites replay (`kind: session`). Written to their own file
    (agent_sessions/sessions.jsonl), so a config can hold them out whole (`dataset.holdout.files`)."""
    by_mod: dict[str, list] = {}
    for f in funcs:
        by_mod.setdefault(f[0], []).append(f)
    mods = sorted(m for m, fs in by_mod.items() if len(fs) >= 3)
    rows = []
    for i in range(n):
        mod = mods[rng.randrange(len(mods))]
        picks = rng.sample(by_mod[mod], min(len(by_mod[mod]), rng.randint(3, 5)))
        path = f"Lib/{mod.replace('.', '/')}.py"
        names = ", ".join(f"`{p[1]}`" for p in picks)
        msgs = [{"role": "system", "content": SYSTEM_AGENT},
                {"role": "user", "content": f"Tests around `{mod}` fail after a refactor. Review {names} in {path} "
                                            "and say which contract each keeps."}]
        for k, (_m, name, sig, _doc, src) in enumerate(picks):
            call = json.dumps({"name": "read_file", "arguments": {"path": path, "symbol": name}})
            lead = "I'll start with" if k == 0 else "Next,"
            msgs += [{"role": "assistant", "content": f"{lead} `{name}`.\n<tool_call>{call}</tool_call>"},
                     {"role": "tool", "content": src.rstrip()}]
        summary = "\n".join(f"- `{name}{sig}`: {doc.splitlines()[0]}" for _m, name, sig, doc, _src in picks)
        msgs.append({"role": "assistant", "content": f"The contracts in `{path}`:\n\n{summary}\n\n"
                                                     "The failing tests should check these."})
        rows.append({"id": f"as-{i}", "messages": msgs})
    return rows


def tokenize_conversation(tok, messages: list[dict]) -> dict:
    """Render with the chat template and mark assistant tokens in `loss_mask`, as training does."""
    text = tok.apply_chat_template(messages, tokenize=False)
    spans, pos = [], 0
    for m in messages:
        start = text.find(m["content"], pos)
        if start < 0:
            raise SpecmatchError("chat template did not render a message verbatim; cannot build loss_mask")
        end = start + len(m["content"])
        pos = end
        if m["role"] == "assistant":
            eos = tok.eos_token or ""
            if eos and text.startswith(eos, end):
                end += len(eos)  # the model learns to stop: the end-of-turn token is trained too
            spans.append((start, end))
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [1 if any(s <= a < e for s, e in spans) else 0 for a, _ in enc["offset_mapping"]]
    return {"input_ids": enc["input_ids"], "loss_mask": mask}


def build(out: Path, tokenizer: str, rows_per_source: dict[str, int], seed: int = 0) -> dict:
    tok = load_tokenizer(tokenizer)
    convs = conversations(rows_per_source, seed)
    counts = {}
    with atomic_dir(out) as tmp:
        (tmp / "README.md").write_text("Demo EAGLE-3 training root built by specmatch from Python's own "
                                       "sources and help topics. Not a benchmark of anything.\n")
        for source, rows in convs.items():
            tokenized = [{"id": r["id"], **tokenize_conversation(tok, r["messages"])} for r in rows]
            counts[source] = len(tokenized)
            d = tmp / source
            if source == "code_explain":  # a Parquet source, like HF datasets exports
                d.mkdir(parents=True)
                pl.DataFrame(tokenized).write_parquet(d / "train-00000-of-00001.parquet")
            elif source == "agent_sessions":  # one file, so a config can hold the source out whole
                d.mkdir(parents=True)
                with open(d / "sessions.jsonl", "w", encoding="utf-8") as fh:
                    fh.writelines(json.dumps(r) + "\n" for r in tokenized)
            elif source == "agent_traces":  # nested, gzip-compressed shards
                d = d / "2026-11"
                d.mkdir(parents=True)
                half = len(tokenized) // 2
                for k, part in enumerate((tokenized[:half], tokenized[half:])):
                    with gzip.open(d / f"shard_{k:02d}.jsonl.gz", "wt", encoding="utf-8") as fh:
                        fh.writelines(json.dumps(r) + "\n" for r in part)
            else:
                d.mkdir(parents=True)
                with open(d / "tokenized_data.jsonl", "w", encoding="utf-8") as fh:
                    fh.writelines(json.dumps(r) + "\n" for r in tokenized)
    return {"root": str(out), "rows": counts}


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--rows", default="{}", help="JSON mapping source -> rows")
    p.add_argument("--seed", type=int, default=0)


def execute(a: argparse.Namespace) -> int:
    rows = json.loads(a.rows) or {"code_instruct": 160, "code_explain": 90, "agent_traces": 60,
                                  "python_docs": 120, "reasoning": 40}
    print(json.dumps(build(a.out, a.tokenizer, rows, a.seed)))
    return 0


def main(argv: list[str] | None = None) -> int:
    return steps.main("demo", __doc__, arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
