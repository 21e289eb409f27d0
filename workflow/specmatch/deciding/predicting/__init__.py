"""For whom, and at what load: speedups predicted where no cell measured them, each from the cells
that were measured and each checked against cells the prediction did not use.

- traffic/: the step model (a server's step cost T(b, C, P), fitted to every cell's own timeline,
  traffic.step_model) and any traffic mix's speedup predicted from per-source measurements, with
  its break-even mix and the check against a measured mix (traffic.predictor, traffic.report);
- stepcost/: the step-cost map: what a speculative step costs against the baseline's at every batch
  size and context, every suite's speedup on a concurrency grid up to the largest batch, and the
  map in k for k sweeps (the step that writes it: deciding/stepcost.py).

Capacity at an SLO and production traffic belong here too. These modules read the measurements
(reading/), the verdicts' rules (verdicts/) and the acceptance's run to run (explaining/); the
recommendations (recommending/) stand on them.
"""
