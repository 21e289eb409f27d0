"""The engine adapter interface and what every adapter shares."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

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


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: ("<redacted>" if SECRET_KEY.search(k) else v) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
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


class Engine:
    """Adapter base. Subclasses fill in launch, reset and acceptance reading."""
    name = "base"
    launches = True
    health_path = "/health"
    reset_path: str | None = None
    flavor = "openai"

    def __init__(self, cfg: dict):
        self.cfg = cfg

    # -- launch ------------------------------------------------------------------------------
    def python(self) -> str:
        return self.cfg.get("python") or sys.executable

    def launch_plan(self, port: int, max_concurrency: int) -> LaunchPlan:
        raise NotImplementedError

    def served_model(self) -> str:
        return self.cfg.get("served_model_name") or self.cfg.get("model") or ""

    def extra_args(self) -> list[str]:
        return [str(a) for a in self.cfg.get("args", [])]

    def user_env(self) -> dict[str, str]:
        return {k: str(v) for k, v in (self.cfg.get("env") or {}).items()}

    # -- benchmarking ------------------------------------------------------------------------
    def protocol(self, endpoint: str) -> str:
        """Wire protocol the client speaks: openai-completions, openai-chat or sglang-generate."""
        return "openai-chat" if endpoint == "chat" else "openai-completions"

    def request_extras(self) -> dict:
        """Extra JSON fields for every request (engine-specific switches)."""
        return {}

    def parse_request_acceptance(self, final: dict) -> dict | None:
        """Per-request speculative statistics from the last stream event, if the engine reports them."""
        return None

    def counters(self, metrics_text: str) -> dict:
        """Server-wide cumulative counters to difference around a cell."""
        return {}

    def cell_acceptance(self, before: dict, after: dict, per_request: list[dict]) -> dict:
        return {}
