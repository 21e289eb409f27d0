"""Which k at which load, part three: the batch bands, the k deployed at every batch size 1..max_batch
from each measured concurrency's choice (kchoice.best_k). The per-batch rule itself (each measured
concurrency runs its own setting, switches between neighbours that differ, what holds above the largest)
is deployment.per_batch_schedule, the one the on/off recommendation uses too; here the settings are k and
the switch points the crossings of two k's speedup curves. The record is kmodel.KBand.

**Bands** (bands). Batch sizes 1..max_batch. Every measured concurrency runs its OWN choice: a decided
one its k; an undecided one its best-supported candidate, which is off (no k pays there against off at
the level deploying speculation needs: the data do not support speculating there, so no k spreads over
it from a neighbour; `KBand.pinned_at`). Off never spreads over a concurrency whose data beat off either:
where some k pays at alpha / K, the choice there is "pays, k open", a decided k. Between two measured
concurrencies whose k differ, the switch sits where the two k's measured speedup curves cross (each
linear in log concurrency between measured points; for k = 0 the curve is 1): the generalisation of
the on/off switch at the crossing of 1. Where they do not cross inside the bracket (an equivalence
choice: the smaller k was chosen though its point estimate was lower; or an undecided concurrency run
off although its estimate favoured a k), the switch is the geometric mean of the two concurrencies
(the midpoint in log space). Below the smallest measured concurrency its k holds (`KBand.extrapolated`
"below", said in the text). Above the largest measured concurrency nothing was measured: where the
largest is decided, its k extends up to max_batch (`extrapolated` "above"; `beyond="off"` deploys k = 0
there instead); where the largest is undecided, speculation is off above it whatever `beyond` says
(`KRecommendation.undecided_top`): nothing measured shows that speculation pays at or above it, and
inheriting a k from a smaller concurrency would be speculation by extrapolation twice over (speculation
costs more per step as the batch grows, so the k of a lighter load is the wrong guess exactly where a
guess costs most). The text says so. A recommendation with no decided concurrency is undecided: no
bands (nothing to deploy is decided anywhere).
"""
from __future__ import annotations

import math

from .deployment import per_batch_schedule
from .kmodel import KBand, KChoice


# -- bands -----------------------------------------------------------------------------------------
def _curve(cmps_by_c: dict, k: int) -> dict[int, float]:
    """c -> the measured log speedup of k against the baseline (0 for k = 0)."""
    out = {}
    for c, cmps in cmps_by_c.items():
        if k == 0:
            out[c] = 0.0
        elif k in cmps and cmps[k].estimate is not None:
            out[c] = cmps[k].estimate
    return out


def _switch(cmps_by_c: dict, lo: int, hi: int, ka: int, kb: int) -> tuple[float, str]:
    """Where ka (chosen at lo) stops being better than kb (chosen at hi): the first crossing in
    [lo, hi] of their speedup curves, each linear in log c between measured points; else sqrt(lo hi)."""
    ya, yb = _curve(cmps_by_c, ka), _curve(cmps_by_c, kb)
    pts = sorted(c for c in ya if c in yb and lo <= c <= hi)
    if pts and pts[0] == lo and pts[-1] == hi:
        diff = [(c, ya[c] - yb[c]) for c in pts]
        if diff[0][1] > 0 >= diff[-1][1]:
            for (c0, d0), (c1, d1) in zip(diff, diff[1:]):
                if d0 > 0 >= d1 and d0 != d1:
                    x = math.log(c0) + d0 * (math.log(c1) - math.log(c0)) / (d0 - d1)
                    return math.exp(x), "crossover"
    return math.sqrt(lo * hi), "geometric mean"


def _per_batch(dec: dict[int, int], cmps_by_c: dict, max_batch: int, beyond: str) -> tuple[list[int], dict]:
    """The k at every batch size 1..max_batch from the k each measured concurrency runs (`dec`: c -> k) by
    deployment.per_batch_schedule, and the switches between neighbours whose k differ ((lo, hi) ->
    (where, how)). Above the largest: its k (`beyond` "extend") or off."""
    known = sorted(dec)
    switches = {(a, b): _switch(cmps_by_c, a, b, dec[a], dec[b]) for a, b in zip(known, known[1:]) if dec[a] != dec[b]}
    above = dec[known[-1]] if beyond == "extend" else 0
    return per_batch_schedule(dec, lambda lo, hi: switches[(lo, hi)][0], max_batch, above), switches


def runs(ch: KChoice) -> int | None:
    """The k a measured concurrency runs by its own data: its choice where decided; where undecided, its
    best-supported candidate: the k with the largest estimate among those that pay against off at the
    deploying level (`paying`; best_k decides such a concurrency "pays, k open", so this is for records
    built otherwise), else off (this module's docstring). None where it has no figure to decide from."""
    if ch.best is None and ch.k is None:
        return None
    if ch.k is not None:
        return ch.k
    if ch.paying:
        return max(ch.paying, key=lambda k: ((ch.speedups.get(str(k)) or {}).get("speedup") or 0.0, -k))
    return 0


def bands(choices: list[KChoice], cmps_by_c: dict, max_batch: int, beyond: str = "extend") -> list[KBand]:
    """Batch bands 1..max_batch with their k, each measured concurrency run by its own choice (runs; module
    docstring, "Bands"). `beyond`: "extend" (the largest measured concurrency's decided k holds above it,
    flagged) or "off" (k = 0 there); above an undecided largest concurrency it is off either way. Empty
    where no concurrency is decided."""
    if beyond not in ("extend", "off"):
        raise ValueError(f"beyond: 'extend' or 'off', not {beyond!r}")
    own = {ch.concurrency: runs(ch) for ch in choices}
    own = {c: k for c, k in own.items() if k is not None}
    decided = sorted(ch.concurrency for ch in choices if ch.k is not None)
    if not decided:
        return []
    pinned = sorted(c for c in own if c not in decided)
    top, bottom = max(own), min(own)
    per_batch, switches = _per_batch(own, cmps_by_c, max_batch, "off" if top in pinned else beyond)
    out: list[KBand] = []
    for b, k in enumerate(per_batch, 1):
        ext = "above" if b > top else "below" if b < bottom else None
        if out and out[-1].k == k and out[-1].extrapolated == ext:
            out[-1].hi = b
            continue
        if not out:
            why = "start"
        elif ext != out[-1].extrapolated:
            why = "measured range"
        else:
            pair = next(((a, z) for (a, z) in switches if a < b <= z), None)
            why = switches[pair][1] if pair else "measured range"
        out.append(KBand(b, b, k, boundary=why, extrapolated=ext))
    for band in out:
        band.decided_at = [c for c in decided if band.lo <= c <= band.hi]
        band.undecided_at = [c for c in pinned if band.lo <= c <= band.hi]
        band.pinned_at = list(band.undecided_at)
    return out
