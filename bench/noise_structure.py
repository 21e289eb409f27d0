"""Where run-to-run variation comes from: the server session, slow drift over the run, or the cell itself.

Reads one or more results trees (`results/cells/<server>/<suite>/r<R>/c<C>.json`, each cell with its
`started_at` and `server_session`) and decomposes the variation of log output throughput between
repeats of a configuration (server, suite, concurrency) into

- **session**: shared by every cell of one server session (a server's start-up state, memory layout,
  compiled graphs): a random intercept per (results tree, server, repeat);
- **drift**: slow change of the machine's speed over the run, shared by every server measured at the
  same time (heat, frequency, background load): a polynomial in the cell's start time (per results
  tree), fitted beside the configurations' means; its part of the variance is what it moves a
  configuration's repeats, the mean over configurations of the variance of the fitted drift at their
  repeats' start times;
- **cell**: the rest, the cell's own conditions and its requests' noise; where the cells' requests are
  there (`c<C>.requests.parquet`), split into the **request** sampling part (the closed loop's makespan
  bootstrapped over the cell's own requests, deciding.reading.measurements.Arrays) and the cell's **environment**
  (cell - request);

and, where cells carry interference readings (records.Interference), the same with and without a
neighbour (flagged cells apart).

The model (a linear mixed model, fitted by REML):

    y_i = mu_config(i) + drift_tree(i)(t_i) + a_session(i) + e_i,   a ~ N(0, s2_session), e ~ N(0, s2_cell)

Why this one: the design is unbalanced (a sequential design repeats only some configurations; servers
are measured on subsets of suites), so ANOVA's method of moments has no unique form, while REML is
unbiased to first order for unbalanced designs and does not count the configurations' means (many
fixed effects for few repeats) against the variances, which maximum likelihood would (biased low by
about (R-1)/R at R repeats). Sessions are nested in servers and span suites and concurrencies, so the
session intercept is identified from how the cells of one session move together across its
configurations; drift from how every server's cells move with time across sessions (each server's
sessions are interleaved with the others' in time, run_order.py). Intervals: parametric bootstrap
(simulate from the fit, refit; percentile intervals), which is honest near the zero boundary where
Wald intervals for variances are not.

    .venv/bin/python bench/noise_structure.py --results /work/results-run0/results [--results ...]
        [--degree 1] [--boot 200] [--by-concurrency] [--out bench/out/noise_structure]

Writes `<out>.json` and `<out>.txt`. Seconds to a minute (the bootstrap refits).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from scipy import optimize

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "workflow"))


# -- the data -------------------------------------------------------------------------------------------
@dataclass
class Cells:
    """One row per cell: log throughput, its configuration, session, results tree, start time (s from the
    tree's first cell), the request-level bootstrap variance of its log throughput (NaN where unknown),
    and whether it was flagged."""
    y: np.ndarray
    config: list
    session: list
    tree: list
    t: np.ndarray
    request_var: np.ndarray
    flagged: np.ndarray
    concurrency: np.ndarray
    server: list

    def subset(self, mask: np.ndarray) -> "Cells":
        idx = np.flatnonzero(mask)
        return Cells(self.y[idx], [self.config[i] for i in idx], [self.session[i] for i in idx],
                     [self.tree[i] for i in idx], self.t[idx], self.request_var[idx], self.flagged[idx],
                     self.concurrency[idx], [self.server[i] for i in idx])

    def __len__(self) -> int:
        return len(self.y)


def request_variance(cell, requests_path: Path, boot: int = 200, seed: int = 0) -> float:
    """The variance of a cell's log throughput from resampling its own requests (the closed loop's
    makespan over a bootstrap sample, deciding.reading.measurements): the part a longer cell would shrink."""
    import polars as pl

    from specmatch.deciding.reading.measurements import Arrays

    if not requests_path.exists():
        return float("nan")
    arr = Arrays.of(cell, pl.read_parquet(requests_path), {})
    n = len(arr.out)
    if n < 2:
        return float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(boot, n))
    vals = arr.stat("output_throughput", idx)
    vals = vals[np.isfinite(vals) & (vals > 0)]
    return float(np.var(np.log(vals), ddof=1)) if len(vals) > 2 else float("nan")


def load(trees: list[Path], with_requests: bool = True, boot: int = 200) -> Cells:
    from specmatch.records import CellResult

    rows = []
    for ti, root in enumerate(trees):
        paths = sorted(p for p in (root / "cells").glob("*/*/r*/c*.json") if p.name.count(".") == 1)
        if not paths:
            raise SystemExit(f"{root}: no cells under {root / 'cells'}")
        cells = [(p, CellResult.from_json(json.loads(p.read_text()))) for p in paths]
        t0 = min(c.started_at for _, c in cells)
        for p, c in cells:
            if not c.output_throughput or c.output_throughput <= 0:
                continue
            rv = (request_variance(c, p.with_name(p.stem + ".requests.parquet"), boot) if with_requests
                  else float("nan"))
            rows.append((math.log(c.output_throughput), (c.server, c.suite, c.concurrency), (ti, c.server, c.repeat),
                         ti, c.started_at - t0, rv, c.flagged, c.concurrency, c.server))
    y, config, session, tree, t, rv, flagged, conc, server = map(list, zip(*rows))
    return Cells(np.array(y), config, session, tree, np.array(t, float), np.array(rv, float), np.array(flagged, bool),
                 np.array(conc), server)


# -- REML ------------------------------------------------------------------------------------------------
def design(cells: Cells, degree: int) -> tuple[np.ndarray, np.ndarray, list, np.ndarray]:
    """X: one mean per configuration (that has at least two cells) and a polynomial drift in time per tree
    (time scaled to [-1, 1] within the tree); Z: session indicators; the drift columns' indices; and the
    mask of cells kept (a configuration measured once says nothing about repeats)."""
    counts: dict = {}
    for k in cells.config:
        counts[k] = counts.get(k, 0) + 1
    keep = np.array([counts[k] >= 2 for k in cells.config])
    configs = sorted({k for k in cells.config if counts[k] >= 2})
    sessions = sorted({s for s, m in zip(cells.session, keep) if m})
    trees = sorted(set(cells.tree))
    cols = []
    for k in configs:
        cols.append(np.array([c == k for c in cells.config], float))
    drift_cols = []
    for tr in trees:
        m = np.array([x == tr for x in cells.tree])
        tt = cells.t[m]
        lo, hi = tt.min(), tt.max()
        scaled = np.where(m, 2 * (cells.t - lo) / (hi - lo) - 1 if hi > lo else 0.0, 0.0)
        for d in range(1, degree + 1):
            drift_cols.append(len(cols))
            cols.append(np.where(m, scaled ** d, 0.0))
    X = np.column_stack(cols)[keep]
    Z = np.column_stack([np.array([s == x for x in cells.session], float) for s in sessions])[keep]
    return X, Z, drift_cols, keep


@dataclass
class Fit:
    s2_session: float
    s2_cell: float
    beta: np.ndarray
    drift_cols: list
    loglik: float


def session_eigen(Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eigendecomposition of Z Z' (Z: disjoint session indicators) in closed form: per session of m
    cells, the normalised indicator with eigenvalue m; the rest of the space (eigenvalue 0) completed by
    QR. (numpy's eigh on a busy machine costs a quarter of a second here, a bootstrap needs hundreds.)"""
    n = Z.shape[0]
    sizes = Z.sum(0)
    first = Z / np.sqrt(np.where(sizes > 0, sizes, 1.0))
    q, _ = np.linalg.qr(np.column_stack([first, np.eye(n)]))
    U = np.column_stack([first, q[:, Z.shape[1]:n]])
    return np.concatenate([sizes, np.zeros(n - Z.shape[1])]), U


