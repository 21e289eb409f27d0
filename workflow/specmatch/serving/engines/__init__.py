"""One small adapter per engine: launch command, health, cache reset, and how to read acceptance.

`get_engine(server_cfg)` picks the adapter; `external` endpoints use the adapter of their `flavor`
for reading acceptance but are never launched.
"""
from __future__ import annotations
from .base import Engine, LaunchPlan, redact_argv, redact_env
from .external import ExternalEngine
from .sglang import SGLangEngine
from .vllm import VLLMEngine

ENGINES = {"vllm": VLLMEngine, "sglang": SGLangEngine, "external": ExternalEngine}


def get_engine(server_cfg: dict) -> Engine:
    """The adapter for a server config's `engine` (the schema has already checked the name)."""
    return ENGINES[server_cfg["engine"]](server_cfg)


def definitions(flavor: str) -> Engine:
    """The adapter whose acceptance definition cells of this flavor follow (vllm, sglang, other)."""
    return {"vllm": VLLMEngine, "sglang": SGLangEngine}.get(flavor, Engine)({})


__all__ = ["Engine", "LaunchPlan", "get_engine", "definitions", "redact_argv", "redact_env", "ENGINES"]
