"""The experiment every calibration simulates, and how its cells are read.

The grid is the embedded default's (three suites of 16 prompts, 16 output tokens, concurrencies 1, 4
and 16, a baseline and a second server on the same prompts), so a rate measured here is a rate of the
grid users run first. The servers are discrete-event ones (specmatch.calibration.des), not the
analysis's makespan model: `BASE` is a plain server, `SPEC` a speculative one whose truth is known
(`SPEC_TRUTH`). `settings` is the analysis's configuration for every simulated experiment, so every
calibration decides with the same rules a run does.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..deciding.reading.measurements import Settings
from .des import Engine

METRICS = ("output_throughput", "tpot", "e2el", "goodput")
CONCURRENCIES = (1, 4, 16)
SUITES = ("a", "b", "c")
PROMPTS = 16
OUT_TOKENS = 16
SLO = {"e2el_ms": 450.0}          # about the baseline's median at c=16 plus 8%: goodput is not throughput there
DECISIONS = ("pays", "loses", "equivalent", "inconclusive", "none")  # none: no figure (e.g. no request met the SLO)
EFFECTS = (0.05, 0.15, 0.30)

BASE = Engine(hiccup_p=0.002, hiccup_s=0.015)


def spec_rho(b: int) -> float:
    """A speculative step's cost in plain decode steps at batch size b (k=3, acceptance 0.6 a token):
    speculation pays about 1.4x at c=1, breaks even near c=4 and loses about 0.6x at c=16."""
    return float(np.interp(b, (1, 4, 16), (1.36, 1.81, 3.35)))


SPEC = replace(BASE, k=3, rho=spec_rho)
SPEC_TRUTH = "throughput 1.39x / 1.00x / 0.62x at c=1/4/16"  # 300 noise-free cells each
SPEC_INFO = {"method": "ngram", "num_speculative_tokens": SPEC.k}
ALPHA = (6.0, 4.0)                 # Beta: a prompt's per-token acceptance probability, mean 0.6


def settings(bootstrap: int = 250, **kw) -> Settings:
    """The analysis's settings in the calibration: "what would decide it" (Settings.designs) only where
    asked for, as the verdicts do not depend on it and it costs ~90% of an analysis."""
    return Settings(**({"confidence": 0.9, "min_effect": 0.05, "bootstrap": bootstrap, "slo": dict(SLO),
                        "designs": False} | kw))


def decided(v) -> bool:
    """A verdict with a figure that is not inconclusive (pays, loses or equivalent)."""
    return v is not None and v.speedup is not None and getattr(v.verdict, "value", v.verdict) != "inconclusive"


# the second server's truth in a calibration population named after it: a fixed speedup, or one drawn per
# experiment, log-uniform in (lo, hi) of the log; any other population's servers are identical
TRUTHS = {"effects": (-0.12, 0.12), "spread": (-0.2, 0.2), "near": (math.log(1.06), math.log(1.10)), "s115": 1.15}


def two_servers(population: str, rng: np.random.Generator) -> dict:
    """The baseline and `spec` of a calibration population (TRUTHS; identical servers where it names none)."""
    truth = TRUTHS.get(population)
    if truth is None:
        return {"baseline": BASE, "spec": BASE}
    return {"baseline": BASE, "spec": BASE.faster(math.exp(rng.uniform(*truth)) if isinstance(truth, tuple) else truth)}