def reml(y: np.ndarray, X: np.ndarray, Z: np.ndarray, drift_cols: list, eig=None) -> Fit:
    """REML estimates of (s2_session, s2_cell) for y = X b + Z a + e (Patterson & Thompson 1971).

    V = s2_cell H(g), H = I + g Z Z' with g = s2_session / s2_cell: s2_cell has a closed form given g, so the
    restricted likelihood is profiled to one dimension and maximised over log g (g = 0, no session
    variance, is checked as the boundary). One eigendecomposition of Z Z' makes every evaluation O(n p^2)."""
    n, p = X.shape
    lam, U = eig if eig is not None else session_eigen(Z)
    yt, Xt = U.T @ y, U.T @ X

    def profile(g: float) -> tuple[float, float, np.ndarray]:
        w = 1.0 / (1.0 + g * lam)
        XtWX = Xt.T @ (Xt * w[:, None])
        b = np.linalg.solve(XtWX, Xt.T @ (w * yt))
        r = yt - Xt @ b
        q = float(r @ (w * r))
        s2e = q / (n - p)
        sign, logdet = np.linalg.slogdet(XtWX)
        nll = 0.5 * ((n - p) * math.log(max(s2e, 1e-300)) - np.log(w).sum() + logdet)
        return nll, s2e, b

    res = optimize.minimize_scalar(lambda lg: profile(math.exp(lg))[0], bounds=(-14.0, 8.0), method="bounded",
                                   options={"xatol": 1e-4})
    g = math.exp(res.x)
    nll, s2e, b = profile(g)
    nll0, s2e0, b0 = profile(0.0)
    if nll0 <= nll:
        g, nll, s2e, b = 0.0, nll0, s2e0, b0
    return Fit(g * s2e, s2e, b, drift_cols, -nll)


