"""Render the decision: the decide step's records as the files a team reads.

The decide step (specmatch.deciding.decide) decided everything and wrote it as records (verdicts.json,
recommendations.json, attribution.json, k_sweeps.json, analysis.json); this step reads them, the
cells they were decided on, the prompt suites' match reports and the sequential design's round plans,
and writes

- `cells.csv` / `cells.parquet`: one tidy row per cell (every repeat); `speedups.csv`: every verdict;
- `plots/*.png`, `summary.md` (the answer on its first screen, then the evidence) and `report.html`
  (the same, as one self-contained page with the plots inline).

Nothing here decides anything: the parts of the report (reporting.tables, verdicts, design, why,
recommendations, kreport, loadgen, markdown, plots) render records only.

    python -m specmatch summary --decided results/summary --cells c*.json [--map-cells c*.json]
        --matches *.match.json [--rounds rounds/r*.json] --out-dir results/summary
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import steps
from ..deciding.decide import FILES
from ..files import atomic_path, read_json, write_text
from ..provenance import Recorder
from ..records import RoundPlan, StepCosts, SuiteMatch
from .decided import Decided
from .markdown import markdown
from .page import page
from .plots import plots
from .tables import cells_frame, verdicts_frame


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--decided", type=Path, help="the decide step's folder (default: --out-dir)")
    p.add_argument("--cells", nargs="+", type=Path, required=True, help="the cells the decisions were made on")
    p.add_argument("--map-cells", nargs="*", type=Path, default=[],
                   help="the step-cost map's own cells (never in a verdict): counted in the machine's quietness")
    p.add_argument("--matches", nargs="*", type=Path, default=[], help="the prompt suites' match reports")
    p.add_argument("--rounds", nargs="*", type=Path, default=[], help="the sequential design's round plans")
    p.add_argument("--stepcost", type=Path, help="the step-cost maps (results/stepcost/stepcost.json)")
    p.add_argument("--out-dir", type=Path, required=True)


def write_tables(d: Decided, out: Path) -> list[Path]:
    table = cells_frame(d)
    with atomic_path(out / "cells.csv") as tmp:
        table.write_csv(tmp)
    with atomic_path(out / "cells.parquet", ".parquet") as tmp:
        table.write_parquet(tmp)
    with atomic_path(out / "speedups.csv") as tmp:
        verdicts_frame(d).write_csv(tmp)
    return [out / "cells.csv", out / "cells.parquet", out / "speedups.csv"]


def execute(a: argparse.Namespace) -> int:
    folder = a.decided or a.out_dir
    rec = Recorder("summary", [folder / f for f in FILES.values()] + a.cells + a.map_cells + a.matches + a.rounds
                   + ([a.stepcost] if a.stepcost else []))
    d = Decided.read(folder, a.cells, a.map_cells)
    if a.stepcost:
        d.stepcost = StepCosts.from_json(read_json(a.stepcost))
    matches = [SuiteMatch.from_json(read_json(m)) for m in a.matches]
    plans = [RoundPlan.from_json(read_json(x)) for x in a.rounds]
    rec.config = {"baseline": d.baseline, "summary": d.decisions.analysis.settings}
    out = a.out_dir
    written = write_tables(d, out)
    made = plots(d, out / "plots")
    records = [folder / f for f in FILES.values() if (folder / f).exists()]
    html_path = out / "report.html"
    listed = [_rel(p, out) for p in [html_path, *made, *records, *written]]
    md = markdown(d, matches, plans, listed)
    write_text(out / "summary.md", md)
    write_text(html_path, page(md, made, out, [_rel(out / "summary.md", out)] + listed[1:]))
    rec.write([out / "summary.md", html_path, *written, *made])
    print("\n## ".join(md.split("\n## ")[:2]))   # the title and the answer
    return 0


def _rel(path: Path, folder: Path) -> str:
    """A file's name relative to the summary folder (as the page links it), else its path."""
    try:
        return path.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    return steps.main("summary", __doc__, arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
