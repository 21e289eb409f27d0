"""Traffic mixes whose truth is known: a discrete-event server (specmatch.calibration.des) serving
batches that mix sources of different acceptance and prompt length, and the coverage of the traffic
predictions (specmatch.deciding.predicting.traffic) against it.

An experiment measures a baseline and a speculative server (k=3, a step cost that grows with the
batch) on a stratified basis suite of three sources and a file suite (`generic`), at c = 1 and a
batched concurrency, in repeats with session and cell run-to-run effects, as the workflow does; the
analysis sees only cells and request records. The truth of a mix is what a suite of the same size
drawn with it measures: the mean over many fresh suites served by the same server without run-to-run
noise (its Monte-Carlo error is printed). The server batches whatever the suite mixes (per-prompt
acceptance: which drafts are right is fixed per prompt and position, as greedy decoding makes it),
so the truth of a mixed suite comes from the simulation, not from the prediction's model.

    python -m specmatch traffic_coverage [--experiments 100] [--concurrency 4] [--size 16]
prints each profile's coverage (truth inside its interval), the mean interval width and the
prediction's bias and spread, per concurrency and metric, and the break-even share's coverage.
`--check SHIFT [--same]` prints instead how often the check of each verified mix agrees at the batched
concurrency (check_calibration), with the speculative server SHIFT (log) slower on the verifying suites.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace

import numpy as np
import polars as pl

from .. import metrics
from ..data.prompts import repeated_draw
from .des import Engine, serve
from .grid import BASE
from .pool import run_tasks
from .simulate import cell
from .tally import share
from ..deciding.analysis import analyse
from ..deciding.reading.measurements import Settings
from ..config import passes_for
from ..deciding.predicting.traffic.report import traffic_report
from ..deciding.predicting.traffic.step_model import figures
from ..records import TrafficProfile, TrafficProfiles

# Strata of a synthetic deployment: per-token acceptance Beta(a, b) and prompt length (median tokens,
# sd of log), as speculation sees agentic rows (long, predictable), instructions and encyclopedic
# questions (short, little to accept).
TRAFFIC_STRATA = {"agent": ((9.0, 3.0), (320, 0.35)), "code": ((6.0, 4.0), (200, 0.4)),
                  "chat": ((4.0, 5.0), (120, 0.4)), "generic": ((2.5, 6.0), (50, 0.35))}
SOURCES = {"agent": 0.3, "code": 0.5, "chat": 0.2}      # the training mix's shares
PROFILES = {"training_mix": dict(SOURCES),
            "generic_heavy": {"agent": 0.18, "code": 0.3, "chat": 0.12, "generic": 0.4},
            "agentic": {"agent": 0.7, "code": 0.2, "generic": 0.1}}


# A world whose context cost is super-linear (ctx2_s) and whose verify step attends k + 1 times over
# the context (spec_ctx: rho grows with the context), with a stratum of long agent-session histories:
# the basis suite holds three of them, and a sessions-heavy mix puts about three times the basis suite's
# context in every batch, where the step model, fitted on shorter suites, extrapolates.
SUPERLINEAR = {"engine": replace(BASE, ctx2_s=4e-3, spec_ctx=4.0),
               "strata": {**TRAFFIC_STRATA, "session": ((9.0, 3.0), (1100, 0.25))},
               "basis": {"agent": 3, "code": 7, "chat": 3, "session": 3},
               "profiles": {"training_mix": dict(SOURCES), "sessions_heavy": {"session": 0.9, "generic": 0.1},
                            "generic_heavy": PROFILES["generic_heavy"]}}
WORLDS = {"linear": {}, "superlinear": SUPERLINEAR}


def _traffic_rho(b: int) -> float:
    """A speculative step (k=3) in plain decode steps at batch size b: cheap at 1, dear at 16."""
    return float(np.interp(b, (1, 4, 16), (1.25, 1.5, 2.3)))


def traffic_prompts(rng, strata: dict, counts: dict, out_tokens: int = 24):
    """Fresh prompts of a suite, `counts` per stratum, in a seeded shuffled order: each with its prompt
    tokens, acceptance probability and which drafts are right at each output position (greedy: fixed
    per prompt)."""
    names = [s for s, k in counts.items() for _ in range(k)]
    rng.shuffle(names)
    n = len(names)
    tokens, alpha = np.zeros(n), np.zeros(n)
    for i, s in enumerate(names):
        (a, b), (med, sd) = strata[s]
        alpha[i] = rng.beta(a, b)
        tokens[i] = float(np.clip(np.round(rng.lognormal(np.log(med), sd)), 8, 1024))
    match = rng.random((n, out_tokens + 8)) < alpha[:, None]
    return names, tokens, alpha, match


def traffic_cells(seed: int, suites: dict, concurrencies=(1, 4), repeats: int = 2, out_tokens: int = 24,
                  session_sd: float = 0.02, cell_sd: float = 0.02, strata: dict | None = None, rho=None,
                  min_requests_per_worker: int | None = None, request_sd: float = 0.0, request_df: float = 3.0,
                  engine: Engine | None = None, shift: dict | None = None, cache_block: int = 0,
                  specs: dict | None = None):
    """Cells of a baseline `base` and a speculative server `spec` (k=3, step cost `rho(b)`) on `suites`
    (name -> {stratum: prompts}) at every concurrency and repeat, simulated by specmatch.calibration.des:
    continuous batching of whatever each suite mixes, per-prompt acceptance, every cell moved by its
    session's and its own run-to-run effect. Request frames carry each prompt's stratum as `source`.
    A file suite is one stratum named like the suite (`generic`). Each cell sends one pass of its suite,
    or, with `min_requests_per_worker`, the whole passes a workflow cell sends (config.passes_for).
    `request_sd`: each request's times also moved by its own heavy-tailed noise (Student t with
    `request_df` dof, scaled to that sd in log: a stall, a scheduling hiccup), independent across
    repeats, so two repeats' per-prompt values disagree beyond their prompts' spread. `shift` (suite ->
    log): the speculative server's times on that suite moved by it (negative: faster), a world that
    differs from what the other suites show, which a check against them should catch. `cache_block`: a
    prefix cache of blocks of this many tokens (0: none): a later pass's prompt is served from it but for
    its last partial block (what vLLM's cache does with a resent prompt), recorded as cached_tokens.
    `specs` (name -> Engine): the speculative servers instead of `spec` (a k sweep's members); each cell of a
    speculative server carries vLLM's per-position acceptance rates."""
    strata = strata or TRAFFIC_STRATA
    rng = np.random.default_rng(seed)
    base = engine or BASE
    engines = {"base": base, **(specs or {"spec": replace(base, k=3, rho=rho or _traffic_rho)})}
    prompts = {}
    for u, counts in suites.items():
        prompts[u] = (same_prompts(rng, u, counts["same_prompts"], prompts) if "same_prompts" in counts
                      else (*traffic_prompts(rng, strata, counts, out_tokens), [f"{u}-{i:03d}" for i in range(sum(counts.values()))]))
    sessions = {(x, r): rng.normal(0, session_sd) for x in engines for r in range(1, repeats + 1)}
    out = []
    for u, (names, tokens, alpha, match, pids) in prompts.items():
        n = len(names)
        for c in concurrencies:
            order = np.arange(n * passes_for(n, 1, min_requests_per_worker, c)) % n
            ids = [pids[i] for i in order]
            keys = [(x, r) for x in engines for r in range(1, repeats + 1)]
            m = len(keys)
            cached = resent_cached(tokens[order], n, cache_block)
            served = serve([engines[x] for x, _ in keys], c, np.tile(tokens[order], (m, 1)),
                           np.full((m, len(order)), out_tokens), rng,
                           match=np.broadcast_to(match[order], (m, len(order)) + match.shape[1:]),
                           cached=None if cached is None else np.tile(cached, (m, 1)))
            moved = (shift or {}).get(u, 0.0)
            served = served.scaled(np.exp([sessions[k] + rng.normal(0, cell_sd) + (moved if k[0] == "spec" else 0.0)
                                           for k in keys]))
            ot = np.full(len(order), float(out_tokens))
            for i, (x, r) in enumerate(keys):
                one = served.row(i)
                if request_sd > 0:
                    f = np.exp(request_sd * rng.standard_t(request_df, len(order))
                               * math.sqrt((request_df - 2) / request_df))
                    one = replace(one, e2e=one.e2e * f, ttft=one.ttft * f)
                spec = engines[x].k > 0
                res, req = cell(x, u, c, r, one.e2e, one.ttft, ot, ids, one.steps if spec else None,
                                one.accepted if spec else None, tokens[order],
                                int(one.steps.sum()) if spec else None, starts=one.start,
                                duration=float(one.duration[0]), drafted=one.drafted if spec else None,
                                session=f"{x}-r{r}", cached=cached)
                if spec:
                    res.spec_decode_acceptance_length = 1 + float(one.accepted.sum() / max(one.steps.sum(), 1))
                    drafts = max(float(one.steps.sum()), 1.0)
                    res.spec_decode_per_position_acceptance_rates = [float(v) / drafts
                                                                     for v in one.positions[:engines[x].k]]
                out.append((res, req.with_columns(pl.Series("pass_index", (np.arange(len(order)) // n).tolist()),
                                                  pl.Series("source", [names[j] for j in order]))))
    return out


def same_prompts(rng, name: str, counts: dict, made: dict) -> tuple:
    """A suite drawn from suites already made (`made`: suite -> traffic_prompts' tuple and ids), as a
    `verify: same_prompts` suite is: per stratum, `counts[stratum]` of the prompts of the first suite that
    holds that stratum, without replacement where it holds enough, else each of them as evenly often as
    the count allows (repeated_draw), shuffled, their ids kept."""
    picks = []
    for st, k in counts.items():
        u = next(v for v, got in made.items() if st in got[0])
        idx = [i for i, s in enumerate(made[u][0]) if s == st]
        picks += [(u, idx[j]) for j in repeated_draw(lambda m, n: list(rng.choice(m, n, replace=False)), len(idx), k)]
    picks = [picks[j] for j in rng.permutation(len(picks))]
    names = [made[u][0][i] for u, i in picks]
    tokens = np.array([made[u][1][i] for u, i in picks])
    alpha = np.array([made[u][2][i] for u, i in picks])
    match = np.array([made[u][3][i] for u, i in picks])
    return names, tokens, alpha, match, [made[u][4][i] for u, i in picks]


def resent_cached(tokens: np.ndarray, n: int, block: int) -> np.ndarray | None:
    """Per request of whole passes over n prompts: the prompt tokens a prefix cache of `block`-token blocks
    serves, the full blocks of a prompt sent before (every pass after the first; at least its last token
    is computed); None without a cache."""
    if block <= 0:
        return None
    full = np.floor(np.maximum(tokens - 1, 0) / block) * block
    return np.where(np.arange(np.shape(tokens)[-1]) >= n, full, 0.0)


def traffic_truth(seed: int, mix: dict, size: int, c: int, suites: int = 300, out_tokens: int = 24,
                  strata: dict | None = None, rho=None, engine: Engine | None = None) -> dict:
    """The true log speedup (throughput and TPOT, as a cell measures them) of a suite of `size` prompts
    whose every prompt's stratum is drawn with the mix's probabilities from the strata's populations:
    the mean over `suites` fresh suites served by the discrete-event server (no run-to-run noise), and
    the Monte-Carlo standard error of each."""
    strata = strata or TRAFFIC_STRATA
    rng = np.random.default_rng(seed)
    names = list(mix)
    p = np.array([mix[s] for s in names], float)
    p /= p.sum()
    tok, match = np.zeros((suites, size)), np.zeros((suites, size, out_tokens + 8), bool)
    for j in range(suites):
        counts = dict(zip(names, rng.multinomial(size, p)))
        _, tok[j], _, match[j] = traffic_prompts(rng, strata, counts, out_tokens)
    ot = np.full((suites, size), out_tokens)
    base = engine or BASE
    spec = replace(base, k=3, rho=rho or _traffic_rho)
    b, x = serve(base, c, tok, ot, rng, match=match), serve(spec, c, tok, ot, rng, match=match)
    # read as the verdicts read a closed-loop cell, no SLO (traffic.step_model.figures)
    thr, tpot = (metrics.log_speedup(m_, figures(m_, c, ot, x.e2e, x.ttft, {}), figures(m_, c, ot, b.e2e, b.ttft, {}))
                 for m_ in ("output_throughput", "tpot"))
    return {"output_throughput": float(thr.mean()), "tpot": float(tpot.mean()),
            "se": {"output_throughput": float(thr.std(ddof=1) / np.sqrt(suites)),
                   "tpot": float(tpot.std(ddof=1) / np.sqrt(suites))}}


def traffic_profiles(profiles: dict | None = None) -> TrafficProfiles:
    """The experiments' profiles resolved as the traffic step resolves a config's (basis suite `basis`,
    file suite `generic`)."""
    return TrafficProfiles("basis", dict(SOURCES), ["generic"],
                           [TrafficProfile(n, dict(m)) for n, m in (profiles or PROFILES).items()])


def basis_counts(size: int, small: int | None = None) -> dict:
    """A stratified basis suite of `size` prompts: at least `small` (default a third) of agent and chat."""
    k = small if small is not None else size // 3
    return {"agent": k, "code": size - 2 * (size // 3) + (size // 3 - k), "chat": size // 3}


def traffic_experiment(seed: int, concurrencies=(1, 4), size: int = 16, repeats: int = 2, bootstrap: int = 400,
                       profiles: dict | None = None, lines: bool = False, basis: dict | None = None,
                       designs: bool = True, **kw):
    """One experiment's analysis and traffic rows. `designs`: the analysis also works out what would decide
    each inconclusive verdict (Settings.designs), which the traffic rows do not read (False: half the time)."""
    cells = traffic_cells(seed, {"basis": basis or basis_counts(size), "generic": {"generic": size}},
                          concurrencies=concurrencies, repeats=repeats, **kw)
    an = analyse(cells, "base", Settings(bootstrap=bootstrap, designs=designs))
    return an, traffic_report(an, traffic_profiles(profiles), [], lines=lines)


def break_even_truth(seed: int, c: int, size: int, points: int = 11, suites: int = 300, rho=None) -> dict:
    """Per metric, where the true speedup crosses 1 along the line from the training mix toward
    `generic` (the generic share), interpolated between `points` shares on log speedup (None: no
    crossing); `rho`: traffic_truth's."""
    shares = np.linspace(0, 1, points)
    ys = []
    for s in shares:
        mix = {k: (1 - s) * v for k, v in SOURCES.items()}
        mix["generic"] = s
        ys.append(traffic_truth(seed, {k: v for k, v in mix.items() if v > 0}, size, c, suites, rho=rho))
    out = {}
    for metric in ("output_throughput", "tpot"):
        y = [t[metric] for t in ys]
        out[metric] = next((float(shares[i - 1] + y[i - 1] / (y[i - 1] - y[i]) * (shares[i] - shares[i - 1]))
                            for i in range(1, points) if np.sign(y[i]) != np.sign(y[0])), None)
    return out


def _experiment_rows(a: tuple) -> list:
    seed, concurrencies, size, break_even, small, noise, world, designs, rho = a
    w = WORLDS[world]
    profiles = w.get("profiles") if not break_even else {"training_mix": PROFILES["training_mix"]}
    return traffic_experiment(seed, concurrencies, size, lines=break_even, basis=w.get("basis") or basis_counts(size, small),
                              profiles=profiles, engine=w.get("engine"), strata=w.get("strata"), designs=designs,
                              rho=_flat(rho), **dict(noise))[1]


def _flat(rho: float | None):
    """A speculative step of `rho` plain steps at every batch size (None: _traffic_rho's)."""
    return None if rho is None else lambda b: rho


def coverage(experiments: int, concurrencies=(1, 4), size: int = 16, seed: int = 1000, truth_suites: int = 400,
             break_even: bool = False, small: int | None = None, request_sd: float = 0.0,
             world: str = "linear", designs: bool = True, session_sd: float = 0.02, cell_sd: float = 0.02,
             rho: float | None = None) -> dict:
    """Per (profile, concurrency, metric): how often the truth lies inside the predicted interval, with
    the Monte-Carlo standard error, the mean log width, and the prediction's bias and sd; with
    `break_even`, how often the true break-even share toward generic lies in [lo, hi]. `small`: prompts
    of the basis suite's agent and chat strata (basis_counts; 3 is the default workflow's smallest);
    `request_sd`, `session_sd`, `cell_sd`: heavy-tailed request noise and run to run (traffic_cells);
    `world`: WORLDS (its engine, strata, basis suite and profiles); `designs`: traffic_experiment's; `rho`:
    a speculative step of that many plain steps at every batch size (default: 1.25 / 1.5 / 2.3 at batch
    1 / 4 / 16). Each row also counts how often its prediction was marked extrapolated."""
    w = WORLDS[world]
    truth = {(p, c): traffic_truth(seed - 1, m, size, c, truth_suites, strata=w.get("strata"), rho=_flat(rho),
                                   engine=w.get("engine"))
             for p, m in (w.get("profiles") or PROFILES).items() for c in concurrencies}
    be_truth = {c: break_even_truth(seed - 2, c, size, rho=_flat(rho)) for c in concurrencies} if break_even else {}
    hits: dict = {}
    noise = (("cell_sd", cell_sd), ("request_sd", request_sd), ("session_sd", session_sd))
    jobs = [(_experiment_rows, (seed + e, tuple(concurrencies), size, break_even, small, noise, world, designs, rho))
            for e in range(experiments)]
    for rows in run_tasks(jobs):   # each experiment is its seed's: the same rows in any number of processes
        for r in rows:
            if r.predicted is None:
                continue
            t = truth[(r.profile, r.concurrency)][r.metric]
            k = (r.profile, r.concurrency, r.metric)
            got = hits.setdefault(k, {"in": 0, "n": 0, "width": [], "err": [], "extrapolated": 0})
            got["in"] += math.log(r.predicted.lo) <= t <= math.log(r.predicted.hi)
            got["n"] += 1
            got["extrapolated"] += bool(r.extrapolated)
            got["width"].append(math.log(r.predicted.hi / r.predicted.lo))
            got["err"].append(math.log(r.predicted.value) - t)
            be = r.break_even
            bt = be_truth.get(r.concurrency, {}).get(r.metric)
            if break_even and r.profile == "training_mix" and bt is not None and be is not None:
                kb = ("break-even", r.concurrency, r.metric)
                g = hits.setdefault(kb, {"in": 0, "n": 0, "width": [], "err": []})
                lo = be.lo if be.lo is not None else be.start
                hi = be.hi if be.hi is not None else 1.0
                g["in"] += min(lo, hi) <= bt <= max(lo, hi)
                g["n"] += 1
                g["width"].append(abs(hi - lo))
                g["err"].append((be.share if be.share is not None else float("nan")) - bt)
    out = {}
    for k, g in hits.items():
        p = g["in"] / g["n"]
        err = np.array(g["err"], float)
        out[k] = {"coverage": p, "mc_se": math.sqrt(max(p * (1 - p), 1e-12) / g["n"]), "n": g["n"],
                  "extrapolated": g.get("extrapolated", 0) / g["n"],
                  "width": float(np.mean(g["width"])), "bias": float(np.nanmean(err)), "sd": float(np.nanstd(err))}
    return {"rows": out, "truth": truth, "break_even_truth": be_truth}


def _check_rows(a: tuple) -> list:
    seed, c, size, shift, small, same, noise, designs = a
    from ..data.prompts import allocate

    verified = {p: m for p, m in PROFILES.items() if p != "training_mix"}
    suites = {"basis": basis_counts(size, small), "generic": {"generic": size}}
    for p, m in verified.items():
        alloc = {k: v for k, v in allocate(size, m).items() if v > 0}
        suites[f"traffic_{p}"] = {"same_prompts": alloc} if same else alloc
    cells = traffic_cells(seed, suites, concurrencies=(c,) if c == 1 else (1, c),
                          shift={f"traffic_{p}": shift for p in verified}, **dict(noise))
    an = analyse(cells, "base", Settings(bootstrap=200, designs=designs))
    profiles = traffic_profiles()
    for p in profiles.profiles:
        if p.name in verified:
            p.verify, p.suite = True, f"traffic_{p.name}"
    return [(r.profile, r.concurrency, r.metric, r.check.agree, r.check.family_holds, r.check.detectable)
            for r in traffic_report(an, profiles, [], lines=False) if r.check is not None and r.concurrency == c]


def check_calibration(experiments: int, c: int = 4, shift: float = 0.0, size: int = 16, seed: int = 3000,
                      small: int | None = None, same: bool = False, designs: bool = True, **noise) -> dict:
    """How often the check of a verified mix agrees (each verifying suite drawn afresh with its mix, as
    the workflow draws it, disjoint from the estimation prompts; with `same`, drawn from the estimation
    prompts as verify: same_prompts draws it, c > 1; `noise`: traffic_cells' session_sd and cell_sd;
    `designs`: traffic_experiment's): with `shift` 0 the prediction is right
    and it should agree at the interval's level; with the speculative server `shift` (log) slower or
    faster on the verifying suites than the estimates say, it should miss. Per (profile, metric) the
    agreement rate with its Monte-Carlo error and the mean minimum detectable error; ("family", metric)
    for the verified mixes together (Bonferroni)."""
    jobs = [(_check_rows, (seed + e, c, size, shift, small, same, tuple(sorted(noise.items())), designs))
            for e in range(experiments)]
    flags: dict = {}    # (profile or "family", metric) -> one outcome per experiment
    mdes: dict = {}
    for rows in run_tasks(jobs):
        fam: dict = {}
        for prof, _c, metric, agree, holds, mde in rows:
            flags.setdefault((prof, metric), []).append(agree)
            mdes.setdefault((prof, metric), []).append(mde)
            fam[metric] = holds
        for metric, holds in fam.items():
            if holds is not None:
                flags.setdefault(("family", metric), []).append(holds)
    out = {}
    for k, f in flags.items():
        p, se, n = share(f)
        out[k] = {"agree": p, "mc_se": se, "n": n, "detectable": float(np.mean(mdes[k])) if k in mdes else None}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specmatch traffic_coverage", description=__doc__.split("\n\n")[0])
    p.add_argument("--experiments", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=4, help="the batched concurrency (besides c=1)")
    p.add_argument("--size", type=int, default=16, help="prompts per suite")
    p.add_argument("--break-even", action="store_true", help="the break-even share's coverage too (slower)")
    p.add_argument("--small", type=int, default=None, help="prompts of the basis suite's agent and chat strata")
    p.add_argument("--request-sd", type=float, default=0.0, help="heavy-tailed request noise (sd in log)")
    p.add_argument("--world", choices=sorted(WORLDS), default="linear",
                   help="superlinear: context cost super-linear, rho growing with context, a sessions-heavy mix")
    p.add_argument("--seed", type=int, default=None, help="the first experiment's seed (default 1000; 3000 with --check)")
    p.add_argument("--truth-suites", type=int, default=400, help="fresh suites the truth of a mix averages")
    p.add_argument("--check", type=float, default=None, metavar="SHIFT",
                   help="the verified mixes' check instead, the speculative server SHIFT (log) slower on their suites")
    p.add_argument("--same", action="store_true", help="with --check: verifying suites of the estimation prompts")
    p.add_argument("--session-sd", type=float, default=None, help="with --check: run to run of a session (sd in log)")
    p.add_argument("--cell-sd", type=float, default=None, help="with --check: run to run of a cell (sd in log)")
    a = p.parse_args(argv)
    if a.check is not None:
        noise = {k: v for k, v in (("session_sd", a.session_sd), ("cell_sd", a.cell_sd)) if v is not None}
        got = check_calibration(a.experiments, a.concurrency, a.check, a.size, 3000 if a.seed is None else a.seed,
                                a.small, a.same, **noise)
        print(f"{a.experiments} experiments, suites of {a.size}, check at c = {a.concurrency}, shift {a.check:+.2f}"
              f"{', same prompts' if a.same else ''}, 90% intervals, 2 repeats")
        for (prof, metric), v in sorted(got.items()):
            mde = "" if v["detectable"] is None else f"  minimum detectable {v['detectable']:.3f}"
            print(f"{prof:>14} {metric:<18} agrees {v['agree']:.3f} ± {v['mc_se']:.3f} (n={v['n']}){mde}")
        return 0
    got = coverage(a.experiments, (1, a.concurrency), a.size, 1000 if a.seed is None else a.seed, a.truth_suites,
                   break_even=a.break_even, small=a.small, request_sd=a.request_sd, world=a.world)
    print(f"{a.experiments} experiments, suites of {a.size}, c = 1 and {a.concurrency}, 90% intervals, 2 repeats")
    for k, v in sorted(got["rows"].items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        t = (got["truth"].get(k[:2], {}).get(k[2]) if k[0] != "break-even"
             else got["break_even_truth"].get(k[1], {}).get(k[2]))
        print(f"{k[0]:>14} c={k[1]:<3} {k[2]:<18} coverage {v['coverage']:.2f} ± {v['mc_se']:.2f} (n={v['n']})  "
              f"width {v['width']:.3f}  bias {v['bias']:+.3f}  sd {v['sd']:.3f}  truth "
              + ("—" if t is None else f"{t:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
