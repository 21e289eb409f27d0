"""Calibration against a server that is not the analysis's own model.

Synthetic experiments shaped like the embedded default (three suites of 16 prompts, 16 output
tokens, concurrencies 1, 4 and 16, a baseline and a second server on the same prompts in the same
order, R repeats in fresh server sessions, servers alternating within repeats) whose cells come from
specmatch.calibration.des (a discrete-event model of a continuously batching server under a closed loop), not
from the makespan formula the analysis bootstraps. Run to run, every cell's times are multiplied by
its session's and its own speed, as a scenario draws them:

- plain: normal session (sd 3%) and cell (sd 4%) effects, the world the analysis assumes;
- hetero: run-to-run noise that depends on concurrency: 2% at c=1 and c=4, 8% at c=16 (1% of it
  shared by the session);
- t3: Student-t with 3 degrees of freedom for session and cell effects (same sd as plain);
- drift: plain, and the machine slows linearly over the run by 10% from the first cell to the last
  (in run order: repeat by repeat, servers alternating, cells in order within a session);
- outlier: plain, and one session per experiment (a server and a repeat drawn at random) 20% slower;
- quiet: normal, 1.5% run to run (where one repeat is meant to suffice).

Each rate is a share of verdicts; its Monte-Carlo error is the standard error of a ratio estimator
over experiments (verdicts of one experiment move together: they share sessions and one estimate
of the run-to-run variance), so it is honest however strongly they are correlated.

    python -m specmatch calibrate    # the whole table (10-20 minutes on 2 cores)

The k sweeps (K_SCENARIOS, k_table): a baseline and a sweep's members whose throughput
speedup at each concurrency is known (each member's step cost calibrated in the same simulated server),
on the embedded default's shape (one suite of 16 prompts, 24 output tokens, c = 1 and 16, the sequential
design 2..3), decided by krecommend.recommend as the workflow decides it (round 2's plan picks the cells of
repeat 3): where speculation is deployed, where off runs although a k beat it, the null's false
"speculate" per concurrency. And three external endpoints (a baseline, its twin, one that pays at low
load and loses at high load), decided by analysis.analyse: the recommendation a vLLM schedule that
drafts below the crossover, marked not verifiable.

    python -m specmatch calibrate --k-sweeps [--experiments 300]
"""
from __future__ import annotations

import functools
import math
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from .des import Engine, Served, serve

METRICS = ("output_throughput", "tpot", "e2el", "goodput")
CONCURRENCIES = (1, 4, 16)
SUITES = ("a", "b", "c")
PROMPTS = 16
OUT_TOKENS = 16
SLO = {"e2el_ms": 450.0}          # about the baseline's median at c=16 plus 8%: goodput is not throughput there
DECISIONS = ("pays", "loses", "equivalent", "inconclusive", "none")  # none: no figure (e.g. no request met the SLO)
EFFECTS = (0.05, 0.15, 0.30)
SWITCH_COST = 0.15


@dataclass(frozen=True)
class Scenario:
    """Run-to-run variation of one simulated machine (log speed of a session and of a cell)."""
    name: str
    session_sd: float = 0.03
    cell_sd: float | tuple = 0.04          # a number, or ((concurrency, sd), ...)
    tails: float | None = None             # Student-t degrees of freedom (None: normal)
    drift: float = 0.0                     # log slow-down from the run's first cell to its last
    outlier: float = 0.0                   # one session per experiment slower by log(1 + outlier)
    prompt_sd: float = 0.0                 # log-sd of the speedup from prompt to prompt (identical on average)
    about: str = ""

    def cell_sd_at(self, c: int) -> float:
        return dict(self.cell_sd)[c] if isinstance(self.cell_sd, tuple) else self.cell_sd

    def draw(self, rng: np.random.Generator, shape, sd) -> np.ndarray:
        if self.tails is None:
            return rng.normal(0.0, 1.0, shape) * sd
        k = self.tails
        return rng.standard_t(k, shape) * sd / math.sqrt(k / (k - 2))


SCENARIOS = {s.name: s for s in (
    Scenario("plain", about="normal session 3% and cell 4% effects (the analysis's assumption)"),
    Scenario("hetero", session_sd=0.01, cell_sd=((1, 0.0173), (4, 0.0173), (16, 0.0794)),
             about="run to run 2% at c=1,4 and 8% at c=16"),
    Scenario("t3", tails=3.0, about="Student-t(3) session and cell effects, sd as plain"),
    Scenario("drift", drift=0.10, about="plain + 10% linear slow-down over the run"),
    Scenario("outlier", outlier=0.20, about="plain + one session per experiment 20% slower"),
    Scenario("quiet", session_sd=0.0093, cell_sd=0.0118, about="run to run 1.5% (vLLM on GPUs, the low end)"),
    Scenario("prompts15", prompt_sd=0.15, about="plain + a speedup that varies by prompt (log-sd 0.15), identical "
                                                "on average"),
    Scenario("prompts30", prompt_sd=0.30, about="plain + a speedup that varies by prompt (log-sd 0.30), identical "
                                                "on average"),
)}

BASE = Engine(hiccup_p=0.002, hiccup_s=0.015)


def spec_rho(b: int) -> float:
    """A speculative step's cost in plain decode steps at batch size b (k=3, acceptance 0.6 a token):
    speculation pays about 1.4x at c=1, breaks even near c=4 and loses about 0.6x at c=16."""
    return float(np.interp(b, (1, 4, 16), (1.36, 1.81, 3.35)))