def drift_variance(fit: Fit, X: np.ndarray, Z: np.ndarray, config: list, unbiased: bool = True) -> float:
    """What the drift moves a configuration's repeats: the mean over configurations of the sample variance
    of the drift at its cells' start times. The fitted drift's square overstates it by its own sampling
    variance (E[b' A b] = beta' A beta + tr(A Cov b)); `unbiased` subtracts that (clipped at zero)."""
    if not fit.drift_cols:
        return 0.0
    D = X[:, fit.drift_cols]
    b = fit.beta[fit.drift_cols]
    cov = None
    if unbiased:
        Vi = np.linalg.inv(fit.s2_session * (Z @ Z.T) + fit.s2_cell * np.eye(len(X)))
        cov = np.linalg.inv(X.T @ Vi @ X)[np.ix_(fit.drift_cols, fit.drift_cols)]
    by: dict = {}
    for i, k in enumerate(config):
        by.setdefault(k, []).append(i)
    vs = []
    for idx in by.values():
        if len(idx) < 2:
            continue
        Dk = D[idx] - D[idx].mean(0)
        A = Dk.T @ Dk / (len(idx) - 1)
        vs.append(float(b @ A @ b) - (float(np.trace(A @ cov)) if cov is not None else 0.0))
    return max(0.0, float(np.mean(vs))) if vs else 0.0


@dataclass
class Decomposition:
    """Variance components of log throughput between repeats (squares of log-scale SDs; `sd_pct` the
    same as percent moves), each with its bootstrap interval."""
    cells: int
    configurations: int
    sessions: int
    confidence: float
    components: dict = field(default_factory=dict)   # name -> {"var", "lo", "hi", "sd_pct", "share"}
    drift_per_run: dict = field(default_factory=dict)  # tree -> fitted log drift from start to end of the run
    request_var_mean: float | None = None
    note: str = ""


