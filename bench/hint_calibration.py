"""Does "what would decide it" come true? Its two power statements, carried out as the workflow would.

Experiments of the calibration harness (specmatch.calibration: the discrete-event server, 3 suites x
c = 1, 4, 16, 16 prompts, servers alternating in fresh sessions) are analysed at R = 2 on throughput.
Every inconclusive verdict names two designs (verdicts.designs): the effect design ("decides it, pays or
loses, with probability 80% if the speedup is outside [lo, hi]") and the equivalence design ("confirming
no difference needs ..., if the speedup is 1.00, probability p"). Each is carried out on the same
experiment as the workflow would (calibration.hints.carry_out: more repeats of today's suite through the
rounds' plans, futility stops included; a larger suite rerun afresh), and read again.

A power statement is a probability at a named effect. Where the truth is known, the statement's own
simulation at the true effect (designs.power) gives the probability it assigns to deciding as the truth
is: on identical servers the equivalence design's stated probability itself, near the bounds about 80%
for the effect design. Printed per population and statement: that probability against the share decided
as the truth is, their gap ± its Monte-Carlo error (ratio estimator over experiments, paired), and the
same by design length (<= 12 repeats named at R = 2, the short designs an audit found optimistic) and
at c = 16 (one burst per cell, where stalls bite).

    nice -n 19 python bench/hint_calibration.py --experiments 40 --sequential --workers 2
    nice -n 19 python bench/hint_calibration.py --populations aa t3 stalls --experiments 24 --sequential
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# SPECMATCH_SRC: another copy of the package (e.g. `git archive` of the commit before a change: the "before")
sys.path.insert(0, os.environ.get("SPECMATCH_SRC", str(Path(__file__).resolve().parents[1] / "workflow")))

from specmatch.calibration import pool  # noqa: E402
from specmatch.calibration.hints import HINT_POPULATIONS, hint_gap, hint_task  # noqa: E402


def line(name: str, r: tuple) -> str:
    st, dec, gap, se, n = r
    return (f"{name:34} at the truth {st:5.1%} -> decided {dec:5.1%}: gap {gap:+5.1%} ± {se:4.1%} ({n})" if n
            else f"{name:34} none")


def report(name: str, rows: list) -> None:
    print(f"\n{name}: {HINT_POPULATIONS[name][1]}")
    for kind in ("equivalence", "effect"):
        print("  " + line(f"{kind} statements", hint_gap(rows, kind)))
        print("    " + line("as stated (not at the truth)", hint_gap(rows, kind, at_truth=False)))
        for what, keep in (("naming <= 12 repeats", lambda r: r[5] <= 12),
                           ("naming > 12 repeats", lambda r: r[5] > 12),
                           ("at c=16", lambda r: r[7] == 16),
                           ("at the truth in [70%, 90%]", lambda r: 0.7 <= r[2] <= 0.9),
                           ("not reachable (the likeliest)", lambda r: not r[8])):
            print("    " + line(what, hint_gap(rows, kind, keep=keep)))
    if rows:
        reps = sorted(r[5] for r in rows)
        print(f"  designs: repeats median {reps[len(reps) // 2]} (max {reps[-1]}), "
              f"{sum(r[6] > 1 for r in rows) / len(rows):.0%} name a larger suite")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiments", type=int, default=24, help="per population")
    p.add_argument("--populations", nargs="+", default=list(HINT_POPULATIONS))
    p.add_argument("--sequential", action="store_true", help="today's design repeats {min: 2, max: 3} (the default's)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--chunk", type=int, default=1, help="experiments per job")
    p.add_argument("--bootstrap", type=int, default=150)
    p.add_argument("--seed", type=int, default=67)
    a = p.parse_args(argv)
    t0 = time.time()
    jobs, owner = [], []
    for pop in a.populations:
        for i in range(0, a.experiments, a.chunk):
            jobs.append((hint_task, {"name": pop, "experiments": min(a.chunk, a.experiments - i), "bootstrap": a.bootstrap,
                                     "sequential": a.sequential, "seed": pool.seed_of(a.seed, pop, i, a.sequential)}))
            owner.append(pop)
    res = pool.run_tasks(jobs, a.workers)
    print(f"'what would decide it' carried out: {a.experiments} experiments per population, R = 2 today "
          f"({'sequential {2, 3}' if a.sequential else 'fixed'}), throughput; the probability at the truth -> "
          "the share decided as the truth is, gap ± MC se (statements)")
    for pop in a.populations:
        report(pop, [r for x, o in zip(res, owner) if o == pop for r in x["rows"]])
    print(f"\n({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
