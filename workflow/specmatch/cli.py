"""`python -m specmatch <step>` (or `specmatch <step>`): every workflow step, and the audit commands.

Each Snakefile rule calls its step through this one entry point, so a module's place in the stage
folders never appears in a rule's shell text.

    specmatch provenance PATH        where a result came from, back to training files and server argv
    specmatch verify [--root DIR]    check every recorded input hash; name what changed and what it invalidates
    specmatch <step> --help          one step's own command line (the steps are listed below)
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .provenance import chain, invalidated, verify

# step -> (module under specmatch, what it does), in pipeline order: the stage folders in the module
# names are the pipeline (data -> training -> serving -> measuring -> deciding -> reporting)
STEPS: dict[str, tuple[str, str]] = {
    "demo": ("data.demo", "build the demo training root (prepared/<source>/...) from text on this machine"),
    "inspect": ("data.inspection", "describe every training source and write the cut table (one pass)"),
    "prompts": ("data.prompts", "draw one prompt suite from the cut table or a prompt file"),
    "traffic": ("data.traffic", "resolve the traffic profiles against the sources inspection found"),
    "model": ("training.model", "the embedded target model, or a draft model cut from a target's layers"),
    "regenerate": ("training.regenerate", "the target's own greedy answers for the drafter's seen rows"),
    "drafter": ("training.drafter", "train an EAGLE-3 head on the seen rows"),
    "launch": ("serving.launch", "start (or reuse) a server session and write its launch record"),
    "server": ("serving.server", "status or stop of the managed server"),
    "watchdog": ("serving.watchdog", "the process that owns a server and stops it with the run (internal)"),
    "cell": ("measuring.cell", "measure one (server, suite, repeat, concurrency) cell"),
    "rounds": ("deciding.rounds", "the sequential design's plan after a round: which cells the next repeat measures"),
    "stepcost": ("deciding.stepcost", "the step-cost map: a speculative step's cost by batch size and context, the"
                                      " acceptance a drafter needs, predictions up to the largest batch"),
    "recommend": ("deciding.recommend", "decide what to deploy and derive the recommended servers"),
    "decide": ("deciding.decide", "every decision once, as records: verdicts, verified recommendations, attribution,"
                                  " k sweeps"),
    "summary": ("reporting.summary", "render the decision records: summary.md, tables and plots"),
    "docs": ("reporting.reference", "write docs/reference/config.md and outputs.md from the config schema and the"
                                    " records (--check: fail if a committed page is stale)"),
    "simulate": ("calibration.simulate", "the decision rules' error rates on quick synthetic experiments"),
    "calibrate": ("calibration.harness", "the full calibration table against a discrete-event server"),
    "stepcost_coverage": ("calibration.stepcost", "the step-cost map's coverage against a server whose step cost is"
                                                  " known"),
    "traffic_coverage": ("calibration.traffic", "the traffic predictions' coverage against a server of mixed batches"),
}
ALIASES = {"inspection": "inspect"}   # the module's own name works too


def module_of(step: str) -> str:
    """The full module name a step runs (`specmatch.<stage>.<module>`)."""
    return f"specmatch.{STEPS[ALIASES.get(step, step)][0]}"


def _help() -> str:
    width = max(map(len, STEPS))
    lines = [f"  {name:<{width}}  {what}" for name, (_, what) in STEPS.items()]
    return "steps (each with its own --help):\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and (argv[0] in STEPS or argv[0] in ALIASES):
        return importlib.import_module(module_of(argv[0])).main(argv[1:])
    p = argparse.ArgumentParser(prog="specmatch", description=__doc__, epilog=_help(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="{provenance,verify,<step>}")
    pv = sub.add_parser("provenance", help="print the provenance chain of a result file")
    pv.add_argument("path")
    vf = sub.add_parser("verify", help="check recorded input hashes against the files on disk")
    vf.add_argument("--root", default="results")
    a = p.parse_args(argv)
    if a.cmd == "provenance":
        print("\n".join(chain(a.path)))
        return 0
    problems = verify(a.root)
    if not problems:
        print(f"verify: every recorded input under {a.root} matches the files on disk")
        return 0
    for pr in problems:
        print(f"CHANGED {pr['changed']} ({pr['why']}) -> {pr['result']}")
    print("invalidated results:")
    for r in invalidated(problems, a.root):
        print(f"  {r}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
