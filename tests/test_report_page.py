"""The answer first: summary.md's first screen, report.html (rendered from the same records, opened in a
real headless Chromium), and result files a teammate can read (the umask holds, atomic writes included)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from builders import REPO, SPEC, run_summary
from specmatch.calibration.simulate import experiment
from specmatch.files import atomic_path, current_umask, write_json, write_text
from specmatch.reporting.page import blocks_html, inline, page

ARTIFACTS = Path(os.environ.get("SPECMATCH_TEST_ARTIFACTS", REPO / ".test-artifacts"))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """A whole decide + summary run on synthetic cells of known truth: pays at c=1,4, loses at c=16."""
    tmp = tmp_path_factory.mktemp("page")
    cells = experiment(np.random.default_rng(0), {1: 1.5, 4: 1.2, 16: 0.6}, repeats=3, session_sd=0.01, cell_sd=0.01)
    out, md = run_summary(tmp, cells, {"baseline": None, "spec": SPEC})
    return out, md


# -- summary.md: the answer on the first screen --------------------------------------------------------
def answer_block(md: str) -> list[str]:
    """summary.md's answer: from its title to the line that says the evidence follows."""
    lines = md.splitlines()
    end = next(i for i, x in enumerate(lines) if x.startswith("Everything below is the evidence"))
    return lines[:end + 1]


@pytest.mark.slow
def test_the_first_screen_holds_the_recommendation_the_verdicts_by_load_and_the_machine(rendered):
    out, md = rendered
    first = answer_block(md)
    assert len(first) <= 30 and first[0] == "# specmatch: does speculation pay off here?"
    assert first[2] == "## The answer"
    text = "\n".join(first)
    rec = json.loads((out / "recommendations.json").read_text())[0]
    deploy = next(x for x in first if x.startswith("- **spec** (`s`): "))
    assert rec["text"] in deploy and "Evidence: " + rec["evidence"] in deploy
    assert rec["deploy"]["flag"] in deploy and "--speculative-config" in deploy   # as the vLLM adapter rendered it
    assert json.dumps(rec["schedule"]["bands"]) in deploy
    header = next(x for x in first if x.startswith("| traffic |"))
    assert header == "| traffic | c=1 | c=4 | c=16 |" and "`spec`" in text
    row = next(x for x in first if x.startswith("| suite `s` (measured) |"))
    # each load's verdict, in the order of the header, with the verdict record's own figures
    verdicts = {v["concurrency"]: v for v in json.loads((out / "verdicts.json").read_text())
                if v["metric"] == "output_throughput" and v["server"] == "spec"}
    cells = [c.strip() for c in row.split("|")[2:5]]
    for c, cell in zip((1, 4, 16), cells):
        v = verdicts[c]
        assert cell.startswith({"pays": "**pays**", "loses": "**loses**"}[v["verdict"]])
        assert f"{v['speedup']:.2f}x [{v['lo']:.2f}, {v['hi']:.2f}]" in cell
    assert any(x.startswith("- **Machine:**") for x in first)
    # the evidence follows: the full recommendation, then the verdicts
    assert md.index("## The answer") < md.index("## Recommendation") < md.index("## Verdicts")


