"""The workflow stays lint-clean and snakefmt-formatted, and every rule has log and conda."""
import re
import shutil
import sys
from pathlib import Path

import pytest

from conftest import REPO, run, snakemake_cmd


def test_snakemake_lint_is_clean():
    out = run(snakemake_cmd() + ["--lint"], REPO)
    assert "Congratulations, your workflow is in a good condition!" in out.stdout + out.stderr


def test_snakefmt_check():
    exe = Path(sys.executable).parent / "snakefmt"
    if not exe.exists():
        pytest.skip("snakefmt not installed")
    run([str(exe), "--check", "Snakefile", "workflow/rules"], REPO)


def test_every_rule_has_log_and_conda():
    for smk in (REPO / "workflow" / "rules").glob("*.smk"):
        for block in re.split(r"\n(?=rule )", smk.read_text())[1:]:
            name = block.split(":")[0]
            assert "    log:" in block, f"{smk.name}: {name} has no log"
            assert "    conda:" in block, f"{smk.name}: {name} has no conda env"
