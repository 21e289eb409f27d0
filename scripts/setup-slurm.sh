#!/usr/bin/env bash
# What the SLURM tests (tests/test_slurm.py) need: Debian's SLURM (slurmctld, slurmd, the client
# commands) and munge, and Snakemake's SLURM executor plugin in .venv, at pinned versions.
# Installs nothing that starts itself: no daemon is started here (scripts/slurm-local.sh does that,
# under a folder of its own). Idempotent: when everything is there it returns in about a second.
# As root (apt-get); run scripts/setup.sh first (it makes .venv).
#   --packages   the Debian packages only (no .venv needed: scripts/test.sh installs them while
#                setup.sh builds .venv, and runs this script again for the plugin)
set -euo pipefail
cd "$(dirname "$0")/.."
packages_only=0
[[ ${1:-} == --packages ]] && packages_only=1
VENV=${SPECMATCH_VENV:-.venv}
PLUGIN_VERSION=2.8.0          # snakemake-executor-plugin-slurm
JOBSTEP_VERSION=0.6.1         # snakemake-executor-plugin-slurm-jobstep: runs a group inside its allocation
THROTTLER_VERSION=1.2.3
DEBS=(slurmctld slurmd slurm-client munge)

missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup-slurm: installing ${missing[*]} needs root (apt-get)" >&2
    exit 1
  fi
  # Debian's maintainer scripts start a daemon after installing it where they can; the local SLURM
  # is started by scripts/slurm-local.sh only, with its own config, so forbid that here (policy-rc.d
  # exit 101: "action not allowed"), and restore whatever policy there was.
  policy=/usr/sbin/policy-rc.d
  saved=""
  if [[ -e $policy ]]; then saved=$(mktemp); cp -p "$policy" "$saved"; fi
  restore() { if [[ -n $saved ]]; then mv -f "$saved" "$policy"; else rm -f "$policy"; fi; }
  trap restore EXIT
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${DEBS[@]}" >/dev/null
  restore
  trap - EXIT
  echo "setup-slurm: installed ${missing[*]}"
fi

if ((packages_only)); then
  echo "setup-slurm: Debian packages ready ($(slurmctld -V 2>/dev/null || echo 'slurmctld ?'), munge $(dpkg-query -W -f='${Version}' munge))"
  exit 0
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "setup-slurm: $VENV is missing: run scripts/setup.sh first" >&2
  exit 1
fi
have=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("snakemake-executor-plugin-slurm"))' 2>/dev/null || true)
if [[ "$have" != "$PLUGIN_VERSION" ]]; then
  # --no-deps: 2.8.0 declares numpy>=2.4.5, which would replace the numpy vLLM's mistral-common
  # needs (<2.4); the plugin uses numpy only in its efficiency report (np.inf), which works with the
  # numpy .venv has. Its other requirements are installed at the versions it was run with.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
    "snakemake-executor-plugin-slurm==$PLUGIN_VERSION" "snakemake-executor-plugin-slurm-jobstep==$JOBSTEP_VERSION" \
    "throttler==$THROTTLER_VERSION" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  echo "setup-slurm: snakemake-executor-plugin-slurm $PLUGIN_VERSION installed in $VENV"
fi
echo "setup-slurm: ready ($(slurmctld -V 2>/dev/null || echo 'slurmctld ?'), munge $(dpkg-query -W -f='${Version}' munge), plugin $PLUGIN_VERSION)"