SPEC = replace(BASE, k=3, rho=spec_rho)
SPEC_TRUTH = "throughput 1.39x / 1.00x / 0.62x at c=1/4/16"  # 300 noise-free cells each
ALPHA = (6.0, 4.0)                 # Beta: a prompt's per-token acceptance probability, mean 0.6


@dataclass
class Workload:
    """One experiment's suites: prompt ids, prompt tokens, acceptance probability per prompt, and
    which drafts are right at each output position (greedy decoding: fixed per prompt); and, where a
    scenario's speedup varies by prompt, each plain server's pace per prompt (des.serve)."""
    ids: dict
    tokens: dict
    alpha: dict
    match: dict
    pace: dict = field(default_factory=dict)   # server -> suite -> tokens per decode step, per prompt

    @classmethod
    def draw(cls, rng: np.random.Generator, suites=SUITES, prompts=PROMPTS, prompt_sd: float = 0.0,
             servers=("baseline", "spec"), out_tokens=OUT_TOKENS) -> "Workload":
        """`prompt_sd` > 0: every server gets its own pace per prompt, lognormal with log-sd prompt_sd / sqrt(2),
        drawn independently, so the speedup of one over another varies by prompt with log-sd prompt_sd and
        the servers are exchangeable: identical on average for every estimand, a burst's slowest request
        included (one server's max is no likelier to be the larger)."""
        ids = {u: [f"{u}-{i:03d}" for i in range(prompts)] for u in suites}
        tokens = {u: np.clip(np.round(rng.lognormal(math.log(200), 0.6, prompts)), 16, 768) for u in suites}
        alpha = {u: rng.beta(*ALPHA, prompts) for u in suites}
        match = {u: rng.random((prompts, out_tokens + 8)) < alpha[u][:, None] for u in suites}
        pace = ({s: {u: np.exp(rng.normal(0.0, prompt_sd / math.sqrt(2), prompts)) for u in suites} for s in servers}
                if prompt_sd else {})
        return cls(ids, tokens, alpha, match, pace)

    def only(self, suites) -> "Workload":
        return Workload(*({u: d[u] for u in suites} for d in (self.ids, self.tokens, self.alpha, self.match)),
                        {s: {u: d[u] for u in suites} for s, d in self.pace.items()})


def run_order(servers: list[str], repeats: int) -> list[tuple[str, int]]:
    """Sessions in the order the workflow runs them (specmatch.run_order): repeat by repeat, servers
    in config order, then reversed, and so on."""
    out = []
    for r in range(1, repeats + 1):
        out += [(s, r) for s in (servers if r % 2 else servers[::-1])]
    return out


def run_to_run(rng: np.random.Generator, sc: Scenario, servers: list[str], suites, concurrencies, repeats: int,
               first_session: int = 0, total_sessions: int | None = None) -> dict:
    """Log time factor of every cell (server, suite, c, repeat): session + cell effects, drift by
    position in the run, the outlying session."""
    order = run_order(servers, repeats)
    total = total_sessions or (first_session + len(order))
    per_session = len(suites) * len(concurrencies)
    bad = order[rng.integers(len(order))] if sc.outlier else None
    out = {}
    for pos, (s, r) in enumerate(order, first_session):
        session = float(sc.draw(rng, (), sc.session_sd))
        j = 0
        for u in suites:
            for c in concurrencies:
                x = session + float(sc.draw(rng, (), sc.cell_sd_at(c)))
                if sc.drift:
                    x += sc.drift * ((pos + (j + 0.5) / per_session) / total - 0.5)
                if bad == (s, r):
                    x += math.log1p(sc.outlier)
                out[(s, u, c, r)] = x
                j += 1
    return out


def simulate_cells(rng: np.random.Generator, work: list[Workload], engines: dict, effects: list[dict],
                   repeats: int | dict, concurrencies=CONCURRENCIES, out_tokens: int = OUT_TOKENS) -> list[list]:
    """Cells (simulate.cell: CellResult and request frame) of every experiment: `engines` maps a
    server to its Engine, or to one Engine per experiment; `effects` per experiment, as run_to_run
    draws them; `repeats` per server (or one number). Every (concurrency) is one vectorised DES run."""
    from .simulate import cell

    E = len(work)
    out: list[list] = [[] for _ in range(E)]
    for c in concurrencies:
        keys, eng, pt, al, mt, pc = [], [], [], [], [], []
        for e, w in enumerate(work):
            for s, en in engines.items():
                reps = repeats[s] if isinstance(repeats, dict) else repeats
                for u in w.ids:
                    for r in (range(1, reps + 1) if isinstance(reps, int) else reps):
                        keys.append((e, s, u, r))
                        eng.append(en[e] if isinstance(en, (list, tuple)) else en)
                        pt.append(w.tokens[u])
                        al.append(w.alpha[u])
                        mt.append(w.match[u])
                        pc.append(w.pace.get(s, {}).get(u, np.ones(len(w.ids[u]))))
        if not keys:
            continue
        pt, al = np.array(pt), np.array(al)
        paced = any(w.pace for w in work)
        served = serve(eng, c, pt, np.full(pt.shape, out_tokens), rng, al, np.array(mt),
                       np.array(pc) if paced else None)
        factor = np.exp([effects[e][(s, u, c, r)] for e, s, u, r in keys])
        served = served.scaled(factor)
        out_tok = np.full(pt.shape[1], float(out_tokens))
        for i, (e, s, u, r) in enumerate(keys):
            one: Served = served.row(i)
            spec = eng[i].k > 0
            out[e].append(cell(s, u, c, r, one.e2e, one.ttft, out_tok, work[e].ids[u],
                               one.steps if spec else None, one.accepted if spec else None, pt[i],
                               int(one.steps.sum()) if spec else None, starts=one.start,
                               duration=float(one.duration[0]), drafted=one.drafted if spec else None,
                               session=f"{s}-r{r}"))
    return out


