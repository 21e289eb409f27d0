# Shared helpers: config validation, target lists and input functions. Logic lives in the
# `specmatch` package (workflow/specmatch); rules only call `python -m specmatch.<step>`.
import json
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

_PKG = str(Path(workflow.basedir) / "workflow")
if _PKG not in sys.path:
    sys.path.insert(0, _PKG)

from specmatch.config import validate as _validate_config
from specmatch.io import SpecmatchError
from specmatch.workflow_env import prepare as _prepare_env

try:
    CFG = _validate_config(config, "config")
except SpecmatchError as _exc:
    raise WorkflowError(str(_exc))


def _uses_conda():
    try:
        from snakemake.settings.types import DeploymentMethod

        return DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
    except Exception:
        return False


# Jobs call `python -m specmatch.<step>` with this checkout's package; servers die with this process.
_prepare_env(_PKG, conda=_uses_conda())
SERVERS = list(CFG["servers"])
SUITES = list(CFG["suites"])
CONCURRENCY = sorted(CFG["concurrency"])
MAX_CONCURRENCY = max(CONCURRENCY)


def to_json(obj):
    """Deterministic JSON for params (sorted keys): a param change reruns exactly its jobs."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def launch_concurrency(server):
    """The concurrency figure a launch depends on, coarse so small sweep edits keep servers."""
    from specmatch.engines.sglang import running_cap

    engine = CFG["servers"][server]["engine"]
    if engine == "vllm":
        return MAX_CONCURRENCY if MAX_CONCURRENCY > 256 else 256
    if engine == "sglang":
        return running_cap(MAX_CONCURRENCY)
    return 0


def launch_concurrency_param(wildcards):
    return launch_concurrency(wildcards.server)


def server_json(wildcards):
    return to_json(CFG["servers"][wildcards.server])


def server_priority(wildcards):
    """Cells of one server run back to back: earlier servers in config order go first."""
    return 10 * (len(SERVERS) - SERVERS.index(wildcards.server))


def server_gpus(wildcards):
    return CFG["servers"][wildcards.server].get("gpus", 0)


def built_paths():
    """Model folders that rules of this workflow build."""
    out = []
    if CFG["models"].get("embedded", {}).get("enabled"):
        out.append(CFG["models"]["embedded"]["path"])
    out += [f"results/models/{n}" for n in CFG["models"].get("drafts", {})]
    return [os.path.normpath(p) for p in out]


def local_inputs(paths):
    """Inputs that Snakemake should track: folders we build, or local files/folders that exist."""
    built = built_paths()
    return [
        p for p in paths if p and (os.path.normpath(p) in built or os.path.exists(p))
    ]


def server_model_inputs(wildcards):
    srv = CFG["servers"][wildcards.server]
    return local_inputs([srv.get("model"), (srv.get("speculative") or {}).get("model")])


def tokenizer_input():
    tok = CFG["dataset"]["tokenizer"]
    return [] if tok.startswith("package:") else local_inputs([tok])


def training_inputs():
    """The demo root when the workflow builds it, else every file under the root (tracked by mtime)."""
    root = CFG["dataset"]["root"]
    if CFG["demo"].get("enabled"):
        return [root]
    if os.path.isdir(root):
        return sorted(str(p) for p in Path(root).rglob("*") if p.is_file())
    return []


def draft_target(wildcards):
    return CFG["models"]["drafts"][wildcards.draft]["from"]


def draft_layers(wildcards):
    return CFG["models"]["drafts"][wildcards.draft]["layers"]


def dataset_root(wildcards):
    return CFG["dataset"]["root"]


def dataset_tokenizer(wildcards):
    return CFG["dataset"]["tokenizer"]


def suite_inputs(wildcards):
    suite = CFG["suites"][wildcards.suite]
    ins = {"manifest": "results/inspect/manifest.json", "tokenizer": tokenizer_input()}
    if suite["kind"] == "file":
        ins["file"] = suite["path"]
    return ins


def suite_json(wildcards):
    return to_json(CFG["suites"][wildcards.suite])


def holdout_json(wildcards):
    suite = CFG["suites"][wildcards.suite]
    return to_json(
        CFG["dataset"].get("holdout", {}) if suite["kind"] == "training" else {}
    )


def requests_json(wildcards):
    return to_json(CFG["requests"])


def cell_files(ext="json"):
    return expand(
        "results/cells/{server}/{suite}/c{concurrency}.{ext}",
        server=SERVERS,
        suite=SUITES,
        concurrency=CONCURRENCY,
        ext=ext,
    )


def all_targets():
    return [
        "results/inspect/manifest.json",
        *expand("results/prompts/{suite}.jsonl", suite=SUITES),
        *expand("results/servers/{server}/launch.json", server=SERVERS),
        *cell_files(),
        "results/summary/summary.md",
    ]


def stop_servers():
    """Stop the managed server when the run ends (the watchdog covers kills and crashes)."""
    from specmatch.server import Manager

    try:
        Manager().stop_current(reason="workflow finished")
    except Exception as exc:  # never mask the run's own outcome
        print(f"specmatch: could not stop the server: {exc}", file=sys.stderr)
