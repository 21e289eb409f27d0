"""What the workflow's rules need beyond their steps: result paths, the cells a sequential design has
measured so far, and the settings the rules pass, defined once and tested without Snakemake.

workflow/rules/common.smk is input functions and path constants only: each of its input functions
calls one function here with what Snakemake knows (the config, a checkpoint's output), so a rule's
inputs are the package's logic, not the Snakefile's.

    CELL_JSON, CELL_REQUESTS, LAUNCH       the cell and launch paths (rule outputs and inputs alike)
    DECISION_FILES                         the decide step's records, which the summary step reads
    cell_keys_through(...)                 the cells measured in repeats 1..r (the sequential design's rounds)
    launch_env(server)                     the conda environment a server's engine needs
    drafter_budget(spec)                   what the drafter may spend, from models.eagle3.<name>
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, Mapping, Sequence, Union

from .config import step_cost_suite
from .records import RoundPlan
from .serving.engines import ENGINES

# One cell of the grid and one server session: every rule and input function formats these.
CELL = "results/cells/{server}/{suite}/r{repeat}/c{concurrency}"
CELL_JSON = CELL + ".json"
CELL_REQUESTS = CELL + ".requests.parquet"
LAUNCH = "results/servers/{server}/r{repeat}/launch.json"

# The decide step's records (specmatch.deciding.decide), by name: the files it writes into the summary
# folder beside what the summary step renders from them.
SUMMARY = "results/summary"
DECISION_FILES = {"verdicts": "verdicts.json", "recommendations": "recommendations.json",
                  "attribution": "attribution.json", "k_sweeps": "k_sweeps.json", "analysis": "analysis.json",
                  "traffic": "traffic.json", "context": "context.json", "context_trends": "context_trends.json",
                  "stopping": "stopping.json"}

CellKey = tuple  # (server, suite, repeat, concurrency)


def cell_path(key: CellKey, ext: str = "json") -> str:
    """The file of one cell: `ext` json (its CellResult) or requests.parquet (its RequestRecords)."""
    server, suite, repeat, concurrency = key
    return f"{CELL.format(server=server, suite=suite, repeat=repeat, concurrency=concurrency)}.{ext}"


def launch_path(server: str, repeat: int) -> str:
    return LAUNCH.format(server=server, repeat=repeat)


Concurrencies = Union[Sequence[int], Mapping[str, Sequence[int]]]


def concurrencies_of(concurrencies: Concurrencies, suite: str) -> list[int]:
    """A suite's concurrencies: one list for every suite, or a suite's own (config.suite_concurrency)."""
    return list(concurrencies[suite] if isinstance(concurrencies, Mapping) else concurrencies)


def grid_keys(servers: Iterable[str], suites: Iterable[str], repeats: Iterable[int],
              concurrencies: Concurrencies) -> list[CellKey]:
    """Every (server, suite, repeat, concurrency) of a grid, server outermost and concurrency
    innermost (the order Snakemake's `expand` gave, which the steps see their inputs in); a suite
    measured at a part of the grid (`concurrencies` by suite) has only those cells."""
    suites, repeats = list(suites), list(repeats)
    return [(s, u, r, c) for s in servers for u in suites for r in repeats for c in concurrencies_of(concurrencies, u)]


def cell_paths(keys: Iterable[CellKey], ext: str = "json") -> list[str]:
    return [cell_path(k, ext) for k in keys]


def launch_paths(servers: Iterable[str], repeats: Iterable[int]) -> list[str]:
    repeats = list(repeats)
    return [launch_path(s, r) for s in servers for r in repeats]


# -- the sequential design: which cells exist after each round ------------------------------------
def rounds_before(r: int, min_repeats: int, max_repeats: int, plan: Callable[[int], RoundPlan]
                  ) -> Iterator[tuple[int, RoundPlan]]:
    """The rounds that ran before repeat r, as (round, plan): from `min_repeats` on, until a plan
    continues nothing (no later round runs) or the design's last round. `plan(k)` reads round k's plan
    (in the workflow, the `sequential_round` checkpoint's output: asking for it is what makes
    Snakemake run that round), and is called for each round in order, never for one after a plan that
    continued nothing."""
    for k in range(min_repeats, min(r, max_repeats)):
        got = plan(k)
        yield k, got
        if not got.next:
            return


def cell_keys_through(r: int, suites_of: dict[str, list[str]], concurrencies: Concurrencies, min_repeats: int,
                      max_repeats: int, plan: Callable[[int], RoundPlan]) -> list[CellKey]:
    """(server, suite, repeat, concurrency) of every configured server's cell measured in repeats 1..r:
    every cell up to `min_repeats` (each server on its own suites, `suites_of`, each suite at its
    concurrencies), then the cells each round's plan added."""
    out = [(name, suite, rep, c) for name, suites in suites_of.items() for suite in suites
           for rep in range(1, min(r, min_repeats) + 1) for c in concurrencies_of(concurrencies, suite)]
    for _, got in rounds_before(r, min_repeats, max_repeats, plan):
        out += [(p.server, p.suite, p.repeat, p.concurrency) for p in got.next]
    return out


def map_keys(cfg: dict, servers: Iterable[str], min_repeats: int) -> list[CellKey]:
    """The step-cost map's own cells (config `step_cost`): `servers` (the configured servers measured on
    the map suite, the configured-off controls left out by the caller) at each map concurrency the
    verdict grid lacks, in the design's first `step_cost.repeats` sessions (all `min_repeats` unless
    it says fewer)."""
    sc = cfg.get("step_cost") or {}
    extra = [c for c in sorted(sc.get("concurrency") or []) if c not in cfg["concurrency"]]
    if not extra:
        return []
    sessions = min(sc.get("repeats") or min_repeats, min_repeats)
    return grid_keys(list(servers), [step_cost_suite(cfg)], range(1, sessions + 1), extra)


def launches_of(keys: Iterable[CellKey]) -> list[str]:
    """The launch records (one per server session) a list of cells was measured on, sorted."""
    return sorted({launch_path(s, rep) for s, _, rep, _ in keys})


# -- settings the rules pass ------------------------------------------------------------------------
def launch_env(server: dict) -> str:
    """The conda environment (envs/<name>.yaml) a server's engine needs with
    `--software-deployment-method conda`: its adapter's (Engine.conda_env), e.g. vLLM's for the GPU or
    the CPU profile, or the package's own for an external endpoint (nothing to start)."""
    return ENGINES[server["engine"]].conda_env(server)


# keys of models.eagle3.<name> that are not the drafter's budget (training.drafter.Budget)
NOT_BUDGET = ("target", "aux_layers", "regenerate")


def drafter_budget(spec: dict) -> dict:
    """What training a drafter may spend (training.drafter.Budget), from its models.eagle3.<name>
    entry: every key but the target, the aux layers and the regeneration settings (each passed on its
    own), and torch threads 0 (all cores: the rule takes the whole machine)."""
    return {k: v for k, v in spec.items() if k not in NOT_BUDGET} | {"threads": 0}
