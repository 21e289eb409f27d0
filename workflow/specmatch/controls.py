"""Configured-off controls: the same speculative configuration, drafting nothing.

A speculative server differs from the baseline in two ways at once: it drafts, and it is
*configured* for speculation (the engine loads a drafter, reserves memory for it, and changes
scheduler settings and kernel paths when speculation is on: vLLM issue 49548). A speedup mixes the
two. The control `<server>__off` is the server's own configuration with drafting switched off at
every batch size, so

    server / baseline  =  (server__off / baseline)  x  (server / server__off)
                          configuration effect         drafting effect

and each factor gets its own verdict (deciding/explaining/attribution.py). Whether an engine can say
"configured but drafting nothing", and how, is its adapter's (Engine.configured_off: vLLM's one
schedule range of k = 0); where it cannot (SGLang, an external endpoint nothing here restarts) the control is reported
as not expressible, with the adapter's reason.

**The cache arm** `<server>__keepcache` (`summary.controls.prefix_cache`) answers another question
on agentic sessions: an engine may keep less of a session's history in the prefix cache when a
drafter is configured (vLLM drops the last cached block of every request for EAGLE-like methods). The
arm is the server's own configuration with the engine's opt-out of that loss (Engine.prefix_cache_kept:
vLLM's `disable_eagle_block_drop`), still drafting, measured on the session suites only: its session
ledger beside the original's says what the loss costs and whether the flag pays
(deciding/explaining/ledger.py), its outputs against the baseline's whether the flag changes answers.
The servers that get one are those the configured-off control would take (`controlled`).

The controls are ordinary configured servers (launches, cells, provenance, caching), added to the
validated config by `with_controls`, so the workflow needs no special case beyond their name.
"""
from __future__ import annotations

import copy

from .config import recommendation_suites
from .files import SpecmatchError
from .serving.engines import ENGINES, get_engine
from .sweep import members as swept, sweep_of

OFF = "__off"
CACHE = "__keepcache"
ARMS = (OFF, CACHE)   # the servers the workflow derives to explain another: never recommended nor predicted


def is_control(name: str) -> bool:
    """Any arm the workflow derives from a server (the configured-off control, the cache arm)."""
    return name.endswith(ARMS)


def is_off(name: str) -> bool:
    return name.endswith(OFF)


def is_cache_arm(name: str) -> bool:
    return name.endswith(CACHE)


def parent(name: str) -> str:
    """The speculative server an arm belongs to."""
    for suffix in ARMS:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def why_no_control(srv: dict) -> str | None:
    """Why the configured-off control cannot be expressed for this server (None: it can)."""
    if not srv.get("speculative"):
        return "it does not speculate"
    return get_engine(srv).configured_off(1)[1]


def off_config(name: str, srv: dict, max_batch: int) -> tuple[dict | None, str | None]:
    """The control's config, or None and why it cannot be expressed for this server: the server's own,
    with the `speculative` block its engine's adapter gives for drafting nothing (Engine.configured_off)."""
    if not srv.get("speculative"):
        return None, "it does not speculate"
    spec, why = get_engine(srv).configured_off(max_batch)
    return (None, why) if spec is None else (derived(srv, spec), None)


def derived(srv: dict, spec: dict) -> dict:
    """An arm's config: the server's own with another `speculative` block (its suites set apart)."""
    cfg = copy.deepcopy({k: v for k, v in srv.items() if k != "suites"})
    cfg["speculative"] = spec
    return cfg


def measured_on(conf: dict, srv: dict, suites: list[str]) -> str | None:
    """Gives an arm those of `suites` its server is measured on; why there is no arm where none is."""
    own = srv.get("suites")
    conf["suites"] = [u for u in suites if not own or u in own]
    return None if conf["suites"] else f"it is not measured on {', '.join(suites)}"


