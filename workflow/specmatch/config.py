"""Load and validate the workflow config against workflow/schemas/config.schema.yaml.

The schema is the reference manual; this module applies its defaults, checks the cross-key rules a
JSON Schema cannot express (the baseline names a server, engines have what they need) and turns
validation errors into messages that name the bad key, e.g. `servers.ngram.speculative.method`.

The engine names a server may take are the engine registry's (serving/engines: ENGINES), filled into
the schema as it is loaded, so registering an adapter is all a new engine needs here. The registry
imports only the shared root, so reading it here makes no circle.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .files import SCHEMAS_DIR, SpecmatchError
from .serving.engines import ENGINES
from .sweep import expand, member_of

SCHEMA_PATH = SCHEMAS_DIR / "config.schema.yaml"


def load_schema() -> dict:
    """The config schema, with a server's `engine` limited to the registered engines."""
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    schema["$defs"]["server"]["properties"]["engine"]["enum"] = list(ENGINES)
    return schema


def _key_path(error: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "(top level)"


def _scalar(types, value):
    """Text that stands for a value of a non-string type becomes that type. Where the schema allows a
    string (argv items and environment values: `[string, number]`), text is already valid and stays
    exactly as written: "2048" must not become 2048.0, nor "0" become "0.0", nor "1e3" become 1000.0."""
    if not isinstance(value, str) or "string" in types:
        return value
    text = value.strip()
    if "integer" in types and text.lstrip("-").isdigit():
        return int(text)
    if "number" in types:
        try:
            return float(text)
        except ValueError:
            pass
    if "boolean" in types and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if "null" in types and text.lower() in ("null", "none", "~"):
        return None
    return value


def _coerce(schema: dict, value: Any, root: dict) -> Any:
    """Turn numbers/booleans written as strings into their types where the schema expects them and
    no string is allowed (text stays text wherever a string is valid)."""
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].split("/")[-1]]
    if "oneOf" in schema:  # several shapes (repeats: 2 or {min, max}): the one whose type the value has
        shape = "object" if isinstance(value, dict) else "array" if isinstance(value, list) else None
        for alt in schema["oneOf"]:
            if shape is None or alt.get("type") == shape:
                value = _coerce(alt, value, root)
                if shape is not None or not isinstance(value, str):
                    return value
        return value
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        return {k: _coerce(props[k], v, root) if k in props else
                (_coerce(extra, v, root) if isinstance(extra, dict) else v) for k, v in value.items()}
    if isinstance(value, list):
        items = schema.get("items")
        return [_coerce(items, v, root) for v in value] if isinstance(items, dict) else value
    return _scalar(types, value)


def _fill_defaults(schema: dict, instance: Any, root: dict) -> None:
    """Fill `default` values of properties the user did not set (recursively, following $ref)."""
    if "$ref" in schema:
        ref = schema["$ref"].split("/")[-1]
        schema = root["$defs"][ref]
    if not isinstance(instance, dict):
        return
    for key, sub in schema.get("properties", {}).items():
        if "$ref" in sub:
            sub = root["$defs"][sub["$ref"].split("/")[-1]]
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if key in instance:
            _fill_defaults(sub, instance[key], root)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key, value in instance.items():
            if key not in schema.get("properties", {}):
                _fill_defaults(extra, value, root)


def validate(config: dict, source: str = "config") -> dict:
    """Return a validated copy of `config` with schema defaults applied; raise SpecmatchError."""
    schema = load_schema()
    cfg = copy.deepcopy(config)
    # `snakemake --config concurrency=[1,8]` hands nested values over as text; coerce by the schema.
    cfg = _coerce(schema, cfg, schema)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{source}: {_key_path(e)}: {_message(e)}" for e in errors[:20]]
        raise SpecmatchError("invalid configuration:\n  " + "\n  ".join(lines))
    for top in ("requests", "summary", "demo", "models"):
        cfg.setdefault(top, {})
    session_defaults(cfg)
    _fill_defaults(schema, cfg, schema)
    # a k sweep (a list under the key the engine sweeps) becomes one ordinary server per value
    # (`<name>@k=<v>`, specmatch.sweep) before anything else reads the servers

    cfg["servers"] = expand(cfg["servers"], f"{source}: ")
    _cross_checks(cfg, source)
    return cfg


