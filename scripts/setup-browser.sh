#!/usr/bin/env bash
# For the tests only (scripts/run.sh never needs it): a real headless browser to open report.html in,
# Chromium and its WebDriver from the distribution's packages (one build, so driver and browser always
# match); Selenium, which drives it, is a dev dependency of .venv. Idempotent: returns at once when
# both are there.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    echo "setup-browser: Chromium and chromedriver are missing; install them (Debian: apt-get install chromium" \
         "chromium-driver) or run this script as root" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
fi
echo "setup-browser: $(chromium --version 2>/dev/null | head -1), $(chromedriver --version | cut -d' ' -f1-2)"
