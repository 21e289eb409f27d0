#!/usr/bin/env bash
# Set up (idempotent) and run the tests. Extra arguments go to pytest (e.g. -k cell, -x).
#   scripts/test.sh           everything, including the end-to-end test that runs the real workflow
#                             against a real vLLM CPU server, the report page in a real headless
#                             Chromium and the workflow through a real one-node SLURM
#                             (tests/test_slurm.py, about 10 minutes, mostly waiting) (what CI runs, via .ci/run)
#   scripts/test.sh --quick   everything except the real-engine tests (marker vllm) and the long ones
#                             (marker slow: calibration, whole-workflow runs, the engines' own
#                             parsers); run it while working
# Both run in SPECMATCH_TEST_WORKERS pytest processes (default 2, the cores of the machine CI runs on;
# 1: one process, as plain pytest), each test module whole in one of them (--dist loadscope: a
# module's fixtures are built once), the modules that take minutes first (tests/conftest.py). While
# one process waits on SLURM, a server or the calibration's own processes, the other runs tests.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
args=()
for a in "$@"; do
  if [[ $a == --quick ]]; then quick=1; else args+=("$a"); fi
done
workers=${SPECMATCH_TEST_WORKERS:-2}
if ((workers > 1)); then
  args=(-n "$workers" --dist loadscope --no-loadscope-reorder "${args[@]}")
fi
if ((!quick)); then
  # The distribution's packages (apt: the network and dpkg) while uv builds .venv: Chromium and its
  # driver, then Debian's SLURM and munge (the SLURM plugin goes into .venv once it exists, below)
  apt_log=$(mktemp)
  { bash scripts/setup-browser.sh && bash scripts/setup-slurm.sh --packages; } > "$apt_log" 2>&1 &
  apt=$!
fi
bash scripts/setup.sh
bash scripts/setup-parsers.sh
if ((quick)); then
  exec .venv/bin/python -m pytest -ra -m "not vllm and not slow" "${args[@]}"
fi
if ! wait "$apt"; then
  cat "$apt_log" >&2
  rm -f "$apt_log"
  echo "test: installing the browser or SLURM failed" >&2
  exit 1
fi
cat "$apt_log"
rm -f "$apt_log"
bash scripts/setup-slurm.sh   # Snakemake's SLURM plugin for tests/test_slurm.py
exec .venv/bin/python -m pytest -ra "${args[@]}"