# -- tallies --------------------------------------------------------------------------------------
@dataclass
class Tally:
    """Verdict counts per experiment x metric x concurrency x decision (DECISIONS)."""
    counts: np.ndarray

    @classmethod
    def empty(cls, experiments: int) -> "Tally":
        return cls(np.zeros((experiments, len(METRICS), len(CONCURRENCIES), len(DECISIONS)), np.int64))

    def add(self, e: int, verdicts, server: str = "spec") -> None:
        for v in verdicts:
            if v.server != server or v.metric not in METRICS:
                continue
            d = "none" if v.speedup is None else getattr(v.verdict, "value", str(v.verdict))
            self.counts[e, METRICS.index(v.metric), CONCURRENCIES.index(v.concurrency), DECISIONS.index(d)] += 1

    def __add__(self, other: "Tally") -> "Tally":
        return Tally(np.concatenate([self.counts, other.counts]))

    @property
    def experiments(self) -> int:
        return self.counts.shape[0]

    def rate(self, kinds=("pays", "loses"), metric: str | tuple | None = None, c: int | None = None
             ) -> tuple[float, float, int]:
        """(rate, Monte-Carlo standard error, verdicts) of `kinds` among the verdicts with a figure.
        The error is a ratio estimator's over experiments (experiments are independent; their
        verdicts need not be)."""
        x = self.counts
        if metric is not None:
            ms = (metric,) if isinstance(metric, str) else metric
            x = x[:, [METRICS.index(m) for m in ms]]
        if c is not None:
            x = x[:, :, [CONCURRENCIES.index(c)]]
        x = x.sum((1, 2))
        k = x[:, [DECISIONS.index(d) for d in kinds]].sum(1).astype(float)
        n = x[:, :DECISIONS.index("none")].sum(1).astype(float)
        N = n.sum()
        if N == 0:
            return float("nan"), float("nan"), 0
        p = k.sum() / N
        E = len(n)
        se = math.sqrt(E / max(E - 1, 1) * float(((k - p * n) ** 2).sum())) / N
        return p, se, int(N)

    def design_effect(self, metric=None) -> float:
        """Variance of the rate over what independent verdicts would give (the verdicts' clustering)."""
        p, se, n = self.rate(metric=metric)
        return se ** 2 / (p * (1 - p) / n) if 0 < p < 1 else float("nan")


# -- the tasks (run in worker processes) ---------------------------------------------------------
def settings(bootstrap: int = 250, **kw):
    """The analysis's settings in the calibration: "what would decide it" (Settings.designs) only where
    asked for, as the verdicts do not depend on it and it costs ~90% of an analysis."""
    from ..deciding.analysis import Settings

    return Settings(**({"confidence": 0.9, "min_effect": 0.05, "bootstrap": bootstrap, "slo": dict(SLO),
                        "designs": False} | kw))


SPEC_INFO = {"method": "ngram", "num_speculative_tokens": SPEC.k}


def _decided(v) -> bool:
    return v is not None and v.speedup is not None and getattr(v.verdict, "value", v.verdict) != "inconclusive"


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
      max: 4}: alpha spent per look, specmatch.deciding.sequential); its verdicts' Tally and the repeats it
      used; `naive`: the same stopping with the fixed design's level at every look (the error it fixes);
    - hints (needs `designs`: "what would decide it" is worked out only then): for every inconclusive
      verdict at the smallest R whose `design` names a number of repeats that was analysed here (suite
      unchanged): (stated probability, decided there, reachable)."""
    from ..deciding.analysis import ServerInfo, Settings, analyse

    name, effect, n, rs = a["name"], a["effect"], a["experiments"], tuple(sorted(a["repeats"]))
    sc = SCENARIOS[name]
    rng = np.random.default_rng(a["seed"])
    rmax = rs[-1]
    work = [Workload.draw(rng, prompt_sd=sc.prompt_sd) for _ in range(n)]
    eff = [run_to_run(rng, sc, ["baseline", "spec"], SUITES, CONCURRENCIES, rmax) for _ in range(n)]
    cells = simulate_cells(rng, work, {"baseline": BASE, "spec": BASE.faster(1 + effect)}, eff, rmax)
    s = settings(a.get("bootstrap", 250), designs=bool(a.get("designs")))
    # the sequential design (repeats 2..rmax, alpha spent per look) is analysed beside the fixed one
    s_seq = Settings.of(vars(s) | {"repeats": {"min": 2, "max": rmax}}) if a.get("sequential") else None
    infos = {"spec": ServerInfo("spec", "vllm", "vllm", SPEC_INFO, 256)} if a.get("claims") else None
    out = {"tally": {R: Tally.empty(n) for R in rs}, "teeth": Tally.empty(n) if a.get("teeth") else None,
           "claims": {R: np.zeros((n, 3), np.int64) for R in rs} if a.get("claims") else None,
           "sequential": Tally.empty(n) if a.get("sequential") else None,
           "naive": Tally.empty(n) if a.get("sequential") else None, "used": np.zeros((n, 2), np.int64),
           "hints": []}
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
                        stop = next((R for R in looks if _decided(by_r[R].get((u, c, "output_throughput")))), rmax)
                        final += [v for (uu, cc, _), v in by_r[stop].items() if (uu, cc) == (u, c)]
                        if count:
                            out["used"][e] += (stop, rmax)
                tally.add(e, final)
        for key, v in (got[looks[0]] if looks else {}).items():
            d = getattr(v, "design", None)
            if v.speedup is None or _decided(v) or not d or d.get("suite_scale", 1) != 1 or d.get("repeats") not in rs:
                continue
            later = got[d["repeats"]].get(key)
            out["hints"].append((key[2], float(d["probability"]), _decided(later), bool(d.get("reachable"))))
    return out


VERIFY_OUTCOMES = ("verified", "failed", "undecided", "not derived")


def verification_outcome(an, rec, name: str) -> str:
    """verified | failed | undecided from the recommendation's typed verification (records.Verification,
    filled by analyse() when the derived server's cells are there); "not measured" and the like
    count as undecided. Before the typed record existed, the summary's verify() dict was read."""
    v = getattr(rec, "verified", None)
    if v is None:
        from ..deciding import analysis

        rec.derived_server = rec.derived_server or name
        v = analysis.verify(an, rec, name)
    get = (lambda k: v.get(k)) if isinstance(v, dict) else (lambda k: getattr(v, k, None))
    x = get("outcome")
    x = getattr(x, "value", x)
    if isinstance(x, str):
        return x if x in VERIFY_OUTCOMES[:3] else "undecided"
    m = get("matches_best")
    return "verified" if m is True else "failed" if m is False else "undecided"


