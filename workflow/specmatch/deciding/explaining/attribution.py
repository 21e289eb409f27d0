"""Explaining: why a speedup happens (docs/methods/why-it-pays.md).

A speculative step yields tau tokens (the engine's acceptance length) and costs rho plain decode
steps of the baseline, so the TPOT speedup is tau / rho. For a server whose batch-size schedule
runs plain steps at some batch sizes, tau is the tokens per decode step, plain steps included
(decompose: its speculative steps alone are a selection):

    rho = tau x TPOT(server) / TPOT(baseline)      (the time of one speculative step, in plain steps)

Normally rho >= 1: a draft plus a verify of k+1 tokens costs at least one plain step, and rho grows
with the batch as the target turns compute-bound, which (not a change in tau) is usually why
speculation stops paying at high concurrency. A TPOT speedup above tau (rho < 1, decisively) is
not the drafter's doing: the speculative server's step was cheaper than the baseline's plain
decode step, so the engine took another path (kernels, scheduler settings it changes when
speculation is configured). Three controls separate the causes:

- **configured off** (`<server>__off`, controls.py): the same configuration drafting nothing; its
  verdict against the baseline is the configuration effect, the server against it the drafting
  effect;
- **tau per prompt** (per-request spec-decode metrics where the engine reports them, else the
  cell's counters);
- **prompt length**: a plain decode step's cost grows with the context, so suites of different
  lengths differ for reasons unrelated to acceptance. Per-prompt log TPOT speedups are regressed on
  log prompt length and log tau with one intercept per suite (the slope is learnt within suites),
  and each suite's speedup is reported at the reference suite's median prompt length.

Intervals follow the verdicts' design (comparison.compare): a paired bootstrap by prompt, the same
draw applied to every repeat (tau and the TPOT ratio drawn jointly, so rho's interval knows their
correlation), plus the measured run-to-run variance of TPOT and of tau across server sessions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..verdicts.comparison import compare, decide
from ..reading.measurements import Arrays, Measurements, plain_steps, take, unit_draw, units
from ..verdicts.noise import RunToRun, VarianceSum, fit_tau2, repeat_mean_variance, shared_variance, tau2_dof
from ...serving.engines import adapters, definitions
from ...records import Interval
from ...resample import draws
from ...stats import log_t_interval

SPEC = ("num_spec_steps", "num_draft_tokens", "num_accepted_tokens")


# -- per prompt ---------------------------------------------------------------------------------
@dataclass
class PerPrompt:
    """One cell's requests summed per prompt (all its passes together), in a fixed prompt order."""
    tpot_sum: np.ndarray
    tpot_n: np.ndarray
    steps: np.ndarray        # over the requests that reported speculative steps
    drafted: np.ndarray
    accepted: np.ndarray
    out: np.ndarray
    prompt_tokens: np.ndarray  # mean over the prompt's requests (NaN when unknown)
    per_request: bool        # whether per-request spec-decode metrics were reported
    decoded: np.ndarray | None = None        # every request's tokens after the first (decode steps' output)
    decode_steps: np.ndarray | None = None   # every request's decode steps, speculative and plain

    @classmethod
    def of(cls, a: Arrays, prompts: list[str]) -> "PerPrompt":
        ids = {p: i for i, p in enumerate(prompts)}
        n = len(prompts)
        idx = np.array([ids.get(p, -1) for p in a.prompts], dtype=int)
        keep = idx >= 0
        g = idx[keep]

        def s(v, mask=None):
            m = keep if mask is None else keep & mask
            return np.bincount(idx[m], np.asarray(v, float)[m], minlength=n)

        tp = np.asarray(a.tpot, float)
        finite = np.isfinite(tp)
        steps = np.nan_to_num(a.spec.get("num_spec_steps", np.full(len(a.out), np.nan)), nan=0.0)
        spec = steps > 0
        pt = a.prompt_tokens if a.prompt_tokens is not None else np.full(len(a.out), np.nan)
        cnt = np.bincount(g, minlength=n).astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            ptok = np.bincount(g, np.nan_to_num(pt[keep], nan=0.0), minlength=n) / cnt
        ptok[~np.isfinite(ptok) | (ptok <= 0)] = np.nan
        acc = np.nan_to_num(a.spec.get("num_accepted_tokens", np.zeros(len(a.out))), nan=0.0)
        decoded = np.maximum(np.asarray(a.out, float) - 1, 0.0)
        dr = np.nan_to_num(a.spec.get("num_draft_tokens", np.zeros(len(a.out))), nan=0.0)
        return cls(s(np.where(finite, tp, 0.0), finite), s(finite.astype(float)), s(steps, spec), s(dr, spec),
                   s(acc, spec), s(a.out, spec), ptok, bool(spec.any()), s(decoded), s(steps + plain_steps(decoded, steps, acc)))


