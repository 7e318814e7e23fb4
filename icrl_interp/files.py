"""Writing files so that a crash never leaves a torn one, and JSON that is always valid.

Every final path is written through a temporary sibling that is flushed and fsynced before
`os.replace` moves it into place, and the directory entry is fsynced after the rename: a kill
at any moment leaves either the old file or the new one, never half of one. Temporary names
start with '.' and end with '.tmp', so they never look like results.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np


def fsync_dir(directory: Path) -> None:
    """Persist a directory entry (a rename or a new file) where the platform allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. a platform without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it is fsynced and renamed onto `path`.

    For writers that want a file name (matplotlib's savefig, h5py, safetensors). On an exception
    the temporary file is removed and `path` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_atomic(path, data: bytes | str) -> Path:
    """Write bytes or text to `path` atomically (temporary sibling, fsync, rename)."""
    raw = data.encode() if isinstance(data, str) else data
    with atomic_path(path) as tmp:
        tmp.write_bytes(raw)
    return Path(path)


def write_json(path, payload, indent: int | None = 1) -> Path:
    """`json_clean(payload)` as JSON (strict: no NaN), written atomically with a final newline."""
    return write_atomic(path, json.dumps(json_clean(payload), indent=indent, allow_nan=False) + "\n")


@contextmanager
def atomic_dir(out) -> Iterator[Path]:
    """Yield a temporary directory beside `out`; on success it replaces `out` (an old `out` is moved
    aside first and deleted after the swap). On an exception the temporary directory is removed."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        for child in tmp.iterdir():
            if child.is_file():
                with open(child, "rb+") as f:
                    os.fsync(f.fileno())
        fsync_dir(tmp)  # the files' own directory entries, before the directory is renamed into place
        os.chmod(tmp, 0o755)  # mkdtemp creates 0700
        if out.exists():
            old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
        fsync_dir(out.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def json_clean(x):
    """JSON-safe copy: numpy scalars and arrays -> Python, tuples -> lists, NaN/Inf -> None."""
    if isinstance(x, dict):
        return {str(k): json_clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return json_clean(x.tolist())
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, (np.integer, int)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(float(x)) else None
    return x
