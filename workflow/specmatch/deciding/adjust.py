"""Covariate adjustment of cells (CUPED-style): remove what a measured covariate explains of run-to-run variation.

A cell's log throughput moves between repeats for reasons shared by everything measured at that moment
(the machine's speed drifting over the run, a neighbour) and reasons of its own. A covariate x measured
with every cell that tracks the first kind (the cell's start time for a drift; a calibration probe of
the machine's speed; the cell's interference reading) can be regressed out (Deng, Xu, Kohavi & Walker
2013, "Improving the sensitivity of online controlled experiments by utilizing pre-experiment data",
WSDM: CUPED):

    y'_kr = y_kr - theta_c (x_kr - xbar_c)

with y the log throughput of repeat r of configuration k = (server, suite, concurrency c), xbar_c the mean
covariate of every cell at concurrency c and theta_c the pooled within-configuration slope at c (every
configuration's repeats centred on their own means, so a server's real effect never enters theta). The
adjustment moves each repeat to what it would have read at the common covariate xbar_c: it removes from
the spread between repeats (what the analysis reads as run-to-run variation) the part x explains, AND
from each configuration's mean the part its repeats' covariates differ from the others' (a neighbour
that hit the baseline's first repeat and not the other server's). Centring each configuration on its own
mean instead would keep that nuisance in the point estimate while removing it from the variance: the
simulation (bench/adjust_sim.py) called identical servers different in 35% of verdicts that way. The
price: x must not depend on the server. Time does not, nor does a probe of the machine taken while the
server idles; a cell's interference reading may slightly (a neighbour gets more CPU beside a server that
leaves more gaps), so `interference` is the weakest of the three. A covariate that tracks nothing gets
theta near 0 and changes nearly nothing (its cost: the one degree of freedom theta takes, out of the
configurations' many). The adjustment is applied as a time scale on the cell (every request's times and
the cell's duration multiplied by exp(theta_c (x - xbar_c)), its throughputs divided by it), so the
analysis (deciding.measurements: the closed loop's makespan, bootstrapped by prompt) reads adjusted cells
exactly as it reads measured ones.

Covariates: `time` (the cell's start time: a drift over the run, free), `interference` (the cell's
foreign CPU, records.Interference: free where cells carry readings), `probe` (a calibration probe's log
speed measured before the cell, attached by the caller as `cell.probe_log_speed`).

NOT WIRED INTO THE WORKFLOW, on purpose. Simulated (bench/adjust_sim.py, A/A, 2 repeats, 100 runs x 4
throughput verdicts each, 90% confidence): with no drift and a covariate that tracks nothing, identical
servers were called different in 10.2% +- 1.5% of verdicts as measured and 17.5 / 19.2 / 21.0% (+- 2%)
adjusted for time / probe / interference; with a drift and a neighbour the covariate tracks, 5.8% as
measured and 10.2 / 13.2 / 15.5% adjusted. theta is fitted on the very spreads the analysis then reads
as run-to-run variation, and those spreads rest on few independent server sessions (4 at 2 servers x 2
repeats), so the fit removes chance session variation and the run-to-run variance (deciding.noise) is
underestimated. Safe uses: theta fixed in advance (a probe calibrated in the engine's own units), or the
run-to-run degrees of freedom reduced by one per fitted theta in deciding.noise. Until then this module
is the evidence and the tool (bench/adjust_sim.py), not a config key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from ..files import SpecmatchError
from ..records import CellResult

COVARIATES = ("time", "interference", "probe")
TIME_FIELDS = ("e2e_s", "ttft_s", "start_s", "read_lag_max_s")
MS_FIELDS = [f"{s}_{m}_ms" for s in ("mean", "median", "std", "p90", "p99") for m in ("ttft", "tpot", "itl", "e2el")]
RATE_FIELDS = ("request_throughput", "output_throughput", "total_token_throughput")


def covariate(cell: CellResult, kind: str) -> float | None:
    """The cell's covariate (None where it has none)."""
    if kind == "time":
        return cell.started_at / 60.0   # minutes: theta reads as a drift per minute
    if kind == "interference":
        i = cell.interference
        return i.foreign_cpu_cores if i is not None and i.available else None
    if kind == "probe":   # a probe's reading the caller attached to the cell (no workflow cell carries one)
        return getattr(cell, "probe_log_speed", None)
    raise SpecmatchError(f"adjust: unknown covariate '{kind}' (one of {', '.join(COVARIATES)})")


