#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite, including the end-to-end test that runs the
# real workflow against a real vLLM CPU server. Extra arguments go to pytest (e.g. -m "not vllm").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup-parsers.sh
exec .venv/bin/python -m pytest -ra "$@"
