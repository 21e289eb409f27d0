"""The inspect step's human-readable outputs: the training-data report (report.md) and the chart
of the training mix by source (mix.png), both rendered from the manifest alone."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..files import atomic_path
from ..records import Manifest


def render_report(manifest: Manifest, chart: Path | None) -> str:
    lines = [f"# Training data: {manifest.root}", "",
             f"{manifest.total_rows:,} rows, {manifest.total_tokens:,} tokens in "
             f"{len(manifest.sources)} sources; tokenizer `{manifest.tokenizer['spec']}` "
             f"(vocabulary {manifest.tokenizer['vocab_size']:,}); {manifest.total_skipped} rows skipped.", ""]
    if chart:
        lines += [f"![training mix]({chart.name})", ""]
    lines += ["| source | files | rows | share of rows | tokens | share of tokens | schema | prompt p50/p90/p99 | completion p50/p90/p99 | turns p50 | skipped |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]

    def pct(d):
        return "/".join(f"{d[k]:.0f}" for k in ("p50", "p90", "p99")) if d else "—"

    for s in manifest.sources:
        lines.append(f"| {s.name} | {len(s.files)} | {s.rows:,} | {s.share_rows:.1%} | {s.tokens:,} | "
                     f"{s.share_tokens:.1%} | {'+'.join(s.schemas)}{' (mixed)' if s.mixed_schemas else ''} | "
                     f"{pct(s.prompt_tokens)} | {pct(s.completion_tokens)} | "
                     f"{(s.turns or {}).get('p50', 0):.0f} | {s.skipped['total']} |")
    if manifest.ignored:
        lines += ["", "Ignored (not data):", ""] + [f"- `{i['path']}`: {i['reason']}" for i in manifest.ignored]
    skipped = [(s.name, r) for s in manifest.sources for r in s.skipped["reasons"]]
    if skipped:
        lines += ["", "Skipped rows:", ""] + [f"- {n}: {r['count']} x {r['reason']} (e.g. {', '.join(r['first_locations'])})"
                                               for n, r in skipped]
    return "\n".join(lines) + "\n"


def mix_chart(manifest: Manifest, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s.name for s in manifest.sources]
    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(names)))
    y = np.arange(len(names))
    ax.barh(y - 0.2, [s.share_rows * 100 for s in manifest.sources], 0.4, label="rows")
    ax.barh(y + 0.2, [s.share_tokens * 100 for s in manifest.sources], 0.4, label="tokens")
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.set_xlabel("share of the training mix (%)")
    ax.legend(loc="lower right")
    ax.set_title("Training mix by source")
    fig.tight_layout()
    with atomic_path(path, ".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
