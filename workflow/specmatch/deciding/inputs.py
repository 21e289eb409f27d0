"""What a deciding step reads: its command-line inputs, the cells and their request records (read
once, into measurements.Measurements) and what the recommendation needs of each server's launch.
The steps (recommend, rounds, decide) share these definitions, so no two of them can come to read
the same measurements differently."""
from __future__ import annotations

import argparse
from pathlib import Path

import polars as pl

from .recommending.deployment import ServerInfo
from .reading.measurements import Measurements, Settings
from ..files import SpecmatchError, read_json
from ..records import CellResult, LaunchRecord
from ..serving.engines import get_engine


def load(cell_paths: list[Path], request_paths: list[Path], settings: Settings) -> Measurements:
    """The cells and their request records, paired in the order Snakemake passed them (never guessed),
    as the measurements every question of the step reads."""
    if len(cell_paths) != len(request_paths):
        raise SpecmatchError(f"{len(cell_paths)} cell files but {len(request_paths)} request files")
    out = []
    for c, r in zip(cell_paths, request_paths):
        cell = CellResult.from_json(read_json(c))
        out.append((cell, pl.read_parquet(r)))
    if not out:
        raise SpecmatchError("no cells to analyse")
    return Measurements.of(out, settings)


def server_infos(launches: list[Path], configs: dict) -> dict[str, ServerInfo]:
    """What the recommendation needs of each server, from its (first repeat's) launch record (an external
    endpoint's largest batch from its config's `max_batch`, else 0: not known)."""
    infos: dict[str, ServerInfo] = {}
    for p in sorted(launches):
        rec = LaunchRecord.from_json(read_json(p))
        if rec.server in infos:
            continue
        cfg = configs.get(rec.server) or rec.config
        engine = get_engine(cfg if cfg.get("engine") else {**cfg, "engine": rec.engine})
        # an endpoint launched by no one here (max_batch 0): its configured `max_batch`, else none known
        # (the recommendation then covers the measured concurrencies)
        max_batch = rec.max_batch if engine.launches else (cfg.get("max_batch") or 0)
        infos[rec.server] = ServerInfo(rec.server, rec.engine, rec.flavor, cfg.get("speculative"), max_batch,
                                       engine.release(rec.engine_versions or {}), tuple(rec.engine_warnings),
                                       tuple(rec.argv), kv_pool=rec.kv_pool)
    return infos


def analysis_arguments(p: argparse.ArgumentParser) -> None:
    """What every step that analyses the cells reads (recommend, summary): one definition, so the
    two steps cannot come to read the same measurements differently."""
    p.add_argument("--baseline", required=True)
    p.add_argument("--settings", default="{}")
    p.add_argument("--servers", required=True, help="the configured servers as JSON (name -> config)")
    p.add_argument("--cells", nargs="+", type=Path, required=True)
    p.add_argument("--requests", nargs="+", type=Path, required=True)
    p.add_argument("--launches", nargs="*", type=Path, default=[])
    p.add_argument("--suites", nargs="*", default=[], help="the suites recommendations are made on")
