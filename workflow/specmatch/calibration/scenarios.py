"""Run-to-run variation of the simulated machines: the noise the calibration checks the verdicts against.

The analysis assumes normal session and cell effects (plain). A calibration that only simulated that
world would check the method against itself, so every scenario here breaks one assumption the way a
real machine does, and the verdicts must keep their error rates in each:

- plain: normal session (sd 3%) and cell (sd 4%) effects, the world the analysis assumes;
- hetero: run-to-run noise that depends on concurrency: 2% at c=1 and c=4, 8% at c=16 (1% of it
  shared by the session);
- t3: Student-t with 3 degrees of freedom for session and cell effects (same sd as plain);
- drift: plain, and the machine slows linearly over the run by 10% from the first cell to the last
  (in run order: repeat by repeat, servers alternating, cells in order within a session);
- outlier: plain, and one session per experiment (a server and a repeat drawn at random) 20% slower;
- quiet: normal, 1.5% run to run (where one repeat is meant to suffice);
- prompts15, prompts30: plain, and a speedup that varies by prompt (the servers identical on average).

Every cell's times are multiplied by exp(its log factor) (des.Served.scaled): a closed loop with no
think time is invariant to the scale, so the factor can be applied after the simulation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Scenario:
    """Run-to-run variation of one simulated machine (log speed of a session and of a cell)."""
    name: str
    session_sd: float = 0.03
    cell_sd: float | tuple = 0.04          # a number, or ((concurrency, sd), ...)
    tails: float | None = None             # Student-t degrees of freedom (None: normal)
    drift: float = 0.0                     # log slow-down from the run's first cell to its last
    outlier: float = 0.0                   # one session per experiment slower by log(1 + outlier)
    prompt_sd: float = 0.0                 # log-sd of the speedup from prompt to prompt (identical on average)
    about: str = ""

    def cell_sd_at(self, c: int) -> float:
        return dict(self.cell_sd)[c] if isinstance(self.cell_sd, tuple) else self.cell_sd

    def draw(self, rng: np.random.Generator, shape, sd) -> np.ndarray:
        if self.tails is None:
            return rng.normal(0.0, 1.0, shape) * sd
        k = self.tails
        return rng.standard_t(k, shape) * sd / math.sqrt(k / (k - 2))


SCENARIOS = {s.name: s for s in (
    Scenario("plain", about="normal session 3% and cell 4% effects (the analysis's assumption)"),
    Scenario("hetero", session_sd=0.01, cell_sd=((1, 0.0173), (4, 0.0173), (16, 0.0794)),
             about="run to run 2% at c=1,4 and 8% at c=16"),
    Scenario("t3", tails=3.0, about="Student-t(3) session and cell effects, sd as plain"),
    Scenario("drift", drift=0.10, about="plain + 10% linear slow-down over the run"),
    Scenario("outlier", outlier=0.20, about="plain + one session per experiment 20% slower"),
    Scenario("quiet", session_sd=0.0093, cell_sd=0.0118, about="run to run 1.5% (vLLM on GPUs, the low end)"),
    Scenario("prompts15", prompt_sd=0.15, about="plain + a speedup that varies by prompt (log-sd 0.15), identical "
                                                "on average"),
    Scenario("prompts30", prompt_sd=0.30, about="plain + a speedup that varies by prompt (log-sd 0.30), identical "
                                                "on average"),
)}


def run_order(servers: list[str], repeats: int) -> list[tuple[str, int]]:
    """Sessions in the order the workflow runs them (specmatch.run_order): repeat by repeat, servers
    in config order, then reversed, and so on."""
    out = []
    for r in range(1, repeats + 1):
        out += [(s, r) for s in (servers if r % 2 else servers[::-1])]
    return out


def run_to_run(rng: np.random.Generator, sc: Scenario, servers: list[str], suites, concurrencies, repeats: int,
               first_session: int = 0, total_sessions: int | None = None) -> dict:
    """Log time factor of every cell (server, suite, c, repeat): session + cell effects, drift by
    position in the run, the outlying session."""
    order = run_order(servers, repeats)
    total = total_sessions or (first_session + len(order))
    per_session = len(suites) * len(concurrencies)
    bad = order[rng.integers(len(order))] if sc.outlier else None
    out = {}
    for pos, (s, r) in enumerate(order, first_session):
        session = float(sc.draw(rng, (), sc.session_sd))
        j = 0
        for u in suites:
            for c in concurrencies:
                x = session + float(sc.draw(rng, (), sc.cell_sd_at(c)))
                if sc.drift:
                    x += sc.drift * ((pos + (j + 0.5) / per_session) / total - 0.5)
                if bad == (s, r):
                    x += math.log1p(sc.outlier)
                out[(s, u, c, r)] = x
                j += 1
    return out
