"""The README's own-data example is a config that runs: it validates as written, and the real workflow
runs it end to end against two scripted endpoints (its placeholders replaced, its sizes shrunk). Also
the README's shape: a landing page whose example is on its first screen, and links that resolve."""
from __future__ import annotations

import copy
import json
import os
import re

import pytest
import yaml

from builders import REPO, copy_workflow, make_root, run, scripted_endpoints, snakemake_cmd

README = REPO / "README.md"
MARK = "<!-- readme-example: {} -->"
MAX_LINES = 250
EXAMPLE_WITHIN = 100   # the own-data example starts on the README's first screen
LINKED = [README, REPO / "results" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

# what the run test changes in the example, beside its placeholders (dataset.root, dataset.tokenizer and
# each external server's base_url): only sizes, so that it runs in a minute on 2 cores
SHRUNK_SUITE = {"size": 6, "min_per_source": 1}
SHRUNK = {"concurrency": [1, 2], "repeats": 1}   # one repeat: each server launched once, half the cells
# keys the example leaves to their defaults that the run test sets: a scripted endpoint streams 12 tokens,
# and a test machine is shared (a cell flags its neighbours instead of measuring again)
ADDED = {"requests": {"warmup": 1, "max_tokens": 12, "on_interference": "flag"}, "summary": {"bootstrap": 200}}
API_KEY = "readme-example-key-3f9c"


def example(name: str) -> tuple[int, dict]:
    """(line number of its marker, parsed YAML) of the README's fenced yaml block after MARK(name)."""
    lines = README.read_text().splitlines()
    at = lines.index(MARK.format(name))
    assert lines[at + 1] == "```yaml", f"{MARK.format(name)} must be followed at once by a ```yaml block"
    end = lines.index("```", at + 2)
    return at + 1, yaml.safe_load("\n".join(lines[at + 2:end]))


def leaves(d, prefix=()):
    """{key path: value} of every leaf of a nested mapping."""
    if isinstance(d, dict) and d:
        out = {}
        for k, v in d.items():
            out.update(leaves(v, prefix + (k,)))
        return out
    return {prefix: d}


def test_readme_is_a_landing_page_with_a_valid_example_on_its_first_screen():
    from specmatch.config import validate

    assert len(README.read_text().splitlines()) <= MAX_LINES
    line, cfg = example("own-data")
    assert line <= EXAMPLE_WITHIN, f"the own-data example starts on line {line}"
    assert cfg["dataset"]["root"] and cfg["dataset"]["tokenizer"]
    assert any(s["engine"] == "external" for s in cfg["servers"].values())
    got = validate(cfg, "README own-data")   # raises on any schema or cross-check error
    assert set(got["servers"]) == set(cfg["servers"])
    # the second snippet (servers specmatch launches) replaces the first one's servers and is valid too
    _, launched = example("own-servers")
    assert set(launched) == {"servers"}
    got = validate({**cfg, "servers": launched["servers"]}, "README own-servers")
    assert {s["engine"] for s in got["servers"].values()} == {"vllm"}
    assert any(s.get("speculative") for s in got["servers"].values())


def relative_links(path):
    """Every relative link target of a Markdown file (no URL, no in-page anchor), its anchor dropped."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)   # code blocks hold no links
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        yield target.split("#", 1)[0]


def test_every_relative_link_resolves():
    """README.md, results/README.md and every page under docs/: every relative link names a file that
    exists."""
    missing = []
    for doc in LINKED:
        assert doc.exists(), doc
        for target in relative_links(doc):
            if not (doc.parent / target).exists():
                missing.append(f"{doc.relative_to(REPO)} -> {target}")
    assert not missing, "links to nothing:\n  " + "\n  ".join(missing)


@pytest.fixture(scope="module")
def endpoints():
    """Two scripted OpenAI-compatible endpoints behind a gateway's path prefix that answer only with the
    key (every call specmatch makes must carry it): one plain, one that reports speculative acceptance."""
    env = {**os.environ, "FAKE_KEY": API_KEY}
    with scripted_endpoints({"base": None, "spec": '{"k": 3, "accept": 2}'}, "--prefix", "/team/llm",
                            "--api-key-env", "FAKE_KEY", env=env) as urls:
        yield urls


def runnable(cfg: dict, root: str, tokenizer: str, urls: dict) -> dict:
    """The README's example with its placeholders replaced and its sizes shrunk (nothing else changed)."""
    out = copy.deepcopy(cfg)
    out["dataset"]["root"], out["dataset"]["tokenizer"] = root, tokenizer
    for name, srv in out["servers"].items():
        if srv["engine"] == "external":
            srv["base_url"] = urls["base"] if name == out["baseline"] else urls["spec"]
    for suite in out["suites"].values():
        suite.update({k: v for k, v in SHRUNK_SUITE.items() if k in suite})
    out.update(SHRUNK)
    for top, keys in ADDED.items():
        out.setdefault(top, {}).update(keys)
    return out


def test_runnable_keeps_every_key_the_readme_sets_but_the_sizes():
    _, cfg = example("own-data")
    urls = {"base": "http://127.0.0.1:1", "spec": "http://127.0.0.1:2"}
    got = leaves(runnable(cfg, "prepared", "tokenizer", urls))
    placeholders = {("dataset", "root"), ("dataset", "tokenizer")} | {
        ("servers", n, "base_url") for n, s in cfg["servers"].items() if s["engine"] == "external"}
    shrunk = {("suites", u, k) for u, s in cfg["suites"].items() for k in SHRUNK_SUITE if k in s}
    shrunk |= {(k,) for k in SHRUNK} | {("repeats", "min"), ("repeats", "max")}
    for path, value in leaves(cfg).items():
        if path in placeholders or path in shrunk:
            continue
        assert got.get(path) == value, f"{'.'.join(map(str, path))}: the README sets {value!r}, the run {got.get(path)!r}"
    # what the run only adds is left to its default by the README
    readme = leaves(cfg)
    assert not [p for p in leaves(ADDED) if p in readme]


@pytest.mark.slow  # the whole workflow on the README's config: about a minute
def test_readme_example_runs_end_to_end(tmp_path, tok, tok_dir, endpoints):
    _, cfg = example("own-data")
    wd = copy_workflow(tmp_path)
    # a training root like the README's: several sources, enough rows that the 5% hashed into the
    # holdout give every source a held-out row
    make_root(wd, tok, {"code": 60, "agent": 40, "chat": 40})
    mine = runnable(cfg, "prepared", str(tok_dir), endpoints)
    (wd / "my.yaml").write_text(yaml.safe_dump(mine, sort_keys=False))
    env = {var: API_KEY for var in {s.get("api_key_env") for s in mine["servers"].values()} if var}
    run(snakemake_cmd() + ["--cores", "2", "--configfile", "my.yaml"], wd, env=env)
    res = wd / "results"
    summary = (res / "summary" / "summary.md").read_text()
    for name in mine["servers"]:
        assert f"`{name}`" in summary or f"**{name}**" in summary, f"the summary never names server {name}"
    suites = list(mine["suites"]) + [f"traffic_{p}" for p, t in mine.get("traffic", {}).items() if t.get("verify")]
    for server in mine["servers"]:
        for suite in suites:
            assert (res / "cells" / server / suite / "r1" / "c2.json").exists(), (server, suite)
    # every call carried the key through the gateway's prefix: the cache reset, the launch record's
    # model card and the load itself (a call without it would read 401 here)
    for cell in (res / "cells").rglob("c*.json"):
        if not cell.name.endswith(".prov.json"):
            assert json.loads(cell.read_text())["cache_reset"] == "ok", cell
    for launch in res.rglob("launch.json"):
        assert "error" not in (json.loads(launch.read_text())["v1_models"] or {"error": "none"}), launch
    # the endpoints' key was read from the environment and written nowhere
    if env:
        leaked = [p for p in res.rglob("*") if p.is_file() and API_KEY.encode() in p.read_bytes()]
        assert not leaked, leaked
