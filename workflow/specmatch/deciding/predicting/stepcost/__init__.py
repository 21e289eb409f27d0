"""The step-cost map: what a speculative step costs at every batch size and context, measured apart
from acceptance, so any load is predicted from few cells (docs/methods/step-cost.md).

A speculative server's TPOT speedup is tau / rho: tau tokens per speculative step (the content's
and the drafter's) over rho, what the step costs in plain decode steps of the baseline at the same
batch (the engine's: a step drafts k tokens and verifies k + 1 whatever is accepted). tau hardly
moves with load; rho moves with the batch and the context and hardly with the content.

**The map** (map.py). Each server's step is T(b, C, P) = t0 + t1 b + t2 C + t3 P seconds (plus
t4 b^2 for the speculative server, whose step verifies k + 1 tokens a sequence) for b decoding
sequences holding C thousand tokens of context with P thousand prompt tokens computed for requests
waiting for a first token (traffic.step_model.fit_step_model: every request's own decode steps and
times, the batch it shared read from its cell's timeline, and the first tokens at c = 1, a prefill with
no queue), iterated to its fixed point. A step schedules as the engine does (traffic.step_model.Scheduler,
from Engine.step_budget): at most its token budget, the decodes first, the waiting prompts in chunks
after them; a prompt's tokens that the prefix cache served are not computed. The map's cells are the verdict cells plus short cells at more concurrencies
(config `step_cost`), in the same fresh server sessions; some concurrencies are held out of the fit,
measured only to check it. rho(b, L) = T_spec(b, bL, 0) / T_base(b, bL, 0) at L tokens of context per
sequence. Its error: the session share of both servers' log-TPOT run to run (noise.run_to_run; a greedy
request's steps do not move, so this is its step time's) at the nearest fitted concurrency, plus each
fitted concurrency's cell noise through the fit's Jacobian (refits with its cells 2% slower, bounds
held): small between fitted cells, growing beyond them.

On an engine that can force the acceptance length while drafting and verifying as usual (vLLM's
`rejection_sample_method: synthetic` on GPUs, SGLang's SGLANG_SIMULATE_ACC_LEN) rho could be mapped at
fixed tau; the CPU build refuses it (Engine.forced_acceptance), so the map reads the real drafter's
requests, whose tau spans the sources' range, and tests whether rho moves with tau: the slope of
each request's step time (over the map's) in its own log tau, within its cell, with an interval
clustered by prompt and by cell.

**Predictions** (predict.py). For a suite at concurrency c: a closed loop of c workers over whole
passes of its prompts (each with its measured prompt length, output and decode steps on each server)
replayed through both servers' T (traffic.step_model.simulate; a first token's queue as a multiplier of
the admission step), read as the verdicts read a cell (metrics.closed_loop). Intervals: the prompt
sample (paired bootstrap by prompt, n/(n-1) corrected, n - 1 dof), the map's error at c, and the
acceptance's run to run; Student t at Satterthwaite's dof, a verdict by the verdicts' rule. Where the
cells measured c: measured / predicted with its interval (run to run of the measured cells and the
map's error; the prompts are the same and cancel). The map holds when the concurrencies held out of the
fit agree (Bonferroni over them); only then do its predictions within the fitted batches decide the
recommendation's concurrencies the verdict grid lacks.

**Traffic profiles** (predict.predict_profile). Each profile's suite drawn stratum by stratum in its
shares from the strata's measured prompts (the basis suite's sources and the file suites), replayed
through the map at every load of the grid: "your traffic" where no cell was measured.

**The map in k** (kmap.py). A k sweep's mapped members give the step cost at any k between them (linear
in k, checked where three k are mapped), every k's speedup on the grid from the largest k's per-position
acceptance, the members held out against their cells, and a k schedule by batch band.

**Break-even acceptance.** At batch b speculation pays in TPOT when tau > rho(b, L): the map at the
suite's median context is the acceptance a drafter must reach there, set beside every source's
measured tau.
"""
from .build import build_map, requests_of
from .map import StepMap, fit_map, rho_points, tau_slope
from .predict import check_rows, map_holds, predict_suite, stratum_taus

__all__ = ["StepMap", "build_map", "requests_of", "fit_map", "rho_points", "tau_slope", "check_rows", "map_holds",
           "predict_suite", "stratum_taus"]
