"""The typed records that cross a stage boundary, defined once.

One prompt travels a one-way path: a **Cut** (one candidate assistant turn of one training row,
a row of `results/inspect/cuts.parquet`, written by inspection) becomes a **Prompt** (a line of
`results/prompts/{suite}.jsonl`), each time it is sent a **RequestRecord** (a row of
`c{C}.requests.parquet`), the records of one cell a **CellResult** (`c{C}.json`, vLLM `bench serve`
key names where the quantity exists), and the analysis over all cells **Verdict**s and
**Recommendation**s (`results/summary/verdicts.json`, `recommendations.json`).

The JSON and Parquet files are serialisations of these classes: `to_json`/`from_json` and
`polars_schema` derive from the dataclass fields, so a field added here reaches every file, and
tests check every written file against the class.
"""
from __future__ import annotations

import dataclasses
import functools
import enum
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import polars as pl


def location(file: str, line: int | None = None, row: int | None = None) -> str:
    """`file:line` for JSON Lines, `file:#row` for other formats: how every message names a row."""
    if line is not None:
        return f"{file}:{line}"
    return f"{file}:#{row}" if row is not None else file


class Record:
    """Shared (de)serialisation for the records below."""

    def to_json(self) -> dict:
        return {f.name: _plain(getattr(self, f.name)) for f in _written(self)}

    @classmethod
    def from_json(cls, obj: dict):
        """The record from its JSON form: unknown keys ignored, and every field typed by its hint read
        back as that type (an Enum from its value, a nested record from its dict), so a record class
        needs no reader of its own for those."""
        kinds = _field_kinds(cls)
        return cls(**{k: _typed(kinds[k], v) for k, v in obj.items() if k in kinds})


@functools.lru_cache(maxsize=None)
def _field_kinds(cls) -> dict:
    """Field name -> the Enum or Record class its hint names (through Optional), else None."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if typing.get_origin(t) in (Union, types.UnionType) and len(args) == 1:
            t = args[0]
        out[f.name] = t if isinstance(t, type) and issubclass(t, (enum.Enum, Record)) else None
    return out


def _typed(kind, v):
    if kind is None or v is None or isinstance(v, kind):
        return v
    if issubclass(kind, enum.Enum):
        return kind(v)
    return kind.from_json(v) if isinstance(v, dict) else v


def _plain(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, Record):
        return v.to_json()
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _written(cls) -> list:
    return [f for f in dataclasses.fields(cls) if f.metadata.get("written", True)]


_POLARS = {int: pl.Int64, float: pl.Float64, str: pl.String, bool: pl.Boolean}


def polars_schema(cls) -> dict[str, pl.DataType]:
    """Parquet/polars column types of a flat record class, from its type hints."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in _written(cls):
        t = hints[f.name]
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if typing.get_origin(t) in (Union, types.UnionType) and len(args) == 1:
            t = args[0]
        if typing.get_origin(t) is list:
            out[f.name] = pl.List(_POLARS[typing.get_args(t)[0]])
        elif t in _POLARS:
            out[f.name] = _POLARS[t]
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: {t} has no Parquet column type")
    return out


def frame(records: list, cls) -> pl.DataFrame:
    """A polars frame of records with the class's exact column types (also when empty)."""
    schema = polars_schema(cls)
    cols = {name: [getattr(r, name) for r in records] for name in schema}
    return pl.DataFrame(cols, schema=schema)


# -- training data -> prompts -----------------------------------------------------------------
@dataclass(frozen=True)
class Cut(Record):
    """One candidate assistant turn of one training row: the prompt is everything before the turn.

    Written by inspection for every assistant turn of every row (the suite's `turn` setting picks
    among them later), so prompt extraction never parses the training data again: it filters and
    samples this table and reads only the rows it chose (`offset` lets it seek in plain JSON Lines)."""
    source: str
    file: str
    row: int                      # 0-based index of the row in its file
    line: Optional[int]           # 1-based line in a JSON Lines file (None for Parquet/Arrow/JSON arrays)
    offset: Optional[int]         # byte offset of that line in an uncompressed JSON Lines file
    row_id: str                   # the row's `id`, else "<file relative to root>:<line or #row>"
    schema: str                   # tokenized | conversations | text
    turn: int                     # which assistant turn (0-based) the cut is before
    turns: int
    prompt_tokens: int
    completion_tokens: int
    holdout: bool
    key: str                      # hash of the prompt's token ids (or messages): duplicates share it

    @property
    def origin(self) -> str:
        return location(self.file, self.line, self.row)