def _message(e: jsonschema.ValidationError) -> str:
    """The error a person can act on: for a value that may take several shapes (oneOf), what each
    shape found wrong, not only that none matched."""
    if e.validator == "oneOf" and e.context:
        why = "; ".join(dict.fromkeys(f"{_key_path(c) if c.absolute_path else 'value'}: {c.message}"
                                      for c in e.context))
        return f"{e.instance!r} is none of the allowed forms ({why})"
    return e.message


def session_defaults(cfg: dict) -> None:
    """What a session suite takes where it says nothing (before the schema's defaults, which are every
    suite's): held-out rows only, and answers that stop where the model stops."""
    for spec in (cfg.get("suites") or {}).values():
        if isinstance(spec, dict) and spec.get("kind") == "session":
            spec.setdefault("holdout", "only")
            spec.setdefault("ignore_eos", False)


def requests_settings(cfg: dict, suite: str) -> dict:
    """The `requests` settings a cell of `suite` is sent with (records.RequestSettings): the config's,
    with the suite's own `passes` and `ignore_eos` where it sets them."""
    spec = cfg["suites"][suite]
    passes = spec.get("passes")
    own = {"ignore_eos": spec["ignore_eos"]} if spec.get("ignore_eos") is not None else {}
    if spec.get("kind") == "session":
        own["session_salt"] = session_salt(cfg)
    return {**cfg["requests"], **({"passes": passes} if passes else {}), **own}


def session_salt(cfg: dict) -> str | None:
    """Why a session suite's passes cannot be raised for this run (None: they can): every server must
    replay each pass under its own cache salt (Engine.cache_salt_field), or else servers would be compared
    on different numbers of passes (a steady state against one wave). One server without a salt keeps the
    configured passes for all."""
    for name, server in sorted(cfg["servers"].items()):
        field, why = ENGINES[server["engine"]](server).cache_salt_field()
        if field is None:
            return f"server {name}: {why}"
    return None


