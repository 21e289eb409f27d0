"""The engine adapter interface and what every adapter shares.

An adapter owns everything that is its engine's: how a server starts and is read (launch, protocol,
acceptance), what its config may sweep and which conda environment it needs, whether a configured-off
control can be expressed, and how the deciding stage's engine-neutral schedules (records.Schedule) run
on it (render: records.Deployment). Nothing outside serving/engines/ names an engine's flags or keys,
so adding an engine is its adapter and its line in the registry (ENGINES, __init__.py).
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from ...files import SpecmatchError
from ...records import Acceptance, CellAcceptance, Deployment, KvPool, Schedule

SECRET_KEY = re.compile(r"(key|token|secret|password|passwd|auth)", re.I)
SECRET_FLAGS = {"--api-key", "--hf-token", "--token"}


@dataclass
class LaunchPlan:
    """Everything needed to start a server: an argv list (never a shell string) and env overrides."""
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 0

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def as_text(value, where: str = "value") -> str:
    """An argv item or environment value as the process receives it, the way a person wrote it in
    the config: text exactly as is ("2048", "0", "1e3"), a YAML integer in decimal (2048 -> "2048",
    never "2048.0"), a YAML float by its shortest round-trip form (0.9 -> "0.9"). Anything else
    (true, null, a list) has no one spelling on a command line and is refused."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecmatchError(f"servers: {where}: {value!r} is not text or a number; quote it as the "
                             "process should receive it")
    return str(int(value)) if isinstance(value, int) else repr(float(value))


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Environment as written to launch records and logs: values of secret-looking names are hidden."""
    return {k: ("<redacted>" if SECRET_KEY.search(k) else v) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
    """argv as written to launch records and logs: the value of every secret flag (`--api-key X` or
    `--api-key=X`) is hidden, so provenance can be shared."""
    out, hide = [], False
    for a in argv:
        if hide:
            out.append("<redacted>")
            hide = False
            continue
        flag = a.split("=", 1)[0]
        if flag in SECRET_FLAGS:
            if "=" in a:
                out.append(f"{flag}=<redacted>")
            else:
                out.append(a)
                hide = True
            continue
        out.append(a)
    return out


def sweep_values(where: str, v) -> list[int]:
    """The values a k sweep lists (`where`: the config key, for the error), each a whole number >= 1,
    none twice."""
    if not v:
        raise SpecmatchError(f"{where}: a sweep lists at least one value")
    out = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise SpecmatchError(f"{where}: {x!r} is not a whole number >= 1 (k = 0 is the baseline, measured "
                                 "already; list only speculative values)")
        if x in out:
            raise SpecmatchError(f"{where}: {x} is listed twice")
        out.append(x)
    return out


class Engine:
    """Adapter base. Subclasses fill in launch, reset and acceptance reading, and what their engine
    makes of a config (sweeps, controls, environment) and of a schedule (render)."""
    name = "base"
    launches = True
    health_path = "/health"
    reset_path: str | None = None
    flavor = "openai"
    # how a deployment line names the engine ("vLLM"); None: specmatch writes no deployment for it
    label: str | None = None
    # how a recommendation's text points at the rendered deployment ("the vLLM schedule above")
    deployment_noun: str | None = None
    # the speculative keys a k sweep may list -> what a sweep member's name calls the value (k | draft)
    sweep_fields: dict[str, str] = {}
    # the Python distributions the engine is installed as, whose versions a launch record keeps
    packages: tuple[str, ...] = ()

    def __init__(self, cfg: dict):
        self.cfg = cfg

    # -- the config ----------------------------------------------------------------------------
    @classmethod
    def conda_env(cls, cfg: dict) -> str:
        """The conda environment (envs/<name>.yaml) a server of this engine needs with
        `--software-deployment-method conda`: the package's own where nothing is started."""
        return "specmatch"

    @classmethod
    def sweep(cls, where: str, spec: dict, listed: list[str]) -> tuple[str, str, list[int], list[dict]]:
        """A k sweep of a `speculative` block whose keys `listed` (all in sweep_fields) hold lists:
        (the swept key, what a member's name calls its value, the values, each member's overrides of the
        block, in the values' order). Errors name the config key (`where`: the block's path)."""
        raise SpecmatchError(f"{where}.{listed[0]}: a list (a sweep) is not supported for engine {cls.name}")

    def configured_off(self, max_batch: int) -> tuple[dict | None, str | None]:
        """The configured-off control's `speculative` block (controls.py): this server's own
        configuration, drafting nothing at every batch size 1..max_batch; or None and why the engine
        cannot express it."""
        return None, (f"engine {self.name} has no setting specmatch knows that keeps the drafter configured while "
                      "drafting nothing")

    def prefix_cache_kept(self) -> tuple[dict | None, str | None]:
        """The `speculative` block of this server with the engine's own opt-out of what its drafter costs
        the prefix cache (the session suites' cache arm, controls.py), the drafter still drafting;
        or None and why there is none."""
        return None, f"engine {self.name} has no setting specmatch knows that keeps the drafter's prefix-cache loss off"

    def cache_salt_field(self) -> tuple[str | None, str]:
        """The request field that keeps a request off prefix-cache blocks computed under another value
        (a session suite's later passes replay each session under their own salt, so a replay costs what
        the first did: measuring.sessions), and where the engine reads it; or None and why there is none."""
        return None, f"engine {self.name} has no request field specmatch knows that partitions its prefix cache"

    def forced_acceptance(self, tau: float = 2.0) -> tuple[dict | None, str]:
        """What makes this server accept `tau` tokens per speculative step whatever it drafts, the drafter
        still drafting and the target still verifying (a step-cost map at fixed acceptance): the settings
        in the engine's terms, or None and why it cannot."""
        return None, f"engine {self.name} has no setting specmatch knows that forces the acceptance length"

    def step_budget(self) -> tuple[int | None, str]:
        """The most tokens one engine step schedules (chunked prefill: a prompt beyond what the decodes leave
        is prefilled over several steps), as this server is configured, and where that comes from; None and
        why where it is not known (the step-cost replay then prefills a prompt in the step that admits it)."""
        return None, f"engine {self.name}: its tokens per step are not known to specmatch"

    def arg_value(self, flag: str) -> str | None:
        """The value of `flag` in the config's `args` (`--flag V` or `--flag=V`; the last one wins), else None."""
        args, got = self.extra_args(), None
        for i, a in enumerate(args):
            if a == flag and i + 1 < len(args):
                got = args[i + 1]
            elif a.startswith(flag + "="):
                got = a.split("=", 1)[1]
        return got

    def release(self, versions: dict) -> str | None:
        """The engine's release among a launch record's `engine_versions` (None: not recorded)."""
        return next((versions[p] for p in self.packages if versions.get(p)), None)

    # -- deployments: the deciding stage's schedules (records.Schedule) in this engine's terms --------
    def named_k(self, spec: dict) -> int:
        """The k this `speculative` block names itself (0: it names none)."""
        return 0

    def naming_k(self, spec: dict, k: int) -> dict | None:
        """This `speculative` block naming k as its own (an endpoint's k read from its draft counters);
        None where the engine has no key for it."""
        return None

    def own_k(self, spec: dict) -> int:
        """The k a server of this `speculative` block drafts where it speculates: the one it names, else
        the engine's own default where specmatch knows it (0: not known)."""
        return self.named_k(spec)

    def server_k(self, spec: dict, batch: int) -> int:
        """The k a server of this `speculative` block drafts at a batch size (0: none there)."""
        return self.own_k(spec)

    def same_speculation(self, a: dict, b: dict, max_batch: int) -> bool:
        """Whether two `speculative` blocks deploy the same thing at every batch size 1..max_batch."""
        return a == b

    def mixed_schedule(self, spec: dict) -> bool:
        """Whether a server of this `speculative` block runs plain steps at some batch sizes and
        speculative steps at others (its acceptance length then counts its speculative steps only)."""
        return False

    def render(self, schedule: Schedule, spec: dict, version: str | None = None, new: bool = True
               ) -> Deployment | None:
        """`schedule` on this engine for a server of this `speculative` block (`version`: the engine
        release it runs, where that matters): the config that runs it and the report's lines, or why
        the engine cannot. `new`: the schedule is not the server as configured, so the report says what
        to set. None: specmatch knows no way to deploy a schedule on this engine."""
        return None

    # -- launch ------------------------------------------------------------------------------
    @classmethod
    def launch_max_batch(cls, max_concurrency: int) -> int:
        """The largest batch a server of this engine is launched for, given the highest concurrency it
        is measured at: coarse, so small sweep edits keep the launch (0: this engine launches nothing)."""
        return 0

    def python(self) -> str:
        return self.cfg.get("python") or sys.executable

    def launch_plan(self, port: int, max_batch: int) -> LaunchPlan:
        raise NotImplementedError

    def validate(self, cache_dir: Path | None = None) -> None:
        """Checks that need the engine's own code, run once before a server starts (not per cell);
        `cache_dir` (the server state folder) may keep what they read of the engine's code."""

    def served_model(self) -> str:
        return self.cfg.get("served_model_name") or self.cfg.get("model") or ""

    def extra_args(self) -> list[str]:
        """The config's `args`, appended verbatim (see `as_text`)."""
        return [as_text(a, f"args[{i}]") for i, a in enumerate(self.cfg.get("args") or [])]

    def user_env(self) -> dict[str, str]:
        """The config's `env` overrides, each value as written (see `as_text`)."""
        return {str(k): as_text(v, f"env.{k}") for k, v in (self.cfg.get("env") or {}).items()}

    # -- benchmarking ------------------------------------------------------------------------
    def api_key(self) -> str | None:
        """The key every request to the server carries (an endpoint someone else runs may need one)."""
        return None

    def auth_headers(self) -> dict[str, str]:
        """The headers that carry `api_key()` on every call specmatch makes, not only the load's."""
        key = self.api_key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def protocol(self, endpoint: str) -> str:
        """Wire protocol the client speaks: openai-completions, openai-chat or sglang-generate."""
        return "openai-chat" if endpoint == "chat" else "openai-completions"

    def request_extras(self) -> dict:
        """Extra JSON fields for every request (engine-specific switches)."""
        return {}

    def output_extras(self) -> dict:
        """Extra JSON fields that make the engine return each output's token ids (requests.record_outputs);
        an engine that returns them anyway (SGLang's output_ids) or cannot needs none."""
        return {}

    def stop_token_ids(self) -> frozenset | None:
        """The served model's end-of-sequence and stop token ids, where its natural stop is looked for
        (the config's `stop_token_ids`, else read from the model folder: model_stop_ids); None where they
        cannot be known here."""
        ids = self.cfg.get("stop_token_ids")
        return frozenset(int(x) for x in ids) if ids else model_stop_ids(self.cfg.get("model"))

    def parse_request_acceptance(self, final: dict) -> Acceptance | None:
        """Per-request speculative statistics (an Acceptance of one request) from the stream event that
        carries them, if the engine reports them."""
        return None

    def counters(self, metrics_text: str) -> dict:
        """Server-wide cumulative counters to difference around a cell."""
        return {}

    def kv_pool(self, startup: str) -> KvPool:
        """The KV cache this engine says it admits, read from its start-up log (`startup`: one session's
        lines, launch.session_startup)."""
        return KvPool(False, reason=f"engine {self.name}: specmatch reads no KV pool figure from its log")

    # -- acceptance: one definition per engine, used for the cell, per prompt source and held-out rows
    acceptance_definition = "none: this engine reports no speculative statistics"

    def acceptance(self, records: list) -> Acceptance | None:
        """Acceptance over these request records by this engine's own definition; None when none of
        them reported speculative statistics."""
        rows = [r for r in records if r.ok and self.speculated(r)]
        if not rows:
            return None
        return self.figures(len(rows), total(rows, "num_spec_steps"), total(rows, "num_draft_tokens"),
                            total(rows, "num_accepted_tokens"), total(rows, "output_tokens"))

    def combine(self, parts: list) -> Acceptance | None:
        """Acceptance over several groups (cells, repeats) pooled: their counts summed, then the same
        definition applied."""
        parts = [a for a in parts if a is not None]
        if not parts:
            return None

        def s(key):
            vals = [getattr(a, key) for a in parts]
            return None if any(v is None for v in vals) else sum(vals)

        return self.figures(sum(a.requests for a in parts), s("num_spec_steps"), s("num_draft_tokens"),
                            s("num_accepted_tokens"), s("output_tokens"))

    def speculated(self, r) -> bool:
        return r.num_spec_steps is not None

    def figures(self, requests, steps, drafted, accepted, tokens) -> Acceptance | None:
        """This engine's acceptance rate and length from summed counts."""
        return None

    def cell_acceptance(self, before: dict, after: dict, records: list) -> CellAcceptance:
        """The cell's acceptance (CellResult.set_acceptance), from the best source the engine has."""
        acc = self.acceptance(records)
        if acc is None:
            return CellAcceptance()
        return CellAcceptance(f"per-request metrics ({self.acceptance_definition})", acc)


