"""Measurements: every cell's requests as arrays, indexed by (server, suite, concurrency, repeat).

The analysis's first seam (docs/methods/verdicts.md): what a cell measured and the estimator the
bootstrap resamples.

**A closed loop's throughput is the rate at its load** (Little's law): C x output tokens / the sum
of the requests' latencies, C the workers that had a request (min(concurrency, requests)): the
tokens a stream of requests at this concurrency delivers per second. Not the cell's tokens over its
duration (vLLM's figure, in the cell table), whose end is the slowest request's: when the
concurrency is at least the suite (the default's c=16 with 16 prompts: one burst) that figure is the
maximum over prompts, a bootstrap of a maximum understates the prompt sample's variance, and
servers identical on average whose speedup varies by prompt (log-sd 0.15 / 0.30) were called
different in 12-18% / 24-31% of verdicts at nominal 10%. A stream at that load never
waits for its slowest request; the rate it sees is the mean latency's.

**A request's weight on the others in the drain.** While every worker is busy, a request that
were not there would be replaced by the next one: the batch, and the others' latencies, stay as they
are. Once the queue is empty (the drain: a burst from its first step), it would leave the batch one
sequence smaller and every step cheaper for the requests beside it: under a step cost a + b x batch,
its influence on the sum of latencies is its own latency plus b x the steps it shares with them, not
its latency alone, which is all a bootstrap of the recorded latencies moves (it resamples a
V-statistic's rows). Each request's figures therefore carry what it adds to the others'
(caused_delay: x / (1 + x B(t)) per other request in flight, per second of its drain; x = b / a),
less the mean of that addition, so the sums, and every point estimate, are the measured ones:
the latency (for throughput, goodput and end-to-end latency: e2e_load) and the TPOT (each other's
delay over its decode, divided by its output tokens - 1: tpot_load). x comes from the server's own
batch scaling: its requests' TPOT here against the same prompts' at its lowest measured concurrency
(batch_scaling), and where it has none the bound x -> infinity (every step's cost per sequence). In
a burst on a step-by-step server the additions are exactly what removing the request takes from the
others (tests/test_measurements.py); with fewer workers than requests they are the model above, as
removing one would also move when the others start. On the discrete-event server this brings the paired bootstrap's
variance at c = 16 (one burst of 16) from 0.45-0.54 of the true prompt sample's variance to
0.83-1.03, and leaves c = 4 (four requests a worker) as it was (1.0-1.1). Without it in TPOT and
end-to-end latency, servers identical on average whose speedup varies by prompt with log-sd 0.30
were called different in 16-17% and 13-15% of c=16 verdicts (stated variance 1.4-1.6x short); with
it 11% and 10-11% (1.0-1.07x), as throughput (bench/burst_variance.py, 240 experiments).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from ... import metrics
from ...metrics import LABEL, LATENCY
from ...records import CellResult
from ...resample import Clusters, draws
from .sequential import Design

__all__ = ["LABEL", "LATENCY", "Arrays", "Measurements", "Settings", "plain_steps", "rows_of", "take", "unit_draw", "units"]


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
    repeats: object = None   # config `repeats`: an int (fixed design) or {min, max} (sequential: alpha spent per look)
    # work out "what would decide it" for inconclusive verdicts (verdicts.designs.what_would_decide): a report the
    # verdicts do not depend on, and by far the analysis's dearest part (a simulation per design); the
    # calibration of the verdicts themselves turns it off, the calibration of the hints keeps it
    designs: bool = True

    @property
    def design(self) -> Design:
        return Design.of(self.repeats)

    @classmethod
    def of(cls, d: dict) -> "Settings":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(m for m in metrics.NAMES if m != "goodput" or self.slo)

    def rng(self, *key) -> np.random.Generator:
        """The random source of one question (a comparison, a bootstrap, a simulation), seeded by the
        settings' seed and the question's key: a result never depends on the order questions are asked."""
        import zlib

        return np.random.default_rng([self.seed, zlib.crc32(repr(key).encode())])


def _reported(v: np.ndarray) -> np.ndarray | None:
    """A per-request count the server may not report: None where no request has it, else 0 where missing."""
    return None if not v.size or np.isnan(v).all() else np.nan_to_num(v, nan=0.0)


# -- one cell's requests, as arrays -----------------------------------------------------------
# the request records' numeric columns Arrays.of reads
NUMERIC = ("output_tokens", "e2e_s", "ttft_s", "num_spec_steps", "num_draft_tokens", "num_accepted_tokens", "start_s",
           "prompt_tokens", "cached_tokens")


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
    flavor: str = "openai"      # whose acceptance definitions its counters follow (the cell's flavor)
    prompt_tokens: np.ndarray | None = None    # per request, from the server's usage (NaN where unknown)
    start: np.ndarray | None = None            # per request: when it was sent (s from the cell's start)
    # per request: the latency and the TPOT the bootstrap resamples, each plus the request's influence on the
    # others' in the drain less its mean (caused_delay; None: the figure itself). The sum over all requests is
    # unchanged, so every point estimate is.
    e2e_load: np.ndarray | None = None
    tpot_load: np.ndarray | None = None
    sources: list = field(default_factory=list)    # per request: its training source (None: a file suite's)
    # per request: its decode steps (speculative and plain); None where they cannot be known (a server that
    # drafted without per-request counters)
    decode_steps: np.ndarray | None = None
    # when the queue of work ran out (None: at the last send). A session suite's workers each run a
    # session turn after turn: the queue is empty once the last session has started, and from then on
    # the batch shrinks as sessions end, while turns are still being sent
    drain_from: float | None = None
    # per request: its prompt tokens the server served from its prefix cache (usage's cached_tokens; 0 where
    # unknown): what its prefill did not compute. A cell's later passes resend its prompts, which hit the cache
    cached_tokens: np.ndarray | None = None

    @classmethod
    def of(cls, cell: CellResult, requests: pl.DataFrame, slo: dict) -> "Arrays":
        ok = requests.filter(pl.col("ok"))
        # every numeric column in one conversion (a cell's columns one by one cost most of reading a run's cells)
        wanted = [c for c in NUMERIC if c in ok.columns]
        table = (ok.select(pl.col(c).cast(pl.Float64).fill_null(np.nan) for c in wanted).to_numpy()
                 if wanted else np.empty((ok.height, 0)))
        at = {c: i for i, c in enumerate(wanted)}

        def col(name: str) -> np.ndarray:
            return table[:, at[name]].copy() if name in at else np.full(ok.height, np.nan)

        out, e2e, ttft = col("output_tokens"), col("e2e_s"), col("ttft_s")
        tpot = metrics.tpot(e2e, ttft, out)
        prompts = ok["prompt_id"].to_list()
        keys = [f"{p}#{k}" for p, k in zip(prompts, ok["pass_index"].to_list())]
        spec = {k: col(k) for k in ("num_spec_steps", "num_draft_tokens", "num_accepted_tokens")}
        start = col("start_s") if "start_s" in ok.columns else None
        sources = ok["source"].to_list() if "source" in ok.columns else [None] * ok.height
        drain = None
        if start is not None and "session_id" in ok.columns and ok.height and np.isfinite(start).all():
            firsts = (ok.with_columns(pl.Series("_start", start)).filter(pl.col("session_id").is_not_null())
                      .group_by("session_id", "pass_index").agg(pl.col("_start").min())["_start"])
            drain = float(firsts.max()) if len(firsts) else None
        return cls(keys, out, e2e, ttft, tpot, metrics.good(e2e, ttft, tpot, slo), cell.request_rate in ("inf", None),
                   cell.concurrency, cell.duration or 0.0, prompts, spec, cell.flavor, col("prompt_tokens"), start,
                   sources=sources, decode_steps=decode_steps(out, spec, cell), drain_from=drain,
                   cached_tokens=_reported(col("cached_tokens")))

    @property
    def workers(self) -> int:
        """The closed loop's workers that had a request."""
        return metrics.workers(self.concurrency, len(self.out))

    def stat(self, metric: str, idx: np.ndarray) -> np.ndarray:
        """The metric over the requests `idx` (rows of resamples): the bootstrap's estimator. A closed
        loop's throughput is the rate at its load, C x tokens / sum of latencies (module docstring);
        latencies and TPOT carry their influence on the others' in the drain (e2e_load, tpot_load)."""
        lat = self.e2e if self.e2e_load is None else self.e2e_load
        tpot = self.tpot if self.tpot_load is None else self.tpot_load
        v = metrics.values(metric, self.out, self.good, lat, tpot)
        pad = idx < 0   # rows of a cluster resample are padded with -1 (unit_draw): they count for nothing
        if not metrics.TABLE[metric].rate:
            return metrics.estimate(metric, self.workers, np.where(pad, np.nan, v[idx]))   # a NaN-aware mean
        v = np.where(pad, 0.0, v[idx])
        if not self.closed:
            return metrics.open_loop_rate(v, self.duration) * (len(self.out) / (~pad).sum(-1))
        return metrics.estimate(metric, self.workers, v, np.where(pad, 0.0, lat[idx]))

    def point(self, metric: str, cell: CellResult) -> float | None:
        """The cell's own figure: a closed loop's throughput and goodput at its load (C x tokens or good
        requests / the sum of latencies: module docstring), an open loop's over the cell's duration
        (vLLM's definitions); mean TPOT and end-to-end latency."""
        rate = metrics.TABLE[metric].rate
        if rate and self.closed:
            if not len(self.out) or not np.isfinite(self.e2e).all() or self.e2e.sum() <= 0:
                return cell.output_throughput if metric == "output_throughput" else None
            return float(metrics.closed_loop(metric, self.workers, self.out, self.good, self.e2e, self.tpot))
        if metric == "output_throughput":
            return cell.output_throughput
        if rate:
            if not cell.duration:
                return None
            return float(metrics.open_loop_rate(metrics.values(metric, self.out, self.good, self.e2e, self.tpot),
                                                cell.duration))
        vals = metrics.values(metric, self.out, self.good, self.e2e, self.tpot)
        vals = vals[~np.isnan(vals)]
        return float(vals.mean()) if vals.size else None


