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
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .errors import UserError


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


# ------------------------------------------------------------------ leftovers of killed writers, and locks
TEMP_RANDOM = r"[a-z0-9_]{8}"
"""The random part of a `tempfile.mkstemp` name (8 of 'a'-'z', '0'-'9', '_'), as `atomic_path` makes them."""
LOCK_SCHEMA = "icrl_interp.lock/1"
"""Content of a lock file (`locked`): {"schema", "pid"}."""
LOCK_WAIT_S = 2.0
"""How long `locked` waits for a lock held by another process (one being killed lets go in milliseconds)."""


def temporaries(directory, name: str | None = None, suffix: str = ".tmp") -> list[Path]:
    """The temporary files `atomic_path(directory / name, suffix)` leaves behind when its process is
    killed (SIGKILL runs no `finally`): regular files named `.NAME.XXXXXXXX` + `suffix` (any NAME when
    `name` is None). Only a process that holds the lock of the writers of `directory` (`locked`) may
    delete them: a live writer may be about to rename one into place."""
    head = re.escape(f".{name}.") if name is not None else r"\..+\."
    pattern = re.compile(head + TEMP_RANDOM + re.escape(suffix))
    try:
        entries = sorted(Path(directory).iterdir())
    except OSError:
        return []
    return [p for p in entries if pattern.fullmatch(p.name) and not p.is_symlink() and p.is_file()]


def _lock_holder(path: Path) -> str:
    try:
        pid = json.loads(path.read_text()).get("pid")
    except (OSError, ValueError, AttributeError):
        pid = None
    return f"process {pid}" if isinstance(pid, int) else "another process"


@contextmanager
def locked(path, what: str, keep: bool = False) -> Iterator[Path]:
    """Hold an exclusive lock on the file `path` (created if missing) while the block runs.

    An advisory `flock` on an open file: the kernel drops it when the last process holding that
    open file is gone, so the lock of a killed owner (SIGKILL included) is free at once, and forked
    children (the shard writers) hold it for as long as any of them lives. Held by another process
    for LOCK_WAIT_S: a one-line UserError naming `what`. `keep`: leave the file when done (a marker); otherwise it is removed,
    while still held. Without `fcntl` (Windows) nothing is locked."""
    try:
        import fcntl
    except ImportError:  # no flock on this platform
        yield Path(path)
        return
    path = Path(path)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            raise UserError(f"{what} is being written by {_lock_holder(path)} of icrl-interp (lock {path}); "
                            "wait for it to finish or stop it") from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # its last holder removed the file after we opened it: lock the one at `path` now
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"schema": LOCK_SCHEMA, "pid": os.getpid()}).encode())
        yield path
    finally:
        if not keep:
            path.unlink(missing_ok=True)
        os.close(fd)


def is_lock_file(path) -> bool:
    """A lock file `locked` made: a regular file holding its JSON, or empty (its maker was killed
    between creating and writing it)."""
    path = Path(path)
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 4096:
            return False
        raw = path.read_bytes()
        return raw == b"" or json.loads(raw).get("schema") == LOCK_SCHEMA
    except (OSError, ValueError, AttributeError):
        return False
