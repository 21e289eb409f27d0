"""The verdicts' error rates: identical servers (false calls), uniformly faster ones (power), and the
designs around them, on the simulated default grid.

One task simulates its experiments once, at the largest number of repeats asked for, and analyses
each R on the first R repeats (nested, as when a repeat is added to a run), so R = 2, 3 and 4 cost one
simulation. Beside the fixed design it reads what a run would also be told: the verdicts with run-to-run
variation ignored (the calibration's teeth), the recommendations for a server identical to the baseline
(A/A crossovers), the sequential design's verdicts and the repeats it used, and whether "what would
decide it" at the smallest R came true at a larger R of the same experiment.
"""
from __future__ import annotations

import numpy as np

from ..deciding.analysis import analyse
from ..deciding.recommending.deployment import ServerInfo
from ..deciding.reading.measurements import Settings
from .grid import BASE, CONCURRENCIES, SPEC_INFO, SUITES, decided, settings
from .scenarios import SCENARIOS, run_to_run
from .tally import Tally
from .workload import Workload, simulate_cells


def experiment_task(a: dict) -> dict:
    """`experiments` experiments of scenario `name`, the second server identical to the baseline
    (effect 0) or uniformly faster by `effect` (every metric's truth 1 + effect; goodput's at least
    that), simulated with max(`repeats`) repeats and analysed at each R in `repeats` on the first R
    repeats (nested: the data of R=2 are part of R=3's, as when a repeat is added to a run; exact for
    scenarios whose noise does not depend on the run's length, i.e. not drift). Returns, per R, a Tally
    of the second server's verdicts, and on request:
    - teeth: the first repeat analysed with run-to-run variation ignored (min_effect 0, one repeat);
    - claims (A/A, per R): per experiment [recommendations, crossovers claimed, recommendations to
      speculate somewhere (keep or schedule)], the second server configured as speculative;
    - sequential (needs R = 2, 3, 4): per (suite, concurrency), stop at the first R whose throughput
      verdict is decided, else go on to 4, analysed under the sequential design (repeats {min: 2,
      max: 4}: alpha spent per look, specmatch.deciding.reading.sequential); its verdicts' Tally and the repeats it
      used; `naive`: the same stopping with the fixed design's level at every look (the error it fixes).
    'What would decide it' is calibrated by carrying its designs out (calibration.hints)."""
    name, effect, n, rs = a["name"], a["effect"], a["experiments"], tuple(sorted(a["repeats"]))
    sc = SCENARIOS[name]
    rng = np.random.default_rng(a["seed"])
    rmax = rs[-1]
    work = [Workload.draw(rng, prompt_sd=sc.prompt_sd) for _ in range(n)]
    eff = [run_to_run(rng, sc, ["baseline", "spec"], SUITES, CONCURRENCIES, rmax) for _ in range(n)]
    cells = simulate_cells(rng, work, {"baseline": BASE, "spec": BASE.faster(1 + effect)}, eff, rmax)
    s = settings(a.get("bootstrap", 250))
    # the sequential design (repeats 2..rmax, alpha spent per look) is analysed beside the fixed one
    s_seq = Settings.of(vars(s) | {"repeats": {"min": 2, "max": rmax}}) if a.get("sequential") else None
    infos = {"spec": ServerInfo("spec", "vllm", "vllm", SPEC_INFO, 256)} if a.get("claims") else None
    out = {"tally": {R: Tally.empty(n) for R in rs}, "teeth": Tally.empty(n) if a.get("teeth") else None,
           "claims": {R: np.zeros((n, 3), np.int64) for R in rs} if a.get("claims") else None,
           "sequential": Tally.empty(n) if a.get("sequential") else None,
           "naive": Tally.empty(n) if a.get("sequential") else None, "used": np.zeros((n, 2), np.int64)}
    for e, cs in enumerate(cells):
        got = {}
        for R in rs:
            an = analyse([x for x in cs if x[0].repeat <= R], "baseline", s, infos, list(SUITES) if infos else None)
            got[R] = {(v.suite, v.concurrency, v.metric): v for v in an.verdicts if v.server == "spec"}
            out["tally"][R].add(e, an.verdicts)
            if infos:
                recs = an.recommendations
                crossed = sum(bool(an.crossovers.get(("spec", u, "output_throughput"))) for u in SUITES)
                out["claims"][R][e] = (len(recs), crossed, sum(r.action in ("keep", "schedule") for r in recs))
        if a.get("teeth"):
            one = [x for x in cs if x[0].repeat == 1]
            out["teeth"].add(e, analyse(one, "baseline", settings(a.get("bootstrap", 250), min_effect=0.0)).verdicts)
        looks = [R for R in rs if R >= 2]
        if s_seq is not None:
            seq = {}
            for R in looks:
                an = analyse([x for x in cs if x[0].repeat <= R], "baseline", s_seq)
                seq[R] = {(v.suite, v.concurrency, v.metric): v for v in an.verdicts if v.server == "spec"}
            for tally, by_r, count in ((out["sequential"], seq, True), (out["naive"], got, False)):
                final = []
                for u in SUITES:
                    for c in CONCURRENCIES:
                        stop = next((R for R in looks if decided(by_r[R].get((u, c, "output_throughput")))), rmax)
                        final += [v for (uu, cc, _), v in by_r[stop].items() if (uu, cc) == (u, c)]
                        if count:
                            out["used"][e] += (stop, rmax)
                tally.add(e, final)
    return out


def claim_rates(claims: np.ndarray) -> dict:
    """A/A: share of recommendations with a crossover, and that speculate somewhere (keep/schedule)."""
    recs = claims[:, 0].sum()
    return {"recommendations": int(recs), "crossover": claims[:, 1].sum() / recs if recs else float("nan"),
            "speculate": claims[:, 2].sum() / recs if recs else float("nan")}
