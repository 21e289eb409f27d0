"""The generated reference pages (docs/reference/config.md and outputs.md) are current and complete, and
the results layout they are generated from (records.RESULT_FILES) is the one the workflow's rules declare."""
from __future__ import annotations

import ast
import dataclasses
import enum
import re
import textwrap

import pytest
import yaml

from builders import REPO
from specmatch import pipeline, records
from specmatch.config import SCHEMA_PATH
from specmatch.reporting import reference
from specmatch.records import RESULT_FILES

RULES = REPO / "workflow" / "rules"


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return reference.pages()


def test_committed_pages_are_what_the_generator_writes_now():
    problems = reference.stale(REPO / "docs" / "reference")
    assert not problems, "\n\n".join(problems)


# -- config.md ----------------------------------------------------------------------------------------
def schema_keys(node: dict, path: str, defs: dict) -> list[str]:
    """Every key a user can set, by dotted path (a map's entries as `<name>`), read straight off the schema."""
    if "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[-1]]
    out = []
    for key, sub in node.get("properties", {}).items():
        out += [f"{path}.{key}".lstrip(".")] + schema_keys(sub, f"{path}.{key}", defs)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        out += schema_keys(extra, f"{path}.<name>", defs)
    for alt in node.get("oneOf", []):
        out += schema_keys(alt, path, defs)
    return out


def test_every_schema_key_is_on_the_config_page(pages):
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    keys = schema_keys(schema, "", schema.get("$defs", {}))
    assert len(keys) > 100 and "servers.<name>.speculative.num_speculative_tokens" in keys
    text = pages["config.md"]
    missing = [k for k in keys if f"`{k}`" not in text]
    assert not missing, missing
    # each top-level key has its section, in schema order
    heads = re.findall(r"^## (\w+)$", text, re.M)
    assert heads == ["Contents", *schema["properties"]]


# what JSON Schema (and the validator here) reads; anything else in a schema node is a typo or a YAML flow
# mapping cut at a comma (`{description: a, b}` makes `b` a key and cuts the description at `a`)
KEYWORDS = {"$schema", "$defs", "$ref", "title", "description", "type", "properties", "additionalProperties",
            "required", "enum", "oneOf", "default", "items", "minItems", "uniqueItems", "minimum", "maximum",
            "exclusiveMinimum", "exclusiveMaximum", "pattern", "propertyNames", "minProperties"}


def test_every_schema_node_says_only_what_json_schema_reads():
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    bad = []

    def walk(node, path):
        for k, v in node.items():
            if k not in KEYWORDS:
                bad.append(f"{path}: {k!r}")
            if k in ("properties", "$defs"):
                for name, sub in v.items():
                    walk(sub, f"{path}/{name}")
            elif k in ("additionalProperties", "items", "propertyNames") and isinstance(v, dict):
                walk(v, f"{path}/{k}")
            elif k == "oneOf":
                for i, alt in enumerate(v):
                    walk(alt, f"{path}/oneOf/{i}")

    walk(schema, "")
    assert not bad, "unknown keywords (a description with an unquoted comma in a {...} mapping?): " + str(bad)


def test_the_config_page_types_defaults_and_requirements():
    page = reference.ConfigPage({"type": "object", "required": ["a"], "$defs": {"d": {
        "type": "object", "properties": {"x": {"type": "integer", "minimum": 1}}}},
        "properties": {
            "a": {"type": "object", "description": "A | b.", "required": ["k"], "properties": {
                "k": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                "e": {"type": "string", "enum": ["p", "q"], "default": "p"},
                "l": {"type": ["array", "null"], "items": {"type": "string"}, "default": None},
                "m": {"type": "object", "additionalProperties": {"$ref": "#/$defs/d"}},
                "n": {"$ref": "#/$defs/d"},
                "o": {"default": 2, "oneOf": [{"type": "integer"}, {"type": "object", "properties": {
                    "min": {"type": "integer"}}}]}}}}}).render()
    assert "| `a.k` | number in (0, 1] | **required** |" in page
    assert "| `a.e` | one of `p`, `q` | `p` |" in page
    assert "| `a.l` | list of string, or null | `null` |" in page
    assert "| `a.m.<name>.x` | integer ≥ 1 | — |" in page          # the $ref resolved, documented once ...
    assert "`a.n.x`" not in page and "Its keys are those of [`a.m.<name>`](#a)" in page   # ... and linked
    assert "| `a.o` | integer, or mapping | `2` |" in page and "| `a.o.min` |" in page
    assert "\nA | b.\n" in page                                       # prose outside a table keeps its pipe


# -- outputs.md ---------------------------------------------------------------------------------------
def documented_classes() -> list[type]:
    roots = [c for e in RESULT_FILES for c in reference.named_records(e)]
    return reference.reachable(roots)[0]


