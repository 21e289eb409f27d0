"""Start (or reuse) one server configuration and write its launch record.

The record — exact argv (secrets redacted), environment overrides, engine and package versions,
model and drafter identity with content hashes, accelerator, start-up time, /v1/models answer — is
an output of its own Snakemake job that depends only on that server's configuration and model
files, so changing one server reruns exactly that server's cells. There is one per repeat: each
repeat measures a fresh server session (its own start-up, memory layout and warm state).

    python -m specmatch launch --name NAME --server JSON --repeat R --max-batch N --out launch.json
                               --log server.log
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import requests

from .. import steps
from .engines import ENGINES, get_engine
from .engines.base import SECRET_KEY
from ..files import sha256_tree, write_json
from ..provenance import Recorder, host
from ..records import LaunchRecord
from .server import START_MARKER, Manager, config_hash, session_of

MAX_FULL_HASH_BYTES = 2 << 30
# vLLM: "(APIServer pid=7374) WARNING 11-30 22:04:46 [vllm.py:1605] Async scheduling ..."; also
# "WARNING: ..." and "WARNING [file.py:12] ..." forms. The message is what follows the level, a
# timestamp and a [source] tag, so the same warning reads the same in every session.
_WARNING = re.compile(r"\bWARNING\b:?\s*(?:\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s*)?(?:\[[^\]]*\]\s*)?(?P<msg>.+)")
MAX_WARNINGS = 40
STARTED = "Application startup complete"  # uvicorn's line, in vLLM's and SGLang's logs


def model_identity(path: str | None) -> dict | None:
    """Content hash of a local model folder (shallow for very large ones), or the hub id as given."""
    if not path:
        return None
    p = Path(path)
    if not p.exists():
        return {"id": path, "local": False}
    files = sorted(f for f in p.rglob("*") if f.is_file())
    size = sum(f.stat().st_size for f in files)
    if size <= MAX_FULL_HASH_BYTES:
        return {"path": str(p), "local": True, "bytes": size, "sha256": sha256_tree(p)}
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relative_to(p)}\0{f.stat().st_size}\n".encode())
        if f.suffix in (".json", ".jinja", ".txt"):
            h.update(f.read_bytes())
    return {"path": str(p), "local": True, "bytes": size, "sha256_shallow": "sha256:" + h.hexdigest(),
            "note": "weights larger than 2 GiB: hashed by names, sizes and config files"}


def session_startup(log: str | Path | None, env: dict | None = None) -> str:
    """This session's start-up lines of the server log: after its last start marker, up to uvicorn's
    "Application startup complete" (what follows is serving or shutting down), secrets redacted (an
    engine may echo a token: never into records)."""
    if not log or not Path(log).is_file():
        return ""
    text = Path(log).read_text(errors="replace")
    for k, v in {**os.environ, **(env or {})}.items():
        if SECRET_KEY.search(k) and len(v) >= 6:
            text = text.replace(v, "<redacted>")
    text = text[text.rfind(START_MARKER) + 1:] if START_MARKER in text else text
    return text[:text.find(STARTED)] if STARTED in text else text


def engine_warnings(startup: str) -> list[str]:
    """The engine's own warnings in a session's start-up lines (session_startup), each once.

    They say what a configuration changes besides drafting: vLLM 0.32 on CPU disables async
    scheduling and caps the scheduled tokens when n-gram speculation is configured, which is what a
    cell with speculation configured but switched off measures. Engines that log without a level
    name (SGLang 0.5.18 logs `[time] message`, utils/common.py configure_logger) contribute nothing here.
    """
    out: list[str] = []
    for line in startup.splitlines():
        m = _WARNING.search(line)
        if m and (msg := m.group("msg").strip()) and msg not in out:
            out.append(msg)
            if len(out) == MAX_WARNINGS:
                break
    return out


# beside the engines' own distributions (Engine.packages), what their speed depends on
RUNTIME_PACKAGES = ("torch", "transformers", "flashinfer-python")


def engine_versions(python: str) -> dict:
    """The versions of every registered engine's distributions and of RUNTIME_PACKAGES installed in `python`."""
    packages = list(dict.fromkeys([p for e in ENGINES.values() for p in e.packages] + list(RUNTIME_PACKAGES)))
    code = ("import importlib.metadata as m, json, sys\nout={}\n"
            "for p in sys.argv[1:]:\n"
            "    try: out[p]=m.version(p)\n    except Exception: pass\nprint(json.dumps(out))")
    try:
        r = subprocess.run([python, "-c", code, *packages], capture_output=True, text=True, timeout=120)
        return json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr[-300:]}
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        return {"error": str(exc)}


def build_record(name: str, cfg: dict, att, max_batch: int, repeat: int = 1) -> LaunchRecord:
    engine = get_engine(cfg)
    models = None
    try:
        models = requests.get(att.base_url + "/v1/models", timeout=30, headers=engine.auth_headers()).json()
    except (requests.RequestException, ValueError) as exc:
        models = {"error": str(exc)}
    spec = cfg.get("speculative") or {}
    startup = session_startup(att.log, engine.user_env()) if engine.launches else ""
    return LaunchRecord(
        server=name, repeat=repeat, session=att.session, engine=cfg["engine"], flavor=engine.flavor,
        config=cfg, config_hash=att.config_hash, max_batch=max_batch,
        argv=att.plan_argv, env=att.plan_env,
        reused_running_server=att.reused, startup_s=att.startup_s,
        engine_versions=engine_versions(engine.python()) if engine.launches else None,
        model=model_identity(cfg.get("model")),
        drafter=model_identity(spec.get("model")) if spec.get("model") else None,
        speculative=spec or None,
        accelerator=host(), v1_models=models, log=att.log,
        engine_warnings=engine_warnings(startup),
        base_url_at_launch=att.base_url if not engine.launches else None,
        kv_pool=engine.kv_pool(startup),
    )


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", required=True)
    p.add_argument("--server", required=True, help="the server's config as JSON")
    p.add_argument("--max-batch", type=int, required=True)
    p.add_argument("--repeat", type=int, default=1, help="the repeat this server session serves")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--log", type=Path)
    p.add_argument("--state-dir", type=Path)


def execute(a: argparse.Namespace) -> int:
    cfg = json.loads(a.server)
    mgr = Manager(a.state_dir)
    inputs = [x for x in (cfg.get("model"), (cfg.get("speculative") or {}).get("model")) if x and Path(x).exists()]
    rec = Recorder("launch", inputs, {"server": cfg, "max_batch": a.max_batch, "repeat": a.repeat})
    att = mgr.attach(a.name, cfg, a.max_batch, a.log, session_of(a.repeat))
    write_json(a.out, build_record(a.name, cfg, att, a.max_batch, a.repeat).to_json())
    rec.write([a.out])
    how = "reused" if att.reused else f"started in {att.startup_s} s"
    print(f"server {a.name}: {how} at {att.base_url} (config {config_hash(cfg, a.max_batch) if get_engine(cfg).launches else 'external'})")
    return 0


def main(argv: list[str] | None = None) -> int:
    return steps.main("launch", __doc__, arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
