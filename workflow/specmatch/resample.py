"""Bootstrap draws: which units a resample takes, written once for every bootstrap of the decisions.

A resample draws as many units as the sample holds, with replacement, from a seeded Generator
(deciding's Settings.rng(*key): seeded by the question, so a figure does not depend on the order the
questions are asked). The unit is what varies together: a prompt, or a session, whose turns share
its effect (its topic, its tools, its cache); resampling a session's turns one by one treats them as
independent and understates the sample's variance (tests/test_session_bootstrap.py).

`draws` makes the draw itself: one rng.integers call of exactly the shape the caller asks for, so the
numbers are those a bootstrap drawing with that call would get (all resamples at once, or one
resample per call where each is fitted before the next is drawn). `Clusters` turns drawn units into
the items they hold.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np


def draws(rng: np.random.Generator, n: int, resamples: int | None = None, *, keep_original: bool = False
          ) -> np.ndarray:
    """Positions 0..n-1 drawn with replacement, n to a resample: `resamples` rows from one
    rng.integers(0, n, (resamples, n)) call, or, with `resamples` None, one resample as a 1-D array from
    rng.integers(0, n, n). `keep_original`: row 0 is the sample as measured (0..n-1), above the
    resamples, so a point estimate and its bootstrap are read through the same code."""
    picks = rng.integers(0, n, n if resamples is None else (resamples, n))
    if keep_original:
        return np.vstack([np.arange(n)[None, :], picks])
    return picks


@dataclass
class Clusters:
    """Items (prompts, requests) grouped into their resampling units: `units` the distinct units in
    sorted order, `index` each item's unit (a position in `units`), `members` each unit's items (their
    positions, in item order)."""
    units: list
    index: np.ndarray
    members: list[np.ndarray]

    @classmethod
    def of(cls, unit_of_item: Sequence[Hashable]) -> Clusters:
        units = list(dict.fromkeys(sorted(unit_of_item)))
        where = {u: i for i, u in enumerate(units)}
        index = np.array([where[u] for u in unit_of_item], dtype=np.int64)
        members: list = [[] for _ in units]
        for pos, u in enumerate(unit_of_item):
            members[where[u]].append(pos)
        return cls(units, index, [np.array(x, dtype=np.int64) for x in members])

    def __len__(self) -> int:
        return len(self.units)

    def items(self, pick: np.ndarray) -> np.ndarray:
        """One resample's items: every item of each drawn unit (`pick`: unit positions, as `draws` gives)."""
        return np.concatenate([self.members[g] for g in pick])

    def padded(self, picks: np.ndarray) -> np.ndarray:
        """Many resamples' items, a row each (`picks`: rows of unit positions), padded with -1 where a
        row's units hold fewer items than the longest row's (measurements.take reads -1 as nothing)."""
        sizes = np.array([len(x) for x in self.members])
        out = np.full((len(picks), int(sizes[picks].sum(1).max())), -1, dtype=np.int64)
        for i, row in enumerate(picks):
            got = self.items(row)
            out[i, :got.size] = got
        return out
