"""Acceptance per suite, with intervals, and pooled per group of requests (the engine's own
definition, pooled over cells)."""
from __future__ import annotations

import numpy as np

from ...records import Acceptance, AcceptanceSummary, GroupAcceptance
from ...serving.engines import definitions
from ..reading.measurements import Measurements, unit_draw


def acceptance_summary(m: Measurements, server: str, suite: str) -> AcceptanceSummary:
    """The engine's own acceptance definition (engines/*: one per engine) over the pooled requests,
    and its percentiles over resamples of prompts (of sessions, for a session suite)."""
    cols = {"num_spec_steps": [], "num_draft_tokens": [], "num_accepted_tokens": [], "out": []}
    prompts, hold, flavor = [], [], None
    for key, a in m.arrays.items():
        if key[0] != server or key[1] != suite:
            continue
        ok = np.nan_to_num(a.spec["num_spec_steps"]) > 0
        for k in ("num_spec_steps", "num_draft_tokens", "num_accepted_tokens"):
            cols[k].append(a.spec[k][ok])
        cols["out"].append(a.out[ok])
        prompts += [p for p, k in zip(a.prompts, ok) if k]
        hold.append(m.cells[key].holdout_share)
        flavor = a.flavor
    if not prompts:
        return AcceptanceSummary(server, suite, None, None, None, 0, 0)
    eng = definitions(flavor)
    ids = {p: i for i, p in enumerate(dict.fromkeys(prompts))}
    group = np.array([ids[p] for p in prompts])
    per_prompt = {k: np.bincount(group, np.concatenate(v)) for k, v in cols.items()}
    known = {k: not np.isnan(np.concatenate(v)).any() for k, v in cols.items()}

    def length(sel) -> float | None:
        val = {k: (float(per_prompt[k][sel].sum()) if known[k] else None) for k in per_prompt}
        acc = eng.figures(len(sel), val["num_spec_steps"], val["num_draft_tokens"], val["num_accepted_tokens"],
                          val["out"])
        return acc.acceptance_length if acc else None

    n = len(ids)
    point = length(np.arange(n))
    # by prompt, or by session for a session suite's turns (unit_draw); a row's -1 padding draws nothing
    draw = unit_draw(m.settings.rng("acceptance", server, suite), list(ids), m.session_ids(), m.settings.bootstrap)
    boot = [x for x in (length(d[d >= 0]) for d in draw) if x is not None]
    q = (1 - m.settings.confidence) / 2
    hs = [h for h in hold if h is not None]
    return AcceptanceSummary(server, suite, point, float(np.quantile(boot, q)) if boot else None,
                             float(np.quantile(boot, 1 - q)) if boot else None, len(prompts),
                             int(per_prompt["num_spec_steps"].sum()), float(np.mean(hs)) if hs else None)




def pooled_acceptance(m: Measurements, key: str) -> list[GroupAcceptance]:
    """Acceptance per (server, suite, group) pooled over cells and repeats by the engine's own
    definition (`key`: the cells' acceptance_by_source, or acceptance_by_holdout: held-out rows vs
    seen ones), sorted by (server, suite, group)."""
    parts: dict = {}
    flavor: dict = {}
    for (server, suite, _c, _r), cell in m.cells.items():
        for group, acc in (getattr(cell, key) or {}).items():
            parts.setdefault((server, suite, group), []).append(Acceptance.from_json(acc))
            flavor[server] = cell.flavor
    out = []
    for (server, suite, group), accs in sorted(parts.items()):
        a = definitions(flavor[server]).combine(accs)
        if a is not None:
            out.append(GroupAcceptance(server, suite, group, a))
    return out


def per_position_rates(m: Measurements, server: str, suite: str) -> list[float] | None:
    """vLLM's per-position acceptance rates of a server on a suite, pooled over its cells (every
    concurrency and repeat) weighted by each cell's drafts; None where no cell reported them."""
    num, den = [], 0.0
    for key, cell in m.cells.items():
        if key[0] != server or key[1] != suite:
            continue
        rates, drafts = cell.spec_decode_per_position_acceptance_rates, cell.spec_decode_num_drafts
        if not rates or not drafts or any(r is None for r in rates):
            continue
        if len(num) < len(rates):
            num += [0.0] * (len(rates) - len(num))
        for p, r in enumerate(rates):
            num[p] += float(r) * drafts
        den += drafts
    if not den:
        return None
    return [x / den for x in num]