def plain_steps(decoded, spec_steps, accepted) -> np.ndarray:
    """A request's plain decode steps: its tokens after the first that no speculative step produced (a
    speculative step yields 1 + its accepted tokens). Never below 0: the engines count accepted tokens
    that max_tokens then cut off, so a request that speculated at every step can appear to have more."""
    return np.maximum(np.asarray(decoded, float) - np.asarray(spec_steps, float) - np.asarray(accepted, float), 0.0)


def decode_steps(out: np.ndarray, spec: dict, cell: CellResult) -> np.ndarray | None:
    """Per request: the decode steps it took (speculative plus plain), from its own counters; one a token
    where its server drafted nothing in the cell; None where a drafting server did not count them per
    request (the step model cannot replay such a cell)."""
    decoded = np.maximum(out - 1, 0.0)
    steps = spec["num_spec_steps"]
    if len(out) and np.isfinite(steps).all():
        return steps + plain_steps(decoded, steps, np.nan_to_num(spec["num_accepted_tokens"], nan=0.0))
    if not (cell.spec_decode_num_drafts or 0):
        return decoded
    return None


# Every column of a cell's request records read as rows (output agreement, natural stopping, sessions)
COLUMNS = ("prompt_id", "pass_index", "ok", "output_tokens", "output_sha256", "output_token_ids", "session_id",
           "turn", "natural_stop", "past_stop_tokens", "cached_tokens", "prompt_tokens", "ttft_s", "start_s", "e2e_s")


