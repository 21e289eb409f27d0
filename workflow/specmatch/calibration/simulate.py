"""Synthetic experiments whose truth is known, to check the decision rules' error rates.

Each experiment measures a baseline and a speculative server on one suite of prompts at several
concurrencies, in R repeats, as the workflow does: the same prompts everywhere (each prompt has
its own difficulty, shared by both servers), a closed loop of C workers, request-to-request noise,
and a run-to-run effect per server session (repeat) that moves every cell of that session. The
speculative server is truly `speedup` times faster per token. The analysis (specmatch.deciding.analysis)
then sees only what a real run would produce: cell results and request records.

    python -m specmatch simulate [--experiments 300] [--session-sd 0.03] [--cell-sd 0.04] [--suites 1]
prints how often identical servers are called pays/loses (false decisions) and how often a true
15% speedup is called pays (power), for one and several repeats.

This model is the analysis's own (a cell's duration is the closed-loop makespan the bootstrap
uses), so it checks the method against itself. The calibration that can fail simulates the server
instead (specmatch.calibration.des, specmatch.calibration.harness: continuous batching, speculative steps, run-to-run
noise the analysis does not assume):

    python -m specmatch calibrate [--experiments 300] [--workers 2] [--k-sweeps]
"""
from __future__ import annotations

import argparse
import heapq
import sys

import numpy as np
import polars as pl

from .. import metrics
from ..deciding.analysis import analyse
from ..deciding.reading.measurements import Settings
from ..records import CellResult, Decision


def closed_loop(durations: np.ndarray, c: int) -> np.ndarray:
    """Start times of requests served in order by c workers (each takes the next when free)."""
    free = [0.0] * c
    starts = np.empty(len(durations))
    for i, d in enumerate(durations):
        t = heapq.heappop(free)
        starts[i] = t
        heapq.heappush(free, t + d)
    return starts


def cell(server: str, suite: str, c: int, repeat: int, e2e: np.ndarray, ttft: np.ndarray, out: np.ndarray,
         prompts: list[str], steps: np.ndarray | None = None, accepted: np.ndarray | None = None,
         prompt_tokens: np.ndarray | None = None, drafts: int | None = None, *, starts: np.ndarray | None = None,
         duration: float | None = None, drafted: np.ndarray | None = None, session: str | None = None,
         cached: np.ndarray | None = None) -> tuple[CellResult, pl.DataFrame]:
    """A cell result and its request frame. By default the requests' start times come from a closed loop
    of c workers over the latencies (the makespan model); a simulation of its own (specmatch.calibration.des) passes
    `starts` and `duration` as it measured them, `drafted` (per request, vLLM's num_draft_tokens) and
    `cached` (per request, the prompt tokens its prefix cache served: usage's cached_tokens)."""
    measured = starts is not None  # a simulation of its own: the cell carries the summaries the client writes
    if starts is None:
        starts = closed_loop(e2e, c)
    if duration is None:
        duration = float((starts + e2e).max())
    n = len(e2e)
    cols = {"prompt_id": prompts, "pass_index": [0] * n, "ok": [True] * n,
            "output_tokens": out.astype(np.int64), "e2e_s": e2e, "ttft_s": ttft, "start_s": starts,
            "num_spec_steps": steps if steps is not None else [None] * n,
            "num_accepted_tokens": accepted if accepted is not None else [None] * n,
            "prompt_tokens": prompt_tokens if prompt_tokens is not None else [None] * n}
    over = {"num_spec_steps": pl.Float64, "num_accepted_tokens": pl.Float64, "prompt_tokens": pl.Float64}
    if drafted is not None:
        cols["num_draft_tokens"], over["num_draft_tokens"] = drafted, pl.Float64
    if cached is not None:
        cols["cached_tokens"], over["cached_tokens"] = cached, pl.Float64
    req = pl.DataFrame(cols, schema_overrides=over)
    res = CellResult(server, suite, c, repeat, "vllm", "openai-completions", "vllm", c, n, n, 1, 0, "inf", 1.0, 0.0,
                     session or f"r{repeat}", False, "sim", "ok", n, 0, {}, duration, 0, int(out.sum()), n / duration,
                     float(out.sum()) / duration, None,
                     spec_decode_num_drafts=drafts if drafts is not None else
                     int(steps.sum()) if steps is not None else None)
    if drafted is not None:
        res.spec_decode_num_draft_tokens = int(np.sum(drafted))
        res.spec_decode_num_accepted_tokens = int(np.sum(accepted))
    if not measured:
        return res, req
    if prompt_tokens is not None:
        res.total_input_tokens = int(np.nansum(prompt_tokens))
        res.total_token_throughput = (res.total_input_tokens + float(out.sum())) / duration
    ms = {"ttft": ttft * 1000, "e2el": e2e * 1000}
    ms["tpot"] = metrics.tpot(e2e, ttft, out) * 1000
    for k, v in ms.items():
        v = v[np.isfinite(v)]
        if v.size:
            for stat, f in (("mean", np.mean), ("median", np.median), ("std", np.std)):
                setattr(res, f"{stat}_{k}_ms", float(f(v)))
            for q in (90, 99):
                setattr(res, f"p{q}_{k}_ms", float(np.percentile(v, q)))
    return res, req


