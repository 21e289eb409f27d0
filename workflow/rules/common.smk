# Shared helpers: config validation, target lists and input functions. Logic lives in the
# `specmatch` package (workflow/specmatch); rules only call `python -m specmatch <step>`.
import json
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod

_PKG = str(Path(workflow.basedir) / "workflow")
if _PKG not in sys.path:
    sys.path.insert(0, _PKG)

from specmatch import pipeline
from specmatch.config import validate as _validate_config
from specmatch.pipeline import CELL_JSON, CELL_REQUESTS, DECISION_FILES, LAUNCH, SUMMARY
from specmatch.config import recommendation_suites, step_cost_suite, suite_concurrency
from specmatch.controls import is_control, with_controls
from specmatch.data.traffic import (
    step_config as traffic_step_config,
    with_traffic_suites,
)
from specmatch.files import SpecmatchError
from specmatch.records import DerivedServers, RoundPlan
from specmatch.run_order import UPSTREAM, priority as _run_priority
from specmatch.deciding.reading.sequential import Design
from specmatch.workflow_env import prepare as _prepare_env

try:
    # the configured-off controls (`<server>__off`, summary.controls) join as configured servers
    # ... and a verified traffic profile's suite (`traffic_<profile>`) joins as a configured suite
    CFG = with_traffic_suites(with_controls(_validate_config(config, "config")))
except SpecmatchError as _exc:
    raise WorkflowError(str(_exc))


def _uses_conda():
    """Whether jobs run in conda environments. Snakemake 9 always gives the workflow its deployment
    settings (api.py); the attribute is Optional only for a Workflow built without them.
    """
    settings = workflow.deployment_settings
    return settings is not None and DeploymentMethod.CONDA in settings.deployment_method


# What the rules' commands need: this checkout's package on PYTHONPATH, the interpreter running
# Snakemake first on PATH, and this process's pid (servers and cells die with it); a job's Snakemake in
# a SLURM allocation ends itself if the allocation's end leaves it orphaned (specmatch.ending).
_prepare_env(_PKG, conda=_uses_conda(), job=workflow.remote_exec)
# One serving slot unless `--resources serving_slot=N` gives more (profiles/default and profiles/slurm
# give 1). Snakemake passes neither `--resources` nor profiles to the Snakemake that runs a group
# inside a cluster allocation (nor to any job it spawns): without this, a server session's cells
# would run side by side there, and that Snakemake would size the group's `srun` step for all of
# them at once (more GPUs than the allocation holds: the step is refused).
if "serving_slot" not in workflow.global_resources:
    workflow.register_resource("serving_slot", 1)
# On SLURM a server session's launch and cells are one group (servers.smk, cells.smk): one
# allocation, one `srun` step whose Snakemake owns the server. Snakemake makes one group job per
# connected piece of the DAG, and cells are connected only through their launch, so when the launch
# is done (a cell rerun, a concurrency added) profiles/slurm's `group-components` joins a session's
# cells into one group job. The Snakemake that runs a group inside its allocation must see the same
# groups, or it runs each cell as a `srun` step of its own, whose end stops the server; the SLURM
# plugin (2.8.0) passes no group settings to it unless told to (its CommonSettings).
try:
    import snakemake_executor_plugin_slurm as _slurm_plugin

    _slurm_plugin.common_settings.pass_group_args = True
except ImportError:
    pass
SERVERS = list(CFG["servers"])
SUITES = list(CFG["suites"])
CONCURRENCY = sorted(CFG["concurrency"])
MAX_CONCURRENCY = max(CONCURRENCY)
SUITE_CONCURRENCY = {suite: suite_concurrency(CFG, suite) for suite in SUITES}
# `repeats`: a fixed design (every cell R times) or the sequential one (every cell `min` times, then
# rounds that add a repeat only where a verdict is still inconclusive: rounds.smk)
DESIGN = Design.of(CFG["repeats"])
REPEATS = list(range(1, DESIGN.min + 1))
RECOMMEND_SUITES = recommendation_suites(CFG)