def rows_of(df: pl.DataFrame) -> list[dict]:
    """A cell's request records, failed ones included, as dicts with every column in COLUMNS (None
    where a cell's records lack it)."""
    have = [c for c in COLUMNS if c in df.columns]
    out = df.select(have).to_dicts()
    for r in out:
        for c in COLUMNS:
            r.setdefault(c, None)
    return out


# -- the measurements ---------------------------------------------------------------------------
@dataclass
class Measurements:
    """Every cell, indexed by (server, suite, concurrency, repeat): the only reader of the cells' request
    records. `arrays`: the successful requests as arrays (what every estimate reads); rows(): every
    request as a dict (what output agreement, natural stopping and sessions read), made when first asked
    for (most analyses never ask: the calibration runs thousands)."""
    cells: dict
    arrays: dict
    settings: Settings
    # (server, against, suite, c, metric) -> the Verdict the sequential design kept where it stopped that
    # configuration (analysis.frozen_verdicts): every comparison of those data keeps it (comparison.freeze)
    frozen: dict = field(default_factory=dict)
    frames: dict = field(default_factory=dict, repr=False)   # key -> the cell's request records as read
    _rows: dict = field(default_factory=dict, repr=False)
    _estimates: dict = field(default_factory=dict, repr=False)
    _sessions: dict | None = field(default=None, repr=False)
    _repeat_counts: dict | None = field(default=None, repr=False)

    @classmethod
    def of(cls, cells: list[tuple[CellResult, pl.DataFrame]], settings: Settings) -> "Measurements":
        c, a, frames = {}, {}, {}
        for cell, req in cells:
            k = (cell.server, cell.suite, cell.concurrency, cell.repeat)
            c[k] = cell
            a[k] = Arrays.of(cell, req, settings.slo)
            frames[k] = req
        m = cls(c, a, settings, frames=frames)
        for (server, suite, conc), keys in _configurations(m).items():
            if not any(a[k].closed and a[k].start is not None and conc > 1 for k in keys):
                continue
            x = batch_scaling(m, server, suite, conc)
            for k in keys:
                if a[k].closed and a[k].start is not None:
                    a[k].e2e_load, a[k].tpot_load = load_figures(a[k], x)
        return m

    @classmethod
    def read(cls, cells: "Measurements | list[tuple[CellResult, pl.DataFrame]]", settings: Settings) -> "Measurements":
        """Measurements as given, or read from (cell, request records) pairs; read again where the
        settings' SLO differs from the one the good-request flags were read with."""
        if not isinstance(cells, Measurements):
            return cls.of(cells, settings)
        if cells.settings.slo == settings.slo:
            return cells
        m = cls.of([(cells.cells[k], cells.frames[k]) for k in cells.cells], settings)
        m.frozen = dict(cells.frozen)
        return m

    def servers(self) -> list[str]:
        return list(dict.fromkeys(k[0] for k in self.cells))

    def only(self, servers) -> "Measurements":
        """The cells of these servers (the same arrays: a server's figures never depend on another's)."""
        keep = set(servers)
        pick = lambda d: {k: v for k, v in d.items() if k[0] in keep}   # noqa: E731
        return Measurements(pick(self.cells), pick(self.arrays), self.settings, dict(self.frozen), pick(self.frames),
                            pick(self._rows))

    def estimated(self, name: str, servers, estimate):
        """An estimate over these servers' cells (run to run, acceptance run to run), made once: every
        question that rests on it (verdicts, verifications, attribution, the context axis) reads the
        same one. `servers`: None for every server."""
        key = (name, self.settings.metrics, tuple(x for x in self.servers() if servers is None or x in servers))
        if key not in self._estimates:
            self._estimates[key] = estimate()
        return self._estimates[key]

    def rows(self, key) -> list[dict]:
        """Every request of a cell, failed ones included, as dicts (rows_of)."""
        if key not in self._rows:
            self._rows[key] = rows_of(self.frames[key])
        return self._rows[key]

    def session_ids(self) -> dict[str, str]:
        """prompt id -> session id of every session suite's turn: a session's turns are one resampling
        unit wherever prompts are resampled (unit_draw), as its turns share the session's effect."""
        if self._sessions is None:
            out = {}
            for df in self.frames.values():
                if "session_id" in df.columns:
                    out.update(dict(df.select("prompt_id", "session_id").drop_nulls().iter_rows()))
            self._sessions = out
        return self._sessions

    def repeats(self, server: str, suite: str, c: int) -> list[int]:
        return sorted(k[3] for k in self.cells if k[:3] == (server, suite, c))

    def repeats_by_cell(self, servers=None) -> dict:
        """(server, suite, concurrency) -> how many repeats it has, for `servers` (None: all). Counted once:
        every comparison asks (comparison.compare's own_share)."""
        if self._repeat_counts is None:
            counts: dict = {}
            for k in self.cells:
                counts[k[:3]] = counts.get(k[:3], 0) + 1
            self._repeat_counts = counts
        if servers is None:
            return self._repeat_counts
        return {k: n for k, n in self._repeat_counts.items() if k[0] in servers}