def model_stop_ids(model: str | None) -> frozenset | None:
    """The token ids that end generation for a model in a local folder, as vLLM collects them
    (sampling_params.py:772-800, `_all_stop_token_ids`): the tokenizer's end-of-sequence token and the
    `eos_token_id`s of generation_config.json (and config.json). Read from the JSON files alone (no
    tokenizer is loaded: a cell must start measuring at once). None for a hub id or a folder that
    names none."""
    if not model:
        return None
    root = Path(model)
    if not root.is_dir():
        return None

    def load(name):
        try:
            return json.loads((root / name).read_text())
        except (OSError, ValueError):
            return {}

    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        v = load(name).get("eos_token_id")
        ids.update([v] if isinstance(v, int) else [x for x in v if isinstance(x, int)] if isinstance(v, list) else [])
    tc = load("tokenizer_config.json")
    eos = tc.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if isinstance(eos, str):
        table = {str(t.get("content")): int(i) for i, t in (tc.get("added_tokens_decoder") or {}).items()
                 if isinstance(t, dict) and str(i).isdigit()}
        if eos not in table:
            table.update({str(t.get("content")): int(t["id"]) for t in load("tokenizer.json").get("added_tokens") or []
                          if isinstance(t, dict) and isinstance(t.get("id"), int)})
        if eos in table:
            ids.add(table[eos])
    return frozenset(ids) or None


def total(records: list, key: str) -> int | None:
    """Sum of a per-request count, or None unless every record reports it."""
    vals = [getattr(r, key) for r in records]
    return None if any(v is None for v in vals) else int(sum(vals))
