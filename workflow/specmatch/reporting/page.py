"""report.html: the summary as one self-contained page, for a browser and for sending to a colleague.

It is summary.md turned into HTML (the same lines, so the page and the markdown never disagree), with
the plots inlined as data URIs right after the answer, and every file of the summary folder linked with
its provenance. Nothing here decides or computes a figure; no script, no external resource.

The converter knows exactly the markdown the report's parts write: headings, paragraphs, "- " lists,
pipe tables, fenced blocks, `code`, **bold** and [links](url).
"""
from __future__ import annotations

import base64
import html
import re
from pathlib import Path

STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2330;background:#fafbfc}
main{max-width:1180px;margin:0 auto;padding:18px 28px 60px}
h1{font-size:24px;margin:8px 0 4px}h2{font-size:19px;margin:28px 0 8px;border-bottom:1px solid #d8dde6;
padding-bottom:3px}h3{font-size:16px}
nav{font-size:13px;margin:6px 0 12px;color:#4a5468}nav a{margin-right:10px}
section.answer{background:#fff;border:1px solid #c9d3e3;border-radius:6px;padding:2px 18px 10px}
.scroll{overflow-x:auto}table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #d8dde6;padding:3px 7px;text-align:left;vertical-align:top}th{background:#eef2f8}
code{font-size:12.5px;background:#eef1f5;padding:0 3px;border-radius:3px}
pre{background:#f1f3f6;padding:8px;overflow-x:auto;font-size:12.5px}
figure{margin:10px 0 18px}figure img{max-width:100%;border:1px solid #d8dde6;background:#fff}
figcaption{font-size:13px;color:#4a5468}li{margin:3px 0}a{color:#1f5fbf}
"""

_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_HEADING = re.compile(r"^(#{1,6}) ")
_SAFE_URL = re.compile(r"^(https?://|#|[^:/?#]*(?:[/?#]|$))", re.I)   # http(s), an anchor, or a relative path
_CODE_OPEN, _CODE_CLOSE = "\ue000", "\ue001"   # private-use marks for a set-aside code span


def _link(m: re.Match) -> str:
    url = html.unescape(m.group(2))   # the text was escaped already; the attribute is escaped once, here
    if not _SAFE_URL.match(url):      # javascript:, data: and the like render as the text they are
        return m.group(0)
    return f'<a href="{html.escape(url)}">{m.group(1)}</a>'


def inline(text: str) -> str:
    """One line's inline markup: `code` spans are literal (set aside first), then bold and links, which
    may span code. Text from the data (source names, prompts) is escaped and never becomes markup."""
    text = text.replace(_CODE_OPEN, "").replace(_CODE_CLOSE, "")
    if text.count("`") % 2:  # an unmatched backtick: keep it as written
        return html.escape(text, quote=False)
    parts = text.split("`")
    codes = [f"<code>{html.escape(p)}</code>" for p in parts[1::2]]
    plain = "".join(html.escape(p, quote=False) + (f"{_CODE_OPEN}{i}{_CODE_CLOSE}" if i < len(codes) else "")
                    for i, p in enumerate(parts[0::2]))
    plain = _BOLD.sub(r"<strong>\1</strong>", plain)
    plain = _LINK.sub(_link, plain)
    return re.sub(f"{_CODE_OPEN}(\\d+){_CODE_CLOSE}", lambda m: codes[int(m.group(1))], plain)


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "section"


def _cells(row: str) -> list[str]:
    """A table row's cells; a `|` inside a code span belongs to its cell."""
    row = row.strip()
    if row.startswith("|"):
        row = row[1:]
    if row.endswith("|"):
        row = row[:-1]
    cells, cur, code = [], [], False
    for ch in row:
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            cells.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    return cells + ["".join(cur).strip()]


def blocks_html(lines: list[str]) -> str:
    """Markdown lines (no heading of level 1 or 2 among them) as HTML."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append("<pre><code>" + html.escape("\n".join(lines[i + 1:j])) + "</code></pre>")
            i = j + 1
        elif _HEADING.match(line):
            level = len(_HEADING.match(line).group(1))
            out.append(f"<h{level}>{inline(line[level:].strip())}</h{level}>")
            i += 1
        elif line.lstrip().startswith("|"):
            j = i
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            rows = [_cells(r) for r in lines[i:j]]
            head, body = rows[0], [r for r in rows[1:] if not all(set(c) <= set("-: ") for c in r)]
            out.append('<div class="scroll"><table><thead><tr>' + "".join(f"<th>{inline(c)}</th>" for c in head)
                       + "</tr></thead><tbody>" + "".join(
                           "<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in body)
                       + "</tbody></table></div>")
            i = j
        elif line.startswith("- "):
            items = []
            while i < len(lines) and (lines[i].startswith("- ") or (items and lines[i].startswith("  ")
                                                                     and lines[i].strip())):
                if lines[i].startswith("- "):
                    items.append(lines[i][2:])
                else:
                    items[-1] += " " + lines[i].strip()
                i += 1
            out.append("<ul>" + "".join(f"<li>{inline(x)}</li>" for x in items) + "</ul>")
        else:
            j = i
            while (j < len(lines) and lines[j].strip() and not lines[j].startswith(("- ", "```"))
                   and not _HEADING.match(lines[j]) and not lines[j].lstrip().startswith("|")):
                j += 1
            out.append("<p>" + " ".join(inline(x) for x in lines[i:j]) + "</p>")
            i = j
    return "\n".join(out)


def sections(md: str) -> tuple[str, list[tuple[str, list[str]]]]:
    """The title and the level-2 sections of a markdown document, in order."""
    title, parts, current = "", [], None
    for line in md.splitlines():
        if line.startswith("# ") and not title:
            title = line[2:].strip()
        elif line.startswith("## "):
            current = (line[3:].strip(), [])
            parts.append(current)
        elif current is not None:
            current[1].append(line)
    return title, parts


def figure(png: Path, rel: str) -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(rel)}">'
            f'<figcaption><code>{html.escape(rel)}</code> (<a href="{html.escape(rel)}.prov.json">provenance</a>)'
            "</figcaption></figure>")


def page(md: str, plots: list[Path], folder: Path, files: list[str]) -> str:
    """The page: the answer (the markdown's first section), the plots, the rest of the markdown, and
    every file of `folder` (names relative to it) with a link to its provenance."""
    title, parts = sections(md)
    body = []
    nav = []
    plot_html = [figure(p, p.relative_to(folder).as_posix()) for p in plots]
    for n, (head, lines) in enumerate(parts):
        if head == "Files":
            continue
        sid = slug(head)
        nav.append(f'<a href="#{sid}">{inline(re.split(r" [(]|: ", head)[0])}</a>')   # the short name
        cls = ' class="answer"' if n == 0 else ""
        body.append(f'<section id="{sid}"{cls}><h2>{inline(head)}</h2>\n{blocks_html(lines)}</section>')
        if n == 0 and plot_html:
            nav.append('<a href="#plots">Plots</a>')
            body.append('<section id="plots"><h2>Plots</h2>\n' + "\n".join(plot_html) + "</section>")
    if files:
        nav.append('<a href="#files">Files</a>')
        rows = "".join(f'<li><a href="{html.escape(f)}">{html.escape(f)}</a> '
                       f'(<a href="{html.escape(f)}.prov.json">provenance</a>)</li>' for f in files)
        body.append('<section id="files"><h2>Files</h2><p>Every file of this folder, and what produced it '
                    f"(<code>specmatch provenance FILE</code> prints the chain back to the inputs):</p><ul>{rows}</ul>"
                    "</section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{html.escape(title)}"
            f"</title><style>{STYLE}</style></head>\n<body><main><h1>{inline(title)}</h1>\n<nav>{' '.join(nav)}</nav>\n"
            + "\n".join(body) + "\n</main></body></html>\n")
