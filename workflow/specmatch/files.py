"""Small file helpers shared by every step.

Results are written atomically (temporary file in the same directory, fsync, rename) so that a job
killed half-way never leaves a file that Snakemake or a reader would take for a complete result. The
renamed file gets the mode a plain `open()` would have given it under the process's umask: results
on a shared cluster file system stay readable by the team (a temporary file is created 0600).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator


# The package's folder and the folder that holds it (workflow/: the schemas live beside the package),
# named once so that a module's place in the stage folders never decides where it looks for them.
PACKAGE_DIR = Path(__file__).resolve().parent
WORKFLOW_DIR = PACKAGE_DIR.parent
SCHEMAS_DIR = WORKFLOW_DIR / "schemas"


class SpecmatchError(Exception):
    """An error a user can act on: the message names the file, line and field at fault."""


def current_umask() -> int:
    """The process's umask, read without changing it where Linux allows (/proc), else set and reset."""
    try:
        with open("/proc/self/status", "rb") as fh:   # bytes: the Name: line may be in any encoding
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it over `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".partial{suffix}", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_path, 0o666 & ~current_umask())
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty folder `.<name>.partial` beside `path`; it replaces `path` only if the block
    succeeds, so a killed job never leaves a folder (a model, a drafter, a data root) that looks whole."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def write_jsonl(path: str | os.PathLike, rows) -> int:
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, sort_keys=False, default=_json_default))
            fh.write("\n")
            n += 1
    return n


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecmatchError(f"{path}: file not found") from None
    except json.JSONDecodeError as exc:
        raise SpecmatchError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    path = Path(path)
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SpecmatchError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    return rows


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return "sha256:" + h.hexdigest()


def sha256_tree(path: str | os.PathLike) -> str:
    """Content hash of a file, or of every file under a directory (relative paths included)."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(sha256_file(f).encode())
    return "sha256:" + h.hexdigest()


def stable_hash(obj: Any) -> str:
    """Hash of a JSON-able object that does not depend on key order."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