def common_prompts(m: Measurements, server: str, baseline: str, suite: str, c: int, reps: list[int]) -> list[str]:
    """The prompts both servers answered in every repeat, in a fixed order (comparison.compare's)."""
    common = set.intersection(*(set(m.arrays[(x, suite, c, r)].keys) for r in reps for x in (server, baseline)))
    return sorted({k.split("#", 1)[0] for k in common})


def acceptance_length(flavor: str, steps, drafted, accepted, out) -> np.ndarray:
    """The engine's acceptance length (engines/*: figures) for summed counts, element-wise: tau, tokens
    per speculative step, as each engine's own counters define it (what it counts as drafted and accepted
    differs by engine)."""
    eng = definitions(flavor)
    steps, drafted, accepted, out = (np.atleast_1d(np.asarray(x, float)) for x in (steps, drafted, accepted, out))
    res = np.full(steps.shape, np.nan)
    for i in np.ndindex(steps.shape):
        acc = eng.figures(0, float(steps[i]), float(drafted[i]), float(accepted[i]), float(out[i]))
        if acc is not None and acc.acceptance_length is not None:
            res[i] = acc.acceptance_length
    return res


def mixed_schedule(spec: dict | None) -> bool:
    """Whether a server's batch-size schedule runs plain steps at some batch sizes and speculative
    steps at others (vLLM's num_speculative_tokens_per_batch_size with k=0 and k>0 bands, SGLang's
    --speculative-adaptive config with 0 and non-zero candidate steps): the registered engines' adapters
    answer for their own keys (Engine.mixed_schedule). Tokens per decode step is right for any server,
    the engine's acceptance length only for one whose every step speculates."""
    return any(a.mixed_schedule(spec or {}) for a in adapters())


def mixed_servers(infos: dict) -> set[str]:
    """The servers (name -> deployment.ServerInfo) whose schedule runs plain steps at some batch sizes."""
    return {x for x, i in infos.items() if mixed_schedule(getattr(i, "speculative", None))}


def every_request_counted(a: Arrays, cell) -> bool:
    """Whether the per-request metrics account for every decode step: each request reported its
    speculative steps, or the ones missing drafted nothing (the reported steps add up to the cell's
    counter). A request without metrics is otherwise unknown, not plain: counting it as plain would
    lower tau by the share of requests whose metrics are missing."""
    steps = np.asarray(a.spec.get("num_spec_steps", np.full(len(a.out), np.nan)), float)
    if np.isfinite(steps).all():
        return True
    return cell.spec_decode_num_drafts is not None and float(np.nansum(steps)) == float(cell.spec_decode_num_drafts)


def tokens_per_decode_step(decoded, decode_steps) -> np.ndarray:
    """Tokens per decode step, plain steps included: what TPOT = step time / tokens per step divides by."""
    decoded, decode_steps = np.atleast_1d(np.asarray(decoded, float)), np.atleast_1d(np.asarray(decode_steps, float))
    with np.errstate(invalid="ignore", divide="ignore"):
        res = decoded / decode_steps
    res[~np.isfinite(res) | (decode_steps <= 0)] = np.nan
    return res


# -- run-to-run variation of tau ----------------------------------------------------------------
def acceptance_run_to_run(m: Measurements, servers: list[str] | None = None) -> tuple[float | None, float]:
    """tau_acc^2: the session-to-session variance of a configuration's log acceptance length, fitted
    as noise.run_to_run fits the metrics' (a median over configurations); estimated once per set of
    servers."""
    return m.estimated("acceptance_run_to_run", servers, lambda: _acceptance_run_to_run(m, servers))