def section(text: str, name: str) -> str:
    m = re.search(rf"^### {name}\n(.*?)(?=^##)", text + "\n## end", re.M | re.S)
    assert m, f"no section for {name}"
    return m.group(1)


def test_every_written_field_and_value_is_on_the_outputs_page(pages):
    text = pages["outputs.md"]
    classes = documented_classes()
    assert {records.CellResult, records.RequestRecord, records.Interference, records.Decision} <= set(classes)
    assert {"KSweeps", "KPoint", "ContextRow", "ContextTrend", "StoppingReport", "OutputAgreement"} <= {
        c.__name__ for c in classes}
    missing = []
    for cls in classes:
        body = section(text, cls.__name__)
        if issubclass(cls, enum.Enum):
            missing += [f"{cls.__name__} {m.value}" for m in cls if f"| `{m.value}` |" not in body]
            continue
        for f in reference.written_fields(cls):
            if f"| `{f.name}` |" not in body:
                missing.append(f"{cls.__name__}.{f.name}")
    assert not missing, missing
    # a field never written is not documented as if it were
    assert "`server_timing`" not in section(text, "RequestRecord")


def test_every_record_is_documented_or_said_not_written():
    documented = {c.__name__ for c in documented_classes()}
    defined = {name for name, c in vars(records).items() if isinstance(c, type) and c.__module__ == records.__name__
               and issubclass(c, (records.Record, enum.Enum)) and c is not records.Record}
    assert not (defined - documented - set(reference.NOT_WRITTEN)), defined - documented - set(reference.NOT_WRITTEN)
    assert set(reference.NOT_WRITTEN) <= defined and not (set(reference.NOT_WRITTEN) & documented)


def test_field_comments_come_from_the_source():
    docs = {d.name: d for d in reference.member_docs(records.RequestRecord)}
    assert docs["pass_index"].doc == "which pass over the suite (0-based)"           # beside the field
    assert docs["cached_tokens"].doc.startswith("prompt tokens served from the prefix cache")  # above it, alone
    assert docs["finish_reason"].group.startswith("the output (requests.record_outputs)")  # over a group
    assert docs["output_sha256"].group == "" and docs["index"].doc == ""
    assert {d.name for d in reference.member_docs(records.CellResult) if d.group} >= {"max_concurrency",
                                                                                       "completed"}
    from specmatch.deciding.recommending.kmodel import KBand

    band = {d.name: d for d in reference.member_docs(KBand)}
    assert band["pinned_at"].doc.endswith("(off: no k pays there at the deploying level; kbands.bands)")
    assert band["extrapolated"].doc.endswith("concurrency (not measured there)")   # goes on past the class's end
    assert {d.name: d.doc for d in reference.member_docs(records.Direction)}["STOPS_PAYING"] == \
        "pays below it, loses above"


# -- the results layout against the rules -------------------------------------------------------------------
DIRECTIVES = ("output", "log", "benchmark")


