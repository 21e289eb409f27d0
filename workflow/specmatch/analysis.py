"""Deciding: verdicts, crossovers and recommendations from repeated, paired measurements.

The experiment (DESIGN.md, "Deciding"): every server measures the same prompts at every
concurrency, and every cell is repeated in fresh server sessions (repeats), interleaved across
servers. So a comparison has two levels of noise, and its interval includes both:

- within a repeat, request to request: a **paired bootstrap by prompt** (the speculative server
  and the baseline served the same prompts; each resample draws prompts, both servers' requests
  for them together). Closed loop, throughput is sum(output tokens) over the time C workers take
  to serve the drawn requests (the cell's own definition, tail included); open loop (a request
  rate), sum(output tokens) / cell duration.
- across repeats, session to session: the **run-to-run variance** tau^2 of one configuration's
  log figure, estimated from every configuration's repeats at once (a robust, median-based fit:
  one outlying configuration cannot set it), and added to each repeat's within-repeat variance.
  The repeats' log ratios are averaged; the interval is Student t with Satterthwaite's degrees
  of freedom.

With one repeat there is no measure of run-to-run variance: intervals are request-level only, the
summary says so, and a verdict then needs an effect beyond `min_effect`.

Verdicts are typed (records.Decision): pays (interval above 1, not equivalent), loses (below),
equivalent (interval inside +/-min_effect: a decisive "no difference"), inconclusive (with the
repeats that would decide it). Their error rates are checked by simulation (specmatch.simulate,
tests/test_calibration.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from .records import METRICS, CellResult, Crossover, Decision, Recommendation, Region, Verdict
from .stats import chi2_cdf, t_ppf

LATENCY = {"tpot", "e2el"}  # lower is better: speedup = baseline / server
LABEL = {"output_throughput": "throughput", "goodput": "goodput", "tpot": "TPOT", "e2el": "end-to-end latency"}


@dataclass
class Settings:
    """The decision rules' knobs (config `summary`). min_effect is the smallest speedup a team would act on:
    it defines "equivalent" and, with one repeat, the margin a verdict must clear."""
    confidence: float = 0.9
    bootstrap: int = 1000
    min_effect: float = 0.05
    slo: dict = field(default_factory=dict)        # ttft_ms, tpot_ms, e2el_ms (vLLM's --goodput)
    recommend_metric: str = "output_throughput"
    seed: int = 0

    @classmethod
    def of(cls, d: dict) -> "Settings":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(m for m in METRICS if m != "goodput" or self.slo)


# -- one cell's requests, as arrays -----------------------------------------------------------
def closed_loop_makespan(e2e: np.ndarray, c: int) -> np.ndarray:
    """How long C workers take to serve requests of these latencies in this order, each worker taking
    the next request when it is free (the cell's closed loop), for every row of resamples at once.

    A cell's throughput is its tokens over its duration (vLLM's definition). With few requests per
    worker that duration carries the tail: which requests happen to finish last. Little's law
    (C * tokens / sum of latencies) has no tail, so a bootstrap of it misses that variance, and with
    one repeat (nothing else measures it) identical servers were called different 3x too often."""
    e2e = np.atleast_2d(e2e)
    rows, n = e2e.shape
    if c >= n:
        return e2e.max(-1)
    free = np.zeros((rows, c))
    r = np.arange(rows)
    for i in range(n):
        j = free.argmin(-1)
        free[r, j] += e2e[:, i]
    return free.max(-1)


@dataclass
class Arrays:
    """A cell's successful requests as numpy arrays, keyed by (prompt, pass) for pairing."""
    keys: list
    out: np.ndarray
    e2e: np.ndarray
    ttft: np.ndarray
    tpot: np.ndarray
    good: np.ndarray
    closed: bool
    concurrency: int
    duration: float
    prompts: list = field(default_factory=list)
    spec: dict = field(default_factory=dict)  # per request: num_spec_steps, num_draft_tokens, num_accepted_tokens
    flavor: str = "vllm"

    @classmethod
    def of(cls, cell: CellResult, requests: pl.DataFrame, slo: dict) -> "Arrays":
        ok = requests.filter(pl.col("ok"))
        out = ok["output_tokens"].cast(pl.Float64).to_numpy()
        e2e = ok["e2e_s"].cast(pl.Float64).to_numpy()
        ttft = ok["ttft_s"].cast(pl.Float64).fill_null(np.nan).to_numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(out > 1, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
        good = np.ones(len(out), bool)
        if slo.get("ttft_ms") is not None:
            good &= ttft * 1000 <= slo["ttft_ms"]
        if slo.get("tpot_ms") is not None:  # vLLM: a request of one token has TPOT 0
            good &= np.nan_to_num(tpot, nan=0.0) * 1000 <= slo["tpot_ms"]
        if slo.get("e2el_ms") is not None:
            good &= e2e * 1000 <= slo["e2el_ms"]
        prompts = ok["prompt_id"].to_list()
        keys = [f"{p}#{k}" for p, k in zip(prompts, ok["pass_index"].to_list())]
        spec = {k: ok[k].cast(pl.Float64).fill_null(np.nan).to_numpy() if k in ok.columns else np.full(len(out), np.nan)
                for k in ("num_spec_steps", "num_draft_tokens", "num_accepted_tokens")}
        return cls(keys, out, e2e, ttft, tpot, good, cell.request_rate in ("inf", None), cell.concurrency,
                   cell.duration or 0.0, prompts, spec, cell.flavor)

    def stat(self, metric: str, idx: np.ndarray) -> np.ndarray:
        """The metric over the requests `idx` (rows of resamples): the bootstrap's estimator."""
        if metric in ("output_throughput", "goodput"):
            num = (self.out if metric == "output_throughput" else self.good.astype(float))[idx].sum(-1)
            if self.closed:  # over the closed loop's own duration, as the cell's figure is
                return num / closed_loop_makespan(self.e2e[idx], self.concurrency)
            return num / self.duration * (len(self.out) / idx.shape[-1])
        vals = (self.tpot if metric == "tpot" else self.e2e)[idx]
        with np.errstate(invalid="ignore"):
            return np.nanmean(vals, axis=-1)

    def point(self, metric: str, cell: CellResult) -> float | None:
        """The cell's own figure: vLLM's definitions (throughput and goodput over the cell's duration)."""
        if metric == "output_throughput":
            return cell.output_throughput
        if metric == "goodput":
            return float(self.good.sum()) / cell.duration if cell.duration else None
        vals = self.tpot if metric == "tpot" else self.e2e
        vals = vals[~np.isnan(vals)]
        return float(vals.mean()) if vals.size else None


# -- the measurements ---------------------------------------------------------------------------
@dataclass
class Measurements:
    """Every cell, indexed by (server, suite, concurrency, repeat)."""
    cells: dict
    arrays: dict
    settings: Settings

    @classmethod
    def of(cls, cells: list[tuple[CellResult, pl.DataFrame]], settings: Settings) -> "Measurements":
        c, a = {}, {}
        for cell, req in cells:
            k = (cell.server, cell.suite, cell.concurrency, cell.repeat)
            c[k] = cell
            a[k] = Arrays.of(cell, req, settings.slo)
        return cls(c, a, settings)

    def servers(self) -> list[str]:
        return list(dict.fromkeys(k[0] for k in self.cells))

    def repeats(self, server: str, suite: str, c: int) -> list[int]:
        return sorted(k[3] for k in self.cells if k[:3] == (server, suite, c))


def _rng(settings: Settings, *key) -> np.random.Generator:
    """A generator seeded by the settings and the comparison: results do not depend on order."""
    import zlib

    return np.random.default_rng([settings.seed, zlib.crc32(repr(key).encode())])


def _log(v) -> float | None:
    return math.log(v) if v is not None and v > 0 and math.isfinite(v) else None


# -- run-to-run variance ------------------------------------------------------------------------
@dataclass
class RunToRun:
    """tau^2 per metric: the session-to-session variance of a configuration's log figure."""
    tau2: dict
    dof: dict             # effective degrees of freedom of each estimate
    configurations: int
    repeats: int          # the largest number of repeats of a configuration

    def sd(self, metric: str) -> float | None:
        t = self.tau2.get(metric)
        return math.sqrt(t) if t is not None else None


def cell_log_stat(m: Measurements, key, metric: str) -> float | None:
    """Log figure of one cell (its repeats' spread is the run-to-run variation)."""
    return _log(m.arrays[key].point(metric, m.cells[key]))


def run_to_run(m: Measurements, servers: list[str] | None = None) -> RunToRun:
    """Robust pooled estimate of tau^2 from every configuration measured in two repeats or more.

    Every repeat of a configuration measures the same prompts, so its log figure y_kr varies from
    repeat to repeat only by the server session and the requests' own noise: y_kr = mu_k + d_kr,
    d ~ N(0, tau^2). For each configuration k, Q_k = sum_r (y_kr - mean_k)^2 / tau^2 is chi-square
    with R_k - 1 degrees of freedom; tau^2 is the value at which the median over configurations of
    that distribution function is one half. A median, so one outlying configuration (a cell that
    ran beside a noisy neighbour) cannot set the margin."""
    groups: dict = {}
    for key in m.cells:
        if servers is None or key[0] in servers:
            groups.setdefault(key[:3], []).append(key)
    tau2, dofs, nconf, rmax = {}, {}, 0, 1
    for metric in m.settings.metrics:
        stats, resid = [], []
        for cfg, keys in groups.items():
            got = [(k[3], y) for k, y in ((k, cell_log_stat(m, k, metric)) for k in keys) if y is not None]
            if len(got) >= 2:
                ys = np.array([y for _, y in got])
                stats.append((float(((ys - ys.mean()) ** 2).sum()), len(ys) - 1))
                resid += [(cfg[0], r, y - ys.mean(), len(ys)) for r, y in got]
                rmax = max(rmax, len(ys))
        if not stats:
            continue
        nconf = max(nconf, len(stats))

        def median_cdf(t2):
            return float(np.median([chi2_cdf(q / t2, d) for q, d in stats]))

        if max(q for q, _ in stats) == 0:
            tau2[metric] = 0.0
        else:
            lo, hi = 0.0, max(q for q, _ in stats)
            while median_cdf(hi) > 0.5:
                hi *= 4
            for _ in range(100):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if median_cdf(mid) > 0.5 else (lo, mid)
            tau2[metric] = (lo + hi) / 2
        dofs[metric] = _tau2_dof(tau2[metric], stats, resid)
    return RunToRun(tau2, dofs, nconf, rmax)


def _tau2_dof(t2: float, stats: list, resid: list) -> float:
    """Degrees of freedom of the tau^2 estimate. Part of run-to-run variation belongs to a server
    session and is shared by every cell of it (so it is learnt from sessions, not cells), part to
    each cell: their shares are estimated from how much the residuals of one session move together,
    and Satterthwaite's rule combines the two; a median has about 2/pi the efficiency of a mean."""
    cells_dof = sum(d for _, d in stats)
    if t2 <= 0 or not resid:
        return max(1.0, cells_dof * 2 / math.pi)
    by_session: dict = {}
    for server, r, e, n in resid:
        by_session.setdefault((server, r), []).append((e, n))
    servers = {k[0] for k in by_session}
    sessions_dof = max(1, len(by_session) - len(servers))
    k_bar = len(resid) / len(by_session)  # cells per session
    shrink = np.mean([n / (n - 1) for _, _, _, n in resid])
    v = float(np.mean([np.mean([e for e, _ in x]) ** 2 for x in by_session.values()])) * shrink
    shared = min(t2, max(0.0, (v - t2 / k_bar) / (1 - 1 / k_bar))) if k_bar > 1 else t2
    own = t2 - shared
    denom = shared ** 2 / sessions_dof + own ** 2 / max(1, cells_dof)
    return max(1.0, (t2 ** 2 / denom if denom > 0 else cells_dof) * 2 / math.pi)


# -- one comparison ---------------------------------------------------------------------------
@dataclass
class Comparison:
    """A server against another (the baseline, unless stated) at one (suite, concurrency), one metric."""
    server: str
    against: str
    suite: str
    concurrency: int
    metric: str
    logs: list            # per repeat: log speedup
    within: list          # per repeat: paired bootstrap variance of the log speedup
    estimate: float | None = None
    se: float | None = None
    dof: float = float("inf")
    run_to_run: bool = False
    note: str | None = None

    @property
    def repeats(self) -> int:
        return len(self.logs)


def compare(m: Measurements, rr: RunToRun, server: str, against: str, suite: str, c: int,
            metric: str) -> Comparison:
    """The log speedup averaged over the repeats, and its variance w + 2 tau^2 / R.

    w comes from a paired bootstrap by prompt that draws the prompts once and applies the draw to
    every repeat: it covers the prompt sample (the same in every repeat, so it does not average
    out) and the requests' own noise (which does). tau^2 adds the two server sessions of each repeat."""
    cmp = Comparison(server, against, suite, c, metric, [], [])
    sign = -1.0 if metric in LATENCY else 1.0
    pairs, notes = [], []
    for r in sorted(set(m.repeats(server, suite, c)) & set(m.repeats(against, suite, c))):
        ks, kb = (server, suite, c, r), (against, suite, c, r)
        ps, pb = m.arrays[ks].point(metric, m.cells[ks]), m.arrays[kb].point(metric, m.cells[kb])
        if not ps or not pb:
            who = [n for n, p in ((server, ps), (against, pb)) if not p]
            notes.append(f"{' and '.join(who)}: " + ("no request met the SLO" if metric == "goodput" else "no figure")
                         + f" at c={c} (repeat {r})")
            continue
        pairs.append((ks, kb))
        cmp.logs.append(sign * (math.log(ps) - math.log(pb)))
    if not cmp.logs:
        cmp.note = "; ".join(dict.fromkeys(notes)) or "not measured"
        return cmp
    common = set.intersection(*(set(m.arrays[k].keys) for pair in pairs for k in pair))
    prompts = sorted({k.split("#", 1)[0] for k in common})
    if len(prompts) < 2:
        cmp.note = "fewer than two prompts answered by both servers in every repeat"
        cmp.logs = []
        return cmp
    draw = _rng(m.settings, "pair", server, against, suite, c, metric).integers(
        0, len(prompts), size=(m.settings.bootstrap, len(prompts)))
    boot = np.zeros(m.settings.bootstrap)
    for ks, kb in pairs:
        one = []
        for key in (ks, kb):
            a = m.arrays[key]
            pos = {k: i for i, k in enumerate(a.keys)}
            # every request of a drawn prompt (all its passes) goes in together
            rows = [[pos[k] for k in sorted(common) if k.split("#", 1)[0] == p] for p in prompts]
            width = max(len(x) for x in rows)
            table = np.array([x + [x[0]] * (width - len(x)) for x in rows])  # passes are equal in practice
            idx = table[draw].reshape(m.settings.bootstrap, -1)
            with np.errstate(divide="ignore", invalid="ignore"):
                one.append(np.log(a.stat(metric, idx)))
        boot += sign * (one[0] - one[1])
    boot /= len(pairs)
    boot = boot[np.isfinite(boot)]
    w = float(boot.var(ddof=1)) if boot.size > 2 else 0.0
    cmp.within = [w] * len(cmp.logs)
    R = len(cmp.logs)
    cmp.estimate = float(np.mean(cmp.logs))
    tau2 = rr.tau2.get(metric)
    if R >= 2 and tau2 is not None:
        between = 2 * tau2 / R
        cmp.se = math.sqrt(w + between)
        cmp.run_to_run = True
        # Satterthwaite: the bootstrap part is known from thousands of resamples, tau^2 from rr.dof
        cmp.dof = float("inf") if between == 0 else (between + w) ** 2 / (between ** 2 / rr.dof[metric])
    else:
        cmp.se = math.sqrt(w)
    return cmp


def decide(cmp: Comparison, s: Settings) -> Verdict:
    """The verdict on one comparison (the rules in this module's docstring)."""
    base = dict(server=cmp.server, suite=cmp.suite, concurrency=cmp.concurrency, metric=cmp.metric,
                confidence=s.confidence, repeats=cmp.repeats, against=cmp.against, run_to_run=cmp.run_to_run)
    if cmp.estimate is None:
        return Verdict(verdict=Decision.INCONCLUSIVE, speedup=None, lo=None, hi=None, decide=cmp.note, **base)
    t = t_ppf(0.5 + s.confidence / 2, cmp.dof)
    lo_l, hi_l = cmp.estimate - t * cmp.se, cmp.estimate + t * cmp.se
    band = math.log(1 + s.min_effect)
    if cmp.run_to_run:
        if -band <= lo_l and hi_l <= band:
            d = Decision.EQUIVALENT
        elif lo_l > 0:
            d = Decision.PAYS
        elif hi_l < 0:
            d = Decision.LOSES
        else:
            d = Decision.INCONCLUSIVE
    else:  # intervals without run-to-run variation: only an effect beyond min_effect is trusted
        d = Decision.PAYS if lo_l > band else Decision.LOSES if hi_l < -band else Decision.INCONCLUSIVE
    v = Verdict(verdict=d, speedup=math.exp(cmp.estimate), lo=math.exp(lo_l), hi=math.exp(hi_l), **base)
    if d == Decision.INCONCLUSIVE:
        v.decide = what_would_decide(cmp, s, t)
    return v


def what_would_decide(cmp: Comparison, s: Settings, t: float) -> str:
    """What would make this comparison decisive if the effect stays where it is: more repeats (they
    average the run-to-run part out) or more prompts (the suite's sampling part shrinks with its size)."""
    if not cmp.run_to_run:
        return ("repeats: 2 or more would measure run-to-run variation (with one repeat a verdict needs an effect "
                f"beyond ±{s.min_effect:.0%})")
    w = float(np.mean(cmp.within))
    between1 = (cmp.se ** 2 - w) * cmp.repeats  # 2 tau^2: the run-to-run variance of one repeat
    band = math.log(1 + s.min_effect)
    est = abs(cmp.estimate)
    margin = max(est, band - est)  # pays/loses needs half-width < |effect|; equivalent, < band - |effect|
    if margin <= 0:
        return "the effect sits at the edge of ±min_effect: no amount of data would settle it"
    target = (margin / t) ** 2  # the variance that would decide it
    if w >= target:
        grow = math.ceil(w / (target * 0.8))
        return (f"a suite about {grow}x larger (the prompt sample, not run-to-run noise, limits it; "
                f"{cmp.repeats} repeats measured)")
    need = math.ceil(between1 / (target - w)) if between1 > 0 else cmp.repeats + 1
    return f"about {max(need, cmp.repeats + 1)} repeats ({cmp.repeats} measured)"


# -- shapes over concurrency ----------------------------------------------------------------
def regions(verdicts: list[Verdict]) -> list[Region]:
    """Consecutive concurrencies with the same verdict, so a non-monotone shape (loses low, pays
    higher up, as with MoE targets) is described as it is instead of by a single crossover."""
    out: list[Region] = []
    for v in sorted(verdicts, key=lambda v: v.concurrency):
        if out and out[-1].verdict == v.verdict:
            out[-1].last = v.concurrency
        else:
            out.append(Region(v.verdict, v.concurrency, v.concurrency))
    return out


def crossover(cmps: list[Comparison], s: Settings) -> Crossover | None:
    """Where the log speedup first crosses 0, linear in log concurrency, with a parametric bootstrap
    interval (each concurrency's estimate drawn from its t distribution). None if it never crosses."""
    pts = sorted((c.concurrency, c.estimate, c.se, c.dof) for c in cmps if c.estimate is not None)
    if len(pts) < 2:
        return None
    xs = np.log([p[0] for p in pts])

    def first_cross(ys):
        for i in range(len(ys) - 1):
            if (ys[i] > 0) != (ys[i + 1] > 0):
                x = xs[i] + (0 - ys[i]) * (xs[i + 1] - xs[i]) / (ys[i + 1] - ys[i])
                return x, ("stops paying" if ys[i] > 0 else "starts paying")
        return None, None

    ys = np.array([p[1] for p in pts])
    x0, direction = first_cross(ys)
    if x0 is None:
        return None
    rng = _rng(s, "crossover", pts[0])
    draws = []
    for _ in range(max(200, s.bootstrap)):
        yb = np.array([p[1] + p[2] * (rng.standard_t(p[3]) if math.isfinite(p[3]) else rng.standard_normal())
                       for p in pts])
        x, d = first_cross(yb)
        if x is None or d != direction:  # no crossing this way: it lies beyond the measured range
            x = math.inf if (yb[-1] > 0) == (direction == "stops paying") else -math.inf
        draws.append(x)
    q = (1 - s.confidence) / 2
    lo, hi = np.quantile(draws, q, method="lower"), np.quantile(draws, 1 - q, method="higher")
    return Crossover(float(math.exp(x0)), float(math.exp(lo)) if math.isfinite(lo) else None,
                     float(math.exp(hi)) if math.isfinite(hi) else None, direction)


# -- the recommendation -----------------------------------------------------------------------
def server_k(spec: dict, batch: int) -> int:
    """Speculative tokens the server itself uses at a batch size: its own schedule (with vLLM's
    carry-forward through gaps and the tail, clamped by num_speculative_tokens), else its k."""
    k = spec.get("num_speculative_tokens")
    sched = spec.get("num_speculative_tokens_per_batch_size")
    if not sched:
        return int(k) if k else 0
    last = None
    for start, end, kk in sorted(sched):
        if start <= batch <= end:
            last = kk
            break
        if start > batch:
            break
        last = kk
    if last is None:
        return 0
    return int(min(last, k)) if k else int(last)


def decisions(verdicts: list[Verdict]) -> dict[int, bool | None]:
    """On (True), off (False) or undecided (None) per measured concurrency: pays -> on; loses or
    equivalent -> off (speculation that makes no difference only costs the drafter's work)."""
    return {v.concurrency: True if v.verdict == Decision.PAYS else
            None if v.verdict == Decision.INCONCLUSIVE else False for v in verdicts}


def on_per_batch(dec: dict[int, bool | None], cross_points: dict[tuple[int, int], float], max_batch: int
                 ) -> list[bool] | None:
    """Speculation on/off for every batch size 1..max_batch, from the decided concurrencies only.
    Between two decided concurrencies that disagree, the switch sits where the measured speedup
    crosses 1 (interpolated on log concurrency, within that bracket; else the geometric mean);
    undecided concurrencies in between do not move it elsewhere. Below the first and above the last
    decided concurrency, its decision holds."""
    known = sorted(c for c, d in dec.items() if d is not None)
    if not known:
        return None
    out = []
    for b in range(1, max_batch + 1):
        if b <= known[0]:
            out.append(dec[known[0]])
            continue
        if b >= known[-1]:
            out.append(dec[known[-1]])
            continue
        lo = max(c for c in known if c <= b)
        hi = min(c for c in known if c >= b)
        if dec[lo] == dec[hi]:
            out.append(dec[lo])
            continue
        inside = sorted((a, x) for (a, z), x in cross_points.items() if lo <= a and z <= hi)
        switch = inside[0][1] if inside else math.sqrt(lo * hi)
        out.append(dec[lo] if b < switch else dec[hi])
    return out


def vllm_schedule(spec: dict, on: list[bool]) -> list[list[int]]:
    """Inclusive [start, end, k] ranges, the first starting at 1, that keep the server's own k where
    speculation stays on and 0 where it goes off (vLLM carries the last range's k to max_num_seqs).
    Where the server's own schedule had switched speculation off and the verdicts say on, its
    num_speculative_tokens is used: the k it speculates with."""
    own = int(spec.get("num_speculative_tokens") or 0)
    ks = [(server_k(spec, b) or own) if on[b - 1] else 0 for b in range(1, len(on) + 1)]
    ranges: list[list[int]] = []
    for b, k in enumerate(ks, 1):
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = b
        else:
            ranges.append([b, b, k])
    return ranges


def validate_schedule(ranges: list[list[int]]) -> None:
    """vLLM's own rules for num_speculative_tokens_per_batch_size (validate_and_normalize_dynamic_sd_schedule)."""
    prev = 0
    if not ranges or ranges[0][0] != 1:
        raise ValueError(f"schedule {ranges}: the first range must start at 1")
    for start, end, k in ranges:
        if start <= prev or start > end or k < 0:
            raise ValueError(f"schedule {ranges}: ranges must be sorted, non-overlapping, start <= end, k >= 0")
        prev = end


def _pairs_crossing(cmps: list[Comparison]) -> dict[tuple[int, int], float]:
    """Interpolated crossing (on log concurrency) between consecutive measured concurrencies."""
    pts = sorted((c.concurrency, c.estimate) for c in cmps if c.estimate is not None)
    out = {}
    for (c0, y0), (c1, y1) in zip(pts, pts[1:]):
        if (y0 > 0) != (y1 > 0) and y1 != y0:
            x = math.log(c0) + (0 - y0) * (math.log(c1) - math.log(c0)) / (y1 - y0)
            out[(c0, c1)] = math.exp(x)
    return out


@dataclass
class ServerInfo:
    """What the recommendation needs to know of a server (from its launch record)."""
    name: str
    engine: str                  # vllm | sglang | external
    flavor: str
    speculative: dict | None
    max_batch: int               # the server's max_num_seqs / running-request cap
    sglang_adaptive: dict | None = None  # the installed SGLang's adaptive mechanism, if it has one
    version: str | None = None
    engine_warnings: tuple = ()  # what the engine warned of at start-up (see launch.engine_warnings)


def recommend(info: ServerInfo, suite: str, verdicts: list[Verdict], cmps: list[Comparison],
              s: Settings) -> Recommendation:
    """What to deploy, built only from verdicts (never from point estimates alone)."""
    regs = regions(verdicts)
    cross = crossover(cmps, s)
    dec = decisions(verdicts)
    rec = Recommendation(info.name, suite, regs, cross, "undecided", None, None, None)
    decided = {c: d for c, d in dec.items() if d is not None}
    undecided = sorted(c for c, d in dec.items() if d is None)
    measured = ", ".join(f"c={c}" for c in sorted(dec))
    if not decided:
        why = "; ".join(dict.fromkeys(v.decide for v in verdicts if v.decide))
        rec.text = f"no recommendation: no concurrency is decided ({why})"
        rec.evidence = "every verdict is inconclusive"
        return rec
    on = on_per_batch(dec, _pairs_crossing(cmps), info.max_batch)
    pays, loses = _list(dec, True, verdicts, Decision.PAYS), _list(dec, False, verdicts, Decision.LOSES)
    same = _list(dec, False, verdicts, Decision.EQUIVALENT)
    undecided_note = f" (undecided at c={','.join(map(str, undecided))})" if undecided else ""
    if all(on):
        rec.action = "keep"
        rec.text = f"keep speculation on at every batch size: it pays at {pays}{undecided_note}"
    elif not any(on):
        rec.action = "off"
        why = [f"it loses at {loses}" if loses else "", f"makes no difference at {same}" if same else ""]
        rec.text = "turn speculation off: " + " and ".join(w for w in why if w) + f", and pays nowhere{undecided_note}"
    else:
        rec.action = "schedule"
        spans = _spans(on)
        rec.text = ("speculate only at batch sizes " + ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)
                    + f": it pays at {pays}" + (f", loses at {loses}" if loses else "")
                    + (f", makes no difference at {same}" if same else "") + undecided_note)
        between = [c for c in undecided if any(k < c for k in decided) and any(k > c for k in decided)]
        if between:
            rec.text += "; the switch follows where the measured speedup crosses 1"
    rec.evidence = "; ".join(f"{r.verdict.value} at c={r.first}" + (f"-{r.last}" if r.last != r.first else "")
                             for r in regs)
    if info.engine == "external":
        rec.sglang = None
        rec.text += " (an external endpoint: nothing here restarts it, so no recommended server is measured)"
        return rec
    if info.flavor == "vllm" and rec.action in ("schedule", "keep"):
        spec = info.speculative or {}
        sched = vllm_schedule(spec, on)
        configured = [server_k(spec, b) for b in range(1, info.max_batch + 1)]
        rec.as_configured = [k for a, z, k in sched for _ in range(a, z + 1)] == configured
        if rec.action == "schedule" or not rec.as_configured:
            # a schedule, or "always on" for a server whose own schedule switches speculation off
            # somewhere: unless it is the server's own, a deployment nobody has measured yet
            validate_schedule(sched)
            rec.vllm_schedule = sched
            if rec.action == "keep":
                rec.text += "; its configured schedule switches speculation off where the verdicts say on"
    elif rec.action in ("keep", "off"):
        rec.as_configured = rec.action == "keep"
    if info.flavor == "sglang":
        rec.sglang = sglang_mechanism(info, rec.action, on)
    return rec