def verify_task(a: dict) -> dict:
    """Verification of the recommended deployment as the workflow runs it: the primary grid (three
    suites, R repeats; the recommendation made on the first) of a baseline and a speculative server
    that pays 1.4x at c=1, breaks even at c=4 and loses 0.6x at c=16 (SPEC_TRUTH); its
    recommendation, when it is a vLLM schedule, deployed in the same simulated server as
    `spec__recommended` and measured on the grid after the primary repeats (its own sessions), once
    with a switch that costs nothing and once with one whose switched-off steps cost 15% more.
    Counts of each outcome per variant; `not derived` where the verdicts gave no schedule to measure."""
    from ..deciding.analysis import ServerInfo, analyse, server_k

    n, repeats = a["experiments"], a.get("repeats", 2)
    rng = np.random.default_rng(a["seed"])
    sc = SCENARIOS[a.get("name", "plain")]
    s = settings(a.get("bootstrap", 250))
    suites = [SUITES[0]]                   # the recommendation's suite; the primary grid has all three
    infos = {"spec": ServerInfo("spec", "vllm", "vllm", SPEC_INFO, 256)}
    work = [Workload.draw(rng) for _ in range(n)]
    servers = ["baseline", "spec", "spec__recommended"]
    eff = []
    for _ in range(n):
        x = run_to_run(rng, sc, servers[:2], SUITES, CONCURRENCIES, repeats, total_sessions=3 * repeats)
        y = run_to_run(rng, sc, servers[2:], suites, CONCURRENCIES, repeats, 2 * repeats, 3 * repeats)
        eff.append(x | y)
    primary = simulate_cells(rng, work, {"baseline": BASE, "spec": SPEC}, eff, repeats)
    recs = []
    for e in range(n):
        an = analyse(primary[e], "baseline", s, infos, suites, primary=servers[:2])
        rec = an.recommendations[0] if an.recommendations else None
        recs.append(rec if rec is not None and rec.action == "schedule" and rec.vllm_schedule else None)
    todo = [e for e, r in enumerate(recs) if r is not None]
    out = {"correct": dict.fromkeys(VERIFY_OUTCOMES, 0), "costly": dict.fromkeys(VERIFY_OUTCOMES, 0),
           "schedules": [r.vllm_schedule for r in recs if r is not None]}
    for v in ("correct", "costly"):
        out[v]["not derived"] = n - len(todo)
    if not todo:
        return out
    for variant, cost in (("correct", 1.0), ("costly", 1 + SWITCH_COST)):
        engines = []
        for e in todo:
            spec = {**SPEC_INFO, "num_speculative_tokens_per_batch_size": recs[e].vllm_schedule}
            on = tuple(server_k(spec, b) > 0 for b in range(0, 257))
            engines.append(replace(SPEC, on=on.__getitem__, off_cost=cost))
        one = [work[e].only(suites) for e in todo]
        derived = simulate_cells(rng, one, {"spec__recommended": engines}, [eff[e] for e in todo], repeats)
        for i, e in enumerate(todo):
            info_d = replace(infos["spec"], name="spec__recommended",
                             speculative={**SPEC_INFO, "num_speculative_tokens_per_batch_size": recs[e].vllm_schedule})
            an = analyse(primary[e] + derived[i], "baseline", s, infos | {"spec__recommended": info_d}, suites,
                         primary=servers[:2])
            rec = next((r for r in an.recommendations if r.server == "spec"), None)
            out[variant][verification_outcome(an, rec, "spec__recommended") if rec else "undecided"] += 1
    return out