def rule_paths(node: ast.AST) -> list[tuple[str, bool]]:
    """(path, is a folder) of every results/ path a directive's argument names."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [(node.value, False)]
    if isinstance(node, ast.Name) and node.id != "DECIDED":
        value = getattr(pipeline, node.id, None)
        assert isinstance(value, str), f"{node.id}: not a path constant of specmatch.pipeline"
        return [(value, False)]
    if any(isinstance(n, ast.Name) and n.id == "DECIDED" for n in ast.walk(node)):   # the decide step's records
        paths = [(f"{pipeline.SUMMARY}/{f}", False) for f in pipeline.DECISION_FILES.values()]
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "prov":
            return [(p + ".prov.json", False) for p, _ in paths]
        return paths
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        args = [p for a in node.args for p in rule_paths(a)]
        if node.func.id == "prov":
            return [(p + ".prov.json", False) for p, _ in args]
        if node.func.id == "directory":
            return [(p, True) for p, _ in args]
        if node.func.id == "report":
            return rule_paths(node.args[0])
    if isinstance(node, ast.IfExp):
        return rule_paths(node.body) + rule_paths(node.orelse)
    # an expression over the config: the default path it names
    return [(n.value, False) for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and n.value.startswith("results/")]


def declared() -> dict[str, set[tuple[str, bool]]]:
    """rule -> every (path under results/, is a folder) its output, log and benchmark declare, each
    `{wildcard}` as `<>`."""
    out: dict[str, set[tuple[str, bool]]] = {}
    for smk in sorted(RULES.glob("*.smk")):
        lines = smk.read_text().splitlines()
        rule = None
        i = 0
        while i < len(lines):
            line = lines[i]
            m = re.match(r"^(?:rule|checkpoint)\s+(\w+)\s*:", line)
            if m:
                rule = m.group(1)
            elif line and not line[0].isspace():
                rule = None
            d = re.match(r"^    (\w+):\s*$", line)
            if rule and d and d.group(1) in DIRECTIVES:
                body = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or lines[i].startswith("        ")):
                    body.append(lines[i])
                    i += 1
                call = ast.parse("f(\n" + textwrap.dedent("\n".join(body)) + "\n)", mode="eval").body
                paths = [p for a in call.args for p in rule_paths(a)]
                paths += [p for k in call.keywords for p in rule_paths(k.value)]
                for path, folder in paths:
                    if path.startswith("results/"):
                        out.setdefault(rule, set()).add((re.sub(r"\{[^}]*\}", "<>", path[len("results/"):]), folder))
                continue
            i += 1
    return out


# a placeholder output no job asks for: demo_data's when the demo is off (its real output is dataset.root)
NOT_FILES = {("demo_data", ".demo_disabled")}


def pattern(entry_path: str) -> re.Pattern:
    """A RESULT_FILES path as a regex over declared paths: `<x>` one path part, `**/` any folders."""
    out = ""
    for token in re.split(r"(\*\*/?|<[^>]*>)", entry_path.rstrip("/")):
        if token.startswith("**"):
            out += ".*"
        elif token.startswith("<"):
            out += "[^/]+"
        else:
            out += re.escape(token)
    return re.compile(out)


def covers(entry: records.ResultFile, path: str, folder: bool) -> bool:
    """Whether a table row is this declared path (or a file inside this declared folder)."""
    return pattern(entry.path).fullmatch(path) is not None or (folder and entry.path.startswith(path + "/"))


def test_the_rule_parser_sees_the_rules():
    d = declared()
    assert ("cells/<>/<>/r<>/c<>.json", False) in d["cell"]
    assert ("servers/<>/r<>/server.log", False) in d["launch"]
    assert ("summary/plots", True) in d["summary"] and ("summary/verdicts.json.prov.json", False) in d["decide"]
    assert ("models/embedded", True) in d["embedded_model"] and ("benchmarks/inspect.tsv", False) in d["inspect"]
    assert {f"summary/{f}" for f in pipeline.DECISION_FILES.values()} <= {p for p, _ in d["decide"]}


def test_result_files_agree_with_what_the_rules_declare():
    d = declared()
    # every declared path has its row, by the rule that declares it (or a row for every rule's)
    uncovered = sorted(f"{rule}: results/{path}" for rule, paths in d.items() for path, folder in paths
                       if (rule, path) not in NOT_FILES
                       and not any(e.rule in (rule, "*") and covers(e, path, folder) for e in RESULT_FILES))
    assert not uncovered, f"declared by a rule but not in records.RESULT_FILES: {uncovered}"
    # every row is declared by its rule; a row of no rule is declared by none (else it would name it)
    wrong = []
    for e in RESULT_FILES:
        rules = list(d) if e.rule in ("*", None) else [e.rule]
        hit = [r for r in rules if any(covers(e, p, f) for p, f in d.get(r, ()))]
        if e.rule is None and hit:
            wrong.append(f"{e.path}: no rule says the table, but {hit} declare it")
        elif e.rule is not None and not hit:
            wrong.append(f"{e.path}: {e.rule!r} declares no such path")
    assert not wrong, wrong
    assert len({e.path for e in RESULT_FILES}) == len(RESULT_FILES)


def test_every_record_a_row_names_exists():
    for e in RESULT_FILES:
        for cls in reference.named_records(e):
            assert dataclasses.is_dataclass(cls) and issubclass(cls, records.Record), (e.path, cls)


def test_the_plots_in_the_table_are_the_ones_the_summary_draws():
    names = set()
    for py in sorted((REPO / "workflow" / "specmatch" / "reporting").glob("*.py")):
        text = py.read_text()
        names |= set(re.findall(r'(?:save\(fig, |panels\()"(\w+)"', text))
        names |= set(re.findall(r'"(\w+)\.png"', text))
    assert {"throughput", "k_sweep", "traffic", "context"} <= names
    table = {e.path[len("summary/plots/"):-len(".png")] for e in RESULT_FILES if e.path.startswith("summary/plots/")}
    assert table == names


# -- the step --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_step_writes_the_pages_and_check_finds_a_stale_one(tmp_path, capsys):
    from specmatch import cli

    assert "docs" in cli.STEPS
    assert cli.main(["docs", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.md", "outputs.md"]
    assert cli.main(["docs", "--check", "--out", str(tmp_path)]) == 0
    page = tmp_path / "outputs.md"
    page.write_text(page.read_text().replace("| `pass_index` |", "| `pass` |"))
    capsys.readouterr()
    assert cli.main(["docs", "--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "outputs.md is stale: run `python -m specmatch docs`" in err and "-| `pass` |" in err
    assert "config.md" not in err
