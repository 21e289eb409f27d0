"""SGLang (GPU), the engine of the original EAGLE-3 deployment.

Facts (shared/notes/engines.md): speculative flags are --speculative-algorithm, -draft-model-path,
-num-steps, -eagle-topk, -num-draft-tokens (all three numbers or none; with topk 1, N = S + 1);
SGLANG_ENABLE_SPEC_V2=True selects the overlap worker and needs topk 1; speculative servers cap
running requests at 48 unless --max-running-requests is set, so we set it (and
--cuda-graph-max-bs) to at least the highest concurrency swept. Acceptance must come from
per-request `meta_info` of the native /generate endpoint (sum of completion tokens over sum of
verify steps), never from the cumulative /get_server_info average.
"""
from __future__ import annotations

from ..io import SpecmatchError
from .base import Engine, LaunchPlan

ALGORITHMS = {"eagle3": "EAGLE3", "eagle": "EAGLE", "standalone": "STANDALONE", "ngram": "NGRAM",
              "draft_model": "STANDALONE", "mtp": "EAGLE"}


def running_cap(max_concurrency: int) -> int:
    """Smallest power of two >= the highest concurrency (>= 64), so small sweep edits keep the launch."""
    cap = 64
    while cap < max_concurrency:
        cap *= 2
    return cap


class SGLangEngine(Engine):
    name = "sglang"
    flavor = "sglang"
    reset_path = "/flush_cache"

    def launch_plan(self, port: int, max_concurrency: int) -> LaunchPlan:
        host = self.cfg.get("host", "127.0.0.1")
        argv = [self.python(), "-m", "sglang.launch_server", "--model-path", self.cfg["model"],
                "--host", host, "--port", str(port)]
        if self.cfg.get("served_model_name"):
            argv += ["--served-model-name", self.cfg["served_model_name"]]
        if self.cfg.get("tensor_parallel_size"):
            argv += ["--tp", str(self.cfg["tensor_parallel_size"])]
        env = {"HF_HUB_OFFLINE": "1"}
        cap = self.cfg.get("max_running_requests") or running_cap(max_concurrency)
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
        # Without these a speculative server silently caps running requests at 48.
        argv += ["--max-running-requests", str(cap), "--cuda-graph-max-bs", str(cap)]
        argv += ["--enable-metrics"]
        argv += self.extra_args()
        env.update(self.user_env())
        return LaunchPlan(argv=argv, env=env, host=host, port=port)

    def protocol(self, endpoint: str) -> str:
        # Only the native endpoint returns per-request meta_info with the verify-step count.
        return "sglang-generate" if endpoint == "completions" else "openai-chat"

    def parse_request_acceptance(self, final: dict) -> dict | None:
        return parse_meta_info((final or {}).get("meta_info") or {})

    def cell_acceptance(self, before: dict, after: dict, per_request: list[dict]) -> dict:
        return acceptance_from_meta(per_request)


def parse_meta_info(meta: dict) -> dict | None:
    """Per-request acceptance from SGLang meta_info, whatever the version's field names."""
    if not meta or meta.get("spec_verify_ct") in (None, 0):
        return None
    accepted = next((meta[k] for k in ("spec_num_correct_drafts", "spec_accept_token_num", "spec_accepted_drafts")
                     if meta.get(k) is not None), None)
    drafted = next((meta[k] for k in ("spec_num_proposed_drafts", "spec_draft_token_num") if meta.get(k) is not None),
                   None)
    return {"num_spec_steps": meta["spec_verify_ct"], "completion_tokens": meta.get("completion_tokens"),
            "num_accepted_tokens": accepted, "num_draft_tokens": drafted,
            "acceptance_length": (meta["completion_tokens"] / meta["spec_verify_ct"])
            if meta.get("completion_tokens") is not None else meta.get("spec_accept_length"),
            "acceptance_rate": meta.get("spec_accept_rate",
                                        accepted / drafted if accepted is not None and drafted else None),
            "acceptance_histogram": meta.get("spec_correct_drafts_histogram", meta.get("spec_accept_histogram"))}


def acceptance_from_meta(per_request: list[dict]) -> dict:
    rows = [r for r in per_request if r and r.get("num_spec_steps")]
    if not rows:
        return {"acceptance_source": None}
    steps = sum(r["num_spec_steps"] for r in rows)
    tokens = sum(r.get("completion_tokens") or 0 for r in rows)
    acc = [r["num_accepted_tokens"] for r in rows if r.get("num_accepted_tokens") is not None]
    drf = [r["num_draft_tokens"] for r in rows if r.get("num_draft_tokens") is not None]
    return {"acceptance_source": "per-request meta_info (sum of completion tokens / sum of verify steps)",
            "spec_decode_num_drafts": steps,
            "spec_decode_num_draft_tokens": sum(drf) if len(drf) == len(rows) else None,
            "spec_decode_num_accepted_tokens": sum(acc) if len(acc) == len(rows) else None,
            "spec_decode_acceptance_length": tokens / steps if steps else None,
            "spec_decode_acceptance_rate": (sum(acc) / sum(drf)) if len(drf) == len(rows) and sum(drf) else None}