# -- k sweeps and external endpoints: which k at which load, with known truth -------------
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
    (specmatch.deciding.measurements), so the ratio of the latency sums. Not the cells' durations: at
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
    from ..deciding.comparison import compare, decision, look_level
    from ..stats import t_ppf

    cmps = {k: compare(m, rr, n, "base", "s", c, s.recommend_metric) for k, n in ks.items() if m.repeats(n, "s", c)}
    cmps = {k: x for k, x in cmps.items() if x.estimate is not None}
    strict = replace(s, confidence=1 - (1 - s.confidence) / max(len(cmps), 1))
    out = []
    for k, x in cmps.items():   # the verdict's interval at the strict look's level (comparison.decide's)
        t = t_ppf(0.5 + look_level(x, strict) / 2, x.dof)
        if decision(x.estimate - t * x.se, x.estimate + t * x.se, math.log(1 + s.min_effect),
                    x.run_to_run).value == "pays":
            out.append(k)
    return sorted(out)


def _sequential(cells: list, s, ks: dict, info) -> list:
    """The cells the sequential design measures: repeats 1-2 of every cell, and repeat 3 of the cells
    round 2's plan (deciding.rounds.plan, on the k choice) continues."""
    from ..deciding.analysis import Analysis
    from ..deciding.krecommend import recommend
    from ..deciding.measurements import Measurements
    from ..deciding.noise import run_to_run as rr_of
    from ..deciding.rounds import plan

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
    from ..deciding.deployment import ServerInfo
    from ..deciding.krecommend import recommend
    from ..deciding.measurements import Measurements
    from ..deciding.noise import run_to_run as rr_of

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


def _rate(flags: list) -> tuple[float, float, int]:
    """(share, binomial Monte-Carlo se, n): experiments are independent, one outcome each."""
    n = len(flags)
    p = sum(map(bool, flags)) / n if n else float("nan")
    return p, math.sqrt(p * (1 - p) / n) if n else float("nan"), n


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
        out.setdefault("speculate_at", {})[c] = _rate([k not in (None, 0) for k in at])
        out.setdefault("off_over_beaten", {})[c] = _rate([r["k_at"][c] == 0 and bool(r["paying"][c]) for r in rows])
        out.setdefault("off_over_beaten_90", {})[c] = _rate([r["k_at"][c] == 0 and bool(r["pays"].get(c)) for r in rows])
        out.setdefault("unsupported", {})[c] = _rate([r["k_at"][c] not in (None, 0) and not r["paying"][c]
                                                      for r in rows])
        out.setdefault("k_at", {})[c] = {k: _rate([x == k for x in at]) for k in sorted(set(at), key=str)}
        out.setdefault("wrong", {})[c] = _rate([x is not None and x != sc.best(c) for x in at])
    out["above"] = _rate([r["above"] not in (None, 0) for r in rows])
    out["anywhere"] = _rate([any(k not in (None, 0) for k in [*r["k_at"].values(), r["above"]]) for r in rows])
    out["actions"] = {a: _rate([r["action"] == a for r in rows]) for a in sorted({r["action"] for r in rows})}
    return out


def kcompare_task(a: dict) -> dict:
    """`experiments` null sweeps of KScenario `name` at a fixed `repeats`: each member's comparison with the
    baseline at each concurrency (comparison.compare, as best_k makes it), its log estimate, standard
    error and degrees of freedom, and whether it pays at alpha and at alpha / K. Light (no choice is
    made), so it can run many experiments: where every k equals off on average, the spread of the
    estimates over experiments against the stated standard errors says whether the intervals are right
    at a concurrency (k_interval_rates), apart from any rule built on them."""
    from ..deciding.comparison import compare
    from ..deciding.measurements import Measurements
    from ..deciding.noise import run_to_run as rr_of

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
    from ..stats import t_ppf

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
        out[c] = {"ratio": (ratio, se_ratio, n), "pays_alpha": _rate(one), "pays_alpha_k": _rate(strict),
                  "some_k": _rate(list(by_e.values()))}
    return out


EXT_TRUTH = ((1, 1.30), (16, 0.60))   # 1.3x up to 4 running requests, 0.6x above (c=4 runs at 1.3x too)
EXT_CONCURRENCIES = (1, 4, 16)


def external_task(a: dict) -> dict:
    """`experiments` runs of three external endpoints (engine external, flavor vllm, no `speculative`
    configured, max_batch 0 as their launch records say): the baseline `base`, its twin `twin`, and
    `spec`, drafting k=4 at 1.3x up to 4 running requests and 0.6x above (EXT_TRUTH), at c = 1, 4,
    16 with `repeats` fixed repeats and K_NOISE[`noise`] run to run (default quiet: scripted endpoints
    are steady), analysed by analysis.analyse with the recommendation suite.
    Per run: whether the twin got a recommendation, and spec's action, schedule (valid by vLLM's rules
    or the error), k per batch size 1..16 as vLLM would run it, crossover and verification outcome."""
    from ..deciding.analysis import analyse
    from ..deciding.deployment import ServerInfo, server_k, validate_schedule

    n = a["experiments"]
    rng = np.random.default_rng(a["seed"])
    R = a.get("repeats", 3)
    s = settings(a.get("bootstrap", 250), repeats=R)
    engines = {"base": BASE, "twin": BASE, "spec": calibrated(4, EXT_TRUTH, step_at=4)}
    infos = {x: ServerInfo(x, "external", "vllm", None, a.get("max_batch", 0)) for x in ("twin", "spec")}
    work = [Workload.draw(rng, ("s",), K_PROMPTS, out_tokens=K_OUT_TOKENS) for _ in range(n)]
    eff = [run_to_run(rng, K_NOISE[a.get("noise", "quiet")], list(engines), ("s",), EXT_CONCURRENCIES, R)
           for _ in range(n)]
    cells = simulate_cells(rng, work, engines, eff, R, EXT_CONCURRENCIES, K_OUT_TOKENS)
    rows = []
    for e in range(n):
        an = analyse(cells[e], "base", s, infos, ["s"])
        recs = {r.server: r for r in an.recommendations}
        r = recs.get("spec")
        row = {"twin": "twin" in recs, "action": r.action if r else None, "schedule": r.vllm_schedule if r else None,
               "crossover": r.crossover.point if r and r.crossover else None, "text": r.text if r else "",
               "verified": r.verified.outcome.value if r and r.verified else None, "valid": None, "k": None,
               "verdicts": {c: v.verdict.value for c in EXT_CONCURRENCIES
                            for v in [an.verdict("spec", "s", c, s.recommend_metric)] if v is not None}}
        if r is not None and r.vllm_schedule:
            try:
                validate_schedule(r.vllm_schedule)
                row["valid"] = True
            except ValueError as err:
                row["valid"] = str(err)
            spec = {**(an.infos["spec"].speculative or {}), "num_speculative_tokens_per_batch_size": r.vllm_schedule}
            row["k"] = [server_k(spec, b) for b in range(1, 17)]
        rows.append(row)
    return {"rows": rows}


