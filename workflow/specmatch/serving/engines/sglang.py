"""SGLang (GPU), the engine of the original EAGLE-3 deployment.

Facts (the pinned releases' own source, checked by tests/test_engine_parsers.py):
speculative flags are --speculative-algorithm, -draft-model-path, -num-steps, -eagle-topk,
-num-draft-tokens (all three numbers or none; with topk 1, N = S + 1); SGLANG_ENABLE_SPEC_V2=True
selects the overlap worker and needs topk 1; speculative servers cap running requests at 48 unless
--max-running-requests is set, so it is set (with the CUDA-graph batch size) to at least the highest
concurrency swept. Flags change between releases, so the adapter reads the version installed in the
server's own python and emits what that version accepts (VERSIONS). Acceptance comes from
per-request `meta_info` of the native /generate endpoint (completion tokens over verify steps),
never from the cumulative /get_server_info average.

A schedule (records.Schedule) runs, where the release has it, as `--speculative-adaptive` with a
config of one batch-size slot per band whose only candidate step count is the band's k (a slot with
one candidate never moves; 0 steps: no drafting); SGLang routes a batch to the slot of the largest key
at or below its CUDA-graph-padded batch size. Nothing keeps a drafter configured while drafting
nothing at every batch size, so a configured-off control cannot be expressed.
"""
from __future__ import annotations

import copy
import functools
import json
import re
import subprocess
from pathlib import Path

from ...files import SpecmatchError
from ...records import Acceptance, Deployment, KvPool, Schedule
from .base import Engine, LaunchPlan, sweep_values

ALGORITHMS = {"eagle3": "EAGLE3", "eagle": "EAGLE", "standalone": "STANDALONE", "ngram": "NGRAM",
              "draft_model": "STANDALONE", "mtp": "EAGLE"}

# What each release accepts, read from its server arguments (checked by tests against 0.5.23's own
# parser and 0.5.10's and 0.5.18's source):
#   --cuda-graph-max-bs: up to 0.5.18; from 0.5.23 argparse calls it ambiguous (-decode / -prefill)
#   --cuda-graph-max-bs-decode: from 0.5.18
#   --speculative-adaptive (+ -config): from 0.5.18
OLDEST = (0, 5, 0)
SPLIT_CUDA_GRAPH_BS = (0, 5, 18)
ADAPTIVE_SINCE = (0, 5, 18)


def version_tuple(version: str | None) -> tuple[int, ...]:
    """(0, 5, 23) from "0.5.23" or "0.5.23.post1"; () when unknown."""
    if not version:
        return ()
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


@functools.lru_cache(maxsize=8)
def installed_version(python: str) -> str | None:
    """The SGLang release installed in a server's python, or None."""
    code = "import importlib.metadata as m\ntry: print(m.version('sglang'))\nexcept Exception: pass"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out or None


def adaptive_support(version: str | None) -> dict | None:
    """SGLang's own way of speculating less as batches grow, when the installed release has it:
    `--speculative-adaptive` with a per-batch-size config of candidate step counts (0 = no drafting)."""
    v = version_tuple(version)
    if not v or v < ADAPTIVE_SINCE:
        return None
    return {"flags": ["--speculative-adaptive", "--speculative-adaptive-config"], "since": "0.5.18"}


ADAPTIVE_METHODS = ("eagle", "eagle3", "mtp")   # the drafters SGLang adapts
FORCED_ENV = "SGLANG_SIMULATE_ACC_LEN"               # a simulated acceptance length (off below 0)
FORCED_MODE_ENV = "SGLANG_SIMULATE_ACC_TOKEN_MODE"   # "real-draft-token": the drafter's own tokens kept
# the scheduler's start-up line: its KV pool in tokens, and the context length one request may reach
_SCHEDULER_POOL = re.compile(r"max_total_num_tokens=(?P<tokens>\d+),.*?context_len=(?P<len>\d+)"
                             r"(?:,\s*(?P<mem>available_(?:cpu|gpu)_mem)=)?.*")
DEFAULT_STEPS = 3   # the steps a speculative config that names none is taken to draft


def adaptive_config(bands: list) -> dict:
    """The --speculative-adaptive-config that runs schedule bands [lo, hi, k]: one batch-size slot per
    band, keyed by its first batch size, whose only candidate is the band's k steps (0: no drafting)."""
    return {str(lo): {"candidate_steps": [int(k)]} for lo, _, k in bands}


