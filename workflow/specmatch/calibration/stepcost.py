"""The step-cost map against a server whose step cost and acceptance are known: the discrete-event
server (specmatch.calibration.des) serving a stratified suite at map concurrencies in repeated sessions
(calibration.traffic.traffic_cells, whole passes as a workflow cell sends), the map (specmatch.deciding.predicting.stepcost) fitted on some
of them and checked at one held out, and how often its intervals hold the truth.

The truth of rho at batch b is the simulated engine's own rho(b) (a speculative step costs rho(b)
plain steps at any context). The truth of a prediction at concurrency c is what a suite drawn like
the measured one (the same strata counts, fresh prompts) measures at c, read as a cell is, sending as
many requests as the prediction does: the mean over many suites served without run-to-run noise.

    python -m specmatch stepcost_coverage [--experiments 200] [--rho flat|rising] [--world plain|chunked]
prints, per batch size and per concurrency, the coverage of the 90% intervals (with Monte-Carlo
error), the mean log width and the bias, and how often the held-out check agreed. The `chunked` world
schedules as vLLM's V1 engine does: at most 512 tokens a step, the decodes first and the waiting prompts
in chunks after them, and a prefix cache that serves a cell's later passes their prompts (16-token
blocks); the map is fitted and replays with the engine's budget (Scheduler), as the stepcost step does
with the budget each engine states. The `long` world: prompts longer than its 256-token budget (2.5
times the strata's lengths), a prefix cache of 64-token blocks.

`--k linear|curved|identical`: the map in k (specmatch.deciding.predicting.stepcost.kmap) on a sweep of k = 1, 3, 5
whose step cost is linear in k (or curved: k squared; or identical: every k exactly off, no draft right
and a step as dear as a plain one), every k from 1 to 5 predicted: the coverage of
rho at every k and of every k's throughput speedup (the truth: a suite drawn like the measured one served
by the engine drafting k), how often the line's check and the held-out member's agreed, and how far the
k the schedule deploys is from the best k's true speedup (and, where no k pays, how often it deploys one).
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace

import numpy as np

from .. import metrics
from .des import serve
from .grid import BASE
from .pool import run_tasks
from .traffic import PROFILES, TRAFFIC_STRATA, resent_cached, traffic_cells, traffic_profiles, traffic_prompts
from ..deciding.predicting.stepcost import build_map, requests_of
from ..deciding.predicting.stepcost.predict import REQUESTS_PER_WORKER
from ..deciding.predicting.traffic.step_model import Scheduler, figures
from ..config import passes_for
from ..deciding.reading.measurements import Measurements, Settings

COUNTS = {"agent": 4, "code": 6, "chat": 4}
MEASURED = (1, 2, 4, 8, 16)       # map cells; CHECK is held out of the fit
CHECK = 4
RHOS = {"flat": lambda b: 1.4,
        # a step that grows dearer with the batch (verifying k + 1 tokens a sequence): linear in b on top of
        # a plain step that is itself linear, so the map's linear form is not exact
        "rising": lambda b: 1.25 + 0.03 * (b - 1)}
BATCHES = (1, 4, 16, 64)
PREDICTED = (4, 16, 32)
# prompts 2.5 times the strata's lengths (300-1024 tokens), longer than the budget
LONG = {s_: (acc, (min(med * 2.5, 800), sd)) for s_, (acc, (med, sd)) in TRAFFIC_STRATA.items()}
WORLDS = {"plain": {"budget": float("inf"), "cache_block": 0, "strata": TRAFFIC_STRATA},
          "chunked": {"budget": 512.0, "cache_block": 16, "strata": TRAFFIC_STRATA},
          "long": {"budget": 256.0, "cache_block": 64, "strata": LONG}}


def engines(rho: str, world: str):
    """The baseline and the speculative engine (k = 3) of a world, and the Scheduler of each as the stepcost
    step would state it."""
    b = replace(BASE, budget=WORLDS[world]["budget"])
    return b, replace(b, k=3, rho=RHOS[rho]), {"base": Scheduler(b.budget, 1), "spec": Scheduler(b.budget, 4)}


def _served(rho: str, world: str, c: int, tok: np.ndarray, match: np.ndarray, n: int, rng: np.random.Generator,
            metric: str) -> float:
    """Suites (rows of whole passes over n prompts) served by both engines of a world without run-to-run noise,
    read as a cell is: the mean log speedup."""
    ot = np.full(tok.shape, 24)
    base, spec, _ = engines(rho, world)
    cached = resent_cached(tok, n, WORLDS[world]["cache_block"])
    b = serve(base, c, tok, ot, rng, match=match, cached=cached)
    x = serve(spec, c, tok, ot, rng, match=match, cached=cached)
    return float(np.mean(metrics.log_speedup(metric, figures(metric, c, ot, x.e2e, x.ttft, {}),
                                             figures(metric, c, ot, b.e2e, b.ttft, {}))))


def truth(rho: str, c: int, seed: int, suites: int = 200, metric: str = "output_throughput", world: str = "plain"
          ) -> float:
    """The true log speedup at c of a suite drawn like the experiments' (module docstring)."""
    rng = np.random.default_rng(seed)
    n = sum(COUNTS.values())
    size = n * passes_for(n, 1, REQUESTS_PER_WORKER, c)   # whole passes, as a cell and the prediction send
    tok, match = np.zeros((suites, size)), np.zeros((suites, size, 32), bool)
    for j in range(suites):
        _, t, _, mt = traffic_prompts(rng, WORLDS[world]["strata"], COUNTS, 24)
        order = np.arange(size) % n
        tok[j], match[j] = t[order], mt[order]
    return _served(rho, world, c, tok, match, n, rng, metric)