def _spans(on: list[bool]) -> list[tuple[int, int]]:
    out, start = [], None
    for b, x in enumerate(on + [False], 1):
        if x and start is None:
            start = b
        elif not x and start is not None:
            out.append((start, b - 1))
            start = None
    return out


def _list(dec: dict, value, verdicts: list[Verdict], kind: Decision) -> str:
    cs = [v.concurrency for v in sorted(verdicts, key=lambda v: v.concurrency) if v.verdict == kind]
    return ("c=" + ",".join(map(str, cs))) if cs else ""


def sglang_mechanism(info: ServerInfo, action: str, on: list[bool]) -> dict:
    """The nearest mechanism the installed SGLang has for speculating less as batches grow."""
    if action in ("keep", "undecided"):
        return {"mechanism": None, "why": "nothing to change"}
    if action == "off":
        return {"mechanism": "baseline", "why": "serve without --speculative-algorithm"}
    if info.sglang_adaptive and _spans(on) == [(1, max(b for b, x in enumerate(on, 1) if x))]:
        from .engines.sglang import adaptive_config

        boundary = max(b for b, x in enumerate(on, 1) if x)
        return {"mechanism": "speculative-adaptive", **info.sglang_adaptive, "boundary": boundary,
                "config": adaptive_config(info.speculative or {}, boundary),
                "why": f"--speculative-adaptive with a config whose batch sizes above {boundary} have only 0 "
                       "steps to choose from (no drafting), and the server's own steps below"}
    if info.sglang_adaptive:
        return {"mechanism": None, "why": "speculation pays in more than one range of batch sizes; SGLang's adaptive "
                                          "config cannot express that: route traffic by batch size instead"}
    return {"mechanism": None,
            "why": f"SGLang {info.version or '(version unknown)'} has no flag that switches speculation off above a "
                   f"batch size (--speculative-adaptive came with 0.5.18): route traffic above batch "
                   f"{max(b for b, x in enumerate(on, 1) if x)} to the baseline server instead"}