def sweep_members(where: str, spec: dict) -> tuple[str, str, list[int], list[dict]]:
    """SGLangEngine.sweep: `num_steps` (k; with eagle_topk 1, num_draft_tokens follows as k + 1; with a
    larger topk, num_draft_tokens stays as written, or is a list of the same length, paired by position)
    -> `<name>@k=<k>`; or `num_draft_tokens` alone (a tree's size at a fixed num_steps, topk > 1 only)
    -> `<name>@draft=<n>`."""
    topk = spec.get("eagle_topk")
    if isinstance(topk, (list, tuple)):
        raise SpecmatchError(f"{where}.eagle_topk: a list (a sweep) is not supported; sweep num_steps or "
                             "num_draft_tokens")
    if spec.get("adaptive"):
        raise SpecmatchError(f"{where}: a sweep cannot be combined with adaptive (SGLang would choose the steps "
                             "itself); remove one of them")
    steps, ndraft = spec.get("num_steps"), spec.get("num_draft_tokens")
    if isinstance(steps, (list, tuple)):
        values = sweep_values(f"{where}.num_steps", steps)
        if topk is None:
            raise SpecmatchError(f"{where}.eagle_topk: required with a num_steps sweep (SGLang needs num_steps, "
                                 "eagle_topk and num_draft_tokens together)")
        if isinstance(ndraft, (list, tuple)):
            drafts = sweep_values(f"{where}.num_draft_tokens", ndraft)
            if len(drafts) != len(values):
                raise SpecmatchError(f"{where}.num_draft_tokens: {len(drafts)} values for {len(values)} num_steps "
                                     "values; list one per num_steps value (paired by position) or a single number")
        elif topk == 1:
            if ndraft is not None and not all(ndraft == v + 1 for v in values):
                raise SpecmatchError(f"{where}.num_draft_tokens: with eagle_topk 1 it is num_steps + 1 for each "
                                     "swept value; leave it out (it follows num_steps) or list "
                                     f"{[v + 1 for v in values]}")
            drafts = [v + 1 for v in values]
        else:
            if ndraft is None:
                raise SpecmatchError(f"{where}.num_draft_tokens: required with eagle_topk {topk} (a number, or one "
                                     "per num_steps value)")
            drafts = [ndraft] * len(values)
        if topk == 1:
            bad = [(v, d) for v, d in zip(values, drafts) if d != v + 1]
            if bad:
                raise SpecmatchError(f"{where}.num_draft_tokens: with eagle_topk 1 it must be num_steps + 1, got "
                                     + ", ".join(f"{d} for num_steps {v}" for v, d in bad))
        return "num_steps", "k", values, [{"num_steps": v, "num_draft_tokens": d} for v, d in zip(values, drafts)]
    values = sweep_values(f"{where}.num_draft_tokens", ndraft)
    if steps is None or topk is None:
        raise SpecmatchError(f"{where}.num_draft_tokens: a sweep of it needs num_steps and eagle_topk set")
    if topk == 1:
        raise SpecmatchError(f"{where}.num_draft_tokens: with eagle_topk 1 it is num_steps + 1, so it cannot be "
                             "swept alone; sweep num_steps instead")
    return "num_draft_tokens", "draft", values, [{"num_draft_tokens": v} for v in values]


def running_cap(max_batch: int) -> int:
    """Smallest power of two >= the highest concurrency (>= 64), so small sweep edits keep the launch."""
    cap = 64
    while cap < max_batch:
        cap *= 2
    return cap