def experiment(rng: np.random.Generator, speedup: float | dict, concurrencies=(1, 4, 16), repeats: int = 3,
               prompts: int = 32, out_tokens: int = 64, request_cv: float = 0.10, prompt_cv: float = 0.30,
               session_sd: float = 0.03, cell_sd: float = 0.04, suites=("s",)
               ) -> list[tuple[CellResult, pl.DataFrame]]:
    """Cells of one synthetic experiment (baseline and `spec`); `speedup` may vary by concurrency.

    Run-to-run variation has two parts, both real on shared machines: a server session's own speed
    (`session_sd`, shared by every cell of that session) and a cell's own conditions (`cell_sd`: what
    ran beside it, e.g. right after a heavy cell)."""
    out = np.full(prompts, float(out_tokens))
    per_suite = {u: ([f"{u}-{i:03d}" for i in range(prompts)], rng.lognormal(0.0, prompt_cv, prompts)) for u in suites}
    cells = []
    for r in range(1, repeats + 1):
        for server in ("baseline", "spec"):
            session = rng.normal(0.0, session_sd)
            for u in suites:
                ids, difficulty = per_suite[u]
                for c in concurrencies:
                    k = speedup.get(c, 1.0) if isinstance(speedup, dict) else speedup
                    speed = np.exp(session + rng.normal(0.0, cell_sd))
                    tpot = 0.02 * (1 + 0.15 * (c - 1)) * speed * difficulty / (k if server == "spec" else 1.0)
                    noise = rng.lognormal(0.0, request_cv, prompts)
                    ttft = 0.05 * (1 + 0.05 * c) * noise
                    e2e = ttft + tpot * (out - 1) * noise
                    steps = np.round(out / 2) if server == "spec" else None
                    cells.append(cell(server, u, c, r, e2e, ttft, out, ids, steps,
                                      (out - steps) if steps is not None else None))
    return cells