def decompose(cells: Cells, degree: int = 1, boot: int = 200, confidence: float = 0.9, seed: int = 0) -> Decomposition:
    X, Z, drift_cols, keep = design(cells, degree)
    sub = cells.subset(keep)
    y = sub.y
    if drift_cols and np.linalg.matrix_rank(X) < X.shape[1]:
        # the drift is not identified (e.g. every configuration measured at one time): leave it out
        X = X[:, [j for j in range(X.shape[1]) if j not in drift_cols]]
        drift_cols = []
    eig = session_eigen(Z)
    fit = reml(y, X, Z, drift_cols, eig)
    dv = drift_variance(fit, X, Z, sub.config)
    rv = sub.request_var[np.isfinite(sub.request_var)]
    rmean = float(rv.mean()) if rv.size else None
    est = {"session": fit.s2_session, "drift": dv, "cell": fit.s2_cell}
    if rmean is not None:
        est["cell: requests"] = min(rmean, fit.s2_cell)
        est["cell: environment"] = max(0.0, fit.s2_cell - rmean)
    # parametric bootstrap: simulate from the fit (sessions and cells afresh, the fitted drift kept), refit
    rng = np.random.default_rng(seed)
    mean = X @ fit.beta
    nses = Z.shape[1]
    draws = {k: [] for k in est}
    for _ in range(boot):
        ys = mean + Z @ rng.normal(0, math.sqrt(fit.s2_session), nses) + rng.normal(0, math.sqrt(fit.s2_cell), len(y))
        f = reml(ys, X, Z, drift_cols, eig)
        draws["session"].append(f.s2_session)
        draws["cell"].append(f.s2_cell)
        draws["drift"].append(drift_variance(f, X, Z, sub.config))
        if rmean is not None:
            draws["cell: requests"].append(min(rmean, f.s2_cell))
            draws["cell: environment"].append(max(0.0, f.s2_cell - rmean))
    a = (1 - confidence) / 2
    total = est["session"] + est["drift"] + est["cell"]
    comps = {}
    for k, v in est.items():
        d = np.array(draws[k])
        # basic (reverse percentile) interval around the estimate, clipped at zero
        lo, hi = ((max(0.0, 2 * v - float(np.quantile(d, 1 - a))), max(0.0, 2 * v - float(np.quantile(d, a))))
                  if d.size else (None, None))
        comps[k] = {"var": v, "lo": lo, "hi": hi, "sd_pct": 100 * (math.exp(math.sqrt(v)) - 1),
                    "share": v / total if total > 0 else None}
    runs = {}
    trees = sorted(set(sub.tree))
    per = len(drift_cols) // len(trees) if drift_cols else 0
    for i, tr in enumerate(trees if per else []):
        b = fit.beta[drift_cols[i * per:(i + 1) * per]]   # b[d - 1] multiplies scaled time ** d
        runs[str(tr)] = float(sum(b[d - 1] * (1 - (-1) ** d) for d in range(1, per + 1)))   # d(1) - d(-1)
    return Decomposition(cells=len(y), configurations=len(set(sub.config)), sessions=nses, confidence=confidence,
                         components=comps, drift_per_run=runs, request_var_mean=rmean,
                         note=f"REML; drift a degree-{degree} polynomial in time per results tree; "
                              f"{boot} parametric bootstrap refits")


def report(name: str, d: Decomposition) -> list[str]:
    lines = [f"### {name}: {d.cells} cells, {d.configurations} configurations, {d.sessions} sessions ({d.note})", "",
             f"| component | variance (log scale) | {d.confidence:.0%} interval | SD as % | share of run-to-run |",
             "|---|---|---|---|---|"]
    for k, c in d.components.items():
        share = f"{c['share']:.0%}" if c["share"] is not None and not k.startswith("cell:") else (
            f"({c['share']:.0%})" if c["share"] is not None else "—")
        iv = f"[{c['lo']:.5f}, {c['hi']:.5f}]" if c["lo"] is not None else "—"
        lines.append(f"| {k} | {c['var']:.5f} | {iv} | {c['sd_pct']:.1f}% | {share} |")
    if d.drift_per_run:
        lines.append("")
        lines.append("Fitted drift from the start to the end of each run (log throughput): " + ", ".join(
            f"tree {k}: {v:+.3f} ({100 * (math.exp(v) - 1):+.1f}%)" for k, v in d.drift_per_run.items()))
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, nargs="+", required=True, help="results trees (folders holding cells/)")
    p.add_argument("--degree", type=int, default=1, help="the drift polynomial's degree (0: no drift term)")
    p.add_argument("--boot", type=int, default=200)
    p.add_argument("--no-requests", action="store_true", help="skip the request-level bootstrap of each cell")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "noise_structure")
    a = p.parse_args()
    cells = load(a.results, with_requests=not a.no_requests)
    out, lines = {}, [f"Noise structure of log output throughput: {', '.join(map(str, a.results))}", ""]
    groups = [("all cells", np.ones(len(cells), bool))]
    for c in sorted(set(cells.concurrency.tolist())):
        groups.append((f"c={c}", cells.concurrency == c))
    if cells.flagged.any():
        groups += [("quiet cells", ~cells.flagged), ("flagged cells (a neighbour)", cells.flagged)]
    for name, mask in groups:
        sub = cells.subset(mask)
        try:
            d = decompose(sub, a.degree, a.boot)
        except (np.linalg.LinAlgError, ValueError) as exc:
            lines += [f"### {name}: not decomposable ({exc})", ""]
            continue
        out[name] = asdict(d)
        lines += report(name, d) + [""]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{a.out}.json").write_text(json.dumps(out, indent=1))
    Path(f"{a.out}.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
