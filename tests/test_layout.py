"""The package's shape, read from its sources: stage folders in pipeline order, imports that only point
down the stages (or to the shared root), no import circle, and one entry point for every step."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from builders import REPO

PKG = REPO / "workflow" / "specmatch"
# the pipeline, in order: a module may import its own stage, an earlier one, or the shared root
STAGES = ("data", "training", "serving", "measuring", "deciding", "reporting", "calibration")
# the engine registry and its adapters: they import only the shared root, so the root may read them (the
# config's engine names, sweeps and environments are the adapters')
REGISTRY = "specmatch.serving.engines"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """Every specmatch module this file imports, at any depth (function-level and TYPE_CHECKING
    imports included: an import that runs late is still a dependency)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("specmatch"):
                continue
            for alias in node.names:   # `from .x import y` may import the module x.y
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("specmatch"))
    return {m if m in known else m.rpartition(".")[0] for m in out} - {name}


def stage_of(mod: str) -> int | None:
    """The stage's index, or None for the shared root (records, files, stats, provenance, config, ...)."""
    parts = mod.split(".")
    return STAGES.index(parts[1]) if len(parts) > 1 and parts[1] in STAGES else None


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: {d for d in imports(p, known) if d in known and d != "specmatch"} for m, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_every_stage_folder_exists_and_holds_modules():
    for stage in STAGES:
        assert (PKG / stage / "__init__.py").exists(), stage
        assert any(p.name != "__init__.py" for p in (PKG / stage).glob("*.py")), f"{stage}/ is empty"


@pytest.mark.slow
def test_no_import_circle():
    assert cycles(graph()) == []


@pytest.mark.slow
def test_imports_point_down_the_stages_or_to_the_root():
    bad = []
    for mod, deps in graph().items():
        here = stage_of(mod)
        for d in deps:
            there = stage_of(d)
            if there is None:
                continue   # the shared root: records, files, stats, provenance, config, ...
            if here is None and in_registry(d):
                continue   # the engine registry, which imports only the root (below)
            if here is None:
                if mod != "specmatch.cli" and mod != "specmatch.__main__":
                    bad.append(f"{mod} (root) imports {d} (stage {STAGES[there]})")
            elif there > here:
                bad.append(f"{mod} ({STAGES[here]}) imports {d} ({STAGES[there]}), a later stage")
    assert bad == []


# the deciding stage by question, in order: a module may import its own floor or a lower one; the steps
# and the analysis that joins every question (modules directly in deciding/) sit on top
DECIDING = ("reading", "verdicts", "explaining", "predicting", "recommending")
STEPS_MODULES = {"decide", "recommend", "rounds", "stepcost"}


def deciding_floor(mod: str) -> int | None:
    """The floor of a deciding module (None: outside deciding/); modules directly in deciding/ are on top."""
    parts = mod.split(".")
    if len(parts) < 3 or parts[1] != "deciding":
        return None
    return DECIDING.index(parts[2]) if parts[2] in DECIDING else len(DECIDING)


@pytest.mark.slow
def test_the_deciding_stage_is_split_by_question_and_its_floors_point_down():
    mods = modules()
    for floor in DECIDING:
        assert (PKG / "deciding" / floor / "__init__.py").exists(), floor
    top = sorted(m.rsplit(".", 1)[-1] for m, path in mods.items() if m.count(".") == 2
                 and m.startswith("specmatch.deciding.") and path.name != "__init__.py")
    assert set(top) <= {"analysis", "inputs"} | STEPS_MODULES, top
    bad = []
    for mod, deps in graph().items():
        here = deciding_floor(mod)
        if here is None:
            continue
        for d in deps:
            there = deciding_floor(d)
            if there is not None and there > here:
                bad.append(f"{mod} imports {d}, a later question")
            if d.rsplit(".", 1)[-1] in STEPS_MODULES and there == len(DECIDING) and mod.rsplit(".", 1)[-1] != "__main__":
                bad.append(f"{mod} imports the step {d}")
    assert bad == []


@pytest.mark.slow
def test_no_module_reexports_private_names():
    """A module's __all__ lists public names only, and analysis re-exports nothing it does not define."""
    import ast

    bad = []
    for mod, path in modules().items():
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                names = [e.value for e in node.value.elts]
                bad += [f"{mod}: {n}" for n in names if n.startswith("_")]
    assert bad == []


def in_registry(mod: str) -> bool:
    return mod == REGISTRY or mod.startswith(REGISTRY + ".")


@pytest.mark.slow
def test_the_engine_registry_imports_only_the_root():
    """What lets the root read the registry: the adapters import nothing of any stage but themselves."""
    g = graph()
    adapters = [m for m in g if in_registry(m)]
    assert REGISTRY in adapters and len(adapters) > 2
    bad = [f"{m} imports {d}" for m in adapters for d in g[m] if stage_of(d) is not None and not in_registry(d)]
    assert bad == []


@pytest.mark.slow
def test_the_checks_see_a_circle_and_an_upward_import(tmp_path):
    """The graph tools are not vacuous: a circle and an upward import are found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    g = graph()
    assert "specmatch.deciding.verdicts.comparison" in g["specmatch.deciding.analysis"]
    assert deciding_floor("specmatch.deciding.reading.measurements") < deciding_floor("specmatch.deciding.analysis")
    assert stage_of("specmatch.reporting.summary") > stage_of("specmatch.deciding.analysis")
    assert stage_of("specmatch.records") is None


def test_every_step_runs_through_one_entry_point():
    from specmatch import cli

    for step, (module, _) in cli.STEPS.items():
        path = PKG / (module.replace(".", "/") + ".py")
        assert path.exists(), f"{step}: {module} does not exist"
        assert re.search(r"^def main\(", path.read_text(), re.M), f"{step}: {module} has no main()"
    shells = []
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        text = smk.read_text()
        assert not re.search(r"python -m specmatch\.", text), f"{smk.name} calls a module, not a step"
        shells += re.findall(r'"python -m specmatch (\w+)', text)
    assert shells and set(shells) <= set(cli.STEPS), shells
    # every step a rule runs is one the README's pipeline has
    assert {"demo", "inspect", "prompts", "model", "regenerate", "drafter", "launch", "cell", "rounds",
            "recommend", "decide", "summary"} <= set(shells)


def test_help_lists_every_step(capsys):
    import pytest

    from specmatch import cli

    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for step in cli.STEPS:
        assert re.search(rf"^\s+{step}\s", out, re.M), step


def test_the_top_level_is_the_design_cards_and_nothing_stray():
    """What git tracks at the top: the design card's layout (Snakefile, config.yaml, workflow/, envs/,
    resources/, results/, tests/) and the project's own folders; a file a run or an experiment left
    there (a pid file was once committed) fails here."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    top = {line.split("/", 1)[0] for line in tracked.splitlines() if line}
    if not top:
        return   # not a git checkout (an sdist): nothing tracked to check
    card = {"Snakefile", "config.yaml", "workflow", "envs", "resources", "results", "tests"}
    own = {"README.md", "docs", "bench", "profiles", "scripts", "pyproject.toml", ".ci", ".gitignore"}
    assert card <= top and top <= card | own, sorted(top - card - own)
