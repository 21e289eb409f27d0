"""How a figure and its interval are written, once for every part of the report.

A figure that is unknown (None, or NaN: nothing measured it) is written "—"; an infinite one is a real
bound (an interval unbounded on that side), written "∞" or "-∞", never "inf" or "—".
"""
from __future__ import annotations

import math
from pathlib import Path

from ..files import atomic_path
from ..records import Effect

UNKNOWN = "—"


def number(v, spec: str = ".2f") -> str:
    """One figure in `spec`: "—" where unknown (None or NaN), "∞"/"-∞" where unbounded."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return UNKNOWN
    if isinstance(v, float) and math.isinf(v):
        return "∞" if v > 0 else "-∞"
    return format(v, spec)


def interval(value, lo, hi, spec: str = ".2f") -> str:
    """`value [lo, hi]`."""
    return f"{number(value, spec)} [{number(lo, spec)}, {number(hi, spec)}]"


def of(x, spec: str = ".2f") -> str:
    """`v [lo, hi]` of an interval record (records.Interval, AdjustedSpeedup: `value`; records.Effect:
    `speedup`); "—" for none, and for an interval around an unknown figure."""
    v = None if x is None else x.speedup if isinstance(x, Effect) else x.value
    if v is None:
        return UNKNOWN
    return interval(v, x.lo, x.hi, spec)


def speedup(v) -> str:
    """`1.23x [1.10, 1.37]` of a verdict (records.Verdict, Effect); "—" where nothing was compared."""
    if not v or v.speedup is None:
        return UNKNOWN
    return f"{number(v.speedup)}x [{number(v.lo)}, {number(v.hi)}]"


def concurrencies(cs) -> str:
    """`1,4,16`: the concurrencies a statement holds at."""
    return ",".join(str(c) for c in cs)


def save_figure(fig, path: Path) -> Path:
    """A figure as a PNG (dpi 110, tight), written atomically, then closed: every plot's one way out."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, ".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
