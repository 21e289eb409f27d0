"""Turn training rows back into the prompts the drafter was trained on; read control prompt files.

Training suites: tokenized rows are cut at an assistant span (from `loss_mask`/`labels`, or, for
rows with neither, from the chat template's assistant header); the prompt is every token before
the span, decoded with the tokenizer the data was made with, so its text is exactly what training
saw; the reference completion is the span. Conversation rows are cut at an assistant message and
rendered with the tokenizer's chat template (tools included). Prompts are sampled across ALL
sources, proportional to the mix (or equal, or by weights), stratified and seeded, deduplicated,
length-filtered; every skipped candidate is counted by reason. Held-out rows (the drafter never saw
them) are marked `holdout: true` so the summary can report both.

Control suites read prompt files: {"prompt"}, {"messages"}, Spec-Bench/MT-bench {"turns"} (category
kept as the source) or ShareGPT {"conversations"}.

    python -m specmatch.prompts --suite NAME --spec JSON --manifest M --tokenizer T --out S.jsonl
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from . import readers
from .inspect import _flat, fast_tokenized_frame, row_schema
from .io import SpecmatchError, read_json, write_json, write_jsonl, write_text
from .stats import describe, ks_critical, ks_statistic, total_variation

ROLE_MAP = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
            "system": "system", "tool": "tool", "function": "tool", "observation": "tool",
            "function_call": "assistant", "ipython": "tool"}


@dataclass
class Candidate:
    source: str
    origin: str
    row_id: str
    turn: int            # which assistant turn (0-based) the cut is before
    turns: int
    prompt_tokens: int
    completion_tokens: int
    holdout: bool
    ids: list | None = None          # tokenized rows: prompt token ids (None until loaded for the sample)
    messages: list | None = None     # conversation rows: prompt messages
    tools: object = None
    key: str = ""


def spans_from_mask(mask: list[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, v in enumerate(mask):
        if v and start is None:
            start = i
        elif not v and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(mask)))
    return spans


def assistant_header_ids(tok) -> list[int]:
    """Token ids the chat template writes before an assistant reply (its generation prompt)."""
    msgs = [{"role": "user", "content": "x"}]
    without = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    with_gen = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    header = with_gen[len(without):] if with_gen.startswith(without) else ""
    return tok(header, add_special_tokens=False)["input_ids"] if header else []


def spans_from_template(ids: list[int], header: list[int], end_id: int | None) -> list[tuple[int, int]]:
    spans, n, h = [], len(ids), len(header)
    if not h:
        return spans
    i = 0
    while i <= n - h:
        if ids[i:i + h] == header:
            start = i + h
            end = start
            while end < n and ids[end] != end_id:
                end += 1
            spans.append((start, min(n, end + 1)))
            i = end
        else:
            i += 1
    return spans


def pick_turns(n: int, how: str, rng: random.Random) -> list[int]:
    if n == 0:
        return []
    return {"first": [0], "last": [n - 1], "all": list(range(n)), "random": [rng.randrange(n)]}[how]


def is_holdout(source: str, path: str, row_id: str, holdout: dict, root: Path) -> bool:
    files = set(holdout.get("files") or [])
    if files:
        try:
            rel = str(Path(path).relative_to(root))
        except ValueError:
            rel = path
        if rel in files or Path(path).name in files:
            return True
    frac = holdout.get("fraction") or 0.0
    if frac <= 0:
        return False
    h = int(hashlib.sha256(f"{source}\0{row_id}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return h < frac


def normalise_messages(conv: list[dict]) -> list[dict]:
    out = []
    for t in conv:
        role = ROLE_MAP.get(t.get("role", t.get("from")), t.get("role", t.get("from")))
        content = t.get("content", t.get("value"))
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        m = {"role": role, "content": content if content is not None else ""}
        if t.get("tool_calls"):
            m["tool_calls"] = t["tool_calls"]
        out.append(m)
    return out


@dataclass
class Cutter:
    """The suite's cutting rules, shared by the vectorised and the row-by-row paths so that both
    admit, cut, filter and count in the same order."""
    spec: dict
    holdout: dict
    root: Path
    skipped: Counter
    cands: list

    def __post_init__(self):
        self.rng = random.Random(self.spec.get("seed", 0))
        self.turn = self.spec.get("turn", "last")
        self.max_p = self.spec.get("max_prompt_tokens", 2048)
        self.min_c = self.spec.get("min_completion_tokens", 1)
        self.max_total = self.spec.get("max_total_tokens")
        self.want_holdout = self.spec.get("holdout", "any")

    def admit(self, source: str, path: str, row_id: str) -> bool | None:
        """The row's holdout flag, or None when the suite's holdout setting excludes the row."""
        hold = is_holdout(source, path, row_id, self.holdout, self.root)
        if (self.want_holdout == "only" and not hold) or (self.want_holdout == "exclude" and hold):
            self.skipped[f"holdout={hold} excluded by suite setting"] += 1
            return None
        return hold

    def keep(self, c: Candidate) -> bool:
        if _keep(c, self.max_p, self.min_c, self.skipped, self.max_total):
            self.cands.append(c)
            return True
        return False

    def cut_tokenized(self, source: str, loc: str, row_id: str, hold: bool, spans: list[tuple[int, int]],
                      ids: list | None = None) -> list[int]:
        """Candidates at the chosen assistant spans; returns the prompt lengths of those kept."""
        if not spans:
            self.skipped["no assistant turn in row"] += 1
            return []
        kept = []
        for t in pick_turns(len(spans), self.turn, self.rng):
            s, e = spans[t]
            if self.keep(Candidate(source, loc, row_id, t, len(spans), s, e - s, hold,
                                   ids=ids[:s] if ids is not None else None)):
                kept.append(s)
        return kept


def collect_candidates(manifest: dict, tok, spec: dict, holdout: dict, skipped: Counter) -> list[Candidate]:
    """Every eligible (row, turn) cut across every source in the manifest, before sampling."""
    cut = Cutter(spec, holdout, Path(manifest["root"]), skipped, [])
    header = assistant_header_ids(tok)
    end_id = tok.convert_tokens_to_ids(tok.eos_token) if tok.eos_token else None
    for src in manifest["sources"]:
        for f in src["files"]:
            df = readers.sniff(Path(f["path"]))
            for batch in readers.iter_batches(df, raw=True):
                if batch.raw is not None and _fast_candidates(batch, src["name"], f["path"], cut):
                    continue
                batch.parse()
                for i, row in enumerate(batch.rows):
                    loc = batch.locations[i]
                    if row is None:
                        skipped["malformed row"] += 1
                        continue
                    schema, problem = row_schema(row)
                    if problem:
                        skipped["malformed row"] += 1
                        continue
                    row_id = str(row.get("id", loc.rsplit(":", 1)[-1]))
                    hold = cut.admit(src["name"], f["path"], row_id)
                    if hold is None:
                        continue
                    if schema == "tokenized":
                        ids = _flat(row["input_ids"])
                        if row.get("loss_mask") is not None:
                            spans = spans_from_mask(_flat(row["loss_mask"]))
                        elif row.get("labels") is not None:
                            spans = spans_from_mask([int(t != -100) for t in _flat(row["labels"])])
                        else:
                            spans = spans_from_template(ids, header, end_id)
                        cut.cut_tokenized(src["name"], loc, row_id, hold, spans, ids)
                    elif schema == "conversations":
                        conv = normalise_messages(row.get("conversations", row.get("messages")))
                        if row.get("system") and conv[0]["role"] != "system":
                            conv.insert(0, {"role": "system", "content": row["system"]})
                        idx = [k for k, m in enumerate(conv) if m["role"] == "assistant"]
                        if not idx:
                            skipped["no assistant turn in row"] += 1
                            continue
                        for t in pick_turns(len(idx), cut.turn, cut.rng):
                            k = idx[t]
                            comp = conv[k]["content"] or json.dumps(conv[k].get("tool_calls") or "")
                            c = Candidate(src["name"], loc, row_id, t, len(idx), -1,
                                          len(tok(comp, add_special_tokens=False)["input_ids"]), hold,
                                          messages=conv[:k], tools=_tools(row.get("tools")))
                            c.prompt_tokens = len(render_ids(tok, c.messages, c.tools))
                            cut.keep(c)
                    else:
                        skipped["text row has no assistant turn to cut at"] += 1
    return cut.cands


def _fast_candidates(batch, source: str, path: str, cut: Cutter) -> bool:
    """Cut a whole JSON Lines batch of tokenized rows with polars; prompt ids are loaded later, only
    for the sampled prompts (memory stays bounded by one batch). False = use the exact path."""
    import polars as pl

    got = fast_tokenized_frame(batch, with_id=True)
    if got is None or got[1] == "none":
        return False
    frame, _kind = got
    el, prev = pl.element(), pl.element().shift(1).fill_null(0)
    spans = frame.select(
        pl.col("mask").list.eval(pl.arg_where((el != 0) & (prev == 0))).alias("starts"),
        pl.col("mask").list.eval(pl.arg_where((el == 0) & (prev != 0))).alias("ends"),
        pl.col("mask").list.last().alias("last"), pl.col("ids").list.len().alias("n"))
    ids_col = frame["id"].to_list() if "id" in frame.columns else [None] * frame.height
    first_new = len(cut.cands)
    rows, cuts = [], []
    for i, (starts, ends, last, n) in enumerate(spans.iter_rows()):
        loc = batch.locations[i]
        row_id = str(ids_col[i]) if ids_col[i] is not None else loc.rsplit(":", 1)[-1]
        hold = cut.admit(source, path, row_id)
        if hold is None:
            continue
        if last:
            ends = list(ends) + [n]
        for s in cut.cut_tokenized(source, loc, row_id, hold, list(zip(starts, ends))):
            rows.append(i)
            cuts.append(s)
    if rows:  # dedup key: a hash of the prompt's token ids, computed without leaving polars
        keyed = frame.select("ids")[rows].with_columns(pl.Series("s", cuts))
        hashes = keyed.select(pl.col("ids").list.head(pl.col("s")).hash())["ids"].to_list()
        for c, h in zip(cut.cands[first_new:], hashes):
            c.key = f"ids:{h}"
    return True


def load_prompt_ids(chosen: list[Candidate]) -> None:
    """Second pass: read the token ids of the sampled prompts only (by file and line)."""
    wanted: dict[str, dict[int, list[Candidate]]] = defaultdict(lambda: defaultdict(list))
    for c in chosen:
        if c.ids is None and c.messages is None:
            path, line = c.origin.rsplit(":", 1)
            wanted[path][int(line)].append(c)
    for path, lines in wanted.items():
        df = readers.sniff(Path(path))
        last = max(lines)
        with readers._open_decompressed(df.path, df.compression) as fh:
            for lineno, raw in enumerate(fh, 1):
                if lineno in lines:
                    ids = _flat(json.loads(raw)["input_ids"])
                    for c in lines[lineno]:
                        c.ids = ids[:c.prompt_tokens]
                if lineno >= last:
                    break


def _tools(tools):
    if isinstance(tools, str):
        try:
            return json.loads(tools)
        except json.JSONDecodeError:
            return None
    return tools


def render_text(tok, messages: list[dict], tools=None) -> str:
    kwargs = {"tools": tools} if tools else {}
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)


def render_ids(tok, messages, tools=None) -> list[int]:
    return tok(render_text(tok, messages, tools), add_special_tokens=False)["input_ids"]


def _keep(c: Candidate, max_p: int, min_c: int, skipped: Counter, max_total: int | None = None) -> bool:
    if max_total and c.prompt_tokens + c.completion_tokens > max_total:
        skipped[f"prompt + completion longer than max_total_tokens ({max_total})"] += 1
        return False
    if c.prompt_tokens > max_p:
        skipped[f"prompt longer than max_prompt_tokens ({max_p})"] += 1
        return False
    if c.completion_tokens < min_c:
        skipped[f"completion shorter than min_completion_tokens ({min_c})"] += 1
        return False
    if c.prompt_tokens == 0:
        skipped["empty prompt"] += 1
        return False
    return True


def allocate(size: int, weights: dict[str, float]) -> dict[str, int]:
    """Largest-remainder allocation of `size` draws to sources by weight (deterministic)."""
    total = sum(weights.values())
    if total <= 0:
        raise SpecmatchError("suite weighting: all source weights are zero")
    exact = {s: size * w / total for s, w in weights.items()}
    alloc = {s: int(v) for s, v in exact.items()}
    rest = size - sum(alloc.values())
    for s in sorted(exact, key=lambda s: (-(exact[s] - alloc[s]), s))[:rest]:
        alloc[s] += 1
    return alloc


def source_weights(manifest: dict, weighting) -> dict[str, float]:
    names = [s["name"] for s in manifest["sources"]]
    if weighting == "mix":
        return {s["name"]: float(s["rows"]) for s in manifest["sources"]}
    if weighting == "equal":
        return {n: 1.0 for n in names}
    unknown = set(weighting) - set(names)
    if unknown:
        raise SpecmatchError(f"suite weighting: unknown sources {sorted(unknown)} (sources: {', '.join(names)})")
    return {n: float(weighting.get(n, 0.0)) for n in names}


def sample(cands: list[Candidate], size: int, weights: dict[str, float], seed: int,
           skipped: Counter) -> tuple[list[Candidate], dict]:
    by_src: dict[str, list[Candidate]] = defaultdict(list)
    seen = set()
    for c in cands:
        key = c.key or hashlib.sha256(json.dumps(c.ids if c.ids is not None else c.messages).encode()).hexdigest()
        if key in seen:
            skipped["duplicate prompt"] += 1
            continue
        seen.add(key)
        c.key = key
        by_src[c.source].append(c)
    alloc = allocate(size, weights)
    rng = random.Random(seed)
    chosen, shortfall = [], {}
    for src in sorted(alloc):
        pool = by_src.get(src, [])
        k = alloc[src]
        if k > len(pool):
            shortfall[src] = {"wanted": k, "available": len(pool)}
            k = len(pool)
        chosen.extend(rng.sample(pool, k))
    rng.shuffle(chosen)
    return chosen, {"allocation": alloc, "shortfall": shortfall}


def parse_rendered(text: str, tok) -> list[dict] | None:
    """Messages back from rendered ChatML / Llama-3 text (None when the template is unknown)."""
    import re

    if "<|im_start|>" in text:
        msgs = [{"role": r, "content": c} for r, c in
                re.findall(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", text, flags=re.S)]
        return msgs or None
    if "<|start_header_id|>" in text:
        msgs = [{"role": r, "content": c} for r, c in
                re.findall(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n(.*?)<\|eot_id\|>", text, flags=re.S)]
        return msgs or None
    return None


def training_suite(name: str, spec: dict, manifest: dict, tok, holdout: dict) -> tuple[list[dict], dict]:
    skipped: Counter = Counter()
    cands = collect_candidates(manifest, tok, spec, holdout, skipped)
    if not cands:
        raise SpecmatchError(f"suite {name}: no eligible prompt in {manifest['root']} "
                             f"(skipped: {dict(skipped) or 'nothing'})")
    weights = source_weights(manifest, spec.get("weighting", "mix"))
    chosen, alloc = sample(cands, spec.get("size", 64), weights, spec.get("seed", 0), skipped)
    load_prompt_ids(chosen)
    tok_chosen = [c for c in chosen if c.ids is not None]
    texts = dict(zip((id(c) for c in tok_chosen),
                     tok.batch_decode([c.ids for c in tok_chosen], skip_special_tokens=False)))
    rows = []
    for i, c in enumerate(chosen):
        if c.ids is not None:
            text = texts[id(c)]
            messages = parse_rendered(text, tok)
        else:
            text = render_text(tok, c.messages, c.tools)
            messages = c.messages
        rows.append({"id": f"{name}-{i:05d}", "suite": name, "source": c.source, "origin": c.origin,
                     "row_id": c.row_id, "turn": c.turn, "turns": c.turns, "messages": messages, "text": text,
                     "prompt_tokens": c.prompt_tokens, "reference_completion_tokens": c.completion_tokens,
                     "max_tokens": c.completion_tokens, "holdout": c.holdout})
    match = match_report(name, rows, manifest, weights, [c.prompt_tokens for c in cands],
                         [c.completion_tokens for c in cands])
    match.update({"candidates": len(cands), "skipped": dict(skipped), **alloc})
    return rows, match


def file_suite(name: str, spec: dict, tok, manifest: dict | None) -> tuple[list[dict], dict]:
    path = Path(spec["path"])
    if not path.is_file():
        raise SpecmatchError(f"suites.{name}.path: {path}: file not found")
    raw, skipped = [], Counter()
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            loc = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SpecmatchError(f"{loc}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise SpecmatchError(f"{loc}: expected a JSON object")
            source = str(obj.get("category") or obj.get("source") or path.stem)
            if isinstance(obj.get("prompt"), str):
                messages = [{"role": "user", "content": obj["prompt"]}]
            elif isinstance(obj.get("messages"), list):
                messages = normalise_messages(obj["messages"])
            elif isinstance(obj.get("turns"), list) and obj["turns"]:
                messages = [{"role": "user", "content": str(obj["turns"][0])}]
            elif isinstance(obj.get("conversations"), list):
                conv = normalise_messages(obj["conversations"])
                idx = [k for k, m in enumerate(conv) if m["role"] == "assistant"]
                messages = conv[: idx[-1]] if idx else conv
            else:
                raise SpecmatchError(f"{loc}: expected a prompt, messages, turns or conversations field")
            if not messages or messages[-1]["role"] == "assistant":
                skipped["ends with an assistant turn"] += 1
                continue
            raw.append((loc, str(obj.get("question_id", obj.get("id", lineno))), source, messages))
    if not raw:
        raise SpecmatchError(f"{path}: no prompts")
    rng = random.Random(spec.get("seed", 0))
    size = spec.get("size", 64)
    picked = rng.sample(raw, min(size, len(raw)))
    rows = []
    for i, (loc, rid, source, messages) in enumerate(picked):
        text = render_text(tok, messages)
        rows.append({"id": f"{name}-{i:05d}", "suite": name, "source": source, "origin": loc, "row_id": rid,
                     "turn": 0, "turns": 0, "messages": messages, "text": text,
                     "prompt_tokens": len(tok(text, add_special_tokens=False)["input_ids"]),
                     "reference_completion_tokens": None, "max_tokens": None, "holdout": True})
    match = match_report(name, rows, manifest, None, None, None) if manifest else {"suite": name}
    match.update({"candidates": len(raw), "skipped": dict(skipped),
                  "shortfall": {"file": {"wanted": size, "available": len(raw)}} if size > len(raw) else {}})
    return rows, match


def match_report(name, rows, manifest, weights, pool_prompt, pool_completion) -> dict:
    """How well the suite matches the training mix: source TVD and a prompt-length KS statistic."""
    suite_mix = Counter(r["source"] for r in rows)
    train_mix = {s["name"]: s["rows"] for s in manifest["sources"]} if manifest else {}
    target = weights or train_mix
    out = {"suite": name, "prompts": len(rows),
           "holdout_share": sum(r["holdout"] for r in rows) / len(rows) if rows else None,
           "suite_sources": dict(sorted(suite_mix.items())),
           "training_sources": train_mix,
           "target_shares": {k: v / sum(target.values()) for k, v in target.items()} if target else {},
           "source_tvd_vs_target": total_variation(dict(suite_mix), target) if target else None,
           "source_tvd_vs_training_mix": total_variation(dict(suite_mix), train_mix) if train_mix else None,
           "prompt_tokens": describe([r["prompt_tokens"] for r in rows]),
           "completion_tokens": describe([r["reference_completion_tokens"] for r in rows])}
    if pool_prompt:
        ks = ks_statistic([r["prompt_tokens"] for r in rows], pool_prompt)
        crit = ks_critical(len(rows), len(pool_prompt))
        out.update({"training_prompt_tokens": describe(pool_prompt),
                    "training_completion_tokens": describe(pool_completion),
                    "prompt_length_ks": ks, "prompt_length_ks_critical_5pct": crit})
        out["representative"] = bool((out["source_tvd_vs_target"] or 0) <= 0.1 and ks is not None and ks <= crit)
    else:
        train_p = [s.get("prompt_tokens") for s in manifest["sources"]] if manifest else []
        out["training_prompt_tokens_by_source"] = {s["name"]: s.get("prompt_tokens") for s in manifest["sources"]} \
            if manifest else {}
        out["representative"] = False if train_mix else None
        del train_p
    if out["representative"] is True:
        out["verdict"] = "representative of the training mix"
    elif out["representative"] is False:
        out["verdict"] = "NOT representative of the training mix (a control suite, or a biased sample)"
    else:
        out["verdict"] = "no training mix to compare with"
    return out


def match_markdown(m: dict) -> str:
    lines = [f"# Suite `{m['suite']}`: {m['prompts']} prompts — {m['verdict']}", ""]
    if m.get("source_tvd_vs_training_mix") is not None:
        lines.append(f"- Source mix: total variation distance {m['source_tvd_vs_training_mix']:.3f} from the training "
                     f"mix ({m.get('source_tvd_vs_target', 0):.3f} from the configured target).")
    if m.get("prompt_length_ks") is not None:
        lines.append(f"- Prompt length: KS statistic {m['prompt_length_ks']:.3f} against all eligible training cuts "
                     f"(5% critical value {m['prompt_length_ks_critical_5pct']:.3f}).")
    lines.append(f"- Held-out share: {m['holdout_share']:.0%}." if m.get("holdout_share") is not None else "")
    if m.get("skipped"):
        lines.append("- Skipped candidates: " + ", ".join(f"{k}: {v}" for k, v in m["skipped"].items()))
    if m.get("shortfall"):
        lines.append("- Shortfall (fewer eligible prompts than asked): " + json.dumps(m["shortfall"]))
    lines += ["", "| source | suite prompts | suite share | target share |", "|---|---|---|---|"]
    total = sum(m["suite_sources"].values()) or 1
    for src in sorted(set(m["suite_sources"]) | set(m.get("target_shares", {}))):
        lines.append(f"| {src} | {m['suite_sources'].get(src, 0)} | {m['suite_sources'].get(src, 0) / total:.1%} | "
                     f"{m.get('target_shares', {}).get(src, 0):.1%} |")
    return "\n".join(l for l in lines if l is not None) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specmatch.prompts", description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", required=True)
    p.add_argument("--spec", required=True, help="the suite's config as JSON")
    p.add_argument("--manifest", type=Path, help="results/inspect/manifest.json")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--holdout", default="{}", help="dataset.holdout as JSON")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--match", required=True, type=Path)
    p.add_argument("--match-md", type=Path)
    a = p.parse_args(argv)
    from .provenance import Recorder
    from .tokenizer import load_tokenizer

    spec = json.loads(a.spec)
    rec = Recorder("prompts", [a.manifest, spec.get("path")], {"suite": a.suite, "spec": spec,
                                                               "holdout": json.loads(a.holdout),
                                                               "tokenizer": a.tokenizer})
    try:
        tok = load_tokenizer(a.tokenizer)
        manifest = read_json(a.manifest) if a.manifest else None
        if spec["kind"] == "training":
            if manifest is None:
                raise SpecmatchError(f"suite {a.suite}: a training suite needs --manifest")
            rows, match = training_suite(a.suite, spec, manifest, tok, json.loads(a.holdout))
        else:
            rows, match = file_suite(a.suite, spec, tok, manifest)
    except SpecmatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    write_jsonl(a.out, rows)
    write_json(a.match, match)
    outputs = [a.out, a.match]
    if a.match_md:
        write_text(a.match_md, match_markdown(match))
        outputs.append(a.match_md)
    rec.write(outputs)
    print(f"suite {a.suite}: {len(rows)} prompts; {match['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
