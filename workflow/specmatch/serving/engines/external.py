"""An OpenAI-compatible endpoint that someone else runs: never launched, only measured.

The API key is read from the environment variable named by `api_key_env` at request time; it never
enters config, logs or records. `flavor` (vllm|sglang) says how to read acceptance.
"""
from __future__ import annotations

import os

from ...files import SpecmatchError
from ...records import Acceptance, CellAcceptance
from .base import Engine
from .sglang import SGLangEngine
from .vllm import VLLMEngine


class ExternalEngine(Engine):
    name = "external"
    launches = False

    def __init__(self, cfg: dict):
        super().__init__(cfg)
        flavor = cfg.get("flavor", "openai")
        self.flavor = flavor
        self._reader = {"vllm": VLLMEngine, "sglang": SGLangEngine}.get(flavor, Engine)(cfg)
        self.reset_path = self._reader.reset_path if flavor in ("vllm", "sglang") else None
        self.acceptance_definition = self._reader.acceptance_definition

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
