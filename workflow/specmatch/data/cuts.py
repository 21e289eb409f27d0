"""The cut table's I/O (`results/inspect/cuts.parquet`: one records.Cut per assistant turn of every
usable row). The inspect step writes it; prompt extraction, regeneration and drafter training read
it. It lives in the data layer on its own so that those readers import a parquet reader and the
table's schema, not the whole inspect step."""
from __future__ import annotations

from pathlib import Path

import polars as pl

from ..files import SpecmatchError, atomic_path
from ..records import CUT_SCHEMA


def write_cuts(path: Path, cuts: pl.DataFrame) -> None:
    with atomic_path(path, ".parquet") as tmp:
        cuts.write_parquet(tmp)


def read_cuts(path: Path) -> pl.DataFrame:
    """The cut table, checked against records.Cut (a table from another specmatch fails clearly)."""
    try:
        df = pl.read_parquet(path)
    except FileNotFoundError:
        raise SpecmatchError(f"{path}: cut table not found (run the inspect step)") from None
    if dict(df.schema) != CUT_SCHEMA:
        raise SpecmatchError(f"{path}: columns {dict(df.schema)} are not those of records.Cut {CUT_SCHEMA}; "
                             "rerun the inspect step")
    return df
