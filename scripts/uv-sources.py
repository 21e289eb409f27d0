"""pip's package sources as uv's flags, one per line (scripts/setup.sh): uv reads neither pip.conf nor
PIP_* variables. As in pip, an environment variable wins over the config and `install.*` over
`global.*`; a local folder or file:// index that does not exist is left out (pip ignores it with a
warning; uv would fail). Constraints and --no-index go along; a custom certificate does not (uv then
fails and setup installs with pip).

Usage: python scripts/uv-sources.py   (the interpreter whose pip config is read; exits non-zero when
pip's config cannot be read, so setup never installs from sources it did not mean)
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from urllib.parse import unquote, urlparse

KEYS = (("index-url", "--index-url"), ("extra-index-url", "--extra-index-url"), ("find-links", "--find-links"),
        ("constraint", "--constraint"))


def parse_config(listing: str) -> dict[str, str]:
    """`pip config list` (key='value' per line, values as Python literals) -> {key: value}, `install.*`
    over `global.*` as pip install reads them."""
    found: dict[tuple[str, str], str] = {}
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        if not sep or "." not in key:
            continue
        section, name = key.split(".", 1)
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            value = value.strip().strip("'\"")
        found[section, name] = str(value)
    out = {}
    for section in ("global", "install"):   # install last: it wins
        out |= {name: v for (s, name), v in found.items() if s == section}
    return out


def local_path(value: str) -> str | None:
    """The local path a source names (a folder, a file, a file:// URL), or None for a remote one."""
    if value.startswith("file:"):
        return unquote(urlparse(value).path)
    return None if "://" in value else value


def uv_flags(env: dict[str, str], conf: dict[str, str]) -> list[str]:
    flags = []
    for key, flag in KEYS:
        for value in (env.get("PIP_" + key.upper().replace("-", "_")) or conf.get(key, "")).split():
            local = local_path(value)
            if local is None or os.path.exists(local):
                flags += [flag, value]
    no_index = env.get("PIP_NO_INDEX") or conf.get("no-index", "")
    if no_index.lower() in ("1", "true", "yes", "on"):
        flags.append("--no-index")
    return flags


def pip_config() -> dict[str, str]:
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             check=True).stdout
    return parse_config(listing)


if __name__ == "__main__":
    print("\n".join(uv_flags(dict(os.environ), pip_config())))