# -- acceptance per suite, with intervals -----------------------------------------------------
@dataclass
class AcceptanceSummary:
    """Mean acceptance length (tokens per speculative step) of a server on a suite, pooled over its
    cells that drafted, with a bootstrap interval over prompts (a prompt's requests stay together)."""
    server: str
    suite: str
    length: float | None
    lo: float | None
    hi: float | None
    requests: int
    steps: int
    holdout_share: float | None = None


def acceptance_summary(m: Measurements, server: str, suite: str) -> AcceptanceSummary:
    """The engine's own acceptance definition (engines/*: one per engine) over the pooled requests,
    and its percentiles over resamples of prompts."""
    from .engines import definitions

    cols = {"num_spec_steps": [], "num_draft_tokens": [], "num_accepted_tokens": [], "out": []}
    prompts, hold, flavor = [], [], None
    for key, a in m.arrays.items():
        if key[0] != server or key[1] != suite:
            continue
        ok = np.nan_to_num(a.spec["num_spec_steps"]) > 0
        for k in ("num_spec_steps", "num_draft_tokens", "num_accepted_tokens"):
            cols[k].append(a.spec[k][ok])
        cols["out"].append(a.out[ok])
        prompts += [p for p, k in zip(a.prompts, ok) if k]
        hold.append(m.cells[key].holdout_share)
        flavor = a.flavor
    if not prompts:
        return AcceptanceSummary(server, suite, None, None, None, 0, 0)
    eng = definitions(flavor)
    ids = {p: i for i, p in enumerate(dict.fromkeys(prompts))}
    group = np.array([ids[p] for p in prompts])
    per_prompt = {k: np.bincount(group, np.concatenate(v)) for k, v in cols.items()}
    known = {k: not np.isnan(np.concatenate(v)).any() for k, v in cols.items()}

    def length(sel) -> float | None:
        val = {k: (float(per_prompt[k][sel].sum()) if known[k] else None) for k in per_prompt}
        acc = eng.figures(len(sel), val["num_spec_steps"], val["num_draft_tokens"], val["num_accepted_tokens"],
                          val["out"])
        return acc.acceptance_length if acc else None

    n = len(ids)
    point = length(np.arange(n))
    draw = _rng(m.settings, "acceptance", server, suite).integers(0, n, size=(m.settings.bootstrap, n))
    boot = [x for x in (length(d) for d in draw) if x is not None]
    q = (1 - m.settings.confidence) / 2
    hs = [h for h in hold if h is not None]
    return AcceptanceSummary(server, suite, point, float(np.quantile(boot, q)) if boot else None,
                             float(np.quantile(boot, 1 - q)) if boot else None, len(prompts),
                             int(per_prompt["num_spec_steps"].sum()), float(np.mean(hs)) if hs else None)