def experiment(a: tuple) -> dict:
    """One experiment: the map's rho at BATCHES, its predictions at PREDICTED and the held-out check."""
    seed, rho, measured, world = a
    base, _, scheds = engines(rho, world)
    cells = traffic_cells(seed, {"basis": COUNTS}, measured, rho=RHOS[rho], min_requests_per_worker=REQUESTS_PER_WORKER,
                          engine=base, cache_block=WORLDS[world]["cache_block"], strata=WORLDS[world]["strata"])
    s = Settings(bootstrap=200)
    m = Measurements.of(cells, s)
    rec = build_map(m, requests_of(m), "spec", "base", "basis", ["basis"], list(measured), [CHECK], 64, "sim", s,
                    scheds)
    pts = {p.batch: p.rho for p in rec.break_even}
    preds = {p.concurrency: p for p in rec.predictions if p.metric == "output_throughput"}
    return {"rho": {b: (pts[b].value, pts[b].lo, pts[b].hi) for b in BATCHES},
            "pred": {c: (preds[c].predicted.value, preds[c].predicted.lo, preds[c].predicted.hi) for c in PREDICTED},
            "check": preds[CHECK].agrees, "tau_moves": rec.tau_moves, "holds": rec.holds}


def profile_truth(rho: str, mix: dict, size: int, c: int, seed: int, suites: int = 200,
                  metric: str = "output_throughput", world: str = "plain") -> float:
    """The true log speedup at c of a traffic profile: suites of `size` prompts whose every prompt's stratum
    is drawn with the mix's shares (fresh prompts), sent in whole passes as a cell and the map's prediction
    send them, served without run-to-run noise, the mean over `suites`."""
    rng = np.random.default_rng(seed)
    names = [s_ for s_, w in mix.items() if w > 0]
    p = np.array([mix[s_] for s_ in names], float)
    p /= p.sum()
    total = size * passes_for(size, 1, REQUESTS_PER_WORKER, c)
    tok, match = np.zeros((suites, total)), np.zeros((suites, total, 32), bool)
    for j in range(suites):
        counts = dict(zip(names, rng.multinomial(size, p)))
        _, t, _, mt = traffic_prompts(rng, WORLDS[world]["strata"], {k: v for k, v in counts.items() if v}, 24)
        order = np.arange(total) % size
        tok[j], match[j] = t[order], mt[order]
    return _served(rho, world, c, tok, match, size, rng, metric)