class SGLangEngine(Engine):
    name = "sglang"
    flavor = "sglang"
    reset_path = "/flush_cache"
    label = "SGLang"
    deployment_noun = "the SGLang mechanism above"
    sweep_fields = {"num_steps": "k", "num_draft_tokens": "draft"}
    packages = ("sglang",)

    # -- the config ----------------------------------------------------------------------------
    @classmethod
    def conda_env(cls, cfg: dict) -> str:
        return "sglang"

    @classmethod
    def sweep(cls, where: str, spec: dict, listed: list[str]) -> tuple[str, str, list[int], list[dict]]:
        return sweep_members(where, spec)

    def configured_off(self, max_batch: int) -> tuple[dict | None, str | None]:
        return None, ("SGLang has no setting that keeps the drafter configured while drafting nothing at every batch "
                      "size (--speculative-adaptive lowers the steps, never to zero)")

    def cache_salt_field(self) -> tuple[str | None, str]:
        """`cache_salt` of the chat and completion requests (sglang/srt/entrypoints/openai/protocol.py,
        0.5.23), carried to the radix cache's key (sglang/srt/mem_cache/radix_cache.py: RadixKey.cache_salt)."""
        return "cache_salt", "SGLang's cache_salt request field"

    def prefix_cache_kept(self) -> tuple[dict | None, str | None]:
        """SGLang 0.5.23's server arguments have no opt-out of what EAGLE costs the radix cache (none of
        its flags names both; tests/test_engine_parsers.py reads them from its own parser): the loss
        reported in sglang#32459 comes from its KV reservation under overlap scheduling (a fix is
        proposed in sglang#32574), not from a setting."""
        return None, ("SGLang has no setting that keeps EAGLE's radix-cache loss off (no such server argument in "
                      "0.5.23; sglang#32459)")

    def forced_acceptance(self, tau: float = 2.0) -> tuple[dict | None, str]:
        """SGLang's environment (sglang/srt/environ.py, read by sglang/srt/speculative/spec_utils.py): a
        simulated acceptance length (off when below 0), the drafter's own tokens kept."""
        return ({"env": {FORCED_ENV: str(float(tau)), FORCED_MODE_ENV: "real-draft-token"}},
                "simulated acceptance length")

    def step_budget(self) -> tuple[int | None, str]:
        """None: SGLang runs a chunk of prefill as its own batch between decode batches unless
        `--enable-mixed-chunk` (sglang/srt/managers/scheduler.py), so vLLM's mixed step (decodes, then
        prompt chunks in what the budget leaves) is not its schedule; the replay prefills a prompt in one step."""
        return None, ("SGLang prefills in batches of their own (chunks of --chunked-prefill-size) between decode "
                      "batches: the replay's mixed step is vLLM's; a prompt is replayed as one prefill step")

    # -- deployments -----------------------------------------------------------------------------
    def named_k(self, spec: dict) -> int:
        return int(spec.get("num_steps") or 0)

    def naming_k(self, spec: dict, k: int) -> dict | None:
        return {**spec, "num_steps": k}

    def own_k(self, spec: dict) -> int:
        """num_steps (a speculative config that names none: DEFAULT_STEPS)."""
        return self.named_k(spec) or (DEFAULT_STEPS if spec else 0)

    def mixed_schedule(self, spec: dict) -> bool:
        """An adaptive config (`adaptive`: its file) with 0 and non-zero candidate steps; one that cannot
        be read counts as mixed (tokens per decode step is right for any server, the engine's acceptance
        length only for one whose every step speculates)."""
        if not spec.get("adaptive"):
            return False
        try:
            cfg = json.loads(Path(spec["adaptive"]).read_text())
            ks = {int(x) for slot in cfg.values() if isinstance(slot, dict) for x in slot.get("candidate_steps", [])}
        except (OSError, ValueError, TypeError, AttributeError):
            return True
        return 0 in ks and any(ks)

    def render(self, schedule: Schedule, spec: dict, version: str | None = None, new: bool = True) -> Deployment:
        """The baseline: serve without --speculative-algorithm. Another schedule: --speculative-adaptive
        with adaptive_config(bands) in a file, num_steps the largest k, eagle_topk 1, where the release
        has it (adaptive_support) and the drafter is one SGLang adapts with topk 1; else why not."""
        if not schedule.top:
            return Deployment(self.name, note="SGLang: baseline (serve without --speculative-algorithm)")
        if not new:
            return Deployment(self.name)
        bands = schedule.bands
        support = adaptive_support(version)
        why = None
        if not support:
            switch = len(bands) == 2 and bands[0][2] > 0 and bands[1][2] == 0
            why = (f"SGLang {version or '(version unknown)'} has no --speculative-adaptive (it came with "
                   f"{'.'.join(map(str, ADAPTIVE_SINCE))}): "
                   + (f"route traffic above batch {bands[0][1]} to the baseline server instead" if switch else
                      "run one server per batch band and route traffic by load instead"))
        elif spec.get("method") not in ADAPTIVE_METHODS:
            why = f"SGLang adapts EAGLE/EAGLE3 only, not {spec.get('method')}"
        elif spec.get("eagle_topk", 1) != 1:
            why = "SGLang adapts only with eagle_topk 1"
        if why:
            return Deployment(self.name, note=f"SGLang: no mechanism ({why})")
        top = schedule.top
        config = adaptive_config(bands)
        out = {**copy.deepcopy(spec), "num_steps": top, "eagle_topk": 1, "num_draft_tokens": top + 1, "adaptive": True}
        flags = (f"--speculative-num-steps {top} --speculative-eagle-topk 1 --speculative-num-draft-tokens {top + 1} "
                 f"{' '.join(support['flags'])} FILE")
        return Deployment(self.name, out, {"adaptive": config},
                          flag=f"SGLang: `{flags}`, FILE holding `{json.dumps(config, sort_keys=True)}`",
                          note="SGLang: speculative-adaptive (each batch band a slot with one candidate step count, "
                               "so SGLang never moves off it; SGLang routes a batch to the slot of the largest key <= "
                               "its CUDA-graph-padded batch size, so a band boundary between two captured batch sizes "
                               "moves up to the next captured one)")

    # -- launch ----------------------------------------------------------------------------------

    def version(self) -> str:
        """The release the server will run: `sglang_version` in its config (for planning without it
        installed), else the one installed in its python. A missing or unsupported release is an
        error here, before anything is allocated."""
        v = self.cfg.get("sglang_version") or installed_version(self.python())
        if not v:
            raise SpecmatchError(f"servers: sglang is not installed in {self.python()} (set servers.<name>.python to "
                                 "the environment that has it)")
        if version_tuple(v) < OLDEST:
            raise SpecmatchError(f"servers: SGLang {v} is older than specmatch supports ({'.'.join(map(str, OLDEST))}); "
                                 "its speculative flags differ")
        return v

    def launch_plan(self, port: int, max_batch: int) -> LaunchPlan:
        version = version_tuple(self.version())
        host = self.cfg.get("host", "127.0.0.1")
        argv = [self.python(), "-m", "sglang.launch_server", "--model-path", self.cfg["model"],
                "--host", host, "--port", str(port)]
        if self.cfg.get("served_model_name"):
            argv += ["--served-model-name", self.cfg["served_model_name"]]
        if self.cfg.get("tensor_parallel_size"):
            argv += ["--tensor-parallel-size", str(self.cfg["tensor_parallel_size"])]  # never an abbreviation
        if self.cfg.get("dtype"):
            argv += ["--dtype", self.cfg["dtype"]]
        env = {"HF_HUB_OFFLINE": "1"}
        cap = self.cfg.get("max_running_requests") or running_cap(max_batch)
        spec = self.cfg.get("speculative")
        if spec:
            method = spec["method"]
            if method not in ALGORITHMS:
                raise SpecmatchError(f"servers: sglang has no speculative method '{method}'")
            argv += ["--speculative-algorithm", ALGORITHMS[method]]
            if spec.get("model"):
                argv += ["--speculative-draft-model-path", spec["model"]]
            nums = [spec.get(k) for k in ("num_steps", "eagle_topk", "num_draft_tokens")]
            if any(n is not None for n in nums):
                if any(n is None for n in nums):
                    raise SpecmatchError("speculative: sglang needs num_steps, eagle_topk and num_draft_tokens "
                                         "all set, or none of them")
                steps, topk, ndraft = nums
                if topk == 1 and ndraft != steps + 1:
                    raise SpecmatchError(f"speculative.num_draft_tokens: with eagle_topk 1 it must be "
                                         f"num_steps + 1 = {steps + 1}, got {ndraft}")
                argv += ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
                         "--speculative-num-draft-tokens", str(ndraft)]
            if spec.get("spec_v2"):
                if spec.get("eagle_topk", 1) != 1:
                    raise SpecmatchError("speculative.spec_v2: the overlap worker requires eagle_topk 1")
                env["SGLANG_ENABLE_SPEC_V2"] = "True"
            if spec.get("adaptive"):
                argv += self._adaptive(spec, version)
        # Without these a speculative server silently caps running requests at 48.
        graph_flag = "--cuda-graph-max-bs-decode" if version >= SPLIT_CUDA_GRAPH_BS else "--cuda-graph-max-bs"
        argv += ["--max-running-requests", str(cap), graph_flag, str(cap)]
        argv += ["--enable-metrics"]
        argv += self.extra_args()
        env.update(self.user_env())
        return LaunchPlan(argv=argv, env=env, host=host, port=port)

    def _adaptive(self, spec: dict, version: tuple) -> list[str]:
        """--speculative-adaptive, where the release has it and SGLang supports it for this drafter."""
        if version < ADAPTIVE_SINCE:
            raise SpecmatchError(f"speculative.adaptive: SGLang {'.'.join(map(str, version))} has no "
                                 f"--speculative-adaptive (it came with {'.'.join(map(str, ADAPTIVE_SINCE))})")
        if spec["method"] not in ("eagle", "eagle3", "mtp"):
            raise SpecmatchError(f"speculative.adaptive: SGLang adapts EAGLE/EAGLE3 only, not {spec['method']}")
        if spec.get("eagle_topk", 1) != 1:
            raise SpecmatchError("speculative.adaptive: SGLang adapts only with eagle_topk 1")
        out = ["--speculative-adaptive"]
        if isinstance(spec["adaptive"], str):
            out += ["--speculative-adaptive-config", spec["adaptive"]]
        return out

    @classmethod
    def launch_max_batch(cls, max_concurrency: int) -> int:
        """SGLang's running-request cap (and CUDA-graph batch size): see running_cap."""
        return running_cap(max_concurrency)

    def protocol(self, endpoint: str) -> str:
        # Only the native endpoint returns per-request meta_info with the verify-step count.
        return "sglang-generate" if endpoint == "completions" else "openai-chat"

    acceptance_definition = ("SGLang: length = completion tokens / verify steps, rate = correct drafts / "
                             "proposed drafts")

    def kv_pool(self, startup: str) -> KvPool:
        """SGLang's scheduler line at start-up (managers/scheduler.py, 0.5.10 and 0.5.23 alike):
        "max_total_num_tokens=N, ..., max_running_requests=R, context_len=L, ...". SGLang prints no
        concurrency of its own: the one here is N / L, as vLLM defines its figure."""
        m = _SCHEDULER_POOL.search(startup)
        if m is None:
            return KvPool(False, reason="SGLang's log has no \"max_total_num_tokens=\" line in this session")
        tokens, length = int(m["tokens"]), int(m["len"])
        return KvPool(True, tokens=tokens, per_request_tokens=length,
                      max_concurrency=round(tokens / length, 2) if length else None,
                      device={"available_cpu_mem": "CPU", "available_gpu_mem": "GPU"}.get(m["mem"]),
                      line=m.group(0).strip())

    def parse_request_acceptance(self, final: dict) -> Acceptance | None:
        return parse_meta_info((final or {}).get("meta_info") or {})

    def speculated(self, r) -> bool:
        return bool(r.num_spec_steps)

    def figures(self, requests, steps, drafted, accepted, tokens) -> Acceptance:
        return Acceptance(requests, steps, drafted, accepted, tokens,
                          accepted / drafted if accepted is not None and drafted else None,
                          tokens / steps if tokens is not None and steps else None)