def _acceptance_run_to_run(m: Measurements, servers: list[str] | None) -> tuple[float | None, float]:
    groups: dict = {}
    for key, cell in m.cells.items():
        if servers is not None and key[0] not in servers:
            continue
        t = cell_tau(m, key)
        if t is not None and t > 0:
            groups.setdefault(key[:3], []).append((key[0], key[3], math.log(t)))
    stats, resid = [], []
    for cfg, got in groups.items():
        if len(got) >= 2:
            ys = np.array([y for _, _, y in got])
            stats.append((float(((ys - ys.mean()) ** 2).sum()), len(ys) - 1))
            resid += [(srv, r, y - ys.mean(), len(ys)) for srv, r, y in got]
    if not stats:
        return None, float("inf")
    t2 = fit_tau2(stats)
    return t2, tau2_dof(t2, stats, resid)


def cell_tau(m: Measurements, key) -> float | None:
    """A cell's tokens per speculative step: pooled per-request metrics, else the cell's counters."""
    a, cell = m.arrays[key], m.cells[key]
    steps = np.nan_to_num(a.spec.get("num_spec_steps", np.array([])), nan=0.0)
    ok = steps > 0
    if ok.any():
        t = acceptance_length(a.flavor, steps[ok].sum(), np.nan_to_num(a.spec["num_draft_tokens"][ok]).sum(),
                 np.nan_to_num(a.spec["num_accepted_tokens"][ok]).sum(), a.out[ok].sum())[0]
        return float(t) if math.isfinite(t) else None
    if cell.spec_decode_num_drafts:
        return cell.spec_decode_acceptance_length
    return None


# -- the decomposition of one comparison ----------------------------------------------------------
@dataclass
class Decomposition:
    tau: Interval | None
    rho: Interval | None
    tpot: Interval | None
    explained: bool | None
    repeats: int
    run_to_run: bool
    source: str | None
    note: str | None = None


