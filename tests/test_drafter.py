"""EAGLE-3 drafter training on a tiny random Llama target (seconds): vocabulary, holdout, determinism,
and the checkpoint format vLLM loads (its own loader is exercised by the real-vLLM end-to-end test)."""
import json

import numpy as np
import pytest
import torch

from specmatch.training.drafter import Budget, draft_vocabulary, save, train
from specmatch.data.inspect_pass import inspect_root
from specmatch.data.rows import ChatTemplate
from builders import make_root

TINY = Budget(steps=4, train_tokens=600, seq_len=64, batch_size=2, draft_vocab=64, ttt_length=2, lr=1e-3, seed=0,
              threads=1)


@pytest.fixture(scope="module")
def data(tmp_path_factory, tok, tok_dir):
    root = make_root(tmp_path_factory.mktemp("data"), tok, {"code": 12, "chat": 8})
    m, cuts = inspect_root(root, str(tok_dir), holdout={"fraction": 0.3})
    return m, cuts


def test_draft_vocabulary_maps_back_to_target_ids():
    seqs = [([5, 9, 9, 7, 3], [0, 1, 1, 1, 0]), ([9, 7, 8], [1, 1, 0])]
    used, info = draft_vocabulary(seqs, 4, 100)
    assert list(used) == sorted(used) and len(used) == 4
    assert {9, 7} <= set(used.tolist())  # the most frequent assistant tokens
    d2t = used - np.arange(len(used))
    assert all(i + d2t[i] == used[i] for i in range(len(used)))  # vLLM: target = draft + d2t[draft]
    assert info["coverage"] == 1.0 and info["distinct_assistant_tokens"] == 2


@pytest.mark.slow
def test_training_never_reads_held_out_rows(tiny_target, data, tok, monkeypatch):
    from specmatch.data import readers

    m, cuts = data
    held = {(f, (o if o is not None else r)) for f, o, r in cuts.filter(cuts["holdout"]).select(
        "file", "offset", "row").iter_rows()}
    assert held, "the fixture must hold some rows out"
    read = []
    real = readers.read_rows
    monkeypatch.setattr(readers, "read_rows", lambda df, wanted: read.extend((str(df.path), w) for w in wanted)
                        or real(df, wanted))
    train(tiny_target, cuts, ChatTemplate.of(tok), TINY, aux_layers=[1, 2, 3], log=lambda m: None)
    assert read and not (set(read) & held)


@pytest.mark.slow
def test_same_seed_and_budget_give_the_same_weights(tiny_target, data, tok, tmp_path):
    m, cuts = data
    a = train(tiny_target, cuts, ChatTemplate.of(tok), TINY, aux_layers=[1, 2, 3], log=lambda m: None)
    b = train(tiny_target, cuts, ChatTemplate.of(tok), TINY, aux_layers=[1, 2, 3], log=lambda m: None)
    sa, sb = a["head"].state_dict(), b["head"].state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    c = train(tiny_target, cuts, ChatTemplate.of(tok), Budget(**{**TINY.__dict__, "seed": 1}), aux_layers=[1, 2, 3],
              log=lambda m: None)
    assert not all(torch.equal(sa[k], c["head"].state_dict()[k]) for k in sa)


@pytest.mark.slow
def test_checkpoint_is_what_vllm_loads_for_eagle3(tiny_target, data, tok, tmp_path):
    from safetensors.torch import load_file

    m, cuts = data
    state = train(tiny_target, cuts, ChatTemplate.of(tok), TINY, aux_layers=[1, 2, 3], log=lambda m: None)
    save(state, tmp_path / "head", TINY, {"training_files": []})
    cfg = json.loads((tmp_path / "head" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == 64 and cfg["vocab_size"] == len(tok)
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    w = load_file(tmp_path / "head" / "model.safetensors")
    # the names vLLM's Eagle3LlamaForCausalLM.load_weights maps (midlayer. -> layers.0.), SpecForge's names
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight", "midlayer.mlp.down_proj.weight",
            "norm.weight", "lm_head.weight", "d2t", "t2d"} <= set(w)
    assert "embed_tokens.weight" not in w  # vLLM shares the target's embeddings
    hidden = json.loads((tiny_target / "config.json").read_text())["hidden_size"]
    assert w["fc.weight"].shape == (hidden, 3 * hidden) and w["lm_head.weight"].shape == (64, hidden)
    assert w["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * hidden  # [embedding ; hidden]
    assert w["d2t"].dtype == torch.int64 and w["t2d"].dtype == torch.bool and int(w["t2d"].sum()) == 64
    used = torch.nonzero(w["t2d"]).flatten()
    assert torch.equal(torch.arange(64) + w["d2t"], used)
    meta = json.loads((tmp_path / "head" / "specmatch_drafter.json").read_text())
    assert meta["budget"]["steps"] == 4 and "final_top1_agreement_by_step" in meta["metrics"]


@pytest.mark.slow
def test_training_on_regenerated_rows_reads_only_them_and_evaluation_reports_held_out(tiny_target, data, tok,
                                                                                       monkeypatch):
    """With a regenerated store, training reads no original row (the store replaces the seen rows,
    matched by file and position, so the holdout stays the cut table's); after training, agreement
    is reported on seen rows (as trained), on their original text, and on held-out rows."""
    from specmatch.data import readers
    from specmatch.data.rows import training_rows
    from specmatch.training.drafter import evaluate

    m, cuts = data
    budget = Budget(**{**TINY.__dict__, "eval_tokens": 200})
    seen = training_rows(cuts, budget.seed)
    store = {}
    for k, c in enumerate(seen.iter_rows(named=True)):
        if k % 2:  # half the seen rows were not regenerated: they are passed over, never read
            continue
        answer = [300 + (k + j) % 50 for j in range(12)] + [2]
        store[(c["file"], c["offset"] if c["offset"] is not None else c["row"])] = (
            [1, 9, 8, 7, 2, 1, 4, 5] + answer, [0] * 8 + [1] * len(answer))
    read = []
    real = readers.read_rows
    monkeypatch.setattr(readers, "read_rows", lambda df, wanted: read.extend((str(df.path), w) for w in wanted)
                        or real(df, wanted))
    state = train(tiny_target, cuts, ChatTemplate.of(tok), budget, aux_layers=[1, 2, 3], log=lambda m: None,
                  store=store)
    assert not read and state["metrics"]["training_rows"] == "regenerated"
    assert all(ids in [v[0][:len(ids)] for v in store.values()] for ids, _ in state["eval"]["seqs"])
    agreement = evaluate(state, cuts, ChatTemplate.of(tok), budget, store, log=lambda m: None)
    assert set(agreement) == {"seen", "seen_original", "held_out"}
    held = {(f, o if o is not None else r) for f, o, r in cuts.filter(cuts["holdout"]).select(
        "file", "offset", "row").iter_rows()}
    assert set(read) & held  # held-out rows are read for the evaluation, after training
    for side in agreement.values():
        assert len(side["top1_agreement_by_step"]) == TINY.ttt_length and side["tokens"] > 0
        assert all(a <= b + 1e-9 for a, b in zip(side["top1_agreement_by_step"],
                                                  side["top1_agreement_in_vocab_by_step"]))