@dataclass
class Slope:
    """theta at one concurrency: its estimate, standard error, the configurations and cells it rests on, and
    the share of the within-configuration variance of log throughput it removes."""
    theta: float
    se: float | None
    configurations: int
    cells: int
    explained: float


@dataclass
class Adjustment:
    """What adjust() did: the covariate, theta per concurrency, and the cells it could not adjust."""
    covariate: str
    slopes: dict = field(default_factory=dict)    # concurrency -> Slope
    unadjusted: list = field(default_factory=list)  # (server, suite, c, repeat) without the covariate


def _key(cell: CellResult) -> tuple:
    return (cell.server, cell.suite, cell.concurrency)


def slopes(cells: list[CellResult], kind: str) -> dict[int, Slope]:
    """theta_c: the pooled within-configuration regression of log throughput on the covariate."""
    groups: dict = {}
    for c in cells:
        x = covariate(c, kind)
        if x is None or not c.output_throughput or c.output_throughput <= 0 or not math.isfinite(x):
            continue
        groups.setdefault(c.concurrency, {}).setdefault(_key(c), []).append((x, math.log(c.output_throughput)))
    out = {}
    for conc, by in groups.items():
        dx, dy = [], []
        configs = 0
        for rows in by.values():
            if len(rows) < 2:
                continue
            configs += 1
            xs, ys = np.array(rows).T
            dx += list(xs - xs.mean())
            dy += list(ys - ys.mean())
        dx, dy = np.array(dx), np.array(dy)
        sxx = float(dx @ dx)
        if configs == 0 or sxx <= 0:
            continue
        theta = float(dx @ dy) / sxx
        resid = dy - theta * dx
        dof = len(dx) - configs - 1
        se = math.sqrt(float(resid @ resid) / dof / sxx) if dof > 0 else None
        syy = float(dy @ dy)
        out[conc] = Slope(theta, se, configs, len(dx), 1 - float(resid @ resid) / syy if syy > 0 else 0.0)
    return out


def scaled(cell: CellResult, requests: pl.DataFrame, g: float) -> tuple[CellResult, pl.DataFrame]:
    """The cell with every time multiplied by g (and every rate divided by it)."""
    fields = {"duration": cell.duration * g}
    for f in RATE_FIELDS:
        v = getattr(cell, f)
        fields[f] = v / g if v is not None else None
    for f in MS_FIELDS:
        v = getattr(cell, f, None)
        if v is not None:
            fields[f] = v * g
    req = requests.with_columns([pl.col(c) * g for c in TIME_FIELDS if c in requests.columns])
    if "arrivals_s" in requests.columns:
        req = req.with_columns(pl.col("arrivals_s").list.eval(pl.element() * g))
    return replace(cell, **fields), req


def adjust(cells: list[tuple[CellResult, pl.DataFrame]], kind: str | None
           ) -> tuple[list[tuple[CellResult, pl.DataFrame]], Adjustment | None]:
    """The cells adjusted for covariate `kind` (None: as measured), and what was done."""
    if not kind:
        return cells, None
    if kind not in COVARIATES:
        raise SpecmatchError(f"adjust: unknown covariate '{kind}' (one of {', '.join(COVARIATES)})")
    th = slopes([c for c, _ in cells], kind)
    xs: dict = {}
    for c, _ in cells:
        x = covariate(c, kind)
        if x is not None and math.isfinite(x):
            xs.setdefault(c.concurrency, []).append(x)
    out, missing = [], []
    for c, req in cells:
        x = covariate(c, kind)
        s = th.get(c.concurrency)
        if x is None or not math.isfinite(x) or s is None:
            missing.append((c.server, c.suite, c.concurrency, c.repeat))
            out.append((c, req))
            continue
        g = math.exp(s.theta * (x - float(np.mean(xs[c.concurrency]))))
        out.append(scaled(c, req, g))
    return out, Adjustment(kind, th, missing)