def profile_experiment(a: tuple) -> dict:
    """One experiment of a traffic profile predicted from the map: basis and generic suites measured at
    MEASURED (CHECK held out), the profile's predictions at PREDICTED."""
    seed, rho, name, world = a
    base, _, scheds = engines(rho, world)
    cells = traffic_cells(seed, {"basis": COUNTS, "generic": {"generic": 4}}, MEASURED, rho=RHOS[rho],
                          min_requests_per_worker=REQUESTS_PER_WORKER, engine=base,
                          cache_block=WORLDS[world]["cache_block"], strata=WORLDS[world]["strata"])
    s = Settings(bootstrap=200)
    m = Measurements.of(cells, s)
    rec = build_map(m, requests_of(m), "spec", "base", "basis", ["basis", "generic"], list(MEASURED), [CHECK], 64,
                    "sim", s, scheds, profiles=traffic_profiles({name: PROFILES[name]}))
    preds = {p.concurrency: p for p in rec.profiles if p.metric == "output_throughput"}
    return {c: (preds[c].predicted.value, preds[c].predicted.lo, preds[c].predicted.hi) for c in PREDICTED if c in preds}


def profile_coverage(experiments: int, rho: str = "flat", name: str = "generic_heavy", seed: int = 7000,
                     truth_suites: int = 200, world: str = "plain") -> dict:
    """Coverage, mean log width and bias of a traffic profile's predictions from the map at PREDICTED."""
    size = sum(COUNTS.values())
    t = {c: profile_truth(rho, PROFILES[name], size, c, seed - 1, truth_suites, world=world) for c in PREDICTED}
    got = list(run_tasks([(profile_experiment, (seed + e, rho, name, world)) for e in range(experiments)]))
    out = {}
    for c in PREDICTED:
        rows = [g[c] for g in got if c in g and g[c][1] and g[c][2]]
        inside = [math.log(lo) <= t[c] <= math.log(hi) for _, lo, hi in rows]
        p = float(np.mean(inside))
        out[c] = {"coverage": p, "mc_se": math.sqrt(max(p * (1 - p), 1e-12) / len(rows)), "n": len(rows),
                  "width": float(np.mean([math.log(hi / lo) for _, lo, hi in rows])),
                  "bias": float(np.mean([math.log(v) for v, _, _ in rows]) - t[c]), "truth": t[c]}
    return out