def to_json(obj):
    """Deterministic JSON for params (sorted keys): a param change reruns exactly its jobs."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def analysis_settings():
    """The decision rules' settings (config `summary`), with the sequential design when there is one
    (each look's verdict at its spent level); a fixed design adds nothing, so its params stay put.
    """
    extra = {"repeats": CFG["repeats"]} if DESIGN.sequential else {}
    return to_json({**CFG["summary"], **extra})


def prov(*paths):
    """The provenance sidecars (`<file>.prov.json`) a step writes beside its outputs."""
    return [f"{p}.prov.json" for p in paths]


# -- servers: the configured ones, and the recommended ones the recommend checkpoint derives -----
def derived_servers():
    """`<server>__recommended` configurations (after the recommend checkpoint has run)."""
    out = checkpoints.recommend.get().output.servers
    return DerivedServers.from_json(json.loads(Path(out).read_text())).servers


def server_config(name):
    if name in CFG["servers"]:
        return CFG["servers"][name]
    return derived_servers()[name].config


def launch_max_batch(wildcards):
    """The largest batch a server is launched for (vLLM max_num_seqs, SGLang's running-request cap),
    coarse so small sweep edits keep servers (Engine.launch_max_batch)."""
    from specmatch.serving.engines import ENGINES

    engine = ENGINES[server_config(wildcards.server)["engine"]]
    return engine.launch_max_batch(MAX_CONCURRENCY)


def server_json(wildcards):
    """The server's configuration as its launch and cells see it: `suites` only chooses which cells
    exist, so editing it never restarts a server or reruns a cell."""
    return to_json(
        {k: v for k, v in server_config(wildcards.server).items() if k != "suites"}
    )


def server_suites(name):
    """The suites a configured server is measured on (all unless `servers.<name>.suites` says)."""
    return CFG["servers"][name].get("suites") or SUITES


def whole_machine(wildcards):
    """Every core Snakemake was given (`--cores`): a benchmark cell, a server launch, inspection and
    drafter training each have the machine to themselves. Read when a job is built, not when the
    rules are parsed, so `--unlock`, `--list-changes` and other commands without `--cores` work.
    A cluster run gives no `--cores`: there the profile sets these rules' CPUs (profiles/slurm:
    `set-threads`, which replaces this), and without it a job asks for one.
    """
    try:
        return workflow.cores
    except WorkflowError:
        return 1


def session_cells(server):
    """How many cells one session (repeat) of `server` has at most: each of its suites at its
    concurrencies (a recommended server is measured on one suite, at every concurrency).
    """
    suites = server_suites(server) if server in CFG["servers"] else RECOMMEND_SUITES[:1]
    extra = [c for c in CFG["step_cost"].get("concurrency", []) if c not in CONCURRENCY]
    return sum(len(SUITE_CONCURRENCY[u]) for u in suites) + len(extra)


def default_runtime():
    """The default `runtime` in minutes (`--default-resources`, profiles/slurm), or None."""
    defaults = workflow.resource_settings.default_resources
    try:
        value = defaults["runtime"].value if defaults is not None else None
    except KeyError:
        return None
    return value if isinstance(value, int) and value > 0 else None


def session_runtime(wildcards):
    """Minutes for a launch or a cell: an equal share of its server session's time limit, which is
    the default `runtime` (profiles/slurm). On a cluster a session's launch and cells are one group,
    one allocation, and Snakemake asks for the *sum* of a group's runtimes (the SLURM plugin refuses
    a --time of our own): so the shares of a whole session add up to the default runtime, and the
    cells a rerun adds to less, however many cells a session has. 0 (no limit asked) when no default
    runtime is set, as in local runs, where it means nothing. `set-resources` (launch/cell runtime)
    replaces it.
    """
    total = default_runtime()
    if total is None:
        return 0
    return max(1, total // (session_cells(wildcards.server) + 1))


def server_priority(wildcards):
    """Run order (specmatch.run_order): repeat by repeat, server by server, alternating; recommended
    servers come after the decision (they exist only then) and are ordered among themselves.
    """
    names = SERVERS if wildcards.server in SERVERS else sorted(derived_servers())
    return _run_priority(wildcards.server, int(wildcards.repeat), names, DESIGN.max)


def launch_env(wildcards):
    """The conda environment a server's engine needs (with --software-deployment-method conda)."""
    name = pipeline.launch_env(server_config(wildcards.server))
    return str(Path(workflow.basedir) / "envs" / f"{name}.yaml")


def server_gpus(wildcards):
    return server_config(wildcards.server).get("gpus", 0)


