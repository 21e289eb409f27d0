"""The skeleton every workflow step shares (`python -m specmatch.<step>`, `specmatch <step>`), once.

A step module defines `arguments(p)` (its command line) and `execute(a) -> int` (the work: it records
its provenance with provenance.Recorder and returns the exit status), and its `main` is

    def main(argv=None) -> int:
        return steps.main("cell", __doc__, arguments, execute, argv)

Here the parser gets the step's name and the first paragraph of its module docstring, and a
SpecmatchError (a problem with the inputs, the config or a server, never a bug) becomes one
`error: ...` line on stderr and exit status 1, so Snakemake's log shows the reason, not a traceback.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable
from .files import SpecmatchError


def parser(step: str, doc: str | None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=f"python -m specmatch {step}", description=(doc or "").split("\n\n")[0])


def main(step: str, doc: str | None, arguments: Callable[[argparse.ArgumentParser], None],
         execute: Callable[[argparse.Namespace], int], argv: list[str] | None = None) -> int:
    p = parser(step, doc)
    arguments(p)
    a = p.parse_args(argv)
    try:
        return execute(a)
    except SpecmatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
