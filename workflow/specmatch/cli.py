"""`specmatch` command: audit results and run single steps by hand.

    specmatch provenance PATH        where a result came from, back to training files and server argv
    specmatch verify [--root DIR]    check every recorded input hash; name what changed and what it invalidates
    specmatch server status|stop     the managed server
    specmatch inspect|prompts|drafter|launch|cell|recommend|summary|model|demo ...
                                     the workflow's steps, standalone
    specmatch simulate               the decision rules' error rates on synthetic experiments
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .provenance import chain, invalidated, verify

# command -> module (the command keeps the step's short name; the module is named for what it does)
STEPS = {"inspect": "inspection", "inspection": "inspection", "prompts": "prompts", "drafter": "drafter",
         "launch": "launch", "cell": "cell", "recommend": "recommend", "summary": "summary", "model": "model",
         "demo": "demo", "server": "server", "simulate": "simulate"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in STEPS:
        return importlib.import_module(f"specmatch.{STEPS[argv[0]]}").main(argv[1:])
    p = argparse.ArgumentParser(prog="specmatch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
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
