"""May this command write here, and does the job fit in memory? Checked before any work.

The rule every `--out`, `--json`, `--figure` and `--export` goes through (docs/integrity.md,
"What commands will and will not overwrite"):

- the path is not empty and its parent directory exists (nothing creates missing parents) and
  can be written in (a real probe file, created and deleted at once);
- an output is never one of the command's inputs, never lies inside an input checkpoint or run
  directory, and an output that replaces a whole directory never contains an input;
- an existing path is replaced (or written into) only when the package made it: a JSON file
  whose `schema` starts with `icrl_interp.`, a PNG carrying the package's text chunk, an HDF5 file
  with an `icrl_interp.` schema attribute, a checkpoint directory holding only checkpoint files,
  or a directory the caller recognises (`owned`: a report, a run). `--force` replaces only those.

Any refusal is one `UserError` line naming the path, the problem and the fix.
`check_finite` refuses NaN / infinite options; `check_fits` is the memory counterpart: an estimate of the bytes a job allocates, refused with
the estimate, the culprit flag and the largest value that fits.
`check_disk` is the same for the bytes a job writes, against the free space of its output's filesystem.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import struct
import tempfile
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

from .errors import UserError
from .files import write_atomic
from .resources import SNAPSHOTS

SCHEMA_PREFIX = "icrl_interp."
CHECKPOINT_FILES = frozenset({"config.json", "model.safetensors", "final_metrics.json", "train_config.json",
                              "optimizer.safetensors", "trainer_state.json"})
"""What a checkpoint directory written by the package holds (construct, export, training steps)."""
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
PNG_MARK = b"icrl_interp\0figure"
"""tEXt chunk (keyword 'icrl_interp') that marks a PNG the package wrote (`mark_png`)."""
SVG_MARK = b"<dc:description>icrl_interp figure</dc:description>"
"""What marks an SVG the package wrote (its metadata's description, within its first KiB)."""
FIGURE_METADATA = {"png": {"Software": None, "icrl_interp": "figure"},
                   "svg": {"Date": None, "Creator": None, "Description": "icrl_interp figure"}}
"""`savefig(metadata=...)` of the package's figures: no date or version (the same inputs give the same
bytes), and the marks above."""


# ------------------------------------------------------------------ what is ours
def _json_schema_ok(data) -> bool:
    if isinstance(data, list):
        return bool(data) and all(_json_schema_ok(x) for x in data)
    return isinstance(data, dict) and str(data.get("schema", "")).startswith(SCHEMA_PREFIX)


def _png_marked(head: bytes) -> bool:
    pos = len(PNG_MAGIC)
    while pos + 8 <= len(head):
        length, kind = struct.unpack(">I4s", head[pos:pos + 8])
        if kind == b"tEXt" and head[pos + 8:pos + 8 + length].startswith(PNG_MARK):
            return True
        if kind == b"IDAT":
            return False
        pos += 12 + length
    return False


def _hdf5_ours(path: Path) -> bool:
    try:
        import h5py

        with h5py.File(path, "r", locking=False) as f:
            schema = f.attrs.get("schema")
    except Exception:  # noqa: BLE001 - unreadable: not recognisably ours
        return False
    schema = schema.decode() if isinstance(schema, bytes) else schema
    return isinstance(schema, str) and schema.startswith(SCHEMA_PREFIX)


def is_checkpoint_dir(path, snapshots: bool = True) -> bool:
    """A directory of checkpoint files only, whose config.json has the package's `format_version`; an
    exported run's `snapshots/` folder of such directories (`train --export`) is part of it."""
    path = Path(path)
    try:
        entries = list(path.iterdir()) if path.is_dir() else []
        if not entries:
            return False
        for p in entries:
            if snapshots and p.name == SNAPSHOTS and p.is_dir() and not p.is_symlink():
                steps = list(p.iterdir())
                if not steps or not all(not s.is_symlink() and is_checkpoint_dir(s, snapshots=False) for s in steps):
                    return False
            elif p.name not in CHECKPOINT_FILES or p.is_symlink() or not p.is_file():
                return False
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(config, dict) and isinstance(config.get("format_version"), int)


def is_ours(path) -> bool:
    """Whether the file or directory at `path` is one the package wrote (see the module docstring)."""
    path = Path(path)
    if path.is_symlink():
        return False
    if path.is_dir():
        return is_checkpoint_dir(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
        if head.startswith(PNG_MAGIC):
            return _png_marked(head)
        if head.startswith(b"<?xml") and b"<svg" in head:
            return SVG_MARK in head
        if head.startswith(HDF5_MAGIC):
            return _hdf5_ours(path)
        if path.stat().st_size > 256 * 2**20:
            return False
        return _json_schema_ok(json.loads(path.read_bytes()))
    except (OSError, ValueError, RecursionError):
        return False


def mark_png(path) -> Path:
    """Add the package's tEXt chunk right after the IHDR chunk of the PNG at `path` (atomically)."""
    raw = Path(path).read_bytes()
    if not raw.startswith(PNG_MAGIC) or raw[12:16] != b"IHDR":
        raise UserError(f"{path} is not a PNG file")
    end = len(PNG_MAGIC) + 12 + struct.unpack(">I", raw[8:12])[0]
    chunk = struct.pack(">I", len(PNG_MARK)) + b"tEXt" + PNG_MARK + struct.pack(">I", zlib.crc32(b"tEXt" + PNG_MARK))
    return write_atomic(path, raw[:end] + chunk + raw[end:])


# ------------------------------------------------------------------ may I write here
def _inside(path: Path, root: Path) -> bool:
    return path != root and root in path.parents


def _probe(directory: Path, flag: str, value) -> None:
    """Create and delete a file in `directory`: the one sure test that it can be written in."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".icrl-probe-", suffix=".tmp", dir=directory)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise UserError(f"{flag} {value}: cannot write in {directory} ({e.strerror or e}); "
                        "choose a writable location") from None


def _claim(value, flag: str, inputs: Iterable, replaces: bool) -> tuple[Path, Path]:
    """(path as given, resolved path) after the checks every output shares."""
    if value is None or not str(value).strip():
        raise UserError(f"{flag} is empty; give a path")
    given = Path(value)
    if given.is_symlink():  # the package never makes links; writing would replace the link, not its target
        raise UserError(f"{flag} {value} is a symbolic link; give the path it points to, or choose a new name")
    path = given.resolve()
    parent = path.parent
    for raw in inputs:
        q = Path(raw).resolve()
        if path == q:
            raise UserError(f"{flag} {value} is an input of this command; write the output elsewhere")
        # checkpoint and run directories (and a run directory still to be made) are never written into
        if _inside(path, q) and not q.is_file() and (not q.exists() or (q / "config.json").is_file()):
            raise UserError(f"{flag} {value} lies inside the input {raw}; write the output elsewhere")
        if replaces and _inside(q, path):
            raise UserError(f"{flag} {value} would replace the directory holding the input {raw}; "
                            "write the output elsewhere")
    if not parent.exists():
        raise UserError(f"{flag} {value}: directory {parent} does not exist; create it first "
                        "(commands do not create missing parent directories)")
    if not parent.is_dir():
        raise UserError(f"{flag} {value}: {parent} is not a directory")
    _probe(parent, flag, value)
    return given, path


def output_file(value, flag: str, *, inputs: Iterable = (), suffixes: tuple[str, ...] = ()) -> Path:
    """A file output (`--json`, `--figure`): new, or a file of ours that gets replaced."""
    if suffixes and Path(str(value or "")).suffix.lower() not in suffixes and str(value or "").strip():
        raise UserError(f"{flag} {value}: unknown file suffix {Path(value).suffix or '(none)'!r}; "
                        f"use a {' or '.join(suffixes)} file name")
    given, path = _claim(value, flag, inputs, replaces=False)
    if path.is_dir():
        raise UserError(f"{flag} {value} is a directory; give a file name")
    if path.exists() and not is_ours(path):
        raise UserError(f"{flag} {value} exists and was not written by icrl-interp; "
                        "move it away or choose another name")
    return given


def output_dir(value, flag: str, *, inputs: Iterable = (), owned: Callable[[Path], bool] = is_checkpoint_dir,
               what: str = "checkpoint directory", replaces: bool = False, force: bool | None = None) -> Path:
    """A directory output: new, empty, or one `owned` recognises.

    `replaces`: the command swaps the whole directory (construct, export) rather than writing
    files into it (report, run). `force`: None replaces an owned directory freely; False refuses
    it ('pass --force'); True allows it. Foreign contents are refused whatever `force` says."""
    given, path = _claim(value, flag, inputs, replaces)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {value} is a file, not a directory; choose a directory path")
    if path.is_dir():
        empty = not any(path.iterdir())
        if not empty and not owned(path):
            hint = " (--force replaces only icrl-interp's own outputs)" if force is not None else ""
            raise UserError(f"{flag} {value} holds files that are not a {what} icrl-interp wrote; "
                            f"choose a new or empty directory{hint}")
        if not empty and force is False:
            raise UserError(f"{flag} {value} already exists; pass --force to replace it")
        if not replaces:
            _probe(path, flag, value)
    return given


# ------------------------------------------------------------------ are the numbers real, does it fit
def check_finite(options) -> None:
    """Refuse a dataclass of options holding an infinite or NaN float, naming its flag."""
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"--{f.name.replace('_', '-')} {value} must be a finite number")


def memory_bytes() -> int:
    """Physical memory of this machine (16 GiB when the platform does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


def human(n: int | float) -> str:
    """Bytes as '12.3 GiB'."""
    n = float(min(n, 2**900))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024:
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} EiB"


def check_fits(estimate: Callable[[dict], int], sizes: dict[str, int], flags: dict[str, str], what: str,
               budget: int | None = None) -> None:
    """Refuse sizes whose `estimate(sizes)` (bytes) exceeds the machine's memory, in one line naming
    the flag that matters most, the estimate, and the largest value of that flag that fits."""
    budget = memory_bytes() if budget is None else budget
    need = estimate(sizes)
    if need <= budget:
        return
    # the culprit: the flag whose reduction to 1 helps most; then the largest value of it that fits
    culprit = min(flags, key=lambda k: estimate({**sizes, k: 1}))
    value = sizes[culprit]
    lo, hi = 0, value  # fits(lo) (0 = nothing fits), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if estimate({**sizes, culprit: mid}) <= budget else (lo, mid)
    fix = f"at most {flags[culprit]} {lo} fits" if lo >= 1 else "lower the other sizes too"
    raise UserError(f"{flags[culprit]} {value} needs ~{human(need)} of memory for {what}; "
                    f"this machine has {human(budget)}: {fix}")


def _mount(path) -> Path:
    """The mount point of the filesystem holding `path` (the nearest existing folder above it)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def free_bytes(path) -> int:
    """Free bytes, for an unprivileged user, on the filesystem where `path` is (or will be made)."""
    return shutil.disk_usage(_mount(path)).free


def check_disk(need: int, path, what: str) -> None:
    """The disk counterpart of `check_fits`: refuse `what` (e.g. '--tasks 10 would write') when its `need`
    bytes exceed the free space of the filesystem of `path`, in one line with both numbers."""
    free = free_bytes(path)
    if need > free:
        raise UserError(f"{what} ~{human(need)} (free on {_mount(path)}: {human(free)})")
