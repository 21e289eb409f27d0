"""One small adapter per engine (base.Engine): launch command, health, cache reset, how to read
acceptance, what its config may sweep, its configured-off control and how a schedule is deployed on it.

ENGINES is the registry, the one list of engines: the config schema's `engine` names come from it
(config.load_schema), and everything else asks a server's adapter (`get_engine(server_cfg)`).
`external` endpoints use the adapter of their `flavor` for reading acceptance and writing deployments
but are never launched. The package imports only the shared root, so the root's config checks may
read the registry without a circle.
"""
from __future__ import annotations
from .base import Engine, LaunchPlan, redact_argv, redact_env
from .external import ExternalEngine
from .sglang import SGLangEngine
from .vllm import VLLMEngine

ENGINES: dict[str, type[Engine]] = {"vllm": VLLMEngine, "sglang": SGLangEngine, "external": ExternalEngine}


def get_engine(server_cfg: dict) -> Engine:
    """The adapter for a server config's `engine` (the schema has already checked the name)."""
    return ENGINES[server_cfg["engine"]](server_cfg)


def definitions(flavor: str) -> Engine:
    """The adapter whose acceptance definition cells of this flavor follow: the registered engine of
    that name that launches (vllm, sglang, ...), else the base (no speculative statistics)."""
    engine = ENGINES.get(flavor)
    return (engine if engine is not None and engine.launches else Engine)({})


def adapters() -> list[Engine]:
    """One adapter of every registered engine, configured with nothing: for a question about a
    `speculative` block whose engine the caller does not know, which each adapter answers for its own keys."""
    return [engine({}) for engine in ENGINES.values()]


__all__ = ["Engine", "LaunchPlan", "get_engine", "definitions", "adapters", "redact_argv", "redact_env", "ENGINES"]