def decompose(m: Measurements, rr: RunToRun, acc_rr: tuple, server: str, baseline: str, suite: str, c: int,
              per_decode_step: bool = False) -> Decomposition:
    """tau, rho and the TPOT speedup (= tau / rho) of `server` against `baseline` at (suite, c).

    `per_decode_step` (a server whose schedule runs plain steps at some batch sizes): tau is the tokens
    per decode step, plain steps included. Its speculative steps alone are a selection (those taken
    while the batch was small: at c=16 a schedule off above batch 4 drafts only as the batch drains),
    and TPOT = step time / tokens per step holds only over all the steps."""
    s = m.settings
    cmp = compare(m, rr, server, baseline, suite, c, "tpot")
    tpot = None
    if cmp.estimate is not None:
        v = decide(cmp, s)
        tpot = Interval(v.speedup, v.lo, v.hi)
    reps = sorted(set(m.repeats(server, suite, c)) & set(m.repeats(baseline, suite, c)))
    if cmp.estimate is None or not reps:
        return Decomposition(None, None, tpot, None, len(reps), False, None, cmp.note)
    flavor = m.arrays[(server, suite, c, reps[0])].flavor
    # the same prompts and the same draw as the TPOT comparison (comparison.compare)
    prompts = common_prompts(m, server, baseline, suite, c, reps)
    sessions = m.session_ids()
    draw = unit_draw(s.rng("pair", server, baseline, suite, c, "tpot"), prompts, sessions, s.bootstrap)
    log_tau, log_tpot, boot_tau, boot_tpot, sources = [], [], [], [], set()
    for r in reps:
        ps = PerPrompt.of(m.arrays[(server, suite, c, r)], prompts)
        pb = PerPrompt.of(m.arrays[(baseline, suite, c, r)], prompts)
        with np.errstate(invalid="ignore", divide="ignore"):
            log_tpot.append(math.log(pb.tpot_sum.sum() / pb.tpot_n.sum()) - math.log(ps.tpot_sum.sum() / ps.tpot_n.sum()))
            boot_tpot.append(np.log(take(pb.tpot_sum, draw).sum(1) / take(pb.tpot_n, draw).sum(1))
                             - np.log(take(ps.tpot_sum, draw).sum(1) / take(ps.tpot_n, draw).sum(1)))
        if per_decode_step:
            cell, a = m.cells[(server, suite, c, r)], m.arrays[(server, suite, c, r)]
            if ps.per_request and every_request_counted(a, cell):
                sources.add("per-request metrics, tokens per decode step")
                t = tokens_per_decode_step(ps.decoded.sum(), ps.decode_steps.sum())[0]
                bt = tokens_per_decode_step(take(ps.decoded, draw).sum(1), take(ps.decode_steps, draw).sum(1))
            elif cell.spec_decode_num_drafts is not None and cell.spec_decode_num_accepted_tokens is not None:
                sources.add("cell counters, tokens per decode step")
                dec = float(np.maximum(a.out - 1, 0).sum())
                drafts = float(cell.spec_decode_num_drafts)
                plain = plain_steps(dec, drafts, cell.spec_decode_num_accepted_tokens)
                t = tokens_per_decode_step(dec, drafts + plain)[0]
                bt = np.full(s.bootstrap, t)
            else:   # neither every request's steps nor the cell's counters: the plain steps are unknown
                t, bt = float("nan"), np.full(s.bootstrap, np.nan)
        elif ps.per_request:
            sources.add("per-request metrics")
            t = acceptance_length(flavor, ps.steps.sum(), ps.drafted.sum(), ps.accepted.sum(), ps.out.sum())[0]
            bt = acceptance_length(flavor, *(take(x, draw).sum(1) for x in (ps.steps, ps.drafted, ps.accepted, ps.out)))
        else:
            cell = m.cells[(server, suite, c, r)]
            t = cell.spec_decode_acceptance_length if cell.spec_decode_num_drafts else None
            t = float("nan") if t is None else t
            bt = np.full(s.bootstrap, t)
            sources.add("cell counters")
        log_tau.append(math.log(t) if t and math.isfinite(t) and t > 0 else float("nan"))
        with np.errstate(invalid="ignore", divide="ignore"):
            boot_tau.append(np.log(bt))
    R = len(reps)
    if not all(math.isfinite(x) for x in log_tau):
        drafted = sum(map(math.isfinite, log_tau))
        return Decomposition(None, None, tpot, None, R, cmp.run_to_run, None,
                             partial_note(drafted, R) if drafted else "drafted nothing in any repeat")
    boot_tau, boot_tpot = np.array(boot_tau), np.array(boot_tpot)   # rows: repeats, columns: resamples
    ok = np.isfinite(boot_tau).all(0) & np.isfinite(boot_tpot).all(0)
    boot_tau, boot_rho = boot_tau[:, ok], (boot_tau - boot_tpot)[:, ok]
    est_tau = float(np.mean(log_tau))
    est_rho = est_tau - cmp.estimate  # cmp.estimate: mean over repeats of log TPOT speedup
    t2_acc, dof_acc = acc_rr
    run = R >= 2 and cmp.run_to_run
    P = max(units(prompts, sessions) - 1, 1)
    tau_parts, rho_parts = VarianceSum(), VarianceSum()
    if run:
        # as comparison.compare: the prompt sample's part is what the repeats share (the covariance of
        # their resampled figures); request noise is in the repeats' spread, i.e. in run to run
        tau_parts.add(("w", "tau"), shared_variance(boot_tau), P)
        rho_parts.add(("w", "rho"), shared_variance(boot_rho), P)
        rho_parts.plus(VarianceSum({k: list(v) for k, v in cmp.parts.parts.items() if not (k and k[0] == "w")}))
        if t2_acc is not None:
            tau_parts.add(("acceptance",), t2_acc / R, dof_acc)
            rho_parts.add(("acceptance",), t2_acc / R, dof_acc)
    else:
        tau_parts.add(("w", "tau"), repeat_mean_variance(boot_tau), P)
        rho_parts.add(("w", "rho"), repeat_mean_variance(boot_rho), P)
    se_tau, dof_tau = math.sqrt(tau_parts.total), tau_parts.dof
    se_rho, dof_rho = math.sqrt(rho_parts.total), rho_parts.dof
    tau = Interval(math.exp(est_tau), *log_t_interval(est_tau, se_tau, dof_tau, s.confidence))
    rho = Interval(math.exp(est_rho), *log_t_interval(est_rho, se_rho, dof_rho, s.confidence))
    return Decomposition(tau, rho, tpot, explained(rho, s.min_effect, run), R, run, ", ".join(sorted(sources)))


def both(vs_baseline: bool | None, vs_control: bool | None) -> bool | None:
    """Drafting explains a gain only if a speculative step costs at least a plain step of the baseline
    and of the configured-off control (the sharper unit: the engine's own path without drafting); a
    step decisively cheaper than either is a gain drafting cannot explain."""
    if vs_baseline is False or vs_control is False:
        return False
    if vs_baseline is True and vs_control in (True, None):
        return True
    return None


