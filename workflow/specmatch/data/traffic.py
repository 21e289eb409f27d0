"""Traffic profiles: the mixes a team deploys, resolved against what inspection found, and the suites
that measure the ones to verify.

A profile (config `traffic.<name>.mix`) weighs strata: the training sources (measured in the basis
suite, config.traffic_basis), the file suites (one stratum each, by suite name: a file of chat or
encyclopedic prompts is none of the training mix) and `training_mix` (the sources in their shares
of the training rows). Weights are normalised to shares of requests. The training mix itself is
always a profile (`training_mix`). Only inspection knows the sources, so a name that is neither a
source nor a file suite is caught here, right after inspection (the `traffic` step writes
`results/prompts/traffic.json`) and not after an hour of measuring; the config's own checks
(config._traffic_checks) catch what the config alone shows.

A profile with `verify: true` gets a derived suite `traffic_<name>` (with_traffic_suites, added to
the validated config as the configured-off controls are added as servers), an ordinary suite to
Snakemake: one prompts job, cells on the same grid as every suite. It is drawn with the profile's
mix by the same seeded procedure as the suites it mixes: a stratified allocation of its size over
the strata (prompts.allocate), the sources' prompts from the basis suite's eligible cuts
(prompts.eligible / sample: the same holdout, turn and length rules), each file suite's from its
file (prompts.file_suite), shuffled together (prompts.traffic_suite). It never draws a prompt the
prediction rests on: the basis suite's rows and the file suites' lines are excluded (`exclude`), so
the check's two errors are independent; where the rest of a pool cannot supply a stratum's share,
its match record says so (shortfall). With `verify: same_prompts` the suite is drawn from the
estimation suites' own prompts instead (the same allocation, each stratum's prompts sampled from the
ones its estimation suite holds, their ids kept), so the analysis predicts it from exactly those
prompts' requests and the check tests the step model's transfer into the mix's batches alone; it is
measured at c > 1 only (config.same_prompts_concurrency). Each prompt's `source` is its stratum (a file's rows
keep their suite's name, not their category), so the analysis reads a verifying suite's
composition from its requests.

    python -m specmatch traffic --config JSON --manifest M --out results/prompts/traffic.json
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

from .. import steps
from ..config import SAME_PROMPTS, TRAFFIC_PREFIX, TRAINING_MIX, same_prompts_concurrency, traffic_basis
from ..files import SpecmatchError, read_json, write_json
from ..provenance import Recorder
from ..records import Manifest, TrafficProfile, TrafficProfiles

TRAINING_KEYS = ("turn", "holdout", "max_prompt_tokens", "max_total_tokens", "min_completion_tokens")


# -- profiles -------------------------------------------------------------------------------------
def training_shares(manifest: Manifest) -> dict[str, float]:
    """Each source's share of the training rows: the training mix's proportions."""
    total = sum(s.rows for s in manifest.sources) or 1
    return {s.name: s.rows / total for s in manifest.sources}


def resolve_mix(where: str, declared: dict, sources: dict[str, float], files: list[str]) -> dict[str, float]:
    """A declared mix as shares of requests per stratum: `training_mix` expanded into the sources'
    training shares, every other name a source or a file suite (else an error that names it and lists
    what exists), zero weights dropped, normalised."""
    clash = sorted(set(sources) & set(files))
    if clash:
        raise SpecmatchError(f"{where}: {', '.join(clash)} is both a training source and a file suite; rename the "
                             "suite so the mix is unambiguous")
    out: dict[str, float] = {}
    for key, w in declared.items():
        if w <= 0:
            continue
        if key == TRAINING_MIX:
            if not sources:
                raise SpecmatchError(f"{where}: `{TRAINING_MIX}` needs a training suite (none measures the sources)")
            for s, share in sources.items():
                out[s] = out.get(s, 0.0) + w * share
        elif key in sources or key in files:
            out[key] = out.get(key, 0.0) + float(w)
        else:
            raise SpecmatchError(f"{where}: '{key}' is neither a training source nor a file suite (sources the "
                                 f"inspection found: {', '.join(sources) or 'none'}; file suites: "
                                 f"{', '.join(files) or 'none'}; or `{TRAINING_MIX}`)")
    total = sum(out.values())
    if total <= 0:
        raise SpecmatchError(f"{where}: every weight is zero")
    return {k: v / total for k, v in out.items()}


def resolve(traffic: dict, suites: dict, basis: str | None, manifest: Manifest | None) -> TrafficProfiles:
    """Every profile resolved against the manifest's sources and the configured file suites, the
    training mix first. `suites`: the config's suites (name -> spec)."""
    files = [n for n, s in suites.items() if s["kind"] == "file"]
    sources = training_shares(manifest) if manifest is not None and basis is not None else {}
    out = TrafficProfiles(basis, sources, files)
    if sources:
        out.profiles.append(TrafficProfile(TRAINING_MIX, dict(sources), {TRAINING_MIX: 1.0}))
    for name, prof in traffic.items():
        mix = resolve_mix(f"traffic.{name}.mix", prof["mix"], sources, files)
        out.profiles.append(TrafficProfile(name, mix, dict(prof["mix"]), bool(prof.get("verify")),
                                           TRAFFIC_PREFIX + name if prof.get("verify") else None))
    return out