# -- resampling units -----------------------------------------------------------------------------
def unit_draw(rng: np.random.Generator, prompts: list[str], unit_of: dict, resamples: int) -> np.ndarray:
    """`resamples` bootstrap resamples of `prompts` by their resampling units (`unit_of`: prompt ->
    unit; a session suite's turns share their session, every other prompt is its own): each row draws
    as many units as there are, with replacement, and takes every prompt of each. Rows are positions
    into `prompts`, padded with -1 where a row's units hold fewer prompts than the longest (`take`,
    Arrays.stat read -1 as nothing). Why: a session's turns share its effect (its topic, its tools,
    its cache); resampling turns treats them as independent and understates the prompt sample's
    variance (tests/test_session_bootstrap.py measures by how much).

    Where every unit is a single prompt the draw is rng.integers(0, n, (resamples, n)): the same draw,
    from the same random source, as a bootstrap by prompt."""
    clusters = Clusters.of([unit_of.get(p, p) for p in prompts])
    if len(clusters) == len(prompts):
        return draws(rng, len(prompts), resamples)
    return clusters.padded(draws(rng, len(clusters), resamples))


def resampled_log_stat(m: "Measurements", key, metric: str, prompts: list, common: list, draw: np.ndarray
                       ) -> np.ndarray:
    """One cell's log figure on each resample of `draw` (rows: positions into `prompts`, -1 padding):
    every request of a drawn prompt (all its passes among `common`, the request keys read, in order) goes
    in together."""
    a = m.arrays[key]
    pos = {k: i for i, k in enumerate(a.keys)}
    by: dict = {}
    for k in common:
        by.setdefault(k.split("#", 1)[0], []).append(pos[k])
    rows = [by[p] for p in prompts]
    width = max(len(x) for x in rows)
    table = np.array([x + [x[0]] * (width - len(x)) for x in rows])  # passes are equal in practice
    idx = np.where((draw < 0)[..., None], -1, table[draw]).reshape(draw.shape[0], -1)  # -1: padding
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(a.stat(metric, idx))