def external_rates(rows: list) -> dict:
    """(share, Monte-Carlo se, n) of: a recommendation for the twin (configured with no speculation,
    drafting nothing: should be none); a valid vLLM schedule for spec (`schedule`); a schedule that
    follows the verdicts (`follows`: drafting at each measured concurrency where speculation pays and off
    where it does not, in one block from batch 1: drafts below the switch, off above it; share of the
    runs with a schedule); the issue's verdicts, pays at c=1 and 4 and loses at 16 (`pattern`), and among
    those a schedule that drafts at batch 1-4 and is off from the crossover on, at 16 included (`right`);
    a schedule's verification NOT_VERIFIABLE (nothing restarts an external endpoint; share of the
    schedules); a text with an empty list ("pays at " followed by nothing)."""
    sched = [r for r in rows if r["valid"] is True]

    def follows(r) -> bool:
        on = [k > 0 for k in r["k"]]
        block = on == sorted(on, reverse=True)
        return block and all(on[c - 1] == (r["verdicts"].get(c) == "pays") for c in EXT_CONCURRENCIES)
    pattern = [r for r in rows if [r["verdicts"].get(c) for c in EXT_CONCURRENCIES] == ["pays", "pays", "loses"]]
    return {"n": len(rows), "twin": _rate([r["twin"] for r in rows]), "schedule": _rate([bool(r["k"]) for r in sched]
                                                                                      + [False] * (len(rows) - len(sched))),
            "follows": _rate([follows(r) for r in sched]), "pattern": _rate([r in pattern for r in rows]),
            "right": _rate([r["valid"] is True and all(k > 0 for k in r["k"][:4]) and r["k"][15] == 0
                            and follows(r) for r in pattern]),
            "not_verifiable": _rate([r["verified"] == "not verifiable" for r in sched]),
            "empty_list": _rate([re.search(r"\bat\s*(?:$|[;,.()])", r["text"]) is not None for r in rows]),
            "switch": [next((b for b, k in enumerate(r["k"], 1) if k == 0), None) for r in sched],
            "actions": {x: _rate([r["action"] == x for r in rows]) for x in sorted({str(r["action"]) for r in rows})}}


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


# -- what would decide it, carried out ---------------------------------------------------------------
HINT_POPULATIONS = {
    "aa": ("plain", "identical servers"),
    "effects": ("plain", "a uniform speedup per experiment, log-uniform within ±12%"),
    "quiet": ("quiet", "identical servers on a quiet machine"),
}


def _hint_engines(name: str, rng: np.random.Generator) -> dict:
    if name == "effects":
        return {"baseline": BASE, "spec": BASE.faster(math.exp(rng.uniform(-0.12, 0.12)))}
    return {"baseline": BASE, "spec": BASE}


def carry_out(rng: np.random.Generator, sc: Scenario, eng: dict, work: Workload, eff: dict, cells: list, design: dict,
              today: int, s, metrics=("output_throughput",)) -> dict:
    """A verdict's named design (Verdict.design) carried out on its experiment as the workflow would:
    more repeats of today's suite (suite_scale 1) add fresh sessions' cells to today's; a larger suite
    reruns every cell with ceil(PROMPTS x g) new prompts in fresh sessions (today's data are not part
    of it). Analysed under `s`'s design with the named repeats (fixed: one look at R'; sequential:
    repeats {min, max: R'}, every look from min on, decided at the first that decides). Returns
    {(suite, concurrency, metric): decided} of the second server."""
    from ..deciding import comparison
    from ..deciding.analysis import Settings, analyse

    Rn, g = int(design["repeats"]), float(design["suite_scale"])
    servers = list(eng)
    if g == 1:
        new = run_to_run(rng, sc, servers, SUITES, CONCURRENCIES, Rn)
        new = {k: (eff[k] if k[3] <= today else v) for k, v in new.items()}
        data = cells + (simulate_cells(rng, [work], eng, [new], range(today + 1, Rn + 1))[0] if Rn > today else [])
        first = today + 1
    else:
        big = Workload.draw(rng, prompts=int(math.ceil(PROMPTS * g)))
        data = simulate_cells(rng, [big], eng, [run_to_run(rng, sc, servers, SUITES, CONCURRENCIES, Rn)], Rn)[0]
        first = 1
    seq = s.design.sequential and Rn > s.design.min
    looks = list(range(max(first, s.design.min), Rn + 1)) if seq else [Rn]
    at = Settings.of(vars(s) | {"repeats": {"min": s.design.min, "max": Rn} if seq else Rn})
    keep = comparison.what_would_decide   # the carried-out verdicts' own hints are not asked for
    comparison.what_would_decide = lambda cmp, s_: ("", None)
    out: dict = {}
    try:
        for R in looks:
            for v in analyse([x for x in data if x[0].repeat <= R], "baseline", at).verdicts:
                if v.server == "spec" and v.metric in metrics:
                    key = (v.suite, v.concurrency, v.metric)
                    out[key] = out.get(key, False) or _decided(v)
    finally:
        comparison.what_would_decide = keep
    return out