# -- models and data ------------------------------------------------------------------------
def built_paths():
    """Model folders that rules of this workflow build."""
    out = []
    if CFG["models"].get("embedded", {}).get("enabled"):
        out.append(CFG["models"]["embedded"]["path"])
        out += embedded_tokenizer_input()
    out += [f"results/models/{n}" for n in CFG["models"].get("drafts", {})]
    out += [f"results/models/{n}" for n in CFG["models"].get("eagle3", {})]
    return [os.path.normpath(p) for p in out]


def embedded_tokenizer_input():
    """The embedded model's own tokenizer folder, when the config names one (models.embedded.tokenizer_path)."""
    emb = CFG["models"].get("embedded", {})
    return (
        [emb["tokenizer_path"]]
        if emb.get("enabled") and emb.get("tokenizer_path")
        else []
    )


def local_inputs(paths):
    """Inputs that Snakemake should track: folders we build, or local files/folders that exist."""
    built = built_paths()
    return [
        p for p in paths if p and (os.path.normpath(p) in built or os.path.exists(p))
    ]


def server_model_inputs(wildcards):
    srv = server_config(wildcards.server)
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


def drafter_target(wildcards):
    return CFG["models"]["eagle3"][wildcards.drafter]["target"]


def drafter_budget(wildcards):
    return to_json(pipeline.drafter_budget(CFG["models"]["eagle3"][wildcards.drafter]))


def drafter_regenerate(name):
    """The regeneration settings of drafter `name` (specmatch.training.regenerate.Settings), or None when off."""
    from specmatch.training.regenerate import settings_of

    return settings_of(
        CFG["models"]["eagle3"][name], CFG["servers"][CFG["baseline"]].get("dtype")
    )


def drafter_regenerated(wildcards):
    """train_drafter's regenerated rows (results/regenerate/<drafter>), when the drafter trains on them."""
    return (
        [f"results/regenerate/{wildcards.drafter}"]
        if drafter_regenerate(wildcards.drafter)
        else []
    )


def drafter_regenerated_arg(wildcards):
    return " ".join(f"--regenerated {p}" for p in drafter_regenerated(wildcards))


def regenerate_settings(wildcards):
    from dataclasses import asdict

    settings = drafter_regenerate(wildcards.drafter)
    if settings is None:
        raise WorkflowError(
            f"models.eagle3.{wildcards.drafter}.regenerate is off: nothing asks for its regenerated rows"
        )
    return to_json(asdict(settings))


def drafter_aux_layers(wildcards):
    layers = CFG["models"]["eagle3"][wildcards.drafter].get("aux_layers")
    return f"--aux-layers {','.join(map(str, layers))}" if layers else ""


def drafter_args(wildcards):
    """train_drafter's optional arguments: its aux layers and its regenerated rows. Empty for a
    drafter that sets neither (as before regeneration existed), so such a drafter does not retrain.
    """
    return " ".join(
        a
        for a in (drafter_aux_layers(wildcards), drafter_regenerated_arg(wildcards))
        if a
    )


def dataset_root(wildcards):
    return CFG["dataset"]["root"]


def dataset_tokenizer(wildcards):
    return CFG["dataset"]["tokenizer"]


def holdout_json(wildcards):
    return to_json(CFG["dataset"].get("holdout", {}))


def suite_inputs(wildcards):
    suite = CFG["suites"][wildcards.suite]
    ins = {"manifest": "results/inspect/manifest.json", "tokenizer": tokenizer_input()}
    if suite["kind"] == "file":
        ins["file"] = suite["path"]
        like = suite.get("length_like")  # a training suite (config.validate checks it)
        if like:
            ins["like"] = f"results/prompts/{like}.jsonl"
    else:
        ins["cuts"] = "results/inspect/cuts.parquet"
    if suite.get(
        "exclude"
    ):  # a verifying traffic suite never redraws the estimation prompts
        ins["exclude"] = [f"results/prompts/{u}.jsonl" for u in suite["exclude"]]
    return ins


def suite_json(wildcards):
    """The suite's spec as its prompts step sees it: `concurrency` only chooses cells, so editing it
    never redraws the suite."""
    return to_json(
        {k: v for k, v in CFG["suites"][wildcards.suite].items() if k != "concurrency"}
    )


def suite_cuts_arg(wildcards, input):
    out = []
    if "cuts" in input.keys():
        out.append(f"--cuts {input.cuts}")
    elif "like" in input.keys():
        out.append(f"--like {input.like}")
    if "exclude" in input.keys():
        out.append("--exclude " + " ".join(input.exclude))
    return " ".join(out)