def passes_for(n_prompts: int, passes: int, min_requests_per_worker: int | None, concurrency: int) -> int:
    """A cell's passes over its suite: `passes` (requests.passes, or the suite's own), raised to the fewest
    whole passes that give each of `concurrency` workers at least `min_requests_per_worker` requests
    (requests.min_requests_per_worker; None leaves `passes`). Whole passes keep every prompt equally often
    in a cell, and the request plan depends only on the suite, the passes and the seed, so every server at
    one concurrency sends the same requests (paired by (prompt, pass))."""
    if not min_requests_per_worker or n_prompts <= 0:
        return passes
    return max(passes, -(-min_requests_per_worker * concurrency // n_prompts))


def keeps_busy(prompts: int, passes: int, concurrency: int) -> bool:
    """Whether a suite keeps `concurrency` workers busy: every cell sends each of its prompts once per pass."""
    return prompts * passes >= concurrency


def step_cost_suite(cfg: dict) -> str:
    """The suite the step-cost map cells measure: `step_cost.suite`, else the first recommendation suite
    (recommendation_suites: the configured ones, else the first training suite, else the first suite),
    the suite the stepcost step maps (deciding.stepcost, given the recommendation suites)."""
    sc = cfg.get("step_cost") or {}
    return sc.get("suite") or recommendation_suites(cfg)[0]


def recommendation_suites(cfg: dict) -> list[str]:
    """The suites recommendations (and controls) stand on: `summary.recommend_suites`, else the first
    training suite, else (a config of prompt files only) the first suite."""
    listed = (cfg.get("summary") or {}).get("recommend_suites")
    if listed:
        return list(listed)
    training = [n for n, s in cfg["suites"].items() if s.get("kind") == "training"]
    return (training or list(cfg["suites"]))[:1]


def suite_concurrency(cfg: dict, suite: str) -> list[int]:
    """The concurrencies `suite` is measured at: its own `concurrency` (a part of the grid), else the
    whole grid (`concurrency`)."""
    own = (cfg["suites"].get(suite) or {}).get("concurrency")
    return sorted(own or cfg["concurrency"])


def whole_grid_suites(cfg: dict) -> dict[str, str]:
    """The suites that must be measured at every concurrency, each with why: the recommendations, the
    traffic predictions (the basis suite, whose sources every mix and the training mix, always a
    profile, weigh, and each file suite a declared mix weighs) and the step-cost map stand on them at
    every load. A file suite no mix weighs may lack a load: the break-even line toward it is then
    not drawn there (the summary says it was not measured)."""
    out = {u: "a recommendation suite" for u in recommendation_suites(cfg)}
    basis = traffic_basis(cfg)
    if basis:
        out.setdefault(basis, "the traffic basis suite (its sources predict every mix, the training mix included)")
    for name, prof in (cfg.get("traffic") or {}).items():
        for stratum, weight in prof["mix"].items():
            if weight > 0 and stratum in cfg["suites"]:
                out.setdefault(stratum, f"a stratum of the traffic mix `{name}`")
    if (cfg.get("step_cost") or {}).get("concurrency"):
        out.setdefault(step_cost_suite(cfg), "the step-cost map's suite")
    return out


def _concurrency_checks(cfg: dict, source: str) -> None:
    """A suite's or a verifying profile's own `concurrency` is a part of the grid, and the suites
    everything else stands on keep the whole grid."""
    grid = set(cfg["concurrency"])
    owners = [(f"suites.{n}", s.get("concurrency")) for n, s in cfg["suites"].items()]
    owners += [(f"traffic.{n}", p.get("concurrency")) for n, p in (cfg.get("traffic") or {}).items()]
    for where, own in owners:
        if own and not set(own) <= grid:
            raise SpecmatchError(f"{source}: {where}.concurrency: {sorted(set(own) - grid)} not in concurrency "
                                 f"{sorted(grid)} (a suite is measured at a part of the grid)")
    for name, why in whole_grid_suites(cfg).items():
        own = (cfg["suites"].get(name) or {}).get("concurrency")
        if own and set(own) != grid:
            raise SpecmatchError(f"{source}: suites.{name}.concurrency: {name} is {why}, measured at every "
                                 f"concurrency of the grid (drop the key)")


def _step_cost_checks(cfg: dict, source: str) -> None:
    sc = cfg.get("step_cost") or {}
    if sc.get("suite") and sc["suite"] not in cfg["suites"]:
        raise SpecmatchError(f"{source}: step_cost.suite: '{sc['suite']}' is not a suite "
                             f"(suites: {', '.join(cfg['suites'])})")
    extra = set(sc.get("check") or []) - set(sc.get("concurrency") or [])
    if extra:
        raise SpecmatchError(f"{source}: step_cost.check: {sorted(extra)} not in step_cost.concurrency (a check "
                             "concurrency is a map cell held out of the fit)")
    first = cfg["repeats"]["min"] if isinstance(cfg["repeats"], dict) else cfg["repeats"]
    if sc.get("repeats") and sc["repeats"] > first:
        raise SpecmatchError(f"{source}: step_cost.repeats: {sc['repeats']} sessions, but the design measures every "
                             f"cell in {first} (repeats{'.min' if isinstance(cfg['repeats'], dict) else ''}): the map "
                             "cells are measured in those sessions")
    inside = set(sc.get("check") or []) & set(cfg["concurrency"])
    if inside:
        raise SpecmatchError(f"{source}: step_cost.check: {sorted(inside)} also in concurrency (the verdict grid): "
                             "a check must be measured only to check the map")


def _cross_checks(cfg: dict, source: str) -> None:
    _step_cost_checks(cfg, source)
    _concurrency_checks(cfg, source)
    servers = cfg["servers"]
    if cfg["baseline"] not in servers:
        raise SpecmatchError(
            f"{source}: baseline: '{cfg['baseline']}' is not a server (servers: {', '.join(servers)})"
        )
    if servers[cfg["baseline"]].get("speculative"):
        raise SpecmatchError(f"{source}: servers.{cfg['baseline']}.speculative: the baseline must not speculate")
    for member, srv in servers.items():
        got = member_of(member)   # a k sweep's member: its errors name the server the user configured
        name = got.parent if got is not None else member
        # a server launched here needs its model; an endpoint nobody here launches, its address
        launched = ENGINES[srv["engine"]].launches
        endpoints = " or ".join(n for n, e in ENGINES.items() if not e.launches)
        if launched and not srv.get("model"):
            raise SpecmatchError(f"{source}: servers.{name}.model: required for engine {srv['engine']}")
        if not launched and not srv.get("base_url"):
            raise SpecmatchError(f"{source}: servers.{name}.base_url: required for engine {srv['engine']}")
        if launched and srv.get("base_url"):
            raise SpecmatchError(f"{source}: servers.{name}.base_url: only for engine {endpoints}")
        if launched and srv.get("max_batch") is not None:
            raise SpecmatchError(f"{source}: servers.{name}.max_batch: only for engine {endpoints} (a server launched "
                                 "here runs the batch its launch sets)")
        for suite in srv.get("suites") or []:
            if suite not in cfg["suites"]:
                raise SpecmatchError(f"{source}: servers.{name}.suites: '{suite}' is not a suite "
                                     f"(suites: {', '.join(cfg['suites'])})")
        if member == cfg["baseline"] and srv.get("suites") and set(srv["suites"]) != set(cfg["suites"]):
            raise SpecmatchError(f"{source}: servers.{name}.suites: the baseline is compared on every suite, "
                                 "so it is measured on every suite (drop the key)")
        spec = srv.get("speculative") or {}
        if spec.get("method") in ("draft_model", "eagle", "eagle3") and not spec.get("model"):
            raise SpecmatchError(f"{source}: servers.{name}.speculative.model: required for method {spec['method']}")
    if isinstance(cfg["repeats"], dict) and cfg["repeats"]["max"] < cfg["repeats"]["min"]:
        raise SpecmatchError(f"{source}: repeats.max: {cfg['repeats']['max']} is below repeats.min "
                             f"({cfg['repeats']['min']})")
    for name, suite in cfg["suites"].items():
        highest = max(suite_concurrency(cfg, name))
        if suite["kind"] == "file" and not suite.get("path"):
            raise SpecmatchError(f"{source}: suites.{name}.path: required for kind file")
        suite_kind_checks(cfg, name, suite, source)
        like = suite.get("length_like")
        if suite["kind"] == "file" and like and cfg["suites"].get(like, {}).get("kind") != "training":
            training = [n for n, u in cfg["suites"].items() if u["kind"] == "training"]
            raise SpecmatchError(f"{source}: suites.{name}.length_like: '{like}' is not a training suite (training "
                                 f"suites: {', '.join(training) or 'none'}): a control copies a training suite's "
                                 "prompt lengths")
        req = requests_settings(cfg, name)
        passes = (req["passes"] if suite["kind"] == "session"   # a session replays whole, closed-loop
                  else passes_for(suite["size"], req["passes"], req.get("min_requests_per_worker"), highest))
        if not keeps_busy(suite["size"], passes, highest):
            raise SpecmatchError(f"{source}: suites.{name}.size: {suite['size']} prompts x {passes} pass(es) cannot "
                                 f"keep concurrency {highest} busy (every cell sends the whole suite); raise the size "
                                 f"or suites.{name}.passes (whole passes of the suite)")
    if cfg["summary"]["recommend_metric"] == "goodput" and not cfg["summary"]["slo"]:
        raise SpecmatchError(f"{source}: summary.recommend_metric: goodput needs summary.slo")
    for name in cfg["summary"].get("recommend_suites") or []:
        if name not in cfg["suites"]:
            raise SpecmatchError(f"{source}: summary.recommend_suites: '{name}' is not a suite")
    for name in servers:
        if name.endswith("__recommended"):
            raise SpecmatchError(f"{source}: servers.{name}: names ending in __recommended are the workflow's own")
    _traffic_checks(cfg, source)


TRAINING_MIX = "training_mix"   # the implicit traffic profile, and the mix key for the training proportions
TRAFFIC_PREFIX = "traffic_"     # a verified profile's derived suite: traffic_<profile>


def traffic_basis(cfg: dict) -> str | None:
    """The suite whose cells estimate every training source of a traffic mix: the first training suite of
    summary.recommend_suites (held-out rows, where recommendations stand), else the first training suite."""
    training = [n for n, s in cfg["suites"].items() if s["kind"] == "training"]
    listed = [u for u in cfg["summary"].get("recommend_suites") or [] if u in training]
    return (listed or training or [None])[0]


SAME_PROMPTS = "same_prompts"   # traffic.<name>.verify: the mix drawn from the estimation suites' own prompts


def same_prompts_concurrency(cfg: dict, prof: dict) -> list | None:
    """Where a same-prompt verifying suite is measured: the profile's `concurrency`, else the grid's
    concurrencies above 1 (at c = 1 a mix of measured prompts is exact: nothing to check); None for any
    other profile."""
    if prof.get("verify") != SAME_PROMPTS:
        return None
    return sorted(prof.get("concurrency") or [c for c in cfg["concurrency"] if c > 1])


def _traffic_checks(cfg: dict, source: str) -> None:
    """What the config alone says about `traffic` (the sources are checked against the manifest by the
    traffic step, specmatch.data.traffic): no reserved or clashing names, a mix of positive weight, a
    basis suite for source names, a verifying suite that can be drawn and keeps the grid busy."""
    suites = cfg["suites"]
    files = [n for n, s in suites.items() if s["kind"] == "file"]
    training = [n for n, s in suites.items() if s["kind"] == "training"]
    if cfg.get("traffic") and TRAINING_MIX in suites:
        raise SpecmatchError(f"{source}: suites.{TRAINING_MIX}: the name is traffic's own (the training mix); rename "
                             "the suite")
    for name, prof in (cfg.get("traffic") or {}).items():
        where = f"{source}: traffic.{name}"
        if name == TRAINING_MIX:
            raise SpecmatchError(f"{where}: the training mix is always a profile; choose another name")
        mix = prof["mix"]
        if sum(mix.values()) <= 0:
            raise SpecmatchError(f"{where}.mix: every weight is zero")
        for key in mix:
            if key in training:
                raise SpecmatchError(f"{where}.mix: '{key}' is a training suite; a mix weighs its sources (name "
                                     f"them) or `{TRAINING_MIX}` (file suites: {', '.join(files) or 'none'})")
        sources = [k for k, w in mix.items() if k not in files and w > 0]
        if sources and traffic_basis(cfg) is None:
            raise SpecmatchError(f"{where}.mix: {', '.join(sources)} name training sources, but no training suite "
                                 "measures them (add a suite of kind training)")
        if not prof.get("verify"):
            continue
        derived = TRAFFIC_PREFIX + name
        if derived in suites:
            raise SpecmatchError(f"{where}.verify: its suite would be named '{derived}', which is a configured suite")
        if prof["verify"] == SAME_PROMPTS:
            at = prof.get("concurrency") or cfg["concurrency"]
            if 1 in (prof.get("concurrency") or []) or not any(c > 1 for c in at):
                raise SpecmatchError(f"{where}.concurrency: verify: {SAME_PROMPTS} checks the step model, which only "
                                     "c > 1 uses (at c = 1 a mix of measured prompts is predicted exactly); name "
                                     "concurrencies above 1")
        for key in mix:
            if key in files and suites[key].get("length_like") and mix[key] > 0:
                raise SpecmatchError(f"{where}.mix: '{key}' composes its prompts to another suite's lengths "
                                     "(length_like), which a verifying suite cannot draw; weigh it in an unverified "
                                     "profile")
        basis = traffic_basis(cfg)
        size = prof.get("size") or (suites[basis]["size"] if basis else max(suites[k]["size"] for k in mix
                                                                             if k in suites))
        passes = requests_settings(cfg, basis)["passes"] if basis else cfg["requests"]["passes"]
        highest = max(same_prompts_concurrency(cfg, prof) or prof.get("concurrency") or cfg["concurrency"])
        if not keeps_busy(size, passes, highest):
            raise SpecmatchError(f"{where}.size: {size} prompts x {passes} pass(es) cannot keep concurrency "
                                 f"{highest} busy")


ONLY_FOR = {"answers": "session", "max_turns": "session", "min_turns": "session", "length_strata": "training"}


def suite_kind_checks(cfg: dict, name: str, suite: dict, source: str) -> None:
    """Keys that mean something for one suite kind only, and what a session suite cannot be: an open
    loop (a session's next turn waits for its answer: concurrency is the sessions in flight)."""
    for key, kind in ONLY_FOR.items():
        if suite.get(key) is not None and suite["kind"] != kind:
            raise SpecmatchError(f"{source}: suites.{name}.{key}: only for kind {kind}")
    if suite["kind"] == "session" and cfg["requests"].get("request_rate") is not None:
        raise SpecmatchError(f"{source}: requests.request_rate: suite {name} is a session suite, replayed closed-loop "
                             "(each turn waits for the previous answer; concurrency is the sessions in flight)")


def load(path: str | Path, overrides: dict | None = None) -> dict:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecmatchError(f"{path}: config file not found") from None
    except yaml.YAMLError as exc:
        raise SpecmatchError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise SpecmatchError(f"{path}: expected a mapping at the top level")
    if overrides:
        raw = deep_merge(raw, overrides)
    return validate(raw, str(path))


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out