def coverage(experiments: int, rho: str = "flat", seed: int = 5000, truth_suites: int = 200,
             measured: tuple = MEASURED, world: str = "plain") -> dict:
    """Coverage, mean log width and bias of rho at BATCHES and of the predictions at PREDICTED, and the
    share of experiments whose check at CHECK agreed; the map's cells at `measured` (CHECK among them)."""
    t_pred = {c: truth(rho, c, seed - 1, truth_suites, world=world) for c in PREDICTED}
    got = list(run_tasks([(experiment, (seed + e, rho, tuple(measured), world)) for e in range(experiments)]))
    out = {}

    def tally(key, rows, t):
        """rows: (value, lo, hi) of a ratio; t: the true log ratio."""
        inside = [math.log(lo) <= t <= math.log(hi) for _, lo, hi in rows]
        p = float(np.mean(inside))
        out[key] = {"coverage": p, "mc_se": math.sqrt(max(p * (1 - p), 1e-12) / len(rows)), "n": len(rows),
                    "width": float(np.mean([math.log(hi / lo) for _, lo, hi in rows])),
                    "bias": float(np.mean([math.log(v) for v, _, _ in rows]) - t), "truth": t}

    for b in BATCHES:
        tally(("rho", b), [g["rho"][b] for g in got], math.log(RHOS[rho](b)))
    for c in PREDICTED:
        tally(("throughput", c), [g["pred"][c] for g in got], t_pred[c])
    checks = [g["check"] for g in got if g["check"] is not None]
    out[("check agrees", CHECK)] = {"coverage": float(np.mean(checks)) if checks else float("nan"), "n": len(checks),
                                    "mc_se": math.sqrt(max(np.mean(checks) * (1 - np.mean(checks)), 1e-12)
                                                       / max(len(checks), 1)) if checks else float("nan"),
                                    "width": float("nan"), "bias": float("nan"), "truth": float("nan")}
    holds = [g["holds"] for g in got if g["holds"] is not None]
    p = float(np.mean(holds)) if holds else float("nan")
    out[("map holds", 0)] = {"coverage": p, "n": len(holds), "mc_se": math.sqrt(max(p * (1 - p), 1e-12)
                                                                                / max(len(holds), 1)),
                             "width": float("nan"), "bias": float("nan"), "truth": float("nan")}
    moves = [g["tau_moves"] for g in got if g["tau_moves"] is not None]
    p = float(np.mean(moves)) if moves else float("nan")
    out[("rho moves with tau", 0)] = {"coverage": p, "n": len(moves), "mc_se": math.sqrt(max(p * (1 - p), 1e-12)
                                                                                         / max(len(moves), 1)),
                                      "width": float("nan"), "bias": float("nan"), "truth": float("nan")}
    return out


# -- the map in k ---------------------------------------------------------------------------------------
def k_rho(k: int, shape: str = "linear"):
    """A speculative step at k drafts, in plain steps at batch b: linear in k at every batch (k passes of a
    drafter and k + 1 tokens verified a sequence), dearer with the batch the more it drafts; `curved`: a
    step whose cost grows with k squared (what the line must catch)."""
    if shape == "curved":
        return lambda b: 1.0 + 0.05 * k * k + 0.012 * k * (b - 1)
    if shape == "identical":
        return lambda b: 1.0
    return lambda b: 1.0 + 0.1 * k + 0.012 * k * (b - 1)


# `identical`: every draft wrong and a step as dear as a plain one, so every k is exactly off
NO_DRAFT = {s_: ((1e-3, 1e3), length) for s_, (_, length) in TRAFFIC_STRATA.items()}


def k_strata(shape: str) -> dict:
    return NO_DRAFT if shape == "identical" else TRAFFIC_STRATA


K_ALL = (1, 2, 3, 4, 5)
K_MAPPED = (1, 3, 5)          # the sweep's members; 3 is held out of the line through 1 and 5 to check it


def k_engines(ks: tuple, shape: str = "linear") -> dict:
    return {f"spec@k={k}": replace(BASE, k=k, rho=k_rho(k, shape)) for k in ks}


def k_truth(k: int, c: int, seed: int, suites: int = 200, metric: str = "output_throughput", shape: str = "linear"
            ) -> float:
    """The true log speedup at c of a suite drawn like the experiments' on the engine drafting k."""
    rng = np.random.default_rng(seed)
    n = sum(COUNTS.values())
    size = n * passes_for(n, 1, REQUESTS_PER_WORKER, c)
    tok, match = np.zeros((suites, size)), np.zeros((suites, size, 32), bool)
    for j in range(suites):
        _, tk, _, mt = traffic_prompts(rng, k_strata(shape), COUNTS, 24)
        order = np.arange(size) % n
        tok[j], match[j] = tk[order], mt[order]
    ot = np.full(tok.shape, 24)
    b = serve(BASE, c, tok, ot, rng, match=match)
    x = serve(k_engines((k,), shape)[f"spec@k={k}"], c, tok, ot, rng, match=match)
    return float(np.mean(metrics.log_speedup(metric, figures(metric, c, ot, x.e2e, x.ttft, {}),
                                             figures(metric, c, ot, b.e2e, b.ttft, {}))))


