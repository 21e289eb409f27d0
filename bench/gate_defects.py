"""CI's simulation gates against the defects they guard: each gate run on code broken on purpose (a
monkeypatch in this process, never a file changed), at the gate's own size, prints whether it fails.

A gate sized down to keep the tests within CI's time must still fail on the defect it was built for;
this is how that was shown (figures in the tests' docstrings). A gate that passes on a defect says how
large a defect it misses.

    nice -n 19 .venv/bin/python bench/gate_defects.py stepcost [--factor 0.25]
    nice -n 19 .venv/bin/python bench/gate_defects.py kmap [--factor 0.25 | --no-baseline]
    nice -n 19 .venv/bin/python bench/gate_defects.py traffic
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))
sys.path.insert(0, str(REPO / "tests"))
os.environ["SPECMATCH_CALIBRATION_WORKERS"] = "1"   # in this process, where the monkeypatch holds

from builders import coverage_gate  # noqa: E402
from specmatch.deciding.verdicts.noise import VarianceSum  # noqa: E402


def scaled(method, factor: float):
    """`method` (a part of a map's variance) with its variance multiplied by `factor`."""
    def part(self, x, b, L):
        return VarianceSum().plus(method(self, x, b, L), factor)
    return part


def stepcost(a) -> bool:
    """tests/test_stepcost.py::test_coverage_of_the_map_and_its_predictions_by_simulation, 40 experiments per
    world, with StepMap.part's variance times --factor."""
    from specmatch.calibration import stepcost as cal
    from specmatch.deciding.predicting.stepcost import map as smap

    smap.StepMap.part = scaled(smap.StepMap.part, a.factor)
    failed = False
    for rho, world in (("flat", "plain"), ("rising", "long")):
        got = cal.coverage(40, rho, world=world, truth_suites=100)
        keys = [("rho", 1), ("rho", 4), ("rho", 16), ("throughput", 4), ("throughput", 16), ("throughput", 32)]
        bad = [k for k in keys if got[k]["coverage"] < coverage_gate(40)]
        failed |= bool(bad)
        print(f"{rho}-{world}: " + ", ".join(f"{k[0]}@{k[1]} {got[k]['coverage']:.3f}" for k in keys)
              + f"; gate {coverage_gate(40):.3f}: " + (f"fails at {bad}" if bad else "passes"))
    return failed


def kmap(a) -> bool:
    """tests/test_stepcost.py::test_coverage_of_the_map_in_k_by_simulation[linear-30], with KStepMap.part's
    variance times --factor, or (--no-baseline) the baseline's side left out."""
    from specmatch.calibration import stepcost as cal
    from specmatch.deciding.predicting.stepcost import kmap as km

    original = km.KStepMap.part
    if a.no_baseline:
        km.KStepMap.part = lambda self, x, b, L: VarianceSum() if x != self.server else original(self, x, b, L)
    else:
        km.KStepMap.part = scaled(original, a.factor)
    got = cal.k_coverage(30, shape="linear", truth_suites=100)
    bad = [(key, kc, round(v["coverage"], 3)) for (key, kc), v in got.items()
           if key in ("rho", "pred") and (key == "pred" or kc[1] <= 16) and v["coverage"] < coverage_gate(v["n"])]
    print(f"{len(bad)} keys below the gate: {bad}" if bad else "passes")
    return bool(bad)


def traffic(a) -> bool:
    """tests/test_traffic.py::test_predictions_cover_the_true_mixed_speedup_at_c1_and_a_batched_concurrency,
    10 experiments on a quiet machine, with the prompt sample left out of the prediction's interval."""
    from specmatch.calibration.traffic import coverage
    from specmatch.deciding.predicting.traffic import predictor

    predictor.Predictor.prompt_variance = lambda self, mix, metric=None: (0.0, float("inf"))
    got = coverage(10, (1, 4), 16, truth_suites=200, designs=False, session_sd=0.005, cell_sd=0.005)
    bad = [(k, round(v["coverage"], 2)) for k, v in got["rows"].items() if v["coverage"] < coverage_gate(10)]
    print(f"{len(bad)} of {len(got['rows'])} rows below the gate {coverage_gate(10):.3f}: {bad}" if bad else "passes")
    return bool(bad)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("gate", choices=["stepcost", "kmap", "traffic"])
    p.add_argument("--factor", type=float, default=0.25, help="the map's variance times this (stepcost, kmap)")
    p.add_argument("--no-baseline", action="store_true", help="kmap: the baseline's side left out instead")
    a = p.parse_args()
    t = time.time()
    failed = {"stepcost": stepcost, "kmap": kmap, "traffic": traffic}[a.gate](a)
    print(f"{a.gate}: the gate {'fails' if failed else 'passes'} on the broken code ({time.time() - t:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