# -- everything at once -----------------------------------------------------------------------
@dataclass
class Analysis:
    """The typed result the summary renders (markdown, plots, verdicts.json, recommendations.json)."""
    settings: Settings
    baseline: str
    servers: list
    suites: list
    concurrencies: list
    run_to_run: RunToRun
    verdicts: list
    comparisons: dict                  # (server, suite, metric) -> [Comparison by concurrency]
    off_cost: list                     # throughput verdicts of cells where a speculative server drafted nothing
    acceptance: list                   # AcceptanceSummary per (speculative server, suite)
    recommendations: list
    measurements: Measurements
    infos: dict = field(default_factory=dict)   # name -> ServerInfo

    def verdict(self, server, suite, c, metric="output_throughput") -> Verdict | None:
        return next((v for v in self.verdicts if (v.server, v.suite, v.concurrency, v.metric) ==
                     (server, suite, c, metric)), None)


def drafted_nothing(m: Measurements, server: str, suite: str, c: int) -> bool:
    """Every repeat of this cell reported zero drafts: speculation was configured but switched off
    (e.g. by a batch-size schedule), so the cell measures what being configured costs."""
    cells = [m.cells[(server, suite, c, r)] for r in m.repeats(server, suite, c)]
    return bool(cells) and all(x.spec_decode_num_drafts == 0 for x in cells)


