#!/usr/bin/env bash
# For the tests only (scripts/run.sh never needs it): the server-side code of pinned SGLang releases,
# without their GPU dependencies, so tests can run SGLang's own argument parser and validation on
# every argv the adapter builds, and read the meta_info keys its source emits.
#   .parsers/sglang-0.5.23: installed (--no-deps) with the two pure-Python modules its server
#                           arguments import (orjson, ipython); its parser runs on the CPU torch of .venv
#   .parsers/sglang-0.5.10: an older release, checked by its source (flags and meta_info keys)
# Idempotent: returns at once when the pinned releases are there.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SPECMATCH_VENV:-.venv}
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
for v in 0.5.23 0.5.10; do
  d=.parsers/sglang-$v
  [[ -f "$d/.done" ]] && continue
  rm -rf "$d"
  quiet "${PIP[@]}" install -q --no-deps --no-compile --target "$d" "sglang==$v"
  if [[ $v == 0.5.23 ]]; then
    quiet "${PIP[@]}" install -q --no-deps --no-compile --target "$d" "orjson==3.13.0" "ipython==9.18.1"
  fi
  touch "$d/.done"
done
echo "setup-parsers: SGLang 0.5.23 and 0.5.10 in .parsers/"