def hint_task(a: dict) -> dict:
    """'What would decide it', checked by carrying it out: `experiments` experiments of
    HINT_POPULATIONS[`name`], analysed at R = 2 (fixed design, or `sequential`: repeats {min: 2, max: 3}),
    throughput only; for every inconclusive verdict, its named design carried out on the same
    experiment (carry_out) and the verdict read again. Returns {"rows": [(experiment, stated
    probability, reachable, decided, repeats, suite scale)]}."""
    from ..deciding.analysis import Settings, analyse

    scenario, _ = HINT_POPULATIONS[a["name"]]
    sc = SCENARIOS[scenario]
    rng = np.random.default_rng(a["seed"])
    s = Settings.of(vars(settings(a.get("bootstrap", 250), slo={}, designs=True))
                    | {"repeats": {"min": 2, "max": 3} if a.get("sequential") else 2})
    rows = []
    for e in range(a["experiments"]):
        work, eng = Workload.draw(rng), _hint_engines(a["name"], rng)
        eff = run_to_run(rng, sc, list(eng), SUITES, CONCURRENCIES, 2)
        cells = simulate_cells(rng, [work], eng, [eff], 2)[0]
        an = analyse(cells, "baseline", s)
        done: dict = {}
        for v in an.verdicts:
            if v.server != "spec" or v.metric != "output_throughput" or v.speedup is None or _decided(v) or not v.design:
                continue
            d = v.design
            key = (d["repeats"], d["suite_scale"])
            if key not in done:
                done[key] = carry_out(rng, sc, eng, work, eff, cells, d, 2, s)
            rows.append((e, float(d["probability"]), bool(d["reachable"]),
                         bool(done[key].get((v.suite, v.concurrency, v.metric))), d["repeats"], d["suite_scale"]))
    return {"rows": rows}


def hint_rates(rows: list, lo: float = 0.0, hi: float = 1.01, reachable: bool | None = None
               ) -> tuple[float, float, float, int]:
    """(mean stated probability, share decided, its Monte-Carlo error, n) of carried-out hints whose
    stated probability is in [lo, hi) (and reachable, where given). The error is a ratio estimator's
    over experiments (rows carry their experiment; hints of one experiment share its sessions)."""
    x = [r for r in rows if lo <= r[1] < hi and (reachable is None or r[2] == reachable)]
    if not x:
        return float("nan"), float("nan"), float("nan"), 0
    ids = np.unique([r[0] for r in x], return_inverse=True)[1]
    k = np.bincount(ids, [float(r[3]) for r in x])
    m = np.bincount(ids).astype(float)
    p = k.sum() / m.sum()
    E = len(m)
    se = math.sqrt(E / max(E - 1, 1) * float(((k - p * m) ** 2).sum())) / m.sum()
    return float(np.mean([r[1] for r in x])), float(p), se, len(x)


# -- running many -------------------------------------------------------------------------------
def workers() -> int:
    """Worker processes (SPECMATCH_CALIBRATION_WORKERS; default: up to 2, the cores a default run has)."""
    return max(1, int(os.environ.get("SPECMATCH_CALIBRATION_WORKERS", min(2, os.cpu_count() or 1))))


def _call(job: tuple):
    fn, args = job
    return fn(args)


def run_tasks(jobs: list[tuple], n_workers: int | None = None) -> list:
    """[(function, args)] -> results, in order; in `n_workers` processes (spawned: polars does not
    survive a fork), each single-threaded."""
    n_workers = workers() if n_workers is None else n_workers
    if n_workers <= 1 or len(jobs) <= 1:
        return [_call(j) for j in jobs]
    import multiprocessing

    for k in ("POLARS_MAX_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(k, "1")
    with ProcessPoolExecutor(n_workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_call, jobs, chunksize=1))


def seed_of(*key) -> int:
    import zlib

    return zlib.crc32(repr(key).encode())


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
    a["hints"] += b["hints"]
    return a


