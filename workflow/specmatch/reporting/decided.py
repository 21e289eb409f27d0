"""What the report renders: the decide step's records and the cells they were decided on.

The report's parts read everything through `Decided`: the records of specmatch.deciding.decide
(verdicts, recommendations, attribution, k sweeps, the analysis record) and the cells (records.CellResult)
of the servers the analysis covered, with the look-ups every part shares. Nothing here computes a
figure: what a figure is was decided upstream and written.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from ..deciding.decide import Decisions
from ..deciding.reading.measurements import Settings
from ..files import read_json
from ..records import CellResult, Crossover, ServerFacts, StepCosts, Verdict


@dataclass
class Decided:
    decisions: Decisions
    cells: dict   # (server, suite, concurrency, repeat) -> CellResult, in the order the cells were given
    stepcost: StepCosts | None = None   # the step-cost maps (results/stepcost/stepcost.json), when given
    map_cells: dict = field(default_factory=dict)   # the map's own cells (never in a verdict), keyed as `cells`

    @classmethod
    def of(cls, decisions: Decisions, cells: list[CellResult]) -> "Decided":
        """The decisions with the cells of the servers they cover (a cell of another server was not
        analysed, so it is not rendered either)."""
        covered = set(decisions.analysis.servers)
        out = {}
        for c in cells:
            if c.server in covered:
                out[(c.server, c.suite, c.concurrency, c.repeat)] = c
        return cls(decisions, out)

    @classmethod
    def read(cls, folder: Path, cell_paths: list[Path], map_paths: list[Path] = ()) -> "Decided":
        d = cls.of(Decisions.read(folder), [CellResult.from_json(read_json(p)) for p in cell_paths])
        for p in map_paths:
            c = CellResult.from_json(read_json(p))
            d.map_cells[(c.server, c.suite, c.concurrency, c.repeat)] = c
        return d

    @property
    def measured_cells(self) -> dict:
        """Every cell this run measured: the verdicts' and the step-cost map's (the machine's quietness
        counts them all: the map's predictions rest on its cells as verdicts rest on theirs)."""
        return {**self.cells, **self.map_cells}

    # -- the grid and its settings ----------------------------------------------------------------
    @functools.cached_property
    def settings(self) -> Settings:
        return Settings.of(self.decisions.analysis.settings)

    @property
    def baseline(self) -> str:
        return self.decisions.analysis.baseline

    @property
    def servers(self) -> list[str]:
        return self.decisions.analysis.servers

    @property
    def suites(self) -> list[str]:
        return self.decisions.analysis.suites

    @property
    def concurrencies(self) -> list[int]:
        return self.decisions.analysis.concurrencies

    def repeats(self, server: str, suite: str, c: int) -> list[int]:
        return sorted(k[3] for k in self.cells if k[:3] == (server, suite, c))

    # -- the decisions ------------------------------------------------------------------------------
    @property
    def verdicts(self) -> list[Verdict]:
        return self.decisions.verdicts

    def verdict(self, server, suite, c, metric="output_throughput") -> Verdict | None:
        return next((v for v in self.verdicts if (v.server, v.suite, v.concurrency, v.metric) ==
                     (server, suite, c, metric)), None)

    @property
    def recommendations(self) -> list:
        return self.decisions.recommendations

    @property
    def attribution(self) -> list:
        return self.decisions.attribution

    @property
    def k_recommendations(self) -> list:
        return self.decisions.k_sweeps.recommendations

    @property
    def k_points(self) -> list:
        return self.decisions.k_sweeps.points

    def crossovers(self, server: str, suite: str, metric: str = "output_throughput") -> list[Crossover]:
        return next((x.crossovers for x in self.decisions.analysis.crossovers
                     if (x.server, x.suite, x.metric) == (server, suite, metric)), [])

    # -- what the launch records say ----------------------------------------------------------------
    def facts(self, server: str) -> ServerFacts | None:
        return next((f for f in self.decisions.analysis.server_facts if f.server == server), None)

    def warnings_beside(self, server: str) -> list[str]:
        """The engine's start-up warnings for `server` that the baseline's session did not log."""
        f = self.facts(server)
        return list(f.warnings_beside_baseline) if f else []

    @functools.cached_property
    def mixed(self) -> set[str]:
        """Servers whose schedule runs plain steps at some batch sizes."""
        return {f.server for f in self.decisions.analysis.server_facts if f.mixed_schedule}

    def goodput(self, key: tuple) -> float | None:
        return next((g.goodput for g in self.decisions.analysis.goodput
                     if (g.server, g.suite, g.concurrency, g.repeat) == key), None)
