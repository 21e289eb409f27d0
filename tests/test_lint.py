"""The workflow stays lint-clean and snakefmt-formatted, and every rule has log and conda."""
import re
import sys
from pathlib import Path

import pytest

from builders import REPO, run, snakemake_cmd


@pytest.mark.slow
def test_snakemake_lint_is_clean():
    out = run(snakemake_cmd() + ["--lint"], REPO)
    assert "Congratulations, your workflow is in a good condition!" in out.stdout + out.stderr


@pytest.mark.slow
def test_snakefmt_check():
    exe = Path(sys.executable).parent / "snakefmt"
    if not exe.exists():
        pytest.skip("snakefmt not installed")
    run([str(exe), "--check", "Snakefile", "workflow/rules"], REPO)


RULE_HEADER = re.compile(r"^(rule|checkpoint)\s+(\w+)\s*:", re.M)


def rule_blocks(text: str) -> dict[str, str]:
    """Every `rule` and `checkpoint` of a rule module: name -> its block (up to the next top-level line)."""
    blocks = {}
    for m in RULE_HEADER.finditer(text):
        rest = text[m.end():]
        end = re.search(r"^\S", rest, re.M)
        blocks[m.group(2)] = rest[:end.start()] if end else rest
    return blocks


def test_rule_blocks_sees_rules_and_checkpoints():
    text = "rule a:\n    log:\n        'x'\n\n\ncheckpoint b:\n    input:\n        'y'\ndef f():\n    pass\n"
    blocks = rule_blocks(text)
    assert set(blocks) == {"a", "b"} and "log:" in blocks["a"] and "log:" not in blocks["b"]


def test_every_rule_has_log_and_conda():
    seen = {}
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        text = smk.read_text()
        assert not re.search(r"^use rule", text, re.M), f"{smk.name}: `use rule` is not checked here"
        for name, block in rule_blocks(text).items():
            seen[name] = smk.name
            assert "\n    log:" in block, f"{smk.name}: {name} has no log"
            assert "\n    conda:" in block, f"{smk.name}: {name} has no conda env"
    # the checkpoint and the workflow's main steps were among the blocks checked
    assert {"recommend", "decide", "summary", "cell", "launch", "inspect", "prompts"} <= set(seen), seen