def decomposed_experiment(rng: np.random.Generator, servers: dict, suites: dict, concurrencies=(1, 4),
                          repeats: int = 2, prompts: int = 24, out_tokens: int = 64, session_sd: float = 0.02,
                          cell_sd: float = 0.02, request_cv: float = 0.05, tau_cv: float = 0.05
                          ) -> list[tuple[CellResult, pl.DataFrame]]:
    """Cells whose speedup has a known cause (specmatch.deciding.explaining.attribution): `servers` maps a name to (tau,
    rho): tau tokens per speculative step (None: a server that drafts nothing, the baseline or a
    configured-off control `x__off`) and rho, the time of one of its steps in plain decode steps of the
    baseline (a number, or a function of prompt length). `suites` maps a name to the (shortest,
    longest) prompt length; a plain decode step costs more over a longer prompt (sqrt of its length).
    Per prompt, tau varies by `tau_cv`; per request, vLLM's counts (1 + accepted / steps = tau)."""
    cells = []
    lengths = {u: rng.uniform(lo, hi, prompts) for u, (lo, hi) in suites.items()}
    difficulty = {u: rng.lognormal(0.0, 0.2, prompts) for u in suites}
    tau_p = {u: rng.lognormal(0.0, tau_cv, prompts) for u in suites}
    out = np.full(prompts, float(out_tokens))
    for r in range(1, repeats + 1):
        for name, (tau, rho) in servers.items():
            session = rng.normal(0.0, session_sd)
            for u in suites:
                ids = [f"{u}-{i:03d}" for i in range(prompts)]
                L = lengths[u]
                for c in concurrencies:
                    plain = 0.02 * (1 + 0.1 * (c - 1)) * (L / 100.0) ** 0.5 * difficulty[u]
                    speed = np.exp(session + rng.normal(0.0, cell_sd))
                    noise = rng.lognormal(0.0, request_cv, prompts)
                    steps_cost = rho(L) if callable(rho) else np.full(prompts, float(rho))
                    if tau is None:
                        tpot = plain * steps_cost * speed * noise
                        steps = accepted = None
                    else:
                        t = tau * tau_p[u]
                        steps = np.round((out - 1) / t)
                        accepted = np.round(steps * (t - 1))
                        tpot = plain * steps_cost / ((steps + accepted) / steps) * speed * noise
                    ttft = 0.05 * noise
                    e2e = ttft + tpot * (out - 1)
                    drafts = 0 if (tau is None and name.endswith("__off")) else None
                    cells.append(cell(name, u, c, r, e2e, ttft, out, ids, steps, accepted, L.round(), drafts))
    return cells


def rates(n: int, repeats: int, speedup: float, seed: int = 0, settings: Settings | None = None,
          **kw) -> dict:
    """Share of throughput verdicts of each kind over n experiments."""
    settings = settings or Settings(bootstrap=400)
    rng = np.random.default_rng(seed)
    counts = {d: 0 for d in Decision}
    total = 0
    for _ in range(n):
        an = analyse(experiment(rng, speedup, repeats=repeats, **kw), "baseline", settings)
        for v in an.verdicts:
            if v.metric == "output_throughput":
                counts[v.verdict] += 1
                total += 1
    return {d.value: counts[d] / total for d in Decision} | {"verdicts": total, "experiments": n}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specmatch simulate", description=__doc__.split("\n\n")[0],
                                epilog="The full calibration table against a discrete-event server: python -m specmatch calibrate")
    p.add_argument("--experiments", type=int, default=300)
    p.add_argument("--confidence", type=float, default=0.9)
    p.add_argument("--min-effect", type=float, default=0.05)
    p.add_argument("--session-sd", type=float, default=0.03, help="a server session's sd of log speed")
    p.add_argument("--cell-sd", type=float, default=0.04, help="a cell's own sd of log speed")
    p.add_argument("--request-cv", type=float, default=0.10)
    p.add_argument("--suites", type=int, default=1)
    a = p.parse_args(argv)
    s = Settings(confidence=a.confidence, min_effect=a.min_effect, bootstrap=400)
    kw = {"session_sd": a.session_sd, "cell_sd": a.cell_sd, "request_cv": a.request_cv,
          "suites": tuple(f"s{i}" for i in range(a.suites))}
    print(f"{a.experiments} experiments x {a.suites} suite(s) x 3 concurrencies; run-to-run sd {a.session_sd:.0%} "
          f"per session and {a.cell_sd:.0%} per cell, request cv {a.request_cv:.0%}; confidence {a.confidence:.0%}, "
          f"min_effect ±{a.min_effect:.0%}")
    for repeats in (1, 2, 3):
        null = rates(a.experiments, repeats, 1.0, seed=1, settings=s, **kw)
        power = rates(a.experiments, repeats, 1.15, seed=2, settings=s, **kw)
        print(f"R={repeats}: identical servers called pays/loses {null['pays'] + null['loses']:.1%} "
              f"(equivalent {null['equivalent']:.1%}); true 1.15x called pays {power['pays']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