# -- the verifying suites -------------------------------------------------------------------------
def traffic_suite_spec(cfg: dict, name: str, prof: dict) -> dict:
    """The derived suite `traffic_<name>`: the mix as declared, the basis suite's drawing rules for the
    sources, each file suite's file for its stratum, the size and passes of the basis."""
    suites = cfg["suites"]
    basis = traffic_basis(cfg)
    b = suites[basis] if basis else {}
    files = {k: {"path": suites[k]["path"]} for k, w in prof["mix"].items()
             if w > 0 and k in suites and suites[k]["kind"] == "file"}
    size = prof.get("size") or b.get("size") or max(suites[k]["size"] for k in files)
    spec = {"kind": "traffic", "profile": name, "mix": dict(prof["mix"]), "size": size, "seed": prof.get("seed", 1),
            "basis": basis, "training": {k: b[k] for k in TRAINING_KEYS if k in b}, "files": files,
            # the suites whose prompts estimate the mix: never drawn again, so the check tests the prediction
            # on prompts it did not see (their errors independent, as the check's variance assumes); or, with
            # verify: same_prompts, the only prompts drawn (the check then tests the step model alone)
            "exclude": sorted(([basis] if basis else []) + list(files))}
    if prof.get("verify") == SAME_PROMPTS:
        spec["same_prompts"] = True
    if b.get("passes"):
        spec["passes"] = b["passes"]
    at = same_prompts_concurrency(cfg, prof) or prof.get("concurrency")
    if at:
        spec["concurrency"] = sorted(at)
    return spec


def with_traffic_suites(cfg: dict) -> dict:
    """The validated config with a suite `traffic_<name>` for every profile with `verify: true`,
    measured by every server measured on every suite, and by a server that lists its suites when it
    lists the basis suite (the cells of a suite never restart a server: `suites` only chooses cells)."""
    made = {TRAFFIC_PREFIX + n: traffic_suite_spec(cfg, n, p) for n, p in (cfg.get("traffic") or {}).items()
            if p.get("verify")}
    if not made:
        return cfg
    out = copy.deepcopy(cfg)
    out["suites"] = {**cfg["suites"], **made}
    basis = traffic_basis(cfg)
    for srv in out["servers"].values():
        if srv.get("suites") and basis in srv["suites"]:
            srv["suites"] = list(srv["suites"]) + [u for u in made if u not in srv["suites"]]
    return out


def step_config(cfg: dict) -> str:
    """The traffic step's --config (deterministic JSON, so an unrelated config edit never reruns it): the
    `traffic` config (less each profile's `concurrency`, which only chooses its verifying suite's cells),
    the basis suite whose cells estimate the sources, and the suites' kinds (a file suite is a stratum)."""
    profiles = {n: {k: v for k, v in p.items() if k != "concurrency"} for n, p in (cfg.get("traffic") or {}).items()}
    return json.dumps({"traffic": profiles, "basis": traffic_basis(cfg),
                       "suites": {n: {"kind": s["kind"]} for n, s in cfg["suites"].items()}},
                      sort_keys=True, separators=(",", ":"))


# -- the step -----------------------------------------------------------------------------------
def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help='JSON {"traffic": ..., "suites": ..., "basis": ...}')
    p.add_argument("--manifest", type=Path, help="results/inspect/manifest.json")
    p.add_argument("--out", required=True, type=Path)


def execute(a: argparse.Namespace) -> int:
    cfg = json.loads(a.config)
    rec = Recorder("traffic", [a.manifest], cfg)
    manifest = Manifest.from_json(read_json(a.manifest)) if a.manifest else None
    profiles = resolve(cfg.get("traffic") or {}, cfg["suites"], cfg.get("basis"), manifest)
    write_json(a.out, profiles.to_json())
    rec.write([a.out])
    for p in profiles.profiles:
        print(f"traffic {p.name}: " + ", ".join(f"{s} {w:.0%}" for s, w in p.mix.items())
              + (f" (verified by suite {p.suite})" if p.suite else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    return steps.main("traffic", __doc__, arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
