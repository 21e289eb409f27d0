"""Measurements: every cell's requests as arrays, indexed by (server, suite, concurrency, repeat).

The analysis's first seam (DESIGN.md, "Deciding"): what a cell measured and the estimator the
bootstrap resamples (a closed loop's throughput over its own makespan, tail included).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from ..measuring.metrics import tpot_s
from ..records import METRICS, CellResult
from .sequential import Design

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
    repeats: object = None   # config `repeats`: an int (fixed design) or {min, max} (sequential: alpha spent per look)

    @property
    def design(self) -> Design:
        return Design.of(self.repeats)

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
    prompt_tokens: np.ndarray | None = None    # per request, from the server's usage (NaN where unknown)

    @classmethod
    def of(cls, cell: CellResult, requests: pl.DataFrame, slo: dict) -> "Arrays":
        ok = requests.filter(pl.col("ok"))
        out = ok["output_tokens"].cast(pl.Float64).to_numpy()
        e2e = ok["e2e_s"].cast(pl.Float64).to_numpy()
        ttft = ok["ttft_s"].cast(pl.Float64).fill_null(np.nan).to_numpy()
        tpot = tpot_s(e2e, ttft, out)
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
        ptok = (ok["prompt_tokens"].cast(pl.Float64).fill_null(np.nan).to_numpy() if "prompt_tokens" in ok.columns
                else np.full(len(out), np.nan))
        return cls(keys, out, e2e, ttft, tpot, good, cell.request_rate in ("inf", None), cell.concurrency,
                   cell.duration or 0.0, prompts, spec, cell.flavor, ptok)

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


def cell_log_stat(m: Measurements, key, metric: str) -> float | None:
    """Log figure of one cell (its repeats' spread is the run-to-run variation)."""
    return _log(m.arrays[key].point(metric, m.cells[key]))


def drafted_nothing(m: Measurements, server: str, suite: str, c: int) -> bool:
    """Every repeat of this cell reported zero drafts: speculation was configured but switched off
    (e.g. by a batch-size schedule), so the cell measures what being configured costs."""
    cells = [m.cells[(server, suite, c, r)] for r in m.repeats(server, suite, c)]
    return bool(cells) and all(x.spec_decode_num_drafts == 0 for x in cells)