@dataclass
class Prompt(Record):
    """One benchmark prompt: exactly the text training saw before an assistant turn (or a control
    prompt), where it came from, and how long its reference completion was."""
    id: str
    suite: str
    source: str
    file: str
    line: Optional[int]
    row: Optional[int]
    row_id: str
    turn: int
    turns: int
    text: str
    messages: Optional[list]
    prompt_tokens: int
    reference_completion_tokens: Optional[int]
    holdout: bool

    @property
    def origin(self) -> str:
        return location(self.file, self.line, self.row)

    def to_json(self) -> dict:
        out = super().to_json()
        if out["messages"] is None:
            del out["messages"]  # a template that cannot be split gives no messages, never `null`
        out["origin"] = self.origin  # for people reading the file; derived, never read back
        return out

    @classmethod
    def from_json(cls, obj: dict) -> "Prompt":
        return super().from_json({"messages": None, "line": None, "row": None, **obj})


# -- one request ------------------------------------------------------------------------------
@dataclass
class RequestRecord(Record):
    """What one request measured. Times are seconds on the client's monotonic clock, relative to the
    cell's start (`start_s`) or to the request's own start (the rest). Token counts come from the
    server's usage (or SGLang's meta_info), never from counting stream events."""
    index: int
    prompt_id: str
    source: str
    holdout: bool
    pass_index: int = 0                     # which pass over the suite (0-based)
    start_s: float = 0.0
    e2e_s: Optional[float] = None
    ttft_s: Optional[float] = None
    arrivals_s: list[float] = field(default_factory=list)
    coalesced_events: int = 0
    prompt_tokens: Optional[int] = None
    output_tokens: Optional[int] = None
    ok: bool = False
    error: Optional[str] = None
    num_draft_tokens: Optional[int] = None
    num_accepted_tokens: Optional[int] = None
    num_spec_steps: Optional[int] = None
    acceptance_length: Optional[float] = None
    acceptance_rate: Optional[float] = None
    arrival_clock: str = "read"
    read_lag_max_s: Optional[float] = None
    # the server's own clock for this request: only the bench's load targets send it; never written
    server_timing: Optional[dict] = field(default=None, metadata={"written": False})


# -- acceptance ---------------------------------------------------------------------------------
@dataclass
class Acceptance(Record):
    """Acceptance over a set of requests (a cell, a prompt source, the held-out rows), by one engine's
    definition (see the engine adapters: vLLM 1 + accepted/drafts, SGLang tokens/verify steps)."""
    requests: int
    num_spec_steps: Optional[int]
    num_draft_tokens: Optional[int]
    num_accepted_tokens: Optional[int]
    output_tokens: Optional[int]
    acceptance_rate: Optional[float]
    acceptance_length: Optional[float]


# -- one cell -----------------------------------------------------------------------------------
@dataclass
class CellResult(Record):
    """One (server, suite, concurrency, repeat) measurement. Names follow vLLM's `bench serve`
    result files where the quantity exists, so existing tools read cells."""
    server: str
    suite: str
    concurrency: int
    repeat: int
    engine: str
    protocol: str
    flavor: str                      # whose definitions acceptance follows: vllm | sglang | openai
    # the load
    max_concurrency: int
    num_prompts: int                 # measured requests (suite prompts x passes)
    suite_prompts: int
    passes: int
    warmup_requests: int
    request_rate: Any                # "inf" (closed loop) or requests/s
    burstiness: float
    started_at: float
    server_session: str
    server_reused: bool
    server_config_hash: str
    cache_reset: str
    # what it measured
    completed: int
    failed: int
    failure_reasons: dict
    duration: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: Optional[float]
    output_throughput: Optional[float]
    total_token_throughput: Optional[float]
    mean_ttft_ms: Optional[float] = None
    median_ttft_ms: Optional[float] = None
    std_ttft_ms: Optional[float] = None
    p90_ttft_ms: Optional[float] = None
    p99_ttft_ms: Optional[float] = None
    mean_tpot_ms: Optional[float] = None
    median_tpot_ms: Optional[float] = None
    std_tpot_ms: Optional[float] = None
    p90_tpot_ms: Optional[float] = None
    p99_tpot_ms: Optional[float] = None
    mean_itl_ms: Optional[float] = None
    median_itl_ms: Optional[float] = None
    std_itl_ms: Optional[float] = None
    p90_itl_ms: Optional[float] = None
    p99_itl_ms: Optional[float] = None
    mean_e2el_ms: Optional[float] = None
    median_e2el_ms: Optional[float] = None
    std_e2el_ms: Optional[float] = None
    p90_e2el_ms: Optional[float] = None
    p99_e2el_ms: Optional[float] = None
    holdout_share: Optional[float] = None
    # how it was measured (the load generator's own honesty)
    arrival_clock: Optional[str] = None
    p99_client_read_lag_ms: Optional[float] = None
    max_client_read_lag_ms: Optional[float] = None
    coalesced_token_events: int = 0
    coalesced_token_share: Optional[float] = None
    definitions: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    # acceptance, scoped to exactly this cell
    acceptance_source: Optional[str] = None
    spec_decode_num_drafts: Optional[int] = None
    spec_decode_num_draft_tokens: Optional[int] = None
    spec_decode_num_accepted_tokens: Optional[int] = None
    spec_decode_acceptance_rate: Optional[float] = None
    spec_decode_acceptance_length: Optional[float] = None
    spec_decode_per_position_acceptance_rates: Optional[list] = None
    acceptance_by_source: dict = field(default_factory=dict)
    acceptance_by_holdout: dict = field(default_factory=dict)


