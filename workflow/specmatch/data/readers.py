"""Find, recognise and stream training-data files, whatever their suffix says.

Formats (detected by content, not by name): JSON Lines and JSON arrays, each plain, gzip or zstd
compressed; Parquet; Arrow IPC files and streams, including Hugging Face `save_to_disk` folders
(`data-*.arrow` + `dataset_info.json`). Rows are yielded in batches with their location
(`file:line` for JSON Lines, `file:#row` otherwise) so a bad row can always be named.

Memory is bounded by one batch (BATCH_LINES lines, or one Parquet/Arrow record batch), except for
a JSON *array* file, which must be parsed whole (docs/getting-started/quickstart.md says so).
"""
from __future__ import annotations

import gzip
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator
from ..files import SpecmatchError

BATCH_LINES = 8192
BATCH_BYTES = 16 << 20  # a batch also ends at 16 MB of text: rows of 20k token ids are ~120 KB each
DATA_SUFFIXES = {".jsonl", ".json", ".ndjson", ".gz", ".zst", ".zstd", ".parquet", ".arrow",
                 ".feather", ".ipc"}
IGNORED_NAMES = {"readme", "license", "licence", "notice", "changelog", ".ds_store", "thumbs.db",
                 "sha256sums", "md5sums", "checksums"}
IGNORED_SUFFIXES = {".md", ".txt", ".rst", ".sha256", ".md5", ".sha1", ".lock", ".py", ".yaml", ".yml",
                    ".log", ".png", ".jpg", ".html", ".csv", ".tsv", ".ipynb", ".sh", ".toml", ".cfg"}
HF_METADATA = {"dataset_info.json", "state.json", "dataset_dict.json"}


@dataclass
class Ignored:
    path: str
    reason: str


@dataclass
class DataFile:
    path: Path
    format: str          # jsonl | json | parquet | arrow-file | arrow-stream
    compression: str     # none | gzip | zstd
    bytes: int
    hf_dataset: bool = False


@dataclass
class Batch:
    """Consecutive rows of one file.

    `rows[i]` is a dict, or None when it could not be parsed (see `errors`). A JSON Lines batch
    carries the undecoded lines in `raw` and `rows` stays None until `parse()` is called, so a fast
    reader can try the whole batch first. `lines` are 1-based line numbers (JSON Lines) and
    `offsets` byte offsets of those lines (uncompressed JSON Lines only); other formats locate a row
    by its index `first_row + i` in the file."""
    path: str
    rows: list | None
    first_row: int = 0
    lines: list[int] | None = None
    offsets: list[int] | None = None
    errors: dict[int, str] = field(default_factory=dict)
    raw: list[bytes] | None = None

    def __len__(self) -> int:
        return len(self.raw) if self.raw is not None else len(self.rows)

    def location(self, i: int) -> str:
        return f"{self.path}:{self.lines[i]}" if self.lines is not None else f"{self.path}:#{self.first_row + i}"

    def parse(self) -> "Batch":
        if self.rows is not None:
            return self
        rows, errors = [], {}
        for i, line in enumerate(self.raw):
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    errors[i] = f"expected a JSON object, got {type(obj).__name__}"
                    obj = None
            except UnicodeDecodeError:
                obj = None
                errors[i] = "not UTF-8 text"
            except json.JSONDecodeError as exc:
                obj = None
                errors[i] = f"bad JSON ({exc.msg} at column {exc.colno})"
            rows.append(obj)
        self.rows, self.errors = rows, errors
        return self


def _magic(path: Path, n: int = 8) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(n)


def open_decompressed(path: Path, compression: str):
    if compression == "gzip":
        return gzip.open(path, "rb")
    if compression == "zstd":
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), read_across_frames=True)
        return io.BufferedReader(reader, buffer_size=1 << 20)  # adds readline/iteration
    return open(path, "rb")


