"""scripts/uv-sources.py: pip's package sources handed to uv (scripts/setup.sh installs with uv,
which reads neither pip.conf nor PIP_* variables)."""
from __future__ import annotations

import os
import subprocess
import sys

from builders import REPO


def flags(tmp_path, conf: str, env: dict[str, str]) -> list[str]:
    cfg = tmp_path / "pip.conf"
    cfg.write_text(conf)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "uv-sources.py")], capture_output=True, text=True,
                         env={**clean, "PIP_CONFIG_FILE": str(cfg), **env}, timeout=60, check=True)
    return out.stdout.split()


def test_pip_config_becomes_uv_flags_leaving_out_local_sources_that_do_not_exist(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    conf = ("[global]\n"
            "index-url = https://mirror.example/simple\n"
            f"extra-index-url = file://{tmp_path}/missing https://download.pytorch.org/whl/cpu file://{wheels}\n"
            f"find-links = {wheels} {tmp_path}/nowhere\n")
    assert flags(tmp_path, conf, {}) == [
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "https://download.pytorch.org/whl/cpu", "--extra-index-url", f"file://{wheels}",
        "--find-links", str(wheels)]


def test_a_pip_variable_wins_over_the_config_as_in_pip(tmp_path):
    conf = "[global]\nextra-index-url = https://a.example/simple\n"
    assert flags(tmp_path, conf, {"PIP_EXTRA_INDEX_URL": "https://b.example/simple"}) == [
        "--extra-index-url", "https://b.example/simple"]
    assert flags(tmp_path, "", {}) == []