# -- decisions ----------------------------------------------------------------------------------
class Decision(str, enum.Enum):
    """A verdict is one of four values, never prose that code branches on."""
    PAYS = "pays"
    LOSES = "loses"
    EQUIVALENT = "equivalent"        # the interval lies inside ±min_effect: decisively no difference
    INCONCLUSIVE = "inconclusive"    # neither: the record says what would decide it


METRICS = ("output_throughput", "goodput", "tpot", "e2el")


@dataclass
class Verdict(Record):
    """A speculative server against the baseline at one (suite, concurrency), on one metric.

    `speedup` > 1 is always better for the speculative server (throughput ratio, or the baseline's
    latency over the server's). The interval combines request-level (paired by prompt) and
    run-to-run variation (across repeats) at `confidence`."""
    server: str
    suite: str
    concurrency: int
    metric: str
    verdict: Decision
    speedup: Optional[float]
    lo: Optional[float]
    hi: Optional[float]
    confidence: float
    repeats: int
    against: str = ""                     # the server compared with (the baseline unless stated)
    run_to_run: bool = True               # whether the interval includes run-to-run variation
    decide: Optional[str] = None          # for inconclusive: what would decide it
    dof: Optional[float] = None           # the Student t interval's degrees of freedom
    # for inconclusive: the cheapest (repeats, suite size) whose data decide it with probability
    # >= `probability` over the effect's current interval, or the best reachable: {repeats,
    # suite_scale, prompts, probability, reachable} (analysis.comparison.deciding_design)
    design: Optional[dict] = None


@dataclass
class Region(Record):
    """Consecutive measured concurrencies with the same verdict."""
    verdict: Decision
    first: int
    last: int


class Direction(str, enum.Enum):
    """Which way a crossover goes as concurrency grows: typed, never prose that code branches on."""
    STOPS_PAYING = "stops paying"         # pays below it, loses above
    STARTS_PAYING = "starts paying"       # loses below it, pays above


@dataclass
class Crossover(Record):
    """Where the speedup crosses 1 between two measured concurrencies whose verdicts have opposite
    signs (`below` pays and `above` loses, or the reverse): interpolated on log concurrency, with
    an interval at the confidence level drawn jointly over the shared server sessions and including
    the interpolation's own error; it never leaves [below, above]."""
    point: float
    lo: Optional[float]
    hi: Optional[float]
    direction: Direction
    below: Optional[int] = None           # the measured concurrency with a decided verdict below it
    above: Optional[int] = None           # ... and above it
    metric: str = "output_throughput"


class Outcome(str, enum.Enum):
    """The measured check of a recommended deployment (records.Verification)."""
    VERIFIED = "verified"                 # equivalent to (or better than) its reference at every concurrency
    FAILED = "failed"                     # decisively worse than its reference somewhere
    UNDECIDED = "undecided"               # neither, at the stated error rates
    NOT_MEASURED = "not measured"         # the deployment has not been measured (yet)
    NOT_VERIFIABLE = "not verifiable"     # nothing here can measure it (e.g. an external endpoint)


@dataclass
class Verification(Record):
    """The recommended deployment, measured on the grid, against a reference fixed by the schedule
    before the data are seen: at each concurrency, the server the schedule says should run there
    (the speculative server where it speculates, the baseline where it does not), on one metric.

    With alpha = 1 - confidence and K concurrencies with a reference: a concurrency is equivalent when
    its 1 - 2 alpha interval (`equivalence_confidence`) lies inside +/-min_effect (TOST at alpha), loses
    when its 1 - 2 alpha / K interval (`per_test_confidence`, Bonferroni) lies below 1 (the deployment
    costs throughput), pays when that one lies above 1. `verified`: every concurrency equivalent or
    better (an intersection-union test: P(verified | some concurrency differs by more than min_effect)
    <= alpha); `failed`: some concurrency loses (P(failed | the deployment equals its references) <=
    alpha). `error_rates` states both bounds (deployment.verification)."""
    server: Optional[str]                 # the measured deployment
    outcome: Outcome
    metric: str
    confidence: float
    per_test_confidence: Optional[float] = None
    min_effect: float = 0.05
    # [{concurrency, against, speedup, lo, hi, equivalence_lo, equivalence_hi, verdict}]
    per_concurrency: list = field(default_factory=list)
    error_rates: dict = field(default_factory=dict)      # {verified_if_costly, failed_if_correct}
    reason: Optional[str] = None
    equivalence_confidence: Optional[float] = None