def k_experiment(a: tuple) -> dict:
    """One k sweep (K_MAPPED) measured at MEASURED: its members' maps, the map in k, rho at every k and
    BATCHES, every k's predictions at PREDICTED, the checks and the schedule."""
    from ..deciding.predicting.stepcost.kmap import build_kmap
    seed, mapped, shape = a
    specs = k_engines(mapped, shape)
    cells = traffic_cells(seed, {"basis": COUNTS}, MEASURED, min_requests_per_worker=REQUESTS_PER_WORKER,
                          engine=BASE, specs=specs, strata=k_strata(shape))
    s = Settings(bootstrap=200)
    m = Measurements.of(cells, s)
    reqs = requests_of(m)
    fitted: dict = {}
    for x in specs:
        build_map(m, reqs, x, "base", "basis", ["basis"], list(MEASURED), [CHECK], 64, "sim", s, fitted=fitted)
    ks = {int(x.split("=")[1]): x for x in specs}
    km = build_kmap(m, reqs, "spec", ks, {k: fitted[x] for k, x in ks.items() if x in fitted}, ["basis"],
                    sorted(set(BATCHES) | set(PREDICTED) | set(MEASURED)), s, "output_throughput")
    L = fitted[ks[max(ks)]].context
    return {"rho": {(p.k, p.batch): (p.rho.value, p.rho.lo, p.rho.hi) for p in km.rho if p.batch in BATCHES},
            "pred": {(p.k, p.concurrency): (p.predicted.value, p.predicted.lo, p.predicted.hi)
                     for p in km.predictions if p.metric == "output_throughput" and p.concurrency in PREDICTED},
            "linear": km.linear, "holds": km.holds, "context": L,
            "schedule": {c: (b.k, b.best) for b in km.schedule for c in PREDICTED if b.lo <= c <= b.hi}}


