"""Your traffic, not the training set: any mix's speedup predicted from per-source measurements, the
break-even mix, and the check against a measured mix (docs/guides/your-traffic.md).

**Strata.** A traffic mix gives each stratum a share of requests: a training source (its prompts in
the basis suite, a stratified training suite: `min_per_source`) or a file suite (one stratum). Every
cell's requests carry their stratum, so a stratum's requests at concurrency c in repeat r are
measured by each server exactly as the verdicts see them; a mix is predicted by reweighting them
(post-stratification), never by re-measuring.

**What mixing does.** Acceptance is a property of the sequence (under greedy decoding, of the
prompt): a request needs the same number of decode steps n_r whatever runs beside it. The cost of
a step is a property of the batch: its size, its context and the prefills it carries, not which
source each sequence came from. Throughput is a ratio of sums over the cell, read as every verdict
reads a closed loop (metrics: C x tokens / the sum of latencies, the rate at the load), not a mean of
per-source ratios; a simulated suite is read by the same estimator, so a prediction and the measured
suite that checks it are the same quantity. So:

- **c = 1** (one request at a time; nothing is shared): a request takes in the mix exactly the time it
  took alone. The mix's mean TPOT is the request-weighted mean of the strata's, sum_s w_s TPOT_s
  (with equal outputs per request this is the step time over the mix's tokens per step, the
  harmonic mean of the strata's tau weighted by their tokens: tau_mix / rho), and its closed-loop
  throughput sum_s w_s out_s / sum_s w_s e2e_s, a post-stratified ratio estimator. No model: exact.
- **c > 1**: a batch holds several sources, and a stratum's request took its time beside its own
  suite's requests (contexts, prefills, a tail in which the batch drained as they finished). Each
  server's step is modelled as T(b, C, P) = t0 + t1 b + t2 C + t3 P seconds for b decoding sequences
  holding C thousand tokens of context with P thousand prompt tokens prefilled in the step (a
  speculative step: draft plus verify, whatever its acceptance), fitted to every cell of the server
  from the cells' own timelines (start, first token and end of every request; non-negative least
  squares on relative error, each request's mean step time over its decode and its first-token
  step). The mix is then a closed loop of C workers over a suite of the basis suite's size whose
  requests are drawn stratum by stratum (each slot's stratum with the mix's probabilities), each
  with its measured decode steps and prompt length, stepped synchronously through T. Each request
  keeps its own measured speed: its multiplier (measured time over the model's replay of its own
  cell) scales the steps it takes part in, so the model only carries a request from its own batch
  into the mix's, and at c = 1 it returns the measured times.

Assumptions (docs/guides/your-traffic.md lists them): a request's decode steps do not depend on the mix (greedy
acceptance; a batch-size schedule that switches drafting by batch size breaks this in the tail); the
step cost depends on the batch (size, context, prefills), linearly, not on the sources in it (a
drafter whose cost depends on what it drafts breaks this); the mix's prompts are like the strata's
measured prompts (lengths, acceptance: post-stratification assumes the strata are the population);
closed loop (open loop is not predicted); no prefix-cache effects between requests.

**Intervals.** log speedup = mean over repeats of each repeat's predicted log speedup, with three
independent parts:
- the prompt sample, per stratum: the post-stratified ratio linearised in each prompt's values
  averaged over the repeats (Predictor.prompt_variance: a prompt's share of the mix's numerator less
  its share of the denominator, server minus baseline), s^2 / n per stratum with n - 1 dof, summed
  with Satterthwaite's dof, so a stratum of 2-3 prompts widens the interval by its t quantile, a
  weighted stratum of one prompt has no interval, and the part is never 0 by chance (a difference
  of two noisy variances, the repeats' shared bootstrap variance or a bootstrap less the simulated
  suites' spread, was clipped to 0 for a third of the default's strata). At c > 1 the influences are
  the prompts' values measured at that concurrency. A prompt's mean over R repeats keeps 1/R of its
  request noise, which run to run counts too: the part errs wide by that;
- run to run: tau^2 of both servers at c over R repeats (noise.RunToRun, as comparison.compare);
- the model's own error (c > 1): every measured suite's speedup predicted by the step model from its
  own requests (their steps and lengths, not their own speeds); the spread of these residuals across
  suites, less what the cells' own run-to-run noise spreads them by, with suites - 1 dof, is how much
  the model's misfit differs between batch conditions: the error the per-request calibration cannot
  remove when a mix puts requests of several suites in one batch. At c = 1 the prediction is exact
  and this part is zero.
Their sum gives a Student t interval at Satterthwaite's dof (noise.VarianceSum), and its verdict
follows the verdicts' rule (comparison.decision). Coverage is checked by simulation against a
discrete-event server that serves mixed batches (tests/test_traffic.py).

**Break-even.** Along the line from a mix toward one stratum (that stratum's share of requests growing
to 1, the rest in the mix's proportions), `share` is where the predicted speedup crosses 1, and
`lo`/`hi` where the pointwise interval's bounds cross 1: the shares whose interval contains 1, a
confidence set for the crossing (test inversion), i.e. where the interval's verdict changes.

**Check.** A verified profile's suite (`traffic_<name>`, never used by the prediction) is predicted at
its drawn composition; `check` gives measured / predicted - 1 with its interval (the server sessions
both share cancel in it) and whether it contains 0. A suite drawn from the estimation prompts
(verify: same_prompts) is predicted from exactly its requests instead (Predictor.exact), so the prompt
sample cancels and the check, at c > 1, tests the step model's transfer into the mix's batches alone
(report._same_prompt_check).
"""