def parse_meta_info(meta: dict) -> Acceptance | None:
    """Per-request acceptance from SGLang meta_info, whatever the version's field names
    (checked against the pinned releases' source in tests/test_sglang_source.py)."""
    if not meta or meta.get("spec_verify_ct") in (None, 0):
        return None
    accepted = next((meta[k] for k in ACCEPTED_KEYS if meta.get(k) is not None), None)
    drafted = next((meta[k] for k in PROPOSED_KEYS if meta.get(k) is not None), None)
    steps, tokens = meta["spec_verify_ct"], meta.get("completion_tokens")
    return Acceptance(requests=1, num_spec_steps=steps, num_draft_tokens=drafted, num_accepted_tokens=accepted,
                      output_tokens=tokens,
                      acceptance_rate=meta.get("spec_accept_rate",
                                               accepted / drafted if accepted is not None and drafted else None),
                      acceptance_length=tokens / steps if tokens is not None else meta.get("spec_accept_length"))


# meta_info keys by release (newest first): correct/proposed drafts were accepted/draft tokens before
ACCEPTED_KEYS = ("spec_num_correct_drafts", "spec_accept_token_num", "spec_accepted_drafts")
PROPOSED_KEYS = ("spec_num_proposed_drafts", "spec_draft_token_num")
HISTOGRAM_KEYS = ("spec_correct_drafts_histogram", "spec_accept_histogram")