def requests_json(wildcards):
    """The requests settings of a cell: the suite's own passes when it sets them
    (config.requests_settings)."""
    from specmatch.config import requests_settings

    return to_json(requests_settings(CFG, wildcards.suite))


# -- cells: paths from specmatch.pipeline (CELL_JSON, CELL_REQUESTS, LAUNCH: one definition) -------
SERVER_SUITES = {name: server_suites(name) for name in SERVERS}


def cell_paths(servers, suites, ext="json"):
    return pipeline.cell_paths(
        pipeline.grid_keys(servers, suites, REPEATS, SUITE_CONCURRENCY), ext
    )


def launch_paths(servers):
    return pipeline.launch_paths(servers, REPEATS)


def map_cells(ext="json"):
    """The step-cost map's own cells (config `step_cost`): the servers measured on the map suite, at
    the map concurrencies the verdict grid lacks, in the first repeats' sessions (pipeline.map_keys).
    """
    suite = step_cost_suite(CFG)
    servers = [s for s in SERVERS if suite in SERVER_SUITES[s] and not is_control(s)]
    return pipeline.cell_paths(pipeline.map_keys(CFG, servers, DESIGN.min), ext)


def derived_cells(ext):
    """Cells of the recommended servers: every concurrency and repeat of their suite."""
    out = []
    for name, d in derived_servers().items():
        out += cell_paths([name], [d.suite], ext)
    return out


def round_plan(r):
    """The sequential design's plan after round r (the `sequential_round` checkpoint's output)."""
    out = checkpoints.sequential_round.get(round=r).output.plan
    return RoundPlan.from_json(json.loads(Path(out).read_text()))


def rounds_before(r):
    """The rounds that ran before repeat r, as (round, plan) (pipeline.rounds_before)."""
    return pipeline.rounds_before(r, DESIGN.min, DESIGN.max, round_plan)


def cell_keys_through(r):
    """Every configured server's cell measured in repeats 1..r (pipeline.cell_keys_through)."""
    return pipeline.cell_keys_through(
        r, SERVER_SUITES, SUITE_CONCURRENCY, DESIGN.min, DESIGN.max, round_plan
    )


def cells_through(r, ext="json"):
    """Cells of the configured servers (each on its own suites) measured in repeats 1..r."""
    return pipeline.cell_paths(cell_keys_through(r), ext)


def launches_through(r):
    """The launch records (one per server session) the cells of repeats 1..r were measured on."""
    return pipeline.launches_of(cell_keys_through(r))


def round_plans(r=None):
    """The plan files of the rounds that ran (before repeat r: every one by default)."""
    return [
        checkpoints.sequential_round.get(round=k).output.plan
        for k, _ in rounds_before(DESIGN.max if r is None else r)
    ]


def configured_cells(ext="json"):
    """Every cell of the configured servers (input functions only: past `min` it reads the rounds)."""
    return cells_through(DESIGN.max, ext)


# the decide step's records (name -> path), outputs of `decide` and inputs of `summary`
DECIDED = {name: f"{SUMMARY}/{file}" for name, file in DECISION_FILES.items()}


def summary_cells(wildcards):
    return configured_cells("json") + derived_cells("json")


def summary_requests(wildcards):
    return configured_cells("requests.parquet") + derived_cells("requests.parquet")


def summary_launches(wildcards):
    return launches_through(DESIGN.max) + launch_paths(list(derived_servers()))


def all_targets():
    return [
        "results/inspect/manifest.json",
        *expand("results/prompts/{suite}.jsonl", suite=SUITES),
        *launch_paths(SERVERS),
        *cells_through(DESIGN.min),
        *map_cells(),
        "results/stepcost/stepcost.json",
        "results/summary/summary.md",
    ]


def stop_servers():
    """When the run ends (onsuccess/onerror; never in a job): stop this host's server (the watchdog
    covers kills and crashes) and remove the server state of SLURM allocations that have ended,
    whose servers ended with them (specmatch.serving.server.end_of_run says what it did).
    """
    from specmatch.serving.server import end_of_run

    try:
        for line in end_of_run():
            print(f"specmatch: {line}", file=sys.stderr)
    except Exception as exc:  # never mask the run's own outcome
        print(f"specmatch: could not stop the server: {exc}", file=sys.stderr)