def units(prompts: list[str], unit_of: dict) -> int:
    """How many resampling units `prompts` hold (unit_draw)."""
    return len({unit_of.get(p, p) for p in prompts})


def take(values, draw: np.ndarray) -> np.ndarray:
    """values[draw] with a -1 of a padded draw (unit_draw) read as 0: what per-prompt sums need."""
    return np.append(np.asarray(values, float), 0.0)[draw]


def _configurations(m: Measurements) -> dict:
    out: dict = {}
    for k in m.cells:
        out.setdefault(k[:3], []).append(k)
    return out


# -- a request's influence on the others, in the drain ----------------------------------------------
def _in_flight(start: np.ndarray, end: np.ndarray, *more: np.ndarray):
    """The closed loop's timeline: event times (starts, ends and any `more` breakpoints), and the
    requests in flight between consecutive ones."""
    ev = np.unique(np.concatenate([start, end, *more]))
    mid = (ev[:-1] + ev[1:]) / 2
    B = ((start[None, :] <= mid[:, None]) & (end[None, :] > mid[:, None])).sum(1)
    return ev, B


def caused_delay(start: np.ndarray, e2e: np.ndarray, x: float, weight: np.ndarray,
                 since: np.ndarray | None = None, drain_from: float | None = None) -> np.ndarray:
    """Per request j: the time its presence in the drain adds to the others, sum over i != j of
    weight[i] x the delay to i, counting only i's time from since[i] on (default: its start).

    Under a step cost a + b x batch, j's presence makes every step b dearer for each other request in
    flight: over dt of the drain (dt / (a + b B) steps) each of them waits x / (1 + x B) dt longer
    (x = b / a; infinite: 1 / B, every step's cost per sequence). Before the drain (the last request
    sent) a request that were not there would be replaced by the next, so it delays nobody. With
    weight 1 and `since` the starts, the sum is what j adds to the sum of latencies;
    with weight 1 / (output tokens - 1) and `since` the first tokens, what it adds to the sum of TPOT."""
    n = len(e2e)
    if n < 2 or not (np.isfinite(start).all() and np.isfinite(e2e).all()) or x <= 0:
        return np.zeros(n)
    end = start + e2e
    frm = start if since is None else np.where(np.isfinite(since), np.maximum(since, start), start)
    ev, B = _in_flight(start, end, frm)   # a slice never straddles a counted phase's beginning
    mid = (ev[:-1] + ev[1:]) / 2
    counted = (frm[None, :] <= mid[:, None]) & (end[None, :] > mid[:, None])   # intervals x requests
    S = counted.astype(float) @ weight                                        # per interval: sum of weights
    per = 1 / np.maximum(B, 1) if not math.isfinite(x) else x / (1 + x * B)
    lo = np.maximum(np.maximum(ev[:-1][None, :], start[:, None]), start.max() if drain_from is None else drain_from)
    hi = np.minimum(ev[1:][None, :], end[:, None])
    others = S[None, :] - counted.T * weight[:, None]                          # less j's own weight
    return (np.maximum(hi - lo, 0.0) * per[None, :] * np.maximum(others, 0.0)).sum(1)