def server_verdicts(m: Measurements, rr: RunToRun, server: str, baseline: str, suites: list, concurrencies: list
                    ) -> tuple[list, dict, list]:
    """One server against the baseline wherever both were measured: its verdicts (every suite, metric
    and concurrency), the comparisons they rest on by (server, suite, metric) in concurrency order,
    and the throughput verdicts of cells where it drafted nothing (configured but off)."""
    verdicts, comparisons, off = [], {}, []
    for suite in suites:
        for metric in m.settings.metrics:
            row = []
            for c in concurrencies:
                if not m.repeats(server, suite, c) or not m.repeats(baseline, suite, c):
                    continue
                cmp = compare(m, rr, server, baseline, suite, c, metric)
                row.append(cmp)
                v = decide(cmp, m.settings)
                verdicts.append(v)
                if metric == "output_throughput" and drafted_nothing(m, server, suite, c):
                    off.append(v)
            if row:
                comparisons[(server, suite, metric)] = row
    return verdicts, comparisons, off


def analyse(cells: list[tuple[CellResult, pl.DataFrame]], baseline: str, settings: Settings,
            infos: dict[str, ServerInfo] | None = None, recommend_suites: list[str] | None = None,
            primary: list[str] | None = None) -> Analysis:
    """Verdicts for every server against the baseline, the run-to-run variance, the configured-but-off
    findings, acceptance per suite and the recommendations. `primary` names the servers of the grid
    the recommendation comes from (run-to-run variance is estimated from them only, so adding the
    recommended server's cells later leaves the recommendation unchanged)."""
    m = Measurements.of(cells, settings)
    servers = m.servers()
    if baseline not in servers:
        from .files import SpecmatchError

        raise SpecmatchError(f"baseline: no cells of server '{baseline}'")
    suites = list(dict.fromkeys(k[1] for k in m.cells))
    concurrencies = sorted({k[2] for k in m.cells})
    rr = run_to_run(m, primary)
    verdicts, comparisons, off = [], {}, []
    for server in servers:
        if server != baseline:
            vs, cmps, offs = server_verdicts(m, rr, server, baseline, suites, concurrencies)
            verdicts += vs
            comparisons.update(cmps)
            off += offs
    acc = [acceptance_summary(m, s_, u) for s_ in servers if s_ != baseline for u in suites]
    acc = [a for a in acc if a.length is not None]
    recs = []
    for server, info in (infos or {}).items():
        drafted = any((k[0] == server and (x.spec_decode_num_drafts or 0) > 0) for k, x in m.cells.items())
        if server == baseline or not (info.speculative or drafted) or (primary is not None and server not in primary):
            continue
        for suite in recommend_suites or []:
            key = (server, suite, settings.recommend_metric)
            if key in comparisons:
                vs = [v for v in verdicts if (v.server, v.suite, v.metric) == key]
                recs.append(recommend(info, suite, vs, comparisons[key], settings))
    return Analysis(settings, baseline, servers, suites, concurrencies, rr, verdicts, comparisons, off, acc, recs, m,
                    infos or {})