def k_coverage(experiments: int, seed: int = 9000, truth_suites: int = 200, mapped: tuple = K_MAPPED,
               shape: str = "linear") -> dict:
    """Coverage, mean log width and bias of the map in k: rho at every k and BATCHES (truth k_rho) and every
    k's throughput speedup at PREDICTED (truth k_truth), with how often linear-in-k and the held-out
    member's check agreed, and the schedule's best k against the truth's."""
    t_pred = {(k, c): k_truth(k, c, seed - 1, truth_suites, shape=shape) for k in K_ALL for c in PREDICTED}
    got = list(run_tasks([(k_experiment, (seed + e, tuple(mapped), shape)) for e in range(experiments)]))
    out = {}
    for (key, truth_of) in (("rho", lambda k, b: math.log(k_rho(k, shape)(b))), ("pred", lambda k, c: t_pred[(k, c)])):
        for kc in sorted({kc for g in got for kc in g[key]}):
            rows = [g[key][kc] for g in got if kc in g[key] and g[key][kc][1] and g[key][kc][2]]
            t = truth_of(*kc)
            inside = [math.log(lo) <= t <= math.log(hi) for _, lo, hi in rows]
            p = float(np.mean(inside))
            out[(key, kc)] = {"coverage": p, "mc_se": math.sqrt(max(p * (1 - p), 1e-12) / len(rows)), "n": len(rows),
                              "width": float(np.mean([math.log(hi / lo) for _, lo, hi in rows])),
                              "bias": float(np.mean([math.log(v) for v, _, _ in rows]) - t), "truth": t}
    for key in ("linear", "holds"):
        v = [g[key] for g in got if g[key] is not None]
        p = float(np.mean(v)) if v else float("nan")
        out[(key, 0)] = {"coverage": p, "n": len(v), "mc_se": math.sqrt(max(p * (1 - p), 1e-12) / max(len(v), 1)),
                         "width": float("nan"), "bias": float("nan"), "truth": float("nan")}
    # the schedule: where it deploys a k, how far that k's true speedup is from the best k's (the regret, in
    # log; "bias" the mean regret) and how often it is within 0.03 of it; how often it decides at all
    for c in PREDICTED:
        best = max(t_pred[(k, c)] for k in K_ALL)
        chosen = [g["schedule"][c][0] for g in got if c in g["schedule"]]
        if best <= 0.01:   # no k pays: how often the schedule deploys one anyway
            p = float(np.mean([bool(k) for k in chosen])) if chosen else float("nan")
            out[("deploys", c)] = {"coverage": p, "n": len(chosen),
                                   "mc_se": math.sqrt(max(p * (1 - p), 1e-12) / max(len(chosen), 1)),
                                   "width": float("nan"), "bias": float("nan"), "truth": best}
        regret = [best - (t_pred[(k, c)] if k else 0.0) for k in chosen if k is not None]
        p = float(np.mean([r <= 0.03 for r in regret])) if regret else float("nan")
        out[("near best", c)] = {"coverage": p, "n": len(regret),
                                 "mc_se": math.sqrt(max(p * (1 - p), 1e-12) / max(len(regret), 1)),
                                 "width": float(len(regret) / max(len(chosen), 1)),
                                 "bias": float(np.mean(regret)) if regret else float("nan"), "truth": best}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specmatch stepcost_coverage", description=__doc__.split("\n\n")[0])
    p.add_argument("--experiments", type=int, default=200)
    p.add_argument("--rho", choices=sorted(RHOS), default="flat")
    p.add_argument("--world", choices=sorted(WORLDS), default="plain")
    p.add_argument("--profile", choices=sorted(PROFILES), help="a traffic profile's predictions from the map instead")
    p.add_argument("--k", choices=["linear", "curved", "identical"],
                   help="the map in k instead: a k sweep (k = 1, 3, 5) whose step cost is linear or curved in k, or "
                        "whose every k is exactly off (no draft right, a step as dear as a plain one)")
    p.add_argument("--measured", default=",".join(map(str, MEASURED)),
                   help=f"the map's cells (the check, c={CHECK}, among them), e.g. 1,4,8,16 as the default measures")
    a = p.parse_args(argv)
    measured = tuple(int(x) for x in a.measured.split(","))
    if a.k:
        print(f"{a.experiments} experiments, map in k from k={K_MAPPED} ({a.k} in k), 90% intervals, 2 repeats")
        for key, v in k_coverage(a.experiments, shape=a.k).items():
            print(f"{key[0]:>7} {str(key[1]):<8} coverage {v['coverage']:.3f} ± {v['mc_se']:.3f} (n={v['n']})  width "
                  f"{v['width']:.3f}  bias {v['bias']:+.4f}  truth {v['truth']:.4f}")
        return 0
    if a.profile:
        for c, v in profile_coverage(a.experiments, a.rho, a.profile, world=a.world).items():
            print(f"{a.profile} c={c:<4} coverage {v['coverage']:.3f} ± {v['mc_se']:.3f} (n={v['n']})  width "
                  f"{v['width']:.3f}  bias {v['bias']:+.4f}  truth {v['truth']:.4f}")
        return 0
    got = coverage(a.experiments, a.rho, measured=measured, world=a.world)
    print(f"{a.experiments} experiments, rho {a.rho}, world {a.world}, map at c={[c for c in measured if c != CHECK]}, check at "
          f"c={CHECK}, 90% intervals, 2 repeats")
    for k, v in got.items():
        print(f"{k[0]:>13} {k[1]:<4} coverage {v['coverage']:.3f} ± {v['mc_se']:.3f} (n={v['n']})  width "
              f"{v['width']:.3f}  bias {v['bias']:+.4f}  truth {v['truth']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