def controlled(servers: dict, names: list | None) -> list[str]:
    """The servers that get a control: those named (a sweep's name stands for its member of the largest
    k), else every speculative server, a k sweep by its member of the largest k only. The control splits
    a speedup into configuration x drafting; configured-off, the members of one sweep differ only in
    the k they would draft and in what the engine sizes by k (vLLM's scheduled-token budget), so one
    control, of the largest k, answers the sweep's configuration question, and each further one would
    cost a server's launches and cells for much the same answer. The split is reported for that member
    only (the others' are not assumed); name members in summary.controls.servers to measure theirs."""
    if names:
        return [n if n in servers else list(swept(n, servers).values())[-1] for n in names]
    out = []
    for n, s in servers.items():
        if not s.get("speculative"):
            continue
        got = sweep_of(n)
        if got is not None and n != list(swept(got[0], servers).values())[-1]:
            continue
        out.append(n)
    return out


def control_plan(cfg: dict) -> tuple[dict, dict]:
    """({control name: config}, {server: why no control}) for `summary.controls`."""
    ctl = cfg["summary"].get("controls") or {}
    if not ctl.get("configured_off"):
        return {}, {}
    servers = cfg["servers"]
    names = ctl.get("servers")
    for n in names or []:
        if n not in servers and not swept(n, servers):
            raise SpecmatchError(f"config: summary.controls.servers: '{n}' is not a server")
        if n == cfg["baseline"]:
            raise SpecmatchError(f"config: summary.controls.servers: '{n}' is the baseline, which does not speculate")
    suites = ctl.get("suites") or recommendation_suites(cfg)
    for u in suites:
        if u not in cfg["suites"]:
            raise SpecmatchError(f"config: summary.controls.suites: '{u}' is not a suite")
    highest = max(cfg["concurrency"])
    out, why = {}, {}
    for name in controlled(servers, names):
        conf, reason = off_config(name, servers[name], ENGINES[servers[name]["engine"]].launch_max_batch(highest))
        reason = reason or measured_on(conf, servers[name], suites)
        if reason:
            why[name] = reason
        else:
            out[name + OFF] = conf
    return out, why


def cache_arm_plan(cfg: dict) -> tuple[dict, dict]:
    """({arm name: config}, {server: why no arm}) for `summary.controls.prefix_cache`: every speculative
    server (or those listed in `summary.controls.servers`) measured on the session suites with its
    engine's opt-out of the drafter's prefix-cache loss (module docstring)."""
    ctl = cfg["summary"].get("controls") or {}
    if not ctl.get("prefix_cache"):
        return {}, {}
    sessions = [u for u, spec in cfg["suites"].items() if spec["kind"] == "session"]
    servers = cfg["servers"]
    out, why = {}, {}
    # the servers the configured-off control would take (a k sweep by its largest k: what the drafter
    # costs the cache does not depend on k); a name that is no speculative server is control_plan's error
    for name in controlled(servers, [n for n in ctl.get("servers") or [] if n in servers or swept(n, servers)]):
        srv = servers[name]
        if not srv.get("speculative"):
            continue
        if not sessions:
            why[name] = "the config has no session suite (kind: session), where the prefix cache works"
            continue
        spec, reason = get_engine(srv).prefix_cache_kept()
        conf = derived(srv, spec) if spec is not None else None
        reason = reason or measured_on(conf, srv, sessions)
        if reason:
            why[name] = reason
        else:
            out[name + CACHE] = conf
    return out, why


def with_controls(cfg: dict) -> dict:
    """The validated config with its arms (`<server>__off`, `<server>__keepcache`) added as configured
    servers."""
    for name in cfg["servers"]:
        if is_control(name):
            raise SpecmatchError(f"config: servers.{name}: names ending in {' or '.join(ARMS)} are the workflow's "
                                 "own (the arms of summary.controls)")
    extra, _ = control_plan(cfg)
    arms, _ = cache_arm_plan(cfg)
    out = copy.deepcopy(cfg)
    out["servers"] = {**cfg["servers"], **extra, **arms}
    return out
