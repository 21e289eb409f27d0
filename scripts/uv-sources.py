"""pip's package sources as uv's flags, one per line (scripts/setup.sh): uv reads neither pip.conf nor
PIP_* variables. An environment variable wins over pip's config, as in pip; a local folder or file://
index that does not exist is left out (pip ignores it with a warning; uv would fail).

Usage: python scripts/uv-sources.py   (the interpreter whose pip config is read)
"""
from __future__ import annotations

import os
import subprocess
import sys

KEYS = (("index-url", "--index-url"), ("extra-index-url", "--extra-index-url"), ("find-links", "--find-links"))


def pip_config() -> dict[str, str]:
    """pip's configured values by key (`global.find-links` -> `find-links`), the first file's first."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    conf: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.split(".", 1)[0] in ("global", "install"):
            conf.setdefault(key.split(".", 1)[-1], value.strip().strip("'\""))
    return conf


def uv_flags(env: dict[str, str], conf: dict[str, str]) -> list[str]:
    flags = []
    for key, flag in KEYS:
        for value in (env.get("PIP_" + key.upper().replace("-", "_")) or conf.get(key, "")).split():
            local = value[len("file://"):] if value.startswith("file://") else (None if "://" in value else value)
            if local is None or os.path.exists(local):
                flags += [flag, value]
    return flags


if __name__ == "__main__":
    print("\n".join(uv_flags(dict(os.environ), pip_config())))
