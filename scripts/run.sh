#!/usr/bin/env bash
# Set up (idempotent) and run the workflow on the embedded default (or pass your own options,
# e.g. --configfile my.yaml). Equivalent to: scripts/setup.sh && .venv/bin/snakemake --cores all
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/snakemake --cores all "$@"
