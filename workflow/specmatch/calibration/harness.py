"""The calibration against a server that is not the analysis's own model: every experiment kind in
one process pool (`compute`), and the tables `python -m specmatch calibrate` prints.

The cells come from a discrete-event server (calibration.des) on the embedded default's grid
(calibration.grid), under run-to-run noise the analysis does not assume (calibration.scenarios). The
subjects, each its own module: the verdicts' false calls and power (verdicts), the verification of a
recommended schedule (verification), 'what would decide it' carried out (hints), the rounds' chance
carried out (chances), k sweeps (ksweeps) and external endpoints (external). Each rate is a share
with a Monte-Carlo error that is honest however strongly an experiment's verdicts are correlated
(calibration.tally).

    python -m specmatch calibrate                 # the whole table (10-20 minutes on 2 cores)
    python -m specmatch calibrate --k-sweeps [--experiments 300]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from .chances import CHANCE_POPULATIONS, chance_rates, chance_task
from .external import external_rates, external_task
from .grid import CONCURRENCIES, EFFECTS, METRICS, OUT_TOKENS, PROMPTS, SLO, SPEC_TRUTH, SUITES
from .hints import HINT_POPULATIONS, hint_gap, hint_task
from .ksweeps import K_OUT_TOKENS, K_PROMPTS, K_SCENARIOS, k_rates, kcompare_task, ksweep_task
from .pool import run_tasks, seed_of, workers
from .scenarios import SCENARIOS
from .tally import fmt, pct
from .verdicts import claim_rates, experiment_task
from .verification import VERIFY_OUTCOMES, verified_shares, verify_task

TASKS = {"experiment": experiment_task, "verify": verify_task, "hints": hint_task, "ksweep": ksweep_task,
         "kcompare": kcompare_task, "external": external_task, "chances": chance_task}


def _merge(a: dict, b: dict) -> dict:
    if "rows" in a:
        a["rows"] += b["rows"]
        return a
    if "correct" in a:
        for v in ("correct", "costly"):
            for k in VERIFY_OUTCOMES:
                a[v][k] += b[v][k]
        a["schedules"] += b["schedules"]
        return a
    for R in a["tally"]:
        a["tally"][R] = a["tally"][R] + b["tally"][R]
        if a["claims"] is not None:
            a["claims"][R] = np.concatenate([a["claims"][R], b["claims"][R]])
    for k in ("teeth", "sequential", "naive"):
        if a[k] is not None:
            a[k] = a[k] + b[k]
    a["used"] = np.concatenate([a["used"], b["used"]])
    return a


def compute(specs: dict, seed: int = 0, chunk: int = 10, bootstrap: int = 250, n_workers: int | None = None) -> dict:
    """Every experiment of every spec in one pool (chunks of `chunk` experiments, the dearest first).
    `specs`: key -> dict(kind="experiment", name, effect, repeats=(R, ...), experiments, teeth, claims,
    sequential), dict(kind="verify", name, experiments, repeats) or dict(kind="hints", name,
    experiments, sequential) (optional: chunk, bootstrap). Result: key -> experiment_task's,
    verify_task's or hint_task's output, summed over chunks."""
    jobs, owner, cost = [], [], []
    for key, spec in specs.items():
        fn = TASKS[spec["kind"]]
        n = spec["experiments"]
        step = spec.get("chunk", chunk)
        for i in range(0, n, step):
            args = {**spec, "experiments": min(step, n - i), "bootstrap": spec.get("bootstrap", bootstrap),
                    "seed": seed_of(seed, tuple(sorted((k, str(v)) for k, v in spec.items())), i)}
            jobs.append((fn, args))
            owner.append(key)
            rs = spec.get("repeats", (2,))
            rs = rs if isinstance(rs, (tuple, list)) else (rs,)
            # ~0.07 CPU-s per analysed repeat; a hint experiment ~100 of them on average, its tail (a
            # design of 64 repeats of a 32-times suite) far more: those go first
            cost.append(args["experiments"] * (1.2 * spec["repeats"] if fn is verify_task else 100 if fn is hint_task
                                               else 5 if fn is chance_task else sum(rs)))
    order = sorted(range(len(jobs)), key=lambda i: -cost[i])
    res = run_tasks([jobs[i] for i in order], n_workers)
    out: dict = {}
    for i, r in sorted(zip(order, res), key=lambda x: x[0]):
        out[owner[i]] = r if owner[i] not in out else _merge(out[owner[i]], r)
    return out


def table(experiments: int = 300, power_experiments: int = 100, verify_experiments: int = 200,
          n_workers: int | None = None, out=sys.stdout) -> dict:
    """The calibration table: false-call rate (scenario x R x metric, overall and per concurrency),
    power at 5/15/30% (plain, R=2,3), verification outcomes, A/A crossovers and recommendations, the
    sequential design, the 'what would decide it' designs, the teeth."""
    t0 = time.time()
    specs: dict = {}
    for name in SCENARIOS:
        if name in ("drift", "outlier"):  # their noise depends on the run's length: one run per R
            for R in (1, 2, 3):
                specs[(name, R)] = dict(kind="experiment", name=name, effect=0.0, repeats=(R,), experiments=experiments)
        else:
            specs[(name, 0)] = dict(kind="experiment", name=name, effect=0.0, repeats=(1, 2, 3, 4),
                                    experiments=experiments, teeth=name == "plain", claims=name == "plain",
                                    sequential=name == "plain")
    for e in EFFECTS:
        specs[("power", e)] = dict(kind="experiment", name="plain", effect=e, repeats=(2, 3, 4),
                                   experiments=power_experiments, sequential=True)
    for name in ("plain", "quiet"):
        specs[("verify", name)] = dict(kind="verify", name=name, experiments=verify_experiments, repeats=2)
    hint_experiments = max(10, power_experiments // 2)
    for name in HINT_POPULATIONS:
        specs[("hints", name)] = dict(kind="hints", name=name, experiments=hint_experiments, chunk=3)
    chance_experiments = max(20, experiments // 2)
    for name in CHANCE_POPULATIONS:
        specs[("chances", name)] = dict(kind="chances", name=name, experiments=chance_experiments, chunk=25)
    res = compute(specs, n_workers=n_workers)

    def tally(name, R):
        return res[(name, R)]["tally"][R] if (name, R) in res else res[(name, 0)]["tally"][R]

    p = lambda *a: print(*a, file=out, flush=True)  # noqa: E731
    p(f"Calibration: {experiments} experiments per scenario and R ({len(SUITES)} suites x {len(CONCURRENCIES)} "
      f"concurrencies, {PROMPTS} prompts, {OUT_TOKENS} output tokens, DES server), confidence 90%, "
      f"min_effect 5%, SLO {SLO}")
    p("False calls (pays or loses) of identical servers: rate ± Monte-Carlo se (nominal 10%) [c=1 / c=4 / c=16]")
    p(f"{'scenario':9} R " + "".join(f"{m:>31}" for m in METRICS) + "   all metrics (design effect)")
    for name in SCENARIOS:
        for R in (1, 2, 3):
            t = tally(name, R)
            cols = [f"{fmt(t.rate(metric=m))} [" + "/".join(pct(t.rate(metric=m, c=c)) for c in CONCURRENCIES)
                    + "]" for m in METRICS]
            p(f"{name:9} {R} " + "".join(f"{x:>31}" for x in cols) + f"   {fmt(t.rate())} ({t.design_effect():.1f})")
    p("\nEquivalent (identical servers, throughput, R=3): " + ", ".join(
        f"{n} {tally(n, 3).rate(('equivalent',), metric='output_throughput')[0]:.0%}" for n in SCENARIOS))
    pl0 = res[("plain", 0)]
    teeth = pl0["teeth"]
    p(f"Teeth (plain, one repeat, min_effect 0: run-to-run variation ignored): false calls "
      f"{fmt(teeth.rate(metric='output_throughput'))} (throughput), {fmt(teeth.rate())} (all metrics)")
    p("A/A recommendations (plain; the copy configured as speculative): " + "; ".join(
        f"R={R}: crossover claimed {c['crossover']:.1%}, speculate somewhere {c['speculate']:.1%} "
        f"of {c['recommendations']}" for R in (2, 3) for c in [claim_rates(pl0["claims"][R])]))
    seq, used = pl0["sequential"], pl0["used"]
    p(f"Sequential (plain, R from 2 until the throughput verdict is decided, at most 4; alpha spent per look, "
      f"specmatch.deciding.reading.sequential): false calls {fmt(seq.rate())} (throughput {fmt(seq.rate(metric='output_throughput'))}); "
      f"repeats used {used[:, 0].sum() / used[:, 1].sum():.0%} of a fixed R=4; the same stopping at the fixed "
      f"design's level every look: {fmt(pl0['naive'].rate())}")
    p(f"\nPower (plain; the second server uniformly faster): pays ± se [loses], {power_experiments} experiments")
    p(f"{'effect':7} R " + "".join(f"{m:>24}" for m in METRICS))
    for e in EFFECTS:
        for R in (2, 3, 4):
            t = res[("power", e)]["tally"][R]
            p(f"{e:6.0%}  {R} " + "".join(f"{fmt(t.rate(('pays',), metric=m))} "
                                         f"[{t.rate(('loses',), metric=m)[0]:.1%}]".rjust(24) for m in METRICS))
    for e in EFFECTS:
        pw = res[("power", e)]
        seq, used = pw["sequential"], pw["used"]
        power = seq.rate(('pays',), metric='output_throughput')
        mean_r = 4 * used[:, 0].sum() / used[:, 1].sum()
        equal = next((R for R in (2, 3, 4) if pw["tally"][R].rate(('pays',), metric='output_throughput')[0]
                      >= power[0]), None)
        vs = (f"a fixed design of equal power needs R={equal}: {1 - mean_r / equal:+.0%} repeats saved"
              if equal else "no fixed design up to R=4 has its power")
        p(f"  {e:.0%}: sequential 2..4 pays {fmt(power)} with {mean_r:.2f} repeats per cell on average "
          f"({used[:, 0].sum() / used[:, 1].sum():.0%} of R=4's); {vs}")
    p(f"\n'What would decide it', carried out (R=2, throughput; each inconclusive verdict's two named designs run on "
      f"its experiment as the workflow would, the verdict read again; {hint_experiments} experiments each): the "
      "probability at the true effect (designs.power) against the share decided as the truth is")
    for name, (_, about, _, _) in HINT_POPULATIONS.items():
        parts = []
        for kind in ("equivalence", "effect"):
            st, dec, gap, se, n = hint_gap(res[("hints", name)]["rows"], kind)
            parts.append(f"{kind}: {st:.0%} -> {dec:.0%} (gap {gap:+.0%} ± {se:.0%} of {n})" if n else f"{kind}: none")
        p(f"  {name} ({about}): " + "; ".join(parts))
    p(f"\nThe rounds' chance, carried out (repeats {{min: 2, max: 3}}; round 2's plan, then its cells of repeat 3; "
      f"{chance_experiments} experiments each; the configurations stopped as unlikely measured again on their own):")
    _stated_lines(p, res, "chances", CHANCE_POPULATIONS, chance_rates,
                  (("continued", True), ("stopped as unlikely", False)))
    for name in ("plain", "quiet"):
        ver = res[("verify", name)]
        p(f"\nVerification of the recommended schedule ({name}: {SCENARIOS[name].about}; {verify_experiments} "
          f"experiments, R=2, truth {SPEC_TRUTH}):")
        for v in ("correct", "costly"):
            sh = verified_shares(ver[v])
            p(f"  {v:8} switch: " + ", ".join(f"{k} {sh[k]:.1%}" for k in VERIFY_OUTCOMES[:3])
              + f" of {sh['derived']} measured ({ver[v]['not derived']} gave no schedule)")
    p(f"\n({time.time() - t0:.0f} s, {n_workers or workers()} worker(s))")
    return res


def _stated_lines(p, res: dict, kind: str, populations: dict, rates, cases: tuple) -> None:
    """A line per population: for each case, the mean probability stated and the share decided."""
    for name, (_, about) in populations.items():
        parts = []
        for what, x in cases:
            st, dec, se, n = rates(res[(kind, name)]["rows"], x)
            parts.append(f"{what}: stated {st:.0%}, decided {dec:.0%} ± {se:.0%} of {n}" if n else f"{what}: none")
        p(f"  {name} ({about}): " + "; ".join(parts))


def k_table(experiments: int = 300, n_workers: int | None = None, out=sys.stdout, names=None) -> dict:
    """The k sweeps' calibration (K_SCENARIOS) and the external endpoints' (external_task): what each
    recommendation deploys where, with Monte-Carlo errors."""
    t0 = time.time()
    specs: dict = {("k", x): dict(kind="ksweep", name=x, experiments=experiments, repeats=3)
                   for x in (names or K_SCENARIOS)}
    specs[("external", "default")] = dict(kind="external", experiments=max(20, experiments // 3), repeats=3)
    res = compute(specs, n_workers=n_workers)
    p = lambda *a: print(*a, file=out, flush=True)  # noqa: E731
    f = lambda r: f"{r[0]:.1%} ± {r[1]:.1%}"  # noqa: E731
    p(f"k sweeps ({experiments} experiments each; one suite of {K_PROMPTS} prompts, {K_OUT_TOKENS} output tokens, "
      "the sequential design 2..3, confidence 90%, min_effect 5%, max_batch 256; rate ± Monte-Carlo se):")
    for key in specs:
        if key[0] != "k":
            continue
        sc, r = K_SCENARIOS[key[1]], k_rates(res[key]["rows"], K_SCENARIOS[key[1]])
        p(f"  {sc.name} ({sc.about}; noise {sc.noise}):")
        p("    speculation deployed: " + ", ".join(f"c={c} {f(r['speculate_at'][c])}" for c in sc.concurrencies)
          + f", above c={max(sc.concurrencies)} {f(r['above'])}, anywhere {f(r['anywhere'])}")
        p("    k deployed: " + "; ".join(f"c={c}: " + ", ".join(f"{'none' if k is None else k} {x[0]:.1%}"
                                                               for k, x in r["k_at"][c].items())
                                         for c in sc.concurrencies)
          + "; actions " + ", ".join(f"{a} {x[0]:.1%}" for a, x in r["actions"].items()))
        p("    off where some k pays at alpha/K: " + ", ".join(f"c={c} {f(r['off_over_beaten'][c])}"
                                                            for c in sc.concurrencies)
          + " (at alpha: " + ", ".join(f"c={c} {f(r['off_over_beaten_90'][c])}" for c in sc.concurrencies) + ")"
          + "; a k where none pays at alpha/K: " + ", ".join(f"c={c} {f(r['unsupported'][c])}"
                                                            for c in sc.concurrencies))
    ext = external_rates(res[("external", "default")]["rows"])
    p(f"External endpoints ({ext['n']} runs; truth 1.3x up to 4 running requests, 0.6x above; c=1, 4, 16; R=3, quiet): "
      f"a valid vLLM schedule {f(ext['schedule'])}, following the verdicts {f(ext['follows'])} of those, not "
      f"verifiable {f(ext['not_verifiable'])}; verdicts pays/pays/loses in {f(ext['pattern'])}, and then a schedule "
      f"drafting at batch 1-4 and off at 16 {f(ext['right'])}; a recommendation for the twin with no speculation "
      f"{f(ext['twin'])}; a text with an empty list {f(ext['empty_list'])}; actions "
      + ", ".join(f"{a} {x[0]:.1%}" for a, x in ext["actions"].items()))
    p(f"({time.time() - t0:.0f} s, {n_workers or workers()} worker(s))")
    return res


def main(argv: list[str] | None = None) -> int:
    """`python -m specmatch calibrate`: the full calibration table (module docstring)."""
    p = argparse.ArgumentParser(prog="python -m specmatch calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--experiments", type=int, default=300,
                   help="experiments per scenario and R (power: a third of it, verification: two thirds); "
                        "10-20 minutes on 2 cores at the default")
    p.add_argument("--workers", type=int, help="processes (default SPECMATCH_CALIBRATION_WORKERS or 2)")
    p.add_argument("--k-sweeps", action="store_true",
                   help="only the k sweeps' and external endpoints' part (k_table: two thirds of --experiments per "
                        "scenario, about 10 minutes on 2 cores at the default)")
    a = p.parse_args(argv)
    n = a.experiments
    if not a.k_sweeps:
        table(experiments=n, power_experiments=max(20, n // 3), verify_experiments=max(20, 2 * n // 3),
              n_workers=a.workers)
        print()
    k_table(experiments=max(20, 2 * n // 3), n_workers=a.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
