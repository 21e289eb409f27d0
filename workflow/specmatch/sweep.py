"""k sweeps in the config: one server that lists values becomes one ordinary server per value.

    servers:
      eagle3: {engine: vllm, model: ..., speculative: {method: eagle3, model: ..., num_speculative_tokens: [1, 2, 4]}}

expands to `eagle3@k=1`, `eagle3@k=2` and `eagle3@k=4`, each the same server with one value. A member's
config holds nothing of the list (neither the other values nor its position in it), so adding a value
to a sweep adds one server and runs only its cells: every other member's launches, cells, provenance
and caches stay as they are.

What can be swept is the engine's (its adapter's `sweep_fields` and `sweep`, serving/engines):

- vLLM: `speculative.num_speculative_tokens` (k, the drafted tokens per step) -> `<name>@k=<k>`;
- SGLang: `speculative.num_steps` (k) -> `<name>@k=<k>`, or `speculative.num_draft_tokens` alone (a
  tree's size at a fixed num_steps) -> `<name>@draft=<n>`.

Names: a configured server's name matches `^[A-Za-z0-9_.-]+$` (workflow/schemas/config.schema.yaml), so
`@` never occurs in one and a member's name cannot collide with a configured name or be misread: the
parent is everything before the last `@`. The wildcards that carry a server name (`{server}` in
workflow/rules/*.smk) are unconstrained, and `@` and `=` are ordinary characters of a POSIX path
component and of a shell word (neither needs quoting), so `results/cells/eagle3@k=2/...` is a plain
path. The workflow's own suffixes (`__off`, `__recommended`) attach after the member's name
(`eagle3@k=2__off`); sweep_of does not read those as members (strip them first).
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Optional
from .files import SpecmatchError
from .records import Record
from .serving.engines import ENGINES

SEP = "@"
NAME = re.compile(r"^[A-Za-z0-9_.-]+$")            # a configured server's name (the config schema's pattern)
MEMBER = re.compile(r"^(?P<parent>[A-Za-z0-9_.-]+)@(?P<label>k|draft)=(?P<value>[1-9][0-9]*)$")


@dataclass
class Sweep(Record):
    """One swept server of the config: `parent` (its configured name) lists `values` of `field`
    (a key of its `speculative` block) on `engine`; `members[i]` is the server of `values[i]`."""
    parent: str
    engine: str
    field: str                    # the swept key (the engine's: num_speculative_tokens, num_steps, ...)
    label: str                    # what a member's name calls the value: k | draft
    values: list = field(default_factory=list)
    members: list = field(default_factory=list)

    def member(self, value: int) -> str:
        return member_name(self.parent, self.label, value)

    def ks(self) -> dict:
        """k -> member name (a `k` sweep: the speculative tokens per step; empty for a `draft` sweep)."""
        return dict(zip(self.values, self.members)) if self.label == "k" else {}


@dataclass
class Member(Record):
    """What a member's name says: the configured server it comes from, and which value it runs."""
    name: str
    parent: str
    label: str                    # k | draft
    value: int


def member_name(parent: str, label: str, value: int) -> str:
    return f"{parent}{SEP}{label}={int(value)}"


def member_of(name: str) -> Optional[Member]:
    """The sweep member a server name is (`<parent>@k=<v>` / `<parent>@draft=<v>`), else None."""
    m = MEMBER.match(name)
    if not m:
        return None
    return Member(name, m["parent"], m["label"], int(m["value"]))


def sweep_of(name: str) -> Optional[tuple[str, int]]:
    """(parent, k) of a k-sweep member (`eagle3@k=2` -> ("eagle3", 2)); None for any other name
    (a configured server, a `draft` member, a name with a workflow suffix such as `__off`)."""
    m = member_of(name)
    return (m.parent, m.value) if m is not None and m.label == "k" else None


def members(parent: str, servers) -> dict[int, str]:
    """k -> member name of the k sweep `parent` among `servers` (names, e.g. an expanded config's), in
    k order; empty where `parent` is no sweep."""
    out = {}
    for name in servers:
        got = sweep_of(name)
        if got is not None and got[0] == parent:
            out[got[1]] = name
    return dict(sorted(out.items()))


def parents(servers) -> list[str]:
    """The k sweeps among `servers` (names), by parent, in the order their first member appears."""
    return list(dict.fromkeys(got[0] for got in map(sweep_of, servers) if got is not None))


def _listed(v) -> bool:
    return isinstance(v, (list, tuple))


def _sweep_of_config(name: str, srv: dict, source: str) -> tuple[Optional[Sweep], list[dict]]:
    """The sweep a configured server is (None if it lists nothing) and its members' configs. A list
    under a key some engine sweeps is a sweep; the server's own engine says whether it may be one and
    what each member runs (Engine.sweep)."""
    spec = srv.get("speculative")
    engine = ENGINES.get(srv.get("engine"))
    if not isinstance(spec, dict) or engine is None:
        return None, []
    sweepable = {k for e in ENGINES.values() for k in e.sweep_fields}
    listed = [k for k, v in spec.items() if _listed(v) and k in sweepable]
    if not listed:
        return None, []
    where = f"{source}servers.{name}.speculative"
    allowed = engine.sweep_fields
    for k in listed:
        if k not in allowed:
            raise SpecmatchError(f"{where}.{k}: a list (a sweep) is not supported for engine {engine.name}"
                                 + (f"; it sweeps {', '.join(allowed)}" if allowed else
                                    " (it has nothing to sweep)"))
    if not NAME.match(name):
        raise SpecmatchError(f"{source}servers.{name}: a swept server's name must match {NAME.pattern} "
                             f"(its members are named <name>{SEP}k=<value>)")
    field_, label, values, overrides = engine.sweep(where, spec, listed)
    configs = [_with(srv, o) for o in overrides]
    return Sweep(name, engine.name, field_, label, values, [member_name(name, label, v) for v in values]), configs


def _with(srv: dict, values: dict) -> dict:
    out = copy.deepcopy(srv)
    out["speculative"].update(values)
    return out


def sweeps(servers: dict, source: str = "") -> list[Sweep]:
    """Every sweep of a config's `servers`, in config order (errors name the config field; `source`,
    e.g. "config.yaml: ", prefixes them)."""
    out = []
    for name, srv in servers.items():
        sw, _ = _sweep_of_config(name, srv, source)
        if sw is not None:
            out.append(sw)
    return out


def expand(servers: dict, source: str = "") -> dict:
    """`servers` with every swept server replaced, in place in the order, by one ordinary server per
    value (`<name>@k=<v>`; module docstring). Servers that list nothing are returned as they are."""
    out: dict = {}
    for name, srv in servers.items():
        sw, configs = _sweep_of_config(name, srv, source)
        if sw is None:
            out[name] = srv
            continue
        for member, cfg in zip(sw.members, configs):
            out[member] = cfg
    clash = [n for n in out if member_of(n) is not None and n in servers]
    if clash:  # a configured name never holds `@` (the schema), but expand may run before validation
        raise SpecmatchError(f"{source}servers.{clash[0]}: the name of a sweep member; rename the server")
    return out