def explained(rho: Interval, min_effect: float, run_to_run: bool = True) -> bool | None:
    """Whether drafting can explain the TPOT speedup: false where the speculative step was decisively
    cheaper than a plain decode step (rho's interval below 1; without a measure of run-to-run
    variation, below 1 - min_effect), true where it cost at least a plain step within min_effect
    (rho's interval above 1/(1+min_effect)), None in between."""
    floor = 1 / (1 + min_effect)
    if rho.hi < (1.0 if run_to_run else floor):
        return False
    if rho.lo >= floor:
        return True
    return None


# -- prompt length --------------------------------------------------------------------------------
@dataclass
class LengthModel:
    """Per suite: the mean per-prompt log TPOT speedup (raw) and at the reference prompt length."""
    raw: dict            # suite -> log value
    adjusted: dict       # suite -> log value
    var_raw: dict        # suite -> bootstrap variance
    var_adj: dict
    boot_raw: dict       # suite -> bootstrap draws (for contrasts)
    boot_adj: dict
    slope: float         # d log speedup / d log prompt length
    reference_tokens: float
    repeats: dict        # suite -> repeats
    ranges: dict         # suite -> (shortest, longest) prompt tokens


def per_prompt_speedups(m: Measurements, server: str, baseline: str, suite: str, c: int
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """(log TPOT speedup, log prompt tokens, log tau) per prompt, averaged over the repeats."""
    reps = sorted(set(m.repeats(server, suite, c)) & set(m.repeats(baseline, suite, c)))
    if not reps:
        return None
    prompts = common_prompts(m, server, baseline, suite, c, reps)
    if len(prompts) < 3:
        return None
    ys, ls, sums = [], [], None
    flavor = m.arrays[(server, suite, c, reps[0])].flavor
    for r in reps:
        ps = PerPrompt.of(m.arrays[(server, suite, c, r)], prompts)
        pb = PerPrompt.of(m.arrays[(baseline, suite, c, r)], prompts)
        with np.errstate(invalid="ignore", divide="ignore"):
            ys.append(np.log(pb.tpot_sum / pb.tpot_n) - np.log(ps.tpot_sum / ps.tpot_n))
        ls.append(pb.prompt_tokens)
        part = np.stack([ps.steps, ps.drafted, ps.accepted, ps.out])
        sums = part if sums is None else sums + part
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.nanmean(np.stack(ys), axis=0) if len(ys) > 1 else ys[0]
        ell = np.log(np.nanmean(np.stack(ls), axis=0))
        tau = (np.log(acceptance_length(flavor, *sums)) if sums is not None and sums[0].any()
               else np.full(len(prompts), np.nan))
    return y, ell, tau, len(reps)


def length_model(m: Measurements, server: str, baseline: str, c: int, suites: list[str],
                 reference_tokens: float) -> LengthModel | None:
    """Fit log speedup_p = a_suite + b (log L_p - log L_ref) + g (log tau_p - mean), prompts of every
    suite together; the slope b comes from variation within suites. None when it is not identified
    (no prompt lengths, or no spread of length within the suites)."""
    data = {}
    for u in suites:
        got = per_prompt_speedups(m, server, baseline, u, c)
        if got is None:
            continue
        y, ell, tau, R = got
        keep = np.isfinite(y) & np.isfinite(ell)
        if keep.sum() >= 3:
            data[u] = (y[keep], ell[keep], tau[keep], R)
    if not data or not reference_tokens or not math.isfinite(reference_tokens):
        return None
    names = list(data)
    ref = math.log(reference_tokens)
    use_tau = all(np.isfinite(d[2]).all() for d in data.values()) and np.concatenate(
        [d[2] for d in data.values()]).std() > 1e-9
    within = sum(float(((d[1] - d[1].mean()) ** 2).sum()) for d in data.values())
    if within < 1e-9:
        return None
    tau_mean = float(np.concatenate([d[2] for d in data.values()]).mean()) if use_tau else 0.0

    def fit(sel: dict) -> tuple[float, dict, dict] | None:
        rows_y, rows_x = [], []
        for j, u in enumerate(names):
            y, ell, tau, _ = data[u]
            i = sel[u]
            x = np.zeros((len(i), len(names) + 1 + use_tau))
            x[:, j] = 1.0
            x[:, len(names)] = ell[i] - ref
            if use_tau:
                x[:, len(names) + 1] = tau[i] - tau_mean
            rows_x.append(x)
            rows_y.append(y[i])
        X, Y = np.concatenate(rows_x), np.concatenate(rows_y)
        if np.linalg.matrix_rank(X) < X.shape[1]:
            return None
        beta = np.linalg.lstsq(X, Y, rcond=None)[0]
        b = float(beta[len(names)])
        raw = {u: float(data[u][0][sel[u]].mean()) for u in names}
        adj = {u: float((data[u][0][sel[u]] - b * (data[u][1][sel[u]] - ref)).mean()) for u in names}
        return b, raw, adj

    full = fit({u: np.arange(len(data[u][0])) for u in names})
    if full is None:
        return None
    b, raw, adj = full
    rng = m.settings.rng("length", server, baseline, c, tuple(names))
    boot_raw = {u: [] for u in names}
    boot_adj = {u: [] for u in names}
    for _ in range(m.settings.bootstrap):
        got = fit({u: draws(rng, len(data[u][0])) for u in names})
        if got is None:
            continue
        for u in names:
            boot_raw[u].append(got[1][u])
            boot_adj[u].append(got[2][u])
    boot_raw = {u: np.array(v) for u, v in boot_raw.items()}
    boot_adj = {u: np.array(v) for u, v in boot_adj.items()}
    var = {u: float(v.var(ddof=1)) if len(v) > 2 else 0.0 for u, v in boot_adj.items()}
    var_raw = {u: float(v.var(ddof=1)) if len(v) > 2 else 0.0 for u, v in boot_raw.items()}
    return LengthModel(raw, adj, var_raw, var, boot_raw, boot_adj, b, reference_tokens,
                       {u: data[u][3] for u in names},
                       {u: (float(np.exp(data[u][1].min())), float(np.exp(data[u][1].max()))) for u in names})


def median_prompt_tokens(m: Measurements, server: str, suite: str) -> float | None:
    """The suite's median prompt length (tokens, from the server's usage), over its cells' requests."""
    vals = [a.prompt_tokens for k, a in m.arrays.items() if k[0] == server and k[1] == suite
            and a.prompt_tokens is not None]
    if not vals:
        return None
    v = np.concatenate(vals)
    v = v[np.isfinite(v)]
    return float(np.median(v)) if v.size else None


def session_variance(rr: RunToRun, server: str, baseline: str, c: int, R: int) -> VarianceSum:
    """The run-to-run variance of a mean log TPOT ratio over R repeats: both servers' sessions at this
    concurrency (noise.RunToRun.at), nothing with one repeat (then it is unmeasured)."""
    out = VarianceSum()
    if R < 2:
        return out
    for name in (server, baseline):
        out.plus(rr.at("tpot", name, c), 1 / R)
    return out


def partial_note(reps_with: int, reps: int) -> str:
    return f"drafted in {reps_with} of {reps} repeats (a schedule that switches drafting off near this batch size)"


# -- what differs between two launches -------------------------------------------------------------
VOLATILE_FLAGS = {"--port", "--host"}  # chosen per session; never a cause


def argv_options(argv) -> dict[str, str | None]:
    """`--flag value` / `--flag=value` / bare `--flag` / `-O0` items of a launch argv, by flag."""
    out: dict[str, str | None] = {}
    items = list(argv or [])
    i = 0
    while i < len(items):
        x = str(items[i])
        if x.startswith("-") and not _number(x):
            if "=" in x and x.startswith("--"):
                k, v = x.split("=", 1)
                out[k] = v
            elif i + 1 < len(items) and not (str(items[i + 1]).startswith("-") and not _number(str(items[i + 1]))):
                out[x] = str(items[i + 1])
                i += 1
            else:
                out[x] = None
        i += 1
    return out


def _number(x: str) -> bool:
    try:
        float(x)
        return True
    except ValueError:
        return False


def launch_differences(own_argv, base_argv) -> list[str]:
    """The options with which a server's launch differs from the baseline's (volatile ones aside):
    what the engine was told to do differently, in the argv's own words."""
    own, base = argv_options(own_argv), argv_options(base_argv)
    out = []
    for k in list(dict.fromkeys([*own, *base])):
        if k in VOLATILE_FLAGS or own.get(k, "\0") == base.get(k, "\0"):
            continue
        if k not in base:
            out.append(f"{k} {own[k]}" if own[k] is not None else k)
        elif k not in own:
            out.append(f"no {k}" + (f" {base[k]}" if base[k] is not None else ""))
        else:
            out.append(f"{k} {own[k]} (baseline: {base[k]})")
    return out