def sniff(path: Path) -> DataFile:
    """Recognise a data file by its first bytes. Raises SpecmatchError for what is not data."""
    size = path.stat().st_size
    if size == 0:
        raise SpecmatchError(f"{path}: empty file (0 bytes); expected training rows")
    head = _magic(path)
    compression = "none"
    if head[:2] == b"\x1f\x8b":
        compression = "gzip"
    elif head[:4] == b"\x28\xb5\x2f\xfd":
        compression = "zstd"
    if compression == "none":
        if head[:4] == b"PAR1":
            return DataFile(path, "parquet", "none", size)
        if head[:6] == b"ARROW1":
            return DataFile(path, "arrow-file", "none", size)
        if head[:4] == b"\xff\xff\xff\xff":
            return DataFile(path, "arrow-stream", "none", size, hf_dataset=(path.parent / "dataset_info.json").exists())
    try:
        with open_decompressed(path, compression) as fh:
            start = fh.read(4096)
    except (OSError, EOFError) as exc:
        raise SpecmatchError(f"{path}: unreadable or truncated ({compression}): {exc}") from None
    text = start.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text:
        raise SpecmatchError(f"{path}: no content after decompression; expected training rows")
    if text[:1] == b"[":
        return DataFile(path, "json", compression, size)
    if text[:1] == b"{":
        return DataFile(path, "jsonl", compression, size)
    raise SpecmatchError(f"{path}: not a recognised data file (expected JSON Lines, JSON, Parquet or Arrow; "
                         f"starts with {start[:16]!r})")


def discover(source_path: Path) -> tuple[list[DataFile], list[Ignored]]:
    """All data files under one source (a file or a folder, recursively), and what was ignored."""
    files, ignored = [], []
    candidates = [source_path] if source_path.is_file() else sorted(p for p in source_path.rglob("*"))
    for p in candidates:
        if p.is_dir():
            continue
        rel = p.name
        lower = rel.lower()
        parts = p.relative_to(source_path.parent).parts
        if any(part.startswith(".") for part in parts):
            ignored.append(Ignored(str(p), "hidden"))
            continue
        stem = lower.split(".")[0]
        suffixes = {s.lower() for s in p.suffixes}
        if lower in HF_METADATA and any(q.suffix == ".arrow" for q in p.parent.iterdir()):
            ignored.append(Ignored(str(p), "Hugging Face dataset metadata"))
            continue
        if stem in IGNORED_NAMES or (p.suffix.lower() in IGNORED_SUFFIXES and not suffixes & DATA_SUFFIXES):
            ignored.append(Ignored(str(p), "not a data file"))
            continue
        if not suffixes & DATA_SUFFIXES and p.suffix:
            ignored.append(Ignored(str(p), f"unknown suffix {p.suffix}"))
            continue
        files.append(sniff(p))
    return files, ignored


def jsonl_batches(df: DataFile, start: int = 0, end: int | None = None, tally: dict | None = None,
                  batch_lines: int = BATCH_LINES) -> Iterator[Batch]:
    """Raw lines of a JSON Lines file (or of the byte range [start, end) of an uncompressed one), in
    batches bounded by lines and bytes. Blank lines are skipped but counted: line numbers count from
    the start of the range (the file's own when start is 0), and `tally["lines"]` gets the range's
    line count, so a reader of later ranges can offset theirs."""
    name = str(df.path)
    plain = df.compression == "none"
    fh = None
    try:
        fh = open_decompressed(df.path, df.compression)
        if start:
            fh.seek(start)
        left = None if end is None else end - start
        pos, lineno, row, carry = start, 0, 0, b""
        while True:
            want = BATCH_BYTES if left is None else min(BATCH_BYTES, left)
            block = fh.read(want) if want > 0 else b""
            if left is not None:
                left -= len(block)
            if block:
                lines = block.split(b"\n")  # one copy; the last piece is a partial line (or b"")
                lines[0] = carry + lines[0]
                carry = lines.pop()
            else:
                lines, carry = ([carry] if carry else []), b""
            raw, nums, offs = [], [], []
            for line in lines:
                lineno += 1
                if line and not line.isspace():
                    raw.append(line)
                    nums.append(lineno)
                    offs.append(pos)
                pos += len(line) + 1
            for k in range(0, len(raw), batch_lines):
                yield Batch(name, None, row, nums[k:k + batch_lines], offs[k:k + batch_lines] if plain else None,
                            raw=raw[k:k + batch_lines])
                row += len(raw[k:k + batch_lines])
            if not block:
                break
        if tally is not None:
            tally["lines"] = lineno
    except (EOFError, OSError) as exc:
        raise SpecmatchError(f"{name}: unreadable or truncated: {exc}") from None
    except Exception as exc:  # zstd raises its own error type on truncation
        if type(exc).__module__.startswith("zstandard"):
            raise SpecmatchError(f"{name}: unreadable or truncated: {exc}") from None
        raise
    finally:
        if fh is not None:
            fh.close()