def verify(an: Analysis, rec: Recommendation, derived: str) -> dict:
    """The recommended deployment, measured on the grid, against the best of the baseline and the
    always-on server at each concurrency (by point estimate): it should match it within noise."""
    s, m = an.settings, an.measurements
    rows, verdicts = [], []
    for c in an.concurrencies:
        if not m.repeats(derived, rec.suite, c):
            continue
        cands = []
        for other in (an.baseline, rec.server):
            vals = [m.cells[(other, rec.suite, c, r)].output_throughput for r in m.repeats(other, rec.suite, c)]
            vals = [v for v in vals if v]
            if vals:
                cands.append((float(np.mean(vals)), other))
        if not cands:
            continue
        best = max(cands)[1]
        v = decide(compare(m, an.run_to_run, derived, best, rec.suite, c, s.recommend_metric), s)
        verdicts.append(v)
        rows.append({"concurrency": c, "against": best, "speedup": v.speedup, "lo": v.lo, "hi": v.hi,
                     "verdict": v.verdict.value,
                     "matches": None if v.verdict == Decision.INCONCLUSIVE else v.verdict != Decision.LOSES})
    if not rows:
        return {"server": derived, "measured": False, "matches_best": None, "per_concurrency": []}
    miss = [r for r in rows if r["matches"] is False]
    unsure = [r for r in rows if r["matches"] is None]
    return {"server": derived, "measured": True, "per_concurrency": rows,
            "matches_best": False if miss else (None if unsure else True),
            "costs": [{"concurrency": r["concurrency"], "against": r["against"], "speedup": r["speedup"],
                       "lo": r["lo"], "hi": r["hi"]} for r in miss]}