def test_the_first_screen_stays_one_screen_with_several_servers_and_traffic_profiles(rendered):
    """Three speculative servers on three profiles and three suites: one row per profile or suite, a
    column per server and load, every recommendation and the machine line within 30 lines; the derived
    `__recommended` server is the recommendation's check, not an answer."""
    from specmatch.deciding.decide import Decisions
    from specmatch.records import Decision, Interval, TrafficCheck, TrafficRow, Verdict
    from specmatch.reporting import answer
    from specmatch.reporting.decided import Decided

    out, _ = rendered
    dec = Decisions.read(out)
    servers = ["spec", "fast", "slow"]
    an = dec.analysis
    an.servers = ["baseline", *servers, "spec__recommended"]
    an.suites = ["s", "t", "u"]
    base = [v for v in dec.verdicts if v.server == "spec" and v.metric == "output_throughput"]
    dec.verdicts = [Verdict.from_json({**v.to_json(), "server": x, "suite": u}) for x in servers
                    for u in an.suites for v in base]
    rec = dec.recommendations[0]
    dec.recommendations = [type(rec).from_json({**rec.to_json(), "server": x}) for x in reversed(servers)]
    dec.traffic = [TrafficRow(p, {"s": 1.0}, x, c, "output_throughput", Interval(1.1, 0.9, 1.3), None,
                              Decision.INCONCLUSIVE, check=TrafficCheck(0.02, -0.1, 0.1, True) if p == "b" else None)
                   for p in ("a", "b", "training_mix") for x in [*servers, "spec__recommended"] for c in (1, 4, 16)]
    for r in dec.traffic:
        if r.check:
            r.measured = Interval(1.12, 1.0, 1.25)
    d = Decided(dec, {})
    md = "\n".join(["# specmatch: does speculation pay off here?", ""] + answer.lines(d))
    block = answer_block(md)
    assert len(block) <= 30, "\n".join(block)
    header = next(x for x in block if x.startswith("| traffic |"))
    assert header.count("`fast` c=") == 3 and header.index("`spec` c=1") < header.index("`fast` c=1")
    rows = [x for x in block if x.startswith("| your mix") or x.startswith("| the training mix")
            or x.startswith("| suite")]
    assert [r.split("|")[1].strip() for r in rows] == [
        "your mix `a` (predicted)", "your mix `b` (predicted)", "the training mix (predicted)",
        "suite `s` (measured)", "suite `t` (measured)", "suite `u` (measured)"]
    assert all(r.count("|") == 2 + 9 for r in rows) and "measured 1.12x, agrees" in rows[1]
    assert "spec__recommended" not in "\n".join(rows + [header])
    deploy = [x for x in block if x.startswith("- **") and "(`s`)" in x]
    assert [x.split("**")[1] for x in deploy] == servers   # config order
    assert any(x.startswith("- **Machine:**") for x in block)


def test_every_file_the_summary_writes_is_listed(rendered):
    out, md = rendered
    files = md[md.index("## Files"):]
    written = [p.relative_to(out).as_posix() for p in out.rglob("*")
               if p.is_file() and not p.name.endswith(".prov.json") and p.name != "summary.md"]
    assert written and "report.html" in written and any(w.startswith("plots/") for w in written)
    for w in written:
        assert f"`{w}`" in files, w


def test_the_machine_line_names_a_busy_machine():
    from types import SimpleNamespace

    from specmatch.records import Interference
    from specmatch.reporting.answer import quietness_line

    quiet = Interference(available=True, foreign_cpu_cores=0.01, threshold_cores=0.05)
    busy = Interference(available=True, foreign_cpu_cores=0.4, threshold_cores=0.05, flagged=True,
                        why=["0.40 cores used by others"])
    cell = lambda i, flagged=False: SimpleNamespace(interference=i, earlier=[], flagged=flagged)  # noqa: E731
    analysis = SimpleNamespace(flagged_claims=[])
    d = SimpleNamespace(cells={("s", "u", 1, 1): cell(quiet)}, verdicts=[], decisions=SimpleNamespace(analysis=analysis),
                        map_cells={})
    d.measured_cells = d.cells
    assert quietness_line(d).startswith("- **Machine:** quiet")
    d.cells[("s", "u", 16, 1)] = cell(busy, flagged=True)
    line = quietness_line(d)
    assert "**busy** during 1 kept measurement(s)" in line and "0.4" not in line.split(";")[0]
    assert "step-cost map" not in line
    # the step-cost map's own cells count like every other cell (never in a verdict, but the map rests on them)
    from specmatch.reporting.decided import Decided

    d.map_cells = {("s", "u", 32, 1): cell(busy, flagged=True), ("b", "u", 32, 1): cell(busy, flagged=True),
                   ("s", "u", 8, 1): cell(quiet)}
    d.measured_cells = Decided.measured_cells.fget(d)
    line = quietness_line(d)
    assert "**busy** during 3 kept measurement(s)" in line and "over 5 cells" in line
    assert "the step-cost map's own cells at c=32 among them" in line
    d.map_cells = {}
    d.cells = {("s", "u", 1, 1): SimpleNamespace(interference=None, earlier=[], flagged=False)}
    d.measured_cells = d.cells
    assert "not sampled" in quietness_line(d)


