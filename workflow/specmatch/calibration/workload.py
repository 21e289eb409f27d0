"""One simulated experiment's prompts and the cells the discrete-event server measures on them.

A Workload is what a run holds fixed across servers and repeats: the prompts, their lengths, how
readily each accepts drafts and which drafts are right at each position (greedy decoding makes that
a property of the prompt), so the servers are compared on the same prompts as the workflow compares
them. simulate_cells serves every (server, suite, repeat) of many experiments in one vectorised DES
run per concurrency (the DES loops over engine steps, not cells) and writes them as the cells and
request frames the analysis reads from a real run (simulate.cell).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .des import Served, serve
from .grid import ALPHA, CONCURRENCIES, OUT_TOKENS, PROMPTS, SUITES
from .simulate import cell


@dataclass
class Workload:
    """One experiment's suites: prompt ids, prompt tokens, acceptance probability per prompt, and
    which drafts are right at each output position (greedy decoding: fixed per prompt); and, where a
    scenario's speedup varies by prompt, each plain server's pace per prompt (des.serve)."""
    ids: dict
    tokens: dict
    alpha: dict
    match: dict
    pace: dict = field(default_factory=dict)   # server -> suite -> tokens per decode step, per prompt

    @classmethod
    def draw(cls, rng: np.random.Generator, suites=SUITES, prompts=PROMPTS, prompt_sd: float = 0.0,
             servers=("baseline", "spec"), out_tokens=OUT_TOKENS) -> "Workload":
        """`prompt_sd` > 0: every server gets its own pace per prompt, lognormal with log-sd prompt_sd / sqrt(2),
        drawn independently, so the speedup of one over another varies by prompt with log-sd prompt_sd and
        the servers are exchangeable: identical on average for every estimand, a burst's slowest request
        included (one server's max is no likelier to be the larger)."""
        ids = {u: [f"{u}-{i:03d}" for i in range(prompts)] for u in suites}
        tokens = {u: np.clip(np.round(rng.lognormal(math.log(200), 0.6, prompts)), 16, 768) for u in suites}
        alpha = {u: rng.beta(*ALPHA, prompts) for u in suites}
        match = {u: rng.random((prompts, out_tokens + 8)) < alpha[u][:, None] for u in suites}
        pace = ({s: {u: np.exp(rng.normal(0.0, prompt_sd / math.sqrt(2), prompts)) for u in suites} for s in servers}
                if prompt_sd else {})
        return cls(ids, tokens, alpha, match, pace)

    def only(self, suites) -> "Workload":
        return Workload(*({u: d[u] for u in suites} for d in (self.ids, self.tokens, self.alpha, self.match)),
                        {s: {u: d[u] for u in suites} for s, d in self.pace.items()})



def simulate_cells(rng: np.random.Generator, work: list[Workload], engines: dict, effects: list[dict],
                   repeats: int | dict, concurrencies=CONCURRENCIES, out_tokens: int = OUT_TOKENS) -> list[list]:
    """Cells (simulate.cell: CellResult and request frame) of every experiment: `engines` maps a
    server to its Engine, or to one Engine per experiment; `effects` per experiment, as run_to_run
    draws them; `repeats` per server (or one number). Every (concurrency) is one vectorised DES run."""
    E = len(work)
    out: list[list] = [[] for _ in range(E)]
    for c in concurrencies:
        keys, eng, pt, al, mt, pc = [], [], [], [], [], []
        for e, w in enumerate(work):
            for s, en in engines.items():
                reps = repeats[s] if isinstance(repeats, dict) else repeats
                for u in w.ids:
                    for r in (range(1, reps + 1) if isinstance(reps, int) else reps):
                        keys.append((e, s, u, r))
                        eng.append(en[e] if isinstance(en, (list, tuple)) else en)
                        pt.append(w.tokens[u])
                        al.append(w.alpha[u])
                        mt.append(w.match[u])
                        pc.append(w.pace.get(s, {}).get(u, np.ones(len(w.ids[u]))))
        if not keys:
            continue
        pt, al = np.array(pt), np.array(al)
        paced = any(w.pace for w in work)
        served = serve(eng, c, pt, np.full(pt.shape, out_tokens), rng, al, np.array(mt),
                       np.array(pc) if paced else None)
        factor = np.exp([effects[e][(s, u, c, r)] for e, s, u, r in keys])
        served = served.scaled(factor)
        out_tok = np.full(pt.shape[1], float(out_tokens))
        for i, (e, s, u, r) in enumerate(keys):
            one: Served = served.row(i)
            spec = eng[i].k > 0
            out[e].append(cell(s, u, c, r, one.e2e, one.ttft, out_tok, work[e].ids[u],
                               one.steps if spec else None, one.accepted if spec else None, pt[i],
                               int(one.steps.sum()) if spec else None, starts=one.start,
                               duration=float(one.duration[0]), drafted=one.drafted if spec else None,
                               session=f"{s}-r{r}"))
    return out

