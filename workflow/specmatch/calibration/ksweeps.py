"""Which k at which load: k sweeps whose truth is known, decided as the workflow decides them.

Each scenario (K_SCENARIOS) is a baseline and a sweep's members whose throughput speedup at each
concurrency is known, reached by calibrating each member's step cost in the same simulated server
(`calibrated`), on the embedded default's shape (one suite of 16 prompts, 24 output tokens, c = 1 and
16, the sequential design 2..3). krecommend.recommend decides each sweep as the workflow does (round
2's plan picks the cells of repeat 3); the rates say where speculation is deployed, where off runs
although a k beat it (read here against the harness's own comparisons, not the code under test), and
the null's false "speculate" per concurrency. kcompare_task reads the comparisons alone, so the
intervals can be told from the rule built on them.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np

from ..deciding.analysis import Analysis
from ..deciding.verdicts.comparison import compare, decision, look_level
from ..deciding.recommending.deployment import ServerInfo
from ..deciding.recommending.krecommend import recommend
from ..deciding.reading.measurements import Measurements
from ..deciding.verdicts.noise import run_to_run as rr_of
from ..deciding.rounds import plan
from ..stats import t_interval, t_ppf
from .des import Engine, serve
from .grid import BASE, settings
from .pool import seed_of
from .scenarios import SCENARIOS, Scenario, run_to_run
from .tally import share
from .workload import Workload, simulate_cells

K_OUT_TOKENS = 24          # the embedded default's max_tokens
K_PROMPTS = 16             # its suite size: c=16 is one burst of the whole suite
K_NOISE = {
    "default": Scenario("default", session_sd=0.08, cell_sd=0.06,
                        about="run to run 10% a cell (8% per session, 6% per cell), the 2-core default's level"),
    "quiet": SCENARIOS["quiet"],
}


@dataclass(frozen=True)
class KScenario:
    """A k sweep whose truth is known: each member's throughput speedup over the baseline at each
    measured concurrency (`truth`: ((k, ((c, speedup), ...)), ...)), reached by calibrating the
    member's step cost rho(k, b) in the simulated server (k_rho); on the default's shape (one suite of
    16 prompts, 24 output tokens, c = 1 and 16, the sequential design 2..3 repeats). `identical`:
    the members are the baseline itself (nothing drafted: every prompt's speedup exactly 1), the
    null without per-prompt heterogeneity, so the path logic can be told from the intervals."""
    name: str
    truth: tuple
    noise: str = "default"
    concurrencies: tuple = (1, 16)
    identical: bool = False
    about: str = ""

    def speedup(self, k: int, c: int) -> float:
        return dict(dict(self.truth)[k])[c]

    def best(self, c: int) -> int:
        """The truth's best k at c (0: off, where no k is faster than the baseline)."""
        x = max((self.speedup(k, c), -k, k) for k, _ in self.truth)
        return x[2] if x[0] > 1 else 0


_ONE = ((3, ((1, 1.32), (16, 0.85))), (5, ((1, 1.20), (16, 0.75))))
_NULL = ((3, ((1, 1.0), (16, 1.0))), (5, ((1, 1.0), (16, 1.0))))
K_SCENARIOS = {s.name: s for s in (
    KScenario("one", _ONE, about="k=3 best by 10% at c=1 (1.32x, k=5 1.20x), off best at c=16 (k=3 0.85x, k=5 0.75x)"),
    KScenario("one-quiet", _ONE, "quiet", about="scenario one on a quiet machine (1.5% run to run)"),
    KScenario("null", _NULL, about="every k as fast as off on average at c=1 and c=16 (per prompt it varies)"),
    KScenario("null-c1", _NULL, concurrencies=(1,), about="the null at c=1 alone"),
    KScenario("null-c16", _NULL, concurrencies=(16,), about="the null at c=16 alone (one burst of the suite)"),
    KScenario("null-same-c16", _NULL, concurrencies=(16,), identical=True,
              about="the null at c=16 with members identical to the baseline prompt by prompt"),
)}


def _rho_log(xs: tuple, ys: tuple, b: int) -> float:
    """Step cost at batch b: linear in log b between the calibrated concurrencies, constant outside."""
    return float(np.interp(math.log(max(b, 1)), xs, ys))


def _rho_step(at: int, lo: float, hi: float, b: int) -> float:
    """Step cost `lo` up to batch `at`, `hi` above (a server that pays at low load and loses above)."""
    return lo if b <= at else hi


def _speedup(engine: Engine, c: int, work: list, rng: np.random.Generator) -> float:
    """Noise-free throughput speedup of `engine` over BASE at c on `work` (geometric mean over draws), on
    the analysis's estimand: a closed loop's rate at its load, C x output tokens / the sum of latencies
    (specmatch.deciding.reading.measurements), so the ratio of the latency sums. Not the cells' durations: at
    c = 16 with 16 prompts a cell is one burst and its duration the slowest request, and a member whose
    duration equals the baseline's while speculation shortens every accepting prompt's latency is
    faster at its load (calibrated on durations, the null's members were: 66% of sweeps deployed a k
    at c=16)."""
    pt = np.array([w.tokens["s"] for w in work])
    al = np.array([w.alpha["s"] for w in work])
    mt = np.array([w.match["s"] for w in work])
    out = np.full(pt.shape, K_OUT_TOKENS)
    base = serve(BASE, c, pt, out, rng, al, mt).e2e.sum(axis=-1)
    spec = serve(engine, c, pt, out, rng, al, mt).e2e.sum(axis=-1)
    return float(np.exp(np.mean(np.log(base) - np.log(spec))))


@functools.lru_cache(maxsize=None)
def calibrated(k: int, targets: tuple, step_at: int | None = None, draws: int = 48) -> Engine:
    """A speculative Engine drafting k whose noise-free throughput speedup over BASE is `targets`
    ((c, speedup), ...) at each c, on the k scenarios' shape: rho at each c by fixed-point iteration
    (rho <- rho x measured / target), c in increasing order (a larger c's tail runs the smaller batch
    sizes); rho(b) linear in log b between them (`step_at`: lo up to that batch, hi above, two targets)."""
    rng = np.random.default_rng(seed_of("calibrated", k, targets, step_at))
    work = [Workload.draw(rng, ("s",), K_PROMPTS, out_tokens=K_OUT_TOKENS) for _ in range(draws)]
    cs = [c for c, _ in targets]
    rho = {c: 1.8 / x for c, x in targets}

    def engine() -> Engine:
        if step_at is not None:
            return replace(BASE, k=k, rho=functools.partial(_rho_step, step_at, rho[cs[0]], rho[cs[-1]]))
        return replace(BASE, k=k, rho=functools.partial(_rho_log, tuple(math.log(c) for c in cs),
                                                        tuple(rho[c] for c in cs)))
    for c, target in targets:
        for _ in range(5):
            rho[c] *= _speedup(engine(), c, work, rng) / target
    return engine()


def k_engines(sc: KScenario) -> dict:
    """name -> Engine: the baseline `base` and one member `spec@k=<k>` per k of the scenario."""
    return {"base": BASE, **{f"spec@k={k}": BASE if sc.identical else calibrated(k, cs) for k, cs in sc.truth}}


def _paying(m, rr, s, ks: dict, c: int) -> list[int]:
    """The k that pay against the baseline at c at alpha / K (K: the members with a figure at c), as
    the harness reads it, independently of the code under test (the 'level used for deploying')."""
    cmps = {k: compare(m, rr, n, "base", "s", c, s.recommend_metric) for k, n in ks.items() if m.repeats(n, "s", c)}
    cmps = {k: x for k, x in cmps.items() if x.estimate is not None}
    strict = replace(s, confidence=1 - (1 - s.confidence) / max(len(cmps), 1))
    out = []
    for k, x in cmps.items():   # the verdict's interval at the strict look's level (comparison.decide's)
        lo, hi = t_interval(x.estimate, x.se, x.dof, look_level(x, strict))
        if decision(lo, hi, math.log(1 + s.min_effect), x.run_to_run).value == "pays":
            out.append(k)
    return sorted(out)


def _sequential(cells: list, s, ks: dict, info) -> list:
    """The cells the sequential design measures: repeats 1-2 of every cell, and repeat 3 of the cells
    round 2's plan (deciding.rounds.plan, on the k choice) continues."""
    first = [x for x in cells if x[0].repeat <= 2]
    m = Measurements.of(first, s)
    rr = rr_of(m)
    rec = recommend(m, rr, info, "spec", ks, "base", "s", s)
    an = Analysis(s, "base", m.servers(), ["s"], sorted({x[0].concurrency for x in first}), rr, [], {}, [], [], [],
                  m, k_recommendations=[rec])
    go = {(x.server, x.concurrency) for x in plan(an, s.design, 2).next}
    return first + [x for x in cells if x[0].repeat == 3 and (x[0].server, x[0].concurrency) in go]


def ksweep_task(a: dict) -> dict:
    """`experiments` simulated k sweeps of KScenario `name` (k_engines), each decided as the workflow
    decides it (the sequential design 2..3, `design` "sequential"; or a fixed `repeats`) by
    krecommend.recommend, max_batch 256. Per experiment: the action, the k deployed at each measured
    concurrency and above the largest (`above`: batch 256), each concurrency's choice, the k that pay
    against off at alpha (the verdicts shown) and at alpha / K (`paying`: read here, not by the code
    under test), and whether the recommendation carries its verification or names what measures it."""
    sc = K_SCENARIOS[a["name"]]
    n = a["experiments"]
    rng = np.random.default_rng(a["seed"])
    seq = a.get("design", "sequential") == "sequential"
    R = 3 if seq else a.get("repeats", 2)
    s = settings(a.get("bootstrap", 250), repeats={"min": 2, "max": 3} if seq else R)
    engines = k_engines(sc)
    ks = {int(name.split("=")[1]): name for name in engines if name != "base"}
    max_batch = a.get("max_batch", 256)
    info = ServerInfo(ks[max(ks)], "vllm", "vllm", {"method": "ngram", "num_speculative_tokens": max(ks)}, max_batch)
    work = [Workload.draw(rng, ("s",), K_PROMPTS, out_tokens=K_OUT_TOKENS) for _ in range(n)]
    eff = [run_to_run(rng, K_NOISE[sc.noise], list(engines), ("s",), sc.concurrencies, R) for _ in range(n)]
    cells = simulate_cells(rng, work, engines, eff, R, sc.concurrencies, K_OUT_TOKENS)
    rows = []
    for e in range(n):
        cs = _sequential(cells[e], s, ks, info) if seq else cells[e]
        m = Measurements.of(cs, s)
        rr = rr_of(m)
        rec = recommend(m, rr, info, "spec", ks, "base", "s", s)
        top = max(sc.concurrencies)
        chs = {ch.concurrency: ch for ch in rec.choices}
        rows.append({
            "action": rec.action, "k_at": {c: rec.k_at(c) for c in sc.concurrencies},
            "above": rec.k_at(max_batch) if max_batch > top else None,
            "how": {c: chs[c].how for c in chs}, "choice": {c: chs[c].k for c in chs},
            "pays": {c: sorted(int(k) for k, x in chs[c].speedups.items() if x.get("verdict") == "pays") for c in chs},
            "paying": {c: _paying(m, rr, s, ks, c) for c in sc.concurrencies},
            "repeats": len({x[0].repeat for x in cs})})
    return {"rows": rows}


def k_rates(rows: list, sc: KScenario) -> dict:
    """What a k scenario's experiments did, each a (share, Monte-Carlo se, n):
    - speculate_at[c]: the recommendation deploys a k > 0 at batch c; `above`: at batch 256;
      `anywhere`: at any measured concurrency or above (a recommendation that deploys nothing counts
      as not speculating);
    - off_over_beaten[c]: off deployed at c although some k pays there against off at alpha / K (the
      level speculation is deployed at); `_90`: at alpha (the verdict the table shows);
    - unsupported[c]: a k deployed at c although none pays there at alpha / K;
    - k_at[c][k]: the distribution of the k deployed at c (None: no recommendation);
    - wrong[c]: a deployed k other than the truth's best (no recommendation not counted)."""
    out: dict = {"n": len(rows)}
    for c in sc.concurrencies:
        at = [r["k_at"][c] for r in rows]
        out.setdefault("speculate_at", {})[c] = share([k not in (None, 0) for k in at])
        out.setdefault("off_over_beaten", {})[c] = share([r["k_at"][c] == 0 and bool(r["paying"][c]) for r in rows])
        out.setdefault("off_over_beaten_90", {})[c] = share([r["k_at"][c] == 0 and bool(r["pays"].get(c)) for r in rows])
        out.setdefault("unsupported", {})[c] = share([r["k_at"][c] not in (None, 0) and not r["paying"][c]
                                                      for r in rows])
        out.setdefault("k_at", {})[c] = {k: share([x == k for x in at]) for k in sorted(set(at), key=str)}
        out.setdefault("wrong", {})[c] = share([x is not None and x != sc.best(c) for x in at])
    out["above"] = share([r["above"] not in (None, 0) for r in rows])
    out["anywhere"] = share([any(k not in (None, 0) for k in [*r["k_at"].values(), r["above"]]) for r in rows])
    out["actions"] = {a: share([r["action"] == a for r in rows]) for a in sorted({r["action"] for r in rows})}
    return out


def kcompare_task(a: dict) -> dict:
    """`experiments` null sweeps of KScenario `name` at a fixed `repeats`: each member's comparison with the
    baseline at each concurrency (comparison.compare, as best_k makes it), its log estimate, standard
    error and degrees of freedom, and whether it pays at alpha and at alpha / K. Light (no choice is
    made), so it can run many experiments: where every k equals off on average, the spread of the
    estimates over experiments against the stated standard errors says whether the intervals are right
    at a concurrency (k_interval_rates), apart from any rule built on them."""
    sc = K_SCENARIOS[a["name"]]
    n, R = a["experiments"], a.get("repeats", 2)
    rng = np.random.default_rng(a["seed"])
    s = settings(a.get("bootstrap", 250), repeats=R)
    engines = k_engines(sc)
    ks = {int(name.split("=")[1]): name for name in engines if name != "base"}
    work = [Workload.draw(rng, ("s",), K_PROMPTS, out_tokens=K_OUT_TOKENS) for _ in range(n)]
    eff = [run_to_run(rng, K_NOISE[sc.noise], list(engines), ("s",), sc.concurrencies, R) for _ in range(n)]
    cells = simulate_cells(rng, work, engines, eff, R, sc.concurrencies, K_OUT_TOKENS)
    rows = []
    for e in range(n):
        m = Measurements.of(cells[e], s)
        rr = rr_of(m)
        for c in sc.concurrencies:
            for k, name in ks.items():
                x = compare(m, rr, name, "base", "s", c, s.recommend_metric)
                if x.estimate is not None and x.se:
                    rows.append({"c": c, "k": k, "estimate": x.estimate, "se": x.se, "dof": x.dof, "e": (a["seed"], e)})
    return {"rows": rows}


def k_interval_rates(rows: list, confidence: float = 0.9, K: int = 2) -> dict:
    """Per concurrency, from kcompare_task's rows of a null: the variance of the log estimates over
    experiments against their mean stated variance (`ratio`: 1 where the intervals are right; above 1,
    too narrow), with its Monte-Carlo se (delta method over experiments); the one-sided false "pays"
    rate of one comparison at alpha and at alpha / K (nominal (1 - confidence) / 2 and that / K) and
    of "some k pays at alpha / K" (the rule that deploys speculation; bound alpha / 2), each with a
    binomial Monte-Carlo se."""
    alpha = 1 - confidence
    out = {}
    for c in sorted({r["c"] for r in rows}):
        rs = [r for r in rows if r["c"] == c]
        est = np.array([r["estimate"] for r in rs])
        var = np.array([r["se"] ** 2 for r in rs])
        m2, v = float(np.mean((est - est.mean()) ** 2)), float(var.mean())
        n = len(rs)
        ratio = m2 / v
        g = np.stack([(est - est.mean()) ** 2, var])   # ratio of means: se by the delta method
        cov = np.cov(g) / n
        se_ratio = math.sqrt(max(cov[0, 0] / v ** 2 - 2 * m2 * cov[0, 1] / v ** 3 + m2 ** 2 * cov[1, 1] / v ** 4, 0))
        one = [r["estimate"] - t_ppf(1 - alpha / 2, r["dof"]) * r["se"] > 0 for r in rs]
        strict = [r["estimate"] - t_ppf(1 - alpha / (2 * K), r["dof"]) * r["se"] > 0 for r in rs]
        by_e: dict = {}
        for r, x in zip(rs, strict):
            by_e[r["e"]] = by_e.get(r["e"], False) or x
        out[c] = {"ratio": (ratio, se_ratio, n), "pays_alpha": share(one), "pays_alpha_k": share(strict),
                  "some_k": share(list(by_e.values()))}
    return out
