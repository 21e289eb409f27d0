"""An OpenAI-compatible endpoint that someone else runs: never launched, only measured.

The API key is read from the environment variable named by `api_key_env` at request time; it never
enters config, logs or records. `flavor` (vllm|sglang) names the engine behind it: how to read its
acceptance, and how a recommendation is written for it (rendered for that engine; nothing here
restarts the endpoint to deploy or measure it, so it has no configured-off control either).
"""
from __future__ import annotations

import os

from ...files import SpecmatchError
from ...records import Acceptance, CellAcceptance, Deployment, KvPool, Schedule
from .base import Engine
from .sglang import SGLangEngine
from .vllm import VLLMEngine

READERS = {"vllm": VLLMEngine, "sglang": SGLangEngine}   # flavor -> the adapter of the engine behind it


class ExternalEngine(Engine):
    name = "external"
    launches = False

    def __init__(self, cfg: dict):
        super().__init__(cfg)
        flavor = cfg.get("flavor", "openai")
        self.flavor = flavor
        self._reader = READERS.get(flavor, Engine)(cfg)
        self.reset_path = self._reader.reset_path if flavor in READERS else None
        self.acceptance_definition = self._reader.acceptance_definition
        self.label, self.deployment_noun = self._reader.label, self._reader.deployment_noun

    def configured_off(self, max_batch: int) -> tuple[dict | None, str | None]:
        return None, "an external endpoint: nothing here restarts it with another configuration"

    def prefix_cache_kept(self) -> tuple[dict | None, str | None]:
        return None, "an external endpoint: nothing here restarts it with another cache setting"

    def cache_salt_field(self) -> tuple[str | None, str]:
        """The field of the engine its flavor names (a vLLM or SGLang behind the endpoint reads it as its own
        server would); none for an endpoint of another flavor."""
        if self.flavor in READERS:
            return self._reader.cache_salt_field()
        return None, f"an external endpoint of flavor {self.flavor}: specmatch knows no request field that partitions its cache"

    def forced_acceptance(self, tau: float = 2.0) -> tuple[dict | None, str]:
        return None, "an external endpoint: nothing here restarts it with a forced acceptance length"

    def kv_pool(self, startup: str) -> KvPool:
        return KvPool(False, reason="an external endpoint: specmatch did not start it and reads no log of it, "
                                    "so its KV pool is unknown")

    def named_k(self, spec: dict) -> int:
        return self._reader.named_k(spec)

    def naming_k(self, spec: dict, k: int) -> dict | None:
        return self._reader.naming_k(spec, k)

    def own_k(self, spec: dict) -> int:
        return self._reader.own_k(spec)

    def server_k(self, spec: dict, batch: int) -> int:
        return self._reader.server_k(spec, batch)

    def same_speculation(self, a: dict, b: dict, max_batch: int) -> bool:
        return self._reader.same_speculation(a, b, max_batch)

    def mixed_schedule(self, spec: dict) -> bool:
        return self._reader.mixed_schedule(spec)

    def render(self, schedule: Schedule, spec: dict, version: str | None = None, new: bool = True
               ) -> Deployment | None:
        """The deployment on the engine behind the endpoint (its flavor's), for whoever runs it."""
        return self._reader.render(schedule, spec, version, new)

    def base_url(self) -> str:
        return self.cfg["base_url"].rstrip("/")

    def api_key(self) -> str | None:
        var = self.cfg.get("api_key_env")
        if not var:
            return None
        key = os.environ.get(var)
        if not key:
            raise SpecmatchError(f"servers: api_key_env names ${var}, which is not set in the environment")
        return key

    def protocol(self, endpoint: str) -> str:
        return self._reader.protocol(endpoint)

    def output_extras(self) -> dict:
        return self._reader.output_extras()

    def parse_request_acceptance(self, final: dict) -> Acceptance | None:
        return self._reader.parse_request_acceptance(final)

    def counters(self, metrics_text: str) -> dict:
        return self._reader.counters(metrics_text)

    def speculated(self, r) -> bool:
        return self._reader.speculated(r)

    def figures(self, *counts):
        return self._reader.figures(*counts)

    def cell_acceptance(self, before: dict, after: dict, records: list) -> CellAcceptance:
        return self._reader.cell_acceptance(before, after, records)