@dataclass
class Recommendation(Record):
    """What to deploy for one speculative server on one suite, built from its verdicts."""
    server: str
    suite: str
    regions: list
    crossover: Optional[Crossover]        # the first of `crossovers` (None where verdicts never change sign)
    action: str                           # keep | off | schedule | undecided | none
    vllm_schedule: Optional[list]         # [[start, end, k], ...] (inclusive) or None
    sglang: Optional[dict]                # the SGLang mechanism, or {"mechanism": None, "why": ...}
    verified: Optional[Verification]      # the measured check of the recommended deployment
    text: str = ""
    evidence: str = ""
    derived_server: Optional[str] = None  # "<server>__recommended" when it is measured on the grid
    as_configured: bool = False           # the recommended deployment is the server as configured
    measured_by: Optional[str] = None     # another configured server that already deploys it
    crossovers: list = field(default_factory=list)  # every Crossover, in concurrency order
    # the largest measured concurrency, where the recommendation's batch sizes above it (up to
    # max_batch) only extend its verdict, unmeasured: an extrapolation (None: measured up to max_batch)
    extrapolated_above: Optional[int] = None
    max_batch: Optional[int] = None

    @classmethod
    def from_json(cls, obj: dict) -> "Recommendation":
        obj = dict(obj)
        if isinstance(obj.get("verified"), dict) and "outcome" not in obj["verified"]:
            obj["verified"] = None  # a file from before verification was typed has no outcome: not read
        r = super().from_json(obj)
        r.regions = [Region.from_json(x) if isinstance(x, dict) else x for x in r.regions or []]
        r.crossovers = [Crossover.from_json(x) if isinstance(x, dict) else x for x in r.crossovers or []]
        return r


@dataclass
class Interval(Record):
    """A figure with its interval at the analysis's confidence."""
    value: Optional[float]
    lo: Optional[float]
    hi: Optional[float]


@dataclass
class Attribution(Record):
    """Why a speculative server's TPOT differs from the baseline's at one (suite, concurrency)
    (`results/summary/attribution.json`, specmatch.attribution).

    A speculative step yields tau tokens (`tokens_per_step`, the engine's acceptance length) and costs
    rho plain decode steps of the baseline (`step_cost_ratio`), so `tpot_speedup` = tau / rho.
    rho < 1 decisively means the speculative server's step was cheaper than a plain decode step:
    the gain is the engine's path, not the drafter's (`explained_by_drafting` false; also when the
    step is decisively cheaper than a plain step of the configured-off control). `configured_off`
    is the throughput verdict of the configured-off control against the baseline (the configuration
    effect) and `drafting_effect` the server against that control, `step_cost_vs_configured_off` rho
    with the control's plain decode step as the unit (what drafting costs on the engine's own path);
    `length_adjusted_speedup` the
    TPOT speedup at the reference suite's prompt length (a per-prompt regression on log prompt
    length and log tau, suite by suite); `contrast` this suite's TPOT speedup over the reference
    suite's, raw and length-adjusted."""
    server: str
    suite: str
    concurrency: int
    tokens_per_step: Optional[Interval]
    step_cost_ratio: Optional[Interval]
    tpot_speedup: Optional[Interval]
    explained_by_drafting: Optional[bool]
    configured_off: Optional[dict] = None      # {server, metric, speedup, lo, hi, verdict}
    drafting_effect: Optional[dict] = None     # {against, metric, speedup, lo, hi, verdict}
    step_cost_vs_configured_off: Optional[Interval] = None  # rho against the control's plain step
    length_adjusted_speedup: Optional[dict] = None  # {value, lo, hi, unadjusted, reference_suite, reference_prompt_tokens, slope}
    contrast: Optional[dict] = None            # {reference_suite, raw: {value, lo, hi}, length_adjusted: {...}}
    confidence: float = 0.9
    repeats: int = 0
    run_to_run: bool = False
    acceptance_source: Optional[str] = None    # per-request metrics | cell counters
    note: Optional[str] = None


REQUEST_SCHEMA = polars_schema(RequestRecord)
CUT_SCHEMA = polars_schema(Cut)