def compute(specs: dict, seed: int = 0, chunk: int = 10, bootstrap: int = 250, n_workers: int | None = None) -> dict:
    """Every experiment of every spec in one pool (chunks of `chunk` experiments, the slowest first).
    `specs`: key -> dict(kind="experiment", name, effect, repeats=(R, ...), experiments, teeth, claims,
    sequential), dict(kind="verify", name, experiments, repeats) or dict(kind="hints", name,
    experiments, sequential) (optional: chunk, bootstrap). Result: key -> experiment_task's,
    verify_task's or hint_task's output, summed over chunks."""
    jobs, owner, cost = [], [], []
    for key, spec in specs.items():
        fn = {"verify": verify_task, "ksweep": ksweep_task, "external": external_task,
              "kcompare": kcompare_task, "hints": hint_task}.get(spec["kind"], experiment_task)
        n = spec["experiments"]
        step = spec.get("chunk", chunk)
        for i in range(0, n, step):
            args = {**spec, "experiments": min(step, n - i), "bootstrap": spec.get("bootstrap", bootstrap),
                    "seed": seed_of(seed, tuple(sorted((k, str(v)) for k, v in spec.items())), i)}
            jobs.append((fn, args))
            owner.append(key)
            rs = spec.get("repeats", (2,))
            rs = rs if isinstance(rs, (tuple, list)) else (rs,)
            cost.append(args["experiments"] * (1.2 * spec["repeats"] if fn is verify_task else 12 if fn is hint_task
                                               else sum(rs)))
    order = sorted(range(len(jobs)), key=lambda i: -cost[i])
    res = run_tasks([jobs[i] for i in order], n_workers)
    out: dict = {}
    for i, r in sorted(zip(order, res), key=lambda x: x[0]):
        out[owner[i]] = r if owner[i] not in out else _merge(out[owner[i]], r)
    return out


def verified_shares(counts: dict) -> dict:
    """Share of each outcome among the experiments whose recommendation was measured."""
    n = sum(counts[k] for k in VERIFY_OUTCOMES[:3])
    return {k: counts[k] / n if n else float("nan") for k in VERIFY_OUTCOMES[:3]} | {"derived": n}


def hint_calibration(hints: list, metric: str | None = "output_throughput") -> tuple[float, float, int]:
    """(mean stated probability, share decided, n) of the 'what would decide it' designs checked."""
    h = [x for x in hints if metric is None or x[0] == metric]
    if not h:
        return float("nan"), float("nan"), 0
    return float(np.mean([x[1] for x in h])), float(np.mean([x[2] for x in h])), len(h)


def claim_rates(claims: np.ndarray) -> dict:
    """A/A: share of recommendations with a crossover, and that speculate somewhere (keep/schedule)."""
    recs = claims[:, 0].sum()
    return {"recommendations": int(recs), "crossover": claims[:, 1].sum() / recs if recs else float("nan"),
            "speculate": claims[:, 2].sum() / recs if recs else float("nan")}


# -- the table ----------------------------------------------------------------------------------
def fmt(r: tuple) -> str:
    p, se, n = r
    return "   n/a    " if not n else f"{p:5.1%}±{se:4.1%}"


def pct(r: tuple) -> str:
    return f"{r[0]:.0%}" if r[2] else "-"


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
                                    sequential=name == "plain", designs=name == "plain")
    for e in EFFECTS:
        specs[("power", e)] = dict(kind="experiment", name="plain", effect=e, repeats=(2, 3, 4),
                                   experiments=power_experiments, sequential=True, designs=True)
    for name in ("plain", "quiet"):
        specs[("verify", name)] = dict(kind="verify", name=name, experiments=verify_experiments, repeats=2)
    hint_experiments = max(10, power_experiments // 2)
    for name in HINT_POPULATIONS:
        specs[("hints", name)] = dict(kind="hints", name=name, experiments=hint_experiments, chunk=3)
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
      f"specmatch.deciding.sequential): false calls {fmt(seq.rate())} (throughput {fmt(seq.rate(metric='output_throughput'))}); "
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
        mp, dec, nh = hint_calibration(pw["hints"])
        power = seq.rate(('pays',), metric='output_throughput')
        mean_r = 4 * used[:, 0].sum() / used[:, 1].sum()
        equal = next((R for R in (2, 3, 4) if pw["tally"][R].rate(('pays',), metric='output_throughput')[0]
                      >= power[0]), None)
        vs = (f"a fixed design of equal power needs R={equal}: {1 - mean_r / equal:+.0%} repeats saved"
              if equal else "no fixed design up to R=4 has its power")
        p(f"  {e:.0%}: sequential 2..4 pays {fmt(power)} with {mean_r:.2f} repeats per cell on average "
          f"({used[:, 0].sum() / used[:, 1].sum():.0%} of R=4's); {vs}; 'what would decide it' at R=2 (throughput): "
          f"stated {mp:.0%}, decided {dec:.0%} of {nh}")
    mp, dec, nh = hint_calibration(pl0["hints"])
    p(f"  A/A: 'what would decide it' at R=2 (throughput), where it named 3 or 4 repeats: stated {mp:.0%}, "
      f"decided {dec:.0%} of {nh}")
    p(f"\n'What would decide it', carried out (R=2, throughput; every inconclusive verdict's named design run on "
      f"its experiment as the workflow would, the verdict read again; {hint_experiments} experiments each):")
    for name, (_, about) in HINT_POPULATIONS.items():
        rows = res[("hints", name)]["rows"]
        parts = []
        for what, reach in (("'decides it with probability p'", True), ("'more data is unlikely to decide it'", False)):
            st, dec, se, n = hint_rates(rows, reachable=reach)
            parts.append(f"{what}: stated {st:.0%}, decided {dec:.0%} ± {se:.0%} of {n}" if n else f"{what}: none")
        p(f"  {name} ({about}): " + "; ".join(parts))
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


def main(argv: list[str] | None = None) -> int:
    """`python -m specmatch calibrate`: the full calibration table (module docstring)."""
    import argparse

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