def iter_batches(df: DataFile, batch_lines: int = BATCH_LINES) -> Iterator[Batch]:
    """Stream a file's rows in parsed batches; rows that do not parse are located, not dropped."""
    name = str(df.path)
    if df.format == "jsonl":
        for b in jsonl_batches(df, batch_lines=batch_lines):
            yield b.parse()
    elif df.format == "json":
        try:
            with open_decompressed(df.path, df.compression) as fh:
                data = json.load(fh)
        except json.JSONDecodeError as exc:
            raise SpecmatchError(f"{name}:{exc.lineno}: not valid JSON ({exc.msg}); a .json file must hold "
                                 "one array of row objects or one object per line") from None
        except (EOFError, OSError) as exc:
            raise SpecmatchError(f"{name}: unreadable or truncated: {exc}") from None
        if not isinstance(data, list):
            raise SpecmatchError(f"{name}: expected a JSON array of rows")
        for start in range(0, len(data), batch_lines):
            chunk = data[start:start + batch_lines]
            errors = {i: f"expected a JSON object, got {type(r).__name__}" for i, r in enumerate(chunk)
                      if not isinstance(r, dict)}
            yield Batch(name, [r if isinstance(r, dict) else None for r in chunk], start, errors=errors)
    else:
        import pyarrow as pa
        import pyarrow.ipc as ipc
        import pyarrow.parquet as pq

        try:
            if df.format == "parquet":
                batches = pq.ParquetFile(df.path).iter_batches(batch_size=batch_lines)
            elif df.format == "arrow-file":
                reader = ipc.open_file(pa.memory_map(str(df.path)))
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            else:
                batches = iter(ipc.open_stream(pa.memory_map(str(df.path))))
            offset = 0
            for rb in batches:
                rows = rb.to_pylist()
                yield Batch(name, rows, offset)
                offset += len(rows)
        except (pa.ArrowInvalid, OSError) as exc:
            raise SpecmatchError(f"{name}: unreadable or truncated {df.format}: {exc}") from None


def read_located(locations) -> dict[tuple[str, int], dict]:
    """The rows at (file, position) pairs (records.Cut.position), each file read once by read_rows.
    Returns {(file, position): row}."""
    by_file: dict[str, dict] = {}
    for path, pos in locations:
        by_file.setdefault(path, {})[pos] = None
    out = {}
    for path, wanted in by_file.items():
        for pos, row in read_rows(sniff(Path(path)), wanted).items():
            out[(path, pos)] = row
    return out


def read_rows(df: DataFile, wanted: dict[int, object]) -> dict[int, dict]:
    """The rows at the given positions of a file, reading no more than needed: a position is a byte
    offset for uncompressed JSON Lines (one seek each), else a 0-based row index (streamed up to the
    last one wanted). Returns {position: row}."""
    out: dict[int, dict] = {}
    if not wanted:
        return out
    if df.format == "jsonl" and df.compression == "none":
        with open(df.path, "rb") as fh:
            for off in sorted(wanted):
                fh.seek(off)
                out[off] = json.loads(fh.readline())
        return out
    last = max(wanted)
    for b in iter_batches(df):
        for i, row in enumerate(b.rows):
            k = b.first_row + i
            if k in wanted:
                out[k] = row
        if b.first_row + len(b.rows) > last:
            break
    return out


def list_sources(root: Path) -> tuple[list[Path], list[Ignored]]:
    """Top-level entries of the training root: each directory or data file is one source."""
    if not root.exists():
        raise SpecmatchError(f"dataset.root: {root}: does not exist (expected a folder with one entry per source)")
    if not root.is_dir():
        raise SpecmatchError(f"dataset.root: {root}: is not a folder")
    sources, ignored = [], []
    for p in sorted(root.iterdir()):
        lower = p.name.lower()
        if p.name.startswith("."):
            ignored.append(Ignored(str(p), "hidden"))
        elif p.is_file() and (lower.split(".")[0] in IGNORED_NAMES or
                              (p.suffix.lower() in IGNORED_SUFFIXES and not {s.lower() for s in p.suffixes} & DATA_SUFFIXES)):
            ignored.append(Ignored(str(p), "not a data file"))
        else:
            sources.append(p)
    if not sources:
        raise SpecmatchError(f"dataset.root: {root}: no sources (it is empty"
                             + (f" apart from {len(ignored)} ignored entries" if ignored else "") + ")")
    return sources, ignored


def source_name(path: Path) -> str:
    name = path.name
    for suf in reversed(path.suffixes):
        if suf.lower() in DATA_SUFFIXES:
            name = name[: -len(suf)]
    return name or path.name

