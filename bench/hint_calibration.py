"""Issue 34, item 4: does "what would decide it" come true? Carried out as the workflow would.

Experiments of the calibration harness (specmatch.calibration: the discrete-event server, 3
suites x c = 1, 4, 16, 16 prompts, servers alternating in fresh sessions) are analysed at R = 2 on
throughput. Every inconclusive verdict states a design (Verdict.design: R' repeats and a suite g
times larger, with the probability p that it decides). Each named design is then carried out on the
same experiment, as the workflow would:

- more repeats (g = 1): repeats 3..R' of every cell, in fresh sessions, added to today's (nested);
- a larger suite (g > 1): every cell rerun with round(16 g) prompts in R' fresh sessions (today's
  data are not part of it);
- under a sequential design (--sequential: repeats {min: 2, max: 3} today), the named R' is run as
  repeats {min: 2, max: R'}: looks 3..R' at their levels, decided at the first look that decides, and
  stopped undecided where the rounds (deciding.rounds.plan) would stop it as unlikely to be decided;
  under a fixed design, one look at R'.

and the same verdict is read again. Printed per population: the stated probability against the share
decided, binned, with Monte-Carlo errors (ratio estimator over experiments), for statements ("decides
it with probability p", p >= 80%) and for best designs below 80% ("the likeliest", "more data is
unlikely to decide it"). With --split, also how the statement's simulation says the design ends
(comparison.decides_probability(split=True): equivalent, pays or loses, stopped by the rounds as
unlikely, undecided at its last look) against how it ended, and the effect posterior it drew from
against the truth (where a population has one truth per experiment). With --null-spike the statements
draw the effect from comparison.effect_mixture ("no difference" as a hypothesis of its own; measured, not
adopted); --null-weight 1 makes that the truth for identical servers (the oracle: what remains is not
the prior).

    nice -n 19 python bench/hint_calibration.py --experiments 60 --workers 2
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

# SPECMATCH_SRC: another copy of the package (e.g. `git archive` of the commit before a change: the "before")
sys.path.insert(0, os.environ.get("SPECMATCH_SRC", str(Path(__file__).resolve().parents[1] / "workflow")))

from specmatch.calibration import grid, pool, scenarios, workload  # noqa: E402

POPULATIONS = {
    "aa": "identical servers, plain run to run (3% session, 4% cell)",
    "effects": "a uniform speedup per experiment, log-uniform within +/-12%, plain run to run",
    "quiet": "identical servers, quiet machine (1.5% run to run)",
    "spec": "the harness's speculative server (1.39x / 1.00x / 0.62x at c = 1 / 4 / 16), plain run to run",
    "t3": "identical servers, Student-t(3) session and cell effects (heavy tails)",
}
SCENARIO = {"aa": "plain", "effects": "plain", "quiet": "quiet", "spec": "plain", "t3": "t3"}


def engines(pop: str, rng: np.random.Generator) -> tuple[dict, float]:
    """The two servers and the true log speedup (nan where it varies with the concurrency)."""
    if pop == "effects":
        x = rng.uniform(-0.12, 0.12)
        return {"baseline": grid.BASE, "spec": grid.BASE.faster(math.exp(x))}, x
    if pop == "spec":
        return {"baseline": grid.BASE, "spec": grid.SPEC}, float("nan")
    return {"baseline": grid.BASE, "spec": grid.BASE}, 0.0


def settings(bootstrap: int, repeats=None):
    from specmatch.deciding.reading.measurements import Settings

    return Settings.of(vars(grid.settings(bootstrap, slo={}, designs=True)) | {"repeats": repeats})


def carried_out(rng, pop, eng, work, eff, cells, d: dict, today: int, sequential: bool, bootstrap: int,
                wanted: set) -> dict:
    """{(suite, c): (decided, outcome, look, the plans' shares)} after carrying out design d on this
    experiment as the workflow would (specmatch.calibration.hints.carry_out: the rounds' futility stops
    included), the outcome one of comparison.OUTCOMES."""
    from specmatch.calibration.hints import carry_out

    s = settings(bootstrap, {"min": 2, "max": 3} if sequential else None)
    outcomes: dict = {}
    shares: list = []
    keys = {(u, c, "output_throughput") for u, c in wanted}
    got = carry_out(rng, scenarios.SCENARIOS[SCENARIO[pop]], eng, work, eff, cells, d, today, s, wanted=keys,
                    outcomes=outcomes, plan_shares=shares)
    return {(u, c): (bool(got.get((u, c, m))), *outcomes[(u, c, m)], shares) for u, c, m in keys}


def predicted(cmp, s, d: dict, seed: int, truth: float) -> tuple:
    """What the statement's simulation says of design d (comparison.decides_probability's outcome split,
    2000 draws) and the effect posterior it draws from (a mixture over the session share's draws):
    (split by OUTCOMES, posterior mean, posterior sd, the truth's PIT, today's estimate, its se)."""
    from scipy.special import ndtr

    from specmatch.deciding.verdicts import comparison as C

    split = C.decides_probability(cmp, s, [(d["repeats"], d["suite_scale"])], np.random.default_rng(seed), 2000,
                                  split=True)
    mix = C.effect_mixture(cmp) if C.NULL_SPIKE else None
    if mix is not None:
        wt, mean, var, _null = mix
    else:
        share = C.share_draws(cmp, np.random.default_rng(seed + 1), 2000) if C.DRAW_SESSION_SHARE else None
        mean, var = C.effect_posterior(cmp, share)
        mean, var = np.atleast_1d(mean), np.atleast_1d(var)
        wt = np.full(mean.shape, 1 / mean.size)
    m = float(wt @ mean)
    sd = math.sqrt(float(wt @ var + wt @ (mean - m) ** 2))
    with np.errstate(divide="ignore", invalid="ignore"):
        # a component of no spread (exactly no difference) holds the truth at its middle where they agree
        cdf = np.where(var > 0, ndtr((truth - mean) / np.sqrt(np.where(var > 0, var, 1.0))),
                       np.where(truth == mean, 0.5, (truth > mean) * 1.0))
    pit = float(wt @ cdf) if math.isfinite(truth) else float("nan")
    return tuple(float(split[o][0]) for o in C.OUTCOMES), m, sd, pit, cmp.estimate, cmp.se


def task(a: dict) -> list:
    from specmatch.deciding.reading import measurements
    from specmatch.deciding.analysis import analyse

    measurements.Settings.metrics = property(lambda self: ("output_throughput",))
    from specmatch.deciding.verdicts import comparison

    comparison.DRAW_SESSION_SHARE = comparison.DRAW_SESSION_SHARE or a["draw_share"]
    comparison.NULL_SPIKE = comparison.NULL_SPIKE or a.get("null_spike", False)
    if a.get("null_weight") is not None:
        comparison.NULL_WEIGHT = a["null_weight"]
    if a.get("tails") is not None:   # the statement's simulation draws run to run with these tails, whatever shows
        from specmatch.deciding.verdicts import noise

        noise.tail_weights.__defaults__ = (((a["tails"], 1.0),),)
    rng = np.random.default_rng(a["seed"])
    pop, n, today = a["population"], a["experiments"], 2
    sc = scenarios.SCENARIOS[SCENARIO[pop]]
    s = settings(a["bootstrap"], {"min": 2, "max": 3} if a["sequential"] else None)
    rows = []   # (experiment, stated p, reachable, decided, repeats, suite scale, detail)
    for e in range(n):
        work = workload.Workload.draw(rng)
        eng, truth = engines(pop, rng)
        eff = scenarios.run_to_run(rng, sc, ["baseline", "spec"], grid.SUITES, grid.CONCURRENCIES, today)
        cells = workload.simulate_cells(rng, [work], eng, [eff], today)[0]
        an = analyse(cells, "baseline", s)
        hints = [(v.suite, v.concurrency, v.design) for v in an.verdicts
                 if v.server == "spec" and v.metric == "output_throughput" and v.speedup is not None
                 and not grid.decided(v) and v.design]
        done: dict = {}
        for u, c, d in hints:
            key = (d["repeats"], d["suite_scale"])
            if key not in done:
                wanted = {(u2, c2) for u2, c2, d2 in hints if (d2["repeats"], d2["suite_scale"]) == key}
                done[key] = carried_out(rng, pop, eng, work, eff, cells, d, today, a["sequential"], a["bootstrap"],
                                        wanted)
            ok, outcome, look, shares = done[key][(u, c)]
            cmp = next(x for x in an.comparisons[("spec", u, "output_throughput")] if x.concurrency == c)
            detail = {"outcome": outcome, "look": look, "truth": truth, "plan_shares": shares,
                      "assumed": cmp.round_shares.get(int(d["repeats"]), cmp.own_share)}
            if a["split"]:
                split, mean, sd, pit, est, se = predicted(cmp, an.settings, d, a["seed"] + e, truth)
                detail |= {"split": split, "mean": mean, "sd": sd, "pit": pit, "estimate": est, "se": se}
            rows.append((a["offset"] + e, float(d["probability"]), bool(d["reachable"]), ok,
                         d["repeats"], d["suite_scale"], detail))
    return rows


def rate(rows: list) -> tuple[float, float, float, int]:
    """(mean stated, share decided, its MC error over experiments, n)."""
    if not rows:
        return float("nan"), float("nan"), float("nan"), 0
    x = np.array([(r[0], r[1], r[3]) for r in rows], float)
    ids = np.unique(x[:, 0], return_inverse=True)[1]
    k = np.bincount(ids, x[:, 2])
    m = np.bincount(ids).astype(float)
    p = k.sum() / m.sum()
    E = len(m)
    se = math.sqrt(E / max(E - 1, 1) * float(((k - p * m) ** 2).sum())) / m.sum()
    return float(x[:, 1].mean()), p, se, len(rows)


def split_lines(rows: list) -> None:
    """The predicted outcome split against the carried-out one, per group of statements, and the effect
    posterior against the truth (z = (truth - posterior mean) / sd: mean 0 and mean square 1 where the
    posterior is right; PIT = Phi(z) uniform)."""
    from specmatch.deciding.verdicts.comparison import OUTCOMES

    for name, sel in (("statements", [r for r in rows if r[2]]),
                      ("best designs below 80%", [r for r in rows if not r[2]])):
        if not sel:
            continue
        sim = np.array([r[6]["split"] for r in sel]).mean(0)
        got = []
        for o in OUTCOMES:
            _, share, se, _ = rate([(r[0], r[1], r[2], r[6]["outcome"] == o) for r in sel])
            got.append(f"{share:5.1%} ± {se:4.1%}")
        print(f"    {name} outcomes, predicted -> carried out: "
              + "; ".join(f"{o} {p:5.1%} -> {g}" for o, p, g in zip(OUTCOMES, sim, got)))
        looks = [r[6]["look"] for r in sel if r[6]["outcome"] in ("equivalent", "effect")]
        if looks:
            print(f"      decided at look median {np.median(looks):.0f}")
        nested = [r for r in sel if r[5] == 1 and r[6]["plan_shares"]]
        if nested:
            sh = [r[6]["plan_shares"] for r in nested]
            print(f"      more repeats of today's suite ({len(nested)}): share of dof assumed, median "
                  f"{np.median([r[6]['assumed'] for r in nested]):.2f}; the plans measured, median at the first "
                  f"look {np.median([x[0] for x in sh]):.2f}, over every look "
                  f"{np.median([v for x in sh for v in x]):.2f}, at the last {np.median([x[-1] for x in sh]):.2f}")
        z = np.array([(r[6]["truth"] - r[6]["mean"]) / r[6]["sd"] for r in sel
                      if math.isfinite(r[6]["truth"]) and r[6]["sd"] > 0])
        if z.size:
            pit = np.array([r[6]["pit"] for r in sel if math.isfinite(r[6]["truth"])])
            est = np.array([r[6]["estimate"] / r[6]["se"] for r in sel])
            print(f"      posterior vs truth: z mean {z.mean():+.2f}, mean square {np.mean(z ** 2):.2f}, PIT quartiles "
                  f"{np.mean(pit < .25):.2f}/{np.mean((pit >= .25) & (pit < .5)):.2f}/"
                  f"{np.mean((pit >= .5) & (pit < .75)):.2f}/{np.mean(pit >= .75):.2f}, outside the central 90% "
                  f"{np.mean((pit < .05) | (pit > .95)):.2f}; |estimate/se| median "
                  f"{np.median(np.abs(est)):.2f}; posterior sd / se median "
                  f"{np.median([r[6]['sd'] / r[6]['se'] for r in sel]):.2f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiments", type=int, default=60, help="per population")
    p.add_argument("--populations", nargs="+", default=list(POPULATIONS))
    p.add_argument("--sequential", action="store_true", help="today's design repeats {min: 2, max: 3}")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--chunk", type=int, default=5)
    p.add_argument("--bootstrap", type=int, default=200)
    p.add_argument("--seed", type=int, default=34)
    p.add_argument("--draw-share", action="store_true",
                   help="draw the session share from its posterior (comparison.DRAW_SESSION_SHARE), measured and "
                        "not adopted")
    p.add_argument("--null-spike", action="store_true",
                   help="draw the effect from the mixture over 'no difference' and a common level "
                        "(comparison.effect_mixture; comparison.NULL_SPIKE)")
    p.add_argument("--null-weight", type=float, default=None,
                   help="with --null-spike, the prior weight of 'no difference' (comparison.NULL_WEIGHT); 1 is "
                        "the oracle where the truth is no difference")
    p.add_argument("--tails", type=float, default=None,
                   help="the Student-t dof the statements draw run to run from (Comparison.tails; the analysis "
                        "draws normal ones): 3 is the truth for t3")
    p.add_argument("--split", action="store_true",
                   help="also the outcomes (equivalent, pays or loses, stopped as unlikely, undecided at the end) "
                        "the statement's simulation predicts against those carried out, and the effect posterior "
                        "it draws from against the truth")
    a = p.parse_args(argv)
    t0 = time.time()
    jobs, owner = [], []
    for pop in a.populations:
        for i in range(0, a.experiments, a.chunk):
            jobs.append((task, {"population": pop, "experiments": min(a.chunk, a.experiments - i), "offset": i,
                                "sequential": a.sequential, "bootstrap": a.bootstrap, "split": a.split,
                                "draw_share": a.draw_share, "null_spike": a.null_spike, "null_weight": a.null_weight,
                                "tails": a.tails,
                                "seed": pool.seed_of(a.seed, pop, i, a.sequential)}))
            owner.append(pop)
    res = pool.run_tasks(jobs, a.workers)
    print(f"'what would decide it' carried out: {a.experiments} experiments per population, R = 2 today "
          f"({'sequential {2, 3}' if a.sequential else 'fixed'}), throughput; stated -> decided ± MC se (n)")
    for pop in a.populations:
        rows = [r for rr, o in zip(res, owner) if o == pop for r in rr]
        print(f"\n{pop}: {POPULATIONS[pop]}")
        for name, sel in (("all", rows), ("statements (reachable)", [r for r in rows if r[2]]),
                          ("best designs below 80%", [r for r in rows if not r[2]])):
            st, dec, se, n = rate(sel)
            print(f"  {name:24} stated {st:5.1%} -> decided {dec:5.1%} ± {se:4.1%} ({n})")
        for lo, hi in ((0, 0.5), (0.5, 0.8), (0.8, 0.9), (0.9, 1.01)):
            st, dec, se, n = rate([r for r in rows if lo <= r[1] < hi])
            if n:
                print(f"    stated in [{lo:.0%}, {min(hi, 1):.0%}): {st:5.1%} -> {dec:5.1%} ± {se:4.1%} ({n})")
        for lo, hi in ((0, 9), (9, 17), (17, 65)):
            st, dec, se, n = rate([r for r in rows if r[2] and lo <= r[4] < hi])
            if n:
                print(f"    statements naming {lo}-{hi - 1} repeats: {st:5.1%} -> {dec:5.1%} ± {se:4.1%} ({n})")
        if a.split:
            split_lines(rows)
        if rows:
            rs = np.array([r[4] for r in rows])
            gs = np.array([r[5] for r in rows])
            print(f"    designs: repeats median {np.median(rs):.0f} (max {rs.max()}), suite x{np.median(gs):g} "
                  f"median ({(gs > 1).mean():.0%} name a larger suite)")
    print(f"\n({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