# -- report.html ----------------------------------------------------------------------------------------
def test_markdown_conversion_escapes_and_keeps_structure():
    assert inline("**pays** at `c<16` & [docs](a.md)") == \
        '<strong>pays</strong> at <code>c&lt;16</code> &amp; <a href="a.md">docs</a>'
    assert inline("a `half open") == "a `half open"   # an unmatched backtick stays text
    assert inline("**over `base` by**") == "<strong>over <code>base</code> by</strong>"   # bold across code
    h = blocks_html(["| a | b |", "|---|---|", "| 1 | <x> |", "", "- one", "  more", "- two", "", "text",
                     "line", "```", "<raw>", "```"])
    assert "<th>a</th><th>b</th>" in h and "<td>&lt;x&gt;</td>" in h and "---" not in h
    assert "<li>one more</li><li>two</li>" in h and "<p>text line</p>" in h
    assert "<pre><code>&lt;raw&gt;</code></pre>" in h
    # names from the data never become markup: no script links, a `|` in code stays in its cell, a line
    # that merely starts with '#' is text, the private marks and NUL do not break the renderer
    assert "<a" not in inline("[x](javascript:alert(1))") and "<a" not in inline("[x](data:text/html,hi)")
    assert inline("[d](a.md?x=1&y=2)") == '<a href="a.md?x=1&amp;y=2">d</a>'
    assert "<td><code>a|b</code></td><td>c</td>" in blocks_html(["| x | y |", "|---|---|", "| `a|b` | c |"])
    assert blocks_html(["#1 in the queue"]) == "<p>#1 in the queue</p>"
    assert inline("a\x00b \ue000 `c`") == "a\x00b  <code>c</code>"


def test_the_page_is_self_contained_and_answer_first(rendered):
    out, md = rendered
    html = (out / "report.html").read_text()
    assert "<script" not in html and "http://" not in html and "https://" not in html
    srcs = [s.split('"')[0] for s in html.split('src="')[1:]]
    pngs = sorted((out / "plots").glob("*.png"))
    assert len(srcs) == len(pngs) > 0 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert html.index('id="the-answer"') < html.index('id="plots"') < html.index('id="recommendation"')
    rec = json.loads((out / "recommendations.json").read_text())[0]
    assert rec["text"].split(":")[0] in html
    for f in ("summary.md", "verdicts.json", "plots/speedup.png", "cells.csv"):
        assert f'href="{f}.prov.json"' in html and (out / f"{f}.prov.json").exists()
    assert page("# t\n\n## A\n\nx\n", [], out, []).count("<section") == 1


def _browser():
    """Chromium and its driver from the distribution (scripts/setup-browser.sh installs them)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.fail("Chromium and chromedriver are needed: run scripts/setup-browser.sh (Debian's chromium, "
                    "chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,800"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


@pytest.mark.slow   # starts a real browser (a few seconds)
def test_the_page_renders_in_a_real_browser_with_the_recommendation_in_the_first_viewport(rendered):
    out, _ = rendered
    rec = json.loads((out / "recommendations.json").read_text())[0]
    browser = _browser()
    try:
        browser.get((out / "report.html").as_uri())
        state = browser.execute_script("""
            const imgs = [...document.images];
            const answer = document.querySelector('section.answer li');
            const r = answer.getBoundingClientRect();
            return {images: imgs.length,
                    broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt),
                    answer: answer.innerText, top: r.top, bottom: r.bottom, height: window.innerHeight,
                    visible: getComputedStyle(answer).visibility === 'visible' && r.width > 0,
                    title: document.title};""")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(ARTIFACTS / "report-first-viewport.png"))
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        browser.quit()
    assert not errors, errors
    assert state["images"] == len(list((out / "plots").glob("*.png"))) > 0 and state["broken"] == []
    assert state["visible"] and 0 <= state["top"] and state["bottom"] <= state["height"], state
    assert rec["text"].split(":")[0] in state["answer"]
    assert state["title"] == "specmatch: does speculation pay off here?"


# -- files a teammate can read ------------------------------------------------------------------------
@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_results_honour_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        assert current_umask() == mask
        write_text(tmp_path / "a.md", "x")
        write_json(tmp_path / "b.json", {"x": 1})
        with atomic_path(tmp_path / "c.parquet", ".parquet") as tmp:
            pl.DataFrame({"x": [1]}).write_parquet(tmp)
    finally:
        os.umask(old)
    for name in ("a.md", "b.json", "c.parquet"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~mask, name