def load_figures(a: Arrays, x: float) -> tuple[np.ndarray, np.ndarray]:
    """Each request's latency and TPOT plus what its presence in the drain adds to the others' (the
    sum of latencies; the sum of TPOT, each other's delay over its decode divided by its output tokens
    - 1), less the mean of that addition: resampled, a request moves the statistic by its influence
    (module docstring); summed over every request, the figures are the measured ones. A TPOT that is
    not defined (one output token) stays undefined and weighs nothing in the others'."""
    n = len(a.e2e)
    share = caused_delay(a.start, a.e2e, x, np.ones(n), drain_from=a.drain_from)
    tpot_ok = np.isfinite(a.tpot)
    per_token = np.where(tpot_ok, 1 / metrics.tpot_tokens(a.out), 0.0)
    first = a.start + np.where(np.isfinite(a.ttft), a.ttft, 0.0)
    t_share = caused_delay(a.start, a.e2e, x, per_token, since=first, drain_from=a.drain_from)
    t_mean = float(t_share[tpot_ok].mean()) if tpot_ok.any() else 0.0
    return a.e2e + share - float(share.mean()), np.where(tpot_ok, a.tpot + t_share - t_mean, np.nan)


def _decode_batch(a: Arrays) -> np.ndarray:
    """Per request: the requests in flight on average over its decode (after its first token)."""
    end = a.start + a.e2e
    ev, B = _in_flight(a.start, end)
    first = a.start + np.where(np.isfinite(a.ttft), a.ttft, 0.0)
    lo = np.maximum(ev[:-1][None, :], first[:, None])
    hi = np.minimum(ev[1:][None, :], end[:, None])
    dt = np.maximum(hi - lo, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (dt * B[None, :]).sum(1) / dt.sum(1)


def batch_scaling(m: Measurements, server: str, suite: str, c: int) -> float:
    """x = b / a of the server's step cost a + b x batch, from its requests' time per output token at
    concurrency c against the same prompts' at its lowest measured concurrency below c (TPOT, whatever
    the tokens per step: a prompt's acceptance is the same at every batch): a prompt's ratio r over
    the batches B, B0 its decode shared gives x = (r - 1) / (B - r B0); the median over prompts, at
    least 0. Infinite (the bound) where no lower concurrency was measured or no prompt gives one."""
    lower = sorted({k[2] for k in m.cells if k[:2] == (server, suite) and k[2] < c})
    if not lower:
        return float("inf")

    def per_prompt(conc: int) -> dict:
        got: dict = {}
        for k in m.cells:
            if k[:3] != (server, suite, conc):
                continue
            a = m.arrays[k]
            if a.start is None or not len(a.out) or not np.isfinite(a.start).all():
                continue
            B = _decode_batch(a)
            for p, t, b in zip(a.prompts, a.tpot, B):
                if np.isfinite(t) and t > 0 and np.isfinite(b):
                    got.setdefault(p, []).append((t, b))
        return {p: (float(np.median([t for t, _ in v])), float(np.median([b for _, b in v]))) for p, v in got.items()}

    here, ref = per_prompt(c), per_prompt(lower[0])
    xs = []
    for p in here.keys() & ref.keys():
        (t, b), (t0, b0) = here[p], ref[p]
        r = t / t0
        den = b - r * b0
        if den > 0:
            xs.append(max(0.0, (r - 1) / den))
    return float(np.median(xs)) if xs else float("inf")


def _log(v) -> float | None:
    return math.log(v) if v is not None and v > 0 and math.isfinite(v) else None


def cell_log_stat(m: Measurements, key, metric: str) -> float | None:
    """Log figure of one cell (its repeats' spread is the run-to-run variation)."""
    return _log(m.arrays[key].point(metric, m.cells[key]))


def drafted_nothing(m: Measurements, server: str, suite: str, c: int) -> bool:
    """Every repeat of this cell reported zero drafts: speculation was configured but switched off
    (e.g. by a batch-size schedule), so the cell measures what being configured costs."""
    cells = [m.cells[(server, suite, c, r)] for r in m.repeats(server, suite, c)]
    return bool(cells) and all(x.spec_decode_num_drafts == 0 for x in cells)
