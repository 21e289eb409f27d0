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
"""
from __future__ import annotations

import functools
import re
import subprocess

from ...files import SpecmatchError
from ...records import Acceptance
from .base import Engine, LaunchPlan

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


def adaptive_config(spec: dict, boundary: int) -> dict:
    """A --speculative-adaptive-config that speculates with the server's own steps up to `boundary`
    and not at all above it (a batch-size slot whose only candidate is 0 steps)."""
    steps = spec.get("num_steps") or 3
    return {"1": {"candidate_steps": [steps]}, str(boundary + 1): {"candidate_steps": [0]}}


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
