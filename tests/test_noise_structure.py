"""bench/noise_structure.py on synthetic cells whose truth is known: REML recovers the session and cell
variances and the drift, with no drift and no session variance where there is none."""
from __future__ import annotations

import importlib.util
import math
import sys

import numpy as np
import pytest

from builders import REPO


def tool():
    spec = importlib.util.spec_from_file_location("noise_structure", REPO / "bench" / "noise_structure.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["noise_structure"] = mod   # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def synth(ns, seed, s2s, s2e, drift, servers=4, suites=3, cs=(1, 16), repeats=3):
    """A default-shaped run: repeat by repeat, server by server, each session 60 s of start-up then its
    cells (35 s each); log throughput = config mean + session + drift (linear over the run) + cell."""
    rng = np.random.default_rng(seed)
    rows = []
    now = 0.0
    mu = {(s, u, c): rng.normal(2, 0.5) for s in range(servers) for u in range(suites) for c in cs}
    total = repeats * servers * (60 + suites * len(cs) * 35)
    for r in range(repeats):
        for s in range(servers):
            now += 60
            a = rng.normal(0, math.sqrt(s2s))
            for u in range(suites):
                for c in cs:
                    rows.append((mu[(s, u, c)] + a + drift * now / total + rng.normal(0, math.sqrt(s2e)),
                                 (s, u, c), (0, s, r), now, c, s))
                    now += 35
    y, cfg, ses, t, conc, srv = map(list, zip(*rows))
    n = len(y)
    return ns.Cells(np.array(y), cfg, ses, [0] * n, np.array(t), np.full(n, 0.0005), np.zeros(n, bool),
                    np.array(conc), srv)


@pytest.mark.slow  # 120 REML fits (about 30 s on a loaded 2-core machine)
def test_reml_recovers_known_components():
    ns = tool()
    est = np.array([[d.components[k]["var"] for k in ("session", "cell")] + [d.drift_per_run["0"]]
                    for d in (ns.decompose(synth(ns, seed, 0.004, 0.002, 0.10), boot=0) for seed in range(60))])
    m, se = est.mean(0), est.std(0) / math.sqrt(len(est))
    assert abs(m[0] - 0.004) < 3 * se[0] + 2e-4      # session: REML is unbiased (ML would read ~2/3 of it)
    assert abs(m[1] - 0.002) < 3 * se[1] + 1e-4      # cell
    assert abs(m[2] - 0.10) < 3 * se[2] + 0.01       # the drift from start to end of the run
    quiet = np.array([[d.components[k]["var"] for k in ("session", "drift")]
                      for d in (ns.decompose(synth(ns, 100 + s, 0.0, 0.002, 0.0), boot=0) for s in range(60))])
    # no session and no drift: their estimates sit at (or near) zero, a small share of the cell's 0.002
    assert quiet[:, 0].mean() < 0.0004 and quiet[:, 1].mean() < 0.0004


def test_decomposition_intervals_and_request_split():
    ns = tool()
    d = ns.decompose(synth(ns, 7, 0.004, 0.002, 0.05), boot=10)
    c = d.components
    assert set(c) == {"session", "drift", "cell", "cell: requests", "cell: environment"}
    for k in ("session", "cell"):
        assert c[k]["lo"] <= c[k]["var"] <= c[k]["hi"]
    assert c["cell: requests"]["var"] == pytest.approx(0.0005)   # the cells' own bootstrap variance
    assert c["cell: requests"]["var"] + c["cell: environment"]["var"] == pytest.approx(c["cell"]["var"])
    assert d.cells == 72 and d.configurations == 24 and d.sessions == 12
    assert "session" in "\n".join(ns.report("x", d))
