"""HDF5 recordings: a crash-safe streaming writer and a lazy reader.

Layout: docs/formats.md, "Recordings" (schema `icrl_interp.recording/2`). Needs neither
torch nor transformer_lens.

Schema 2 keeps apart what the prompts are and what produced the activations: the root
attribute `task_family` names the registered family whose prompts (layout, task data,
reference algorithm) were recorded ("" for prompts of no known task), `model` is JSON
{"family": model family or null, "architecture": architecture name or null, "class": the
model's Python class name}, and `checkpoint_config` is the checkpoint's format-2 config.
Schema 1 files (one attribute `family` that meant both, "generic" for neither) are still
read: `Recording.task_family` and `Recording.model_info` answer for both schemas.

Crash safety: the writer works on `<name>.partial` beside the final path, in HDF5
SWMR mode once all datasets exist (so a kill at any moment leaves a readable
file), records the number of finished prompts in `/progress` after each flushed
batch, and moves the file into place with `os.replace` only after setting
`complete = true`. A resumed writer truncates every dataset to `/progress`.

Integrity (docs/integrity.md, "Truncated and corrupt recordings"; the HDF5 side is
`icrl_interp.recording.integrity`): the writer seals the file's string heaps once its attributes
exist (`integrity.seal`); `Recording` opens a file only once it passed the checks
(`integrity.open_checked`), then reads every object header and chunk index once.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import h5py
import numpy as np

from ..core.errors import UserError
from ..core.files import fsync_dir, json_clean
from .integrity import (HDF5_ERRORS, INTEGRITY, WRITE_FLAGS, check_sealed, check_whole, clear_write_flags,
                        integrity_digest, open_checked, reason, seal)
from .writeback import WriteBehind

SCHEMA = "icrl_interp.recording/2"
"""Schema written by `RecordingWriter`."""
SCHEMA_V1 = "icrl_interp.recording/1"
"""The previous schema (attribute `family` for both the task and the model), still read."""
READABLE = (SCHEMA, SCHEMA_V1)
LEGACY_NO_FAMILY = ("", "generic")
"""Schema-1 `family` values that named no family (a model of no known family, prompts of no task)."""
CHUNK_MIN, CHUNK_MAX = 10 * 1024, 1024 * 1024
SYNC_BYTES = 32 * 2**20
"""The writer starts a sync of the file after every SYNC_BYTES of batches (`writeback.WriteBehind`, in a thread of
its own): the disk then writes while the next forward passes run (the recorder writes from a thread, `background`),
not all at the final fsync."""
BF16 = "bfloat16"
SHARDS = "shards"
"""Root attribute of a master file: JSON list of its shard files (docs/formats.md, "Sharded recordings")."""


def partial_path(path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".partial")


SCRATCH = (".new", ".resume")
"""Suffixes of the working files a RecordingWriter makes beside its partial file (`scratch_paths`)."""


def scratch_paths(path) -> list[Path]:
    """The working files a RecordingWriter of `path` makes beside its partial file: `.partial.new` until
    its first batch is on disk, `.partial.resume` while a resume copies. A writer killed there leaves
    one; it holds nothing to resume, and only the holder of the run's lock may remove it."""
    part = partial_path(path)
    return [part.with_name(part.name + suffix) for suffix in SCRATCH]


def chunk_shape(row_shape: tuple[int, ...], itemsize: int, batch_size: int | None = None) -> tuple[int, ...]:
    """Chunk of whole rows within [10 KiB, 1 MiB], as large as allowed.

    Where a divisor of the batch size fits that range, the chunk has that many
    rows, so every full batch is a whole number of chunks and goes to HDF5
    without anything being read back. A single row over 1 MiB is split along
    its largest axes instead.
    """
    row = list(row_shape)
    row_bytes = max(int(np.prod(row, dtype=np.int64)) * itemsize, 1)
    if row_bytes <= CHUNK_MAX:
        lo, hi = -(-CHUNK_MIN // row_bytes), CHUNK_MAX // row_bytes
        fits = [k for k in range(1, min(batch_size or 0, hi) + 1) if batch_size % k == 0 and k >= lo]
        # unaligned: 64 KiB keeps small datasets small (HDF5 allocates whole chunks)
        return (int(fits[-1] if fits else min(hi, max(lo, 64 * 1024 // row_bytes))), *row)
    while int(np.prod(row, dtype=np.int64)) * itemsize > CHUNK_MAX:
        i = int(np.argmax(row))
        row[i] = (row[i] + 1) // 2
    return (1, *row)


def bf16_to_float32(raw: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (stored as int16/uint16) -> float32, exactly."""
    return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _json_attr(value) -> str:
    return json.dumps(json_clean(value), sort_keys=True)


def json_decoded(v):
    """An attribute's value as `Recording.attr` returns it: JSON text of an object, an array or null decoded,
    numpy scalars as Python ones, anything else as it is."""
    if isinstance(v, str) and v[:1] in "{[" or v == "null":
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v
    return v.item() if isinstance(v, np.generic) else v


class RecordingWriter:
    """Append batches of prompts to `<path>.partial`; `finish()` moves it to `path`.

    `meta` holds the root attributes (JSON-able values; dicts are stored as JSON text).
    `IDENTITY` keys of meta must match when resuming (spec, checkpoint hash, seed, ...). With
    `n_total` (prompts requested) in meta, `finish()` publishes only a file holding that many.
    """

    IDENTITY = ("schema", "task_family", "model", "probe_spec", "checkpoint_sha256", "seed", "batch_size",
                "source_sha256", "n_total", "shard")
    OPTIONAL_IDENTITY = ("n_total",)
    """Identity keys that partial files of older versions lack (then not compared)."""
    _new: Path | None = None
    """Where a new file is written until its first batch is on disk (then it is the partial file)."""

    def __init__(self, path, meta: dict, resume: bool = False):
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self.meta = {"schema": SCHEMA, **meta}
        self._f: h5py.File | None = None
        self.n_done = 0
        self._unsynced = 0
        """Bytes of batches written since the last sync was started (`SYNC_BYTES`)."""
        self._behind: WriteBehind | None = None
        if self.path.exists() and not resume:
            raise UserError(f"{self.path} exists; remove it or choose another --out")
        if resume:
            if not self.partial.exists():
                raise UserError(f"nothing to resume: {self.partial} does not exist")
            self._open_for_resume()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.partial.exists():
                raise UserError(f"{self.partial} exists from an interrupted run; pass --resume to continue it or delete it")
            # the file becomes the partial file once its first batch is on disk in SWMR mode (`_appear`): a
            # writer killed while HDF5 still holds its first metadata in memory leaves a torn file, under
            # this other name, with nothing to resume in it
            self._new = scratch_paths(self.path)[0]
            self._f = h5py.File(self._new, "w", libver="latest")
            for key, value in self.meta.items():
                self._f.attrs[key] = value if isinstance(value, (str, int, float, bool, np.number)) else _json_attr(value)
            self._f.attrs["complete"] = False
            self._f.create_dataset("progress", data=np.zeros(1, dtype=np.int64))

    # ------------------------------------------------------------ resume
    def _open_for_resume(self) -> None:
        # Copy the finished rows into a fresh file beside the partial, then swap it in: the
        # old partial stays intact until the copy is complete.
        src = self._open_partial()
        fresh = self.partial.with_name(self.partial.name + ".resume")
        try:
            self._check_identity(src)
            if "progress" not in src:
                raise UserError(f"cannot resume: {self.partial} has no /progress (not a partial recording)")
            self.n_done = int(src["progress"][0])
            for _, ds in self._datasets(src):
                if ds.maxshape[0] is None and not 0 <= self.n_done <= ds.shape[0]:  # /progress damaged
                    raise UserError(f"cannot resume: {self.partial} is corrupt (/progress says {self.n_done} "
                                    f"prompts, but {ds.name} holds {ds.shape[0]} rows)")
            with h5py.File(fresh, "w", libver="latest") as dst:
                for k, v in src.attrs.items():
                    if k != INTEGRITY:  # describes the old file's bytes; the copy is sealed anew
                        dst.attrs[k] = v
                for name in src:
                    src.copy(src[name], dst, name=name)
                for _, ds in self._datasets(dst):
                    # rows past /progress belong to a batch the killed writer never vouched for
                    if ds.maxshape[0] is None and ds.shape[0] != self.n_done:
                        ds.resize(self.n_done, axis=0)
        except HDF5_ERRORS as e:
            fresh.unlink(missing_ok=True)
            raise UserError(f"cannot resume: {self.partial} is corrupt ({reason(e)})") from None
        except BaseException:
            fresh.unlink(missing_ok=True)
            raise
        finally:
            src.close()
        os.replace(fresh, self.partial)
        self._f = h5py.File(self.partial, "r+", libver="latest")
        if "acts" in self._f:
            seal(self._f)  # the copy has new global heaps
            self._f.swmr_mode = True

    def _open_partial(self) -> h5py.File:
        """The partial file, open for reading once it passed the integrity checks. A writer killed
        in SWMR mode leaves the "open for writing" flags set; they are cleared first, so that
        the file opens plainly and a corrupt one fails at once (docs/integrity.md)."""
        src = None
        try:
            sb = check_whole(self.partial)
            if sb.flags & WRITE_FLAGS:
                clear_write_flags(self.partial, sb)
            src = h5py.File(self.partial, "r")
            check_sealed(src, self.partial)
            return src
        except UserError as e:
            message = str(e)
        except HDF5_ERRORS as e:
            message = f"{self.partial}: not a readable HDF5 file ({reason(e)})"
        if src is not None:
            src.close()
        raise UserError(f"cannot resume: {message}")

    def _check_identity(self, src: h5py.File) -> None:
        for key in self.IDENTITY:
            if key not in self.meta or (key in self.OPTIONAL_IDENTITY and key not in src.attrs):
                continue
            want = self.meta[key]
            want = want if isinstance(want, (str, int, float, bool)) else _json_attr(want)
            have = _attr(src, key)
            if have != want:
                scalars = all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in (have, want))
                values = f" ({have} there, {want} now)" if scalars else ""
                raise UserError(f"cannot resume {self.partial}: it was recorded with a different {key}{values}")

    @staticmethod
    def _datasets(f: h5py.File) -> list[tuple[str, h5py.Dataset]]:
        out = []
        f.visititems(lambda name, obj: out.append((name, obj)) if isinstance(obj, h5py.Dataset) else None)
        return out

    # ------------------------------------------------------------ writing
    def write_static(self, group: str, arrays: dict[str, np.ndarray]) -> None:
        """Arrays written once (parameters, theta*); must come before the first batch."""
        if self._f.swmr_mode:
            return  # resumed: already there
        g = self._f.require_group(group)
        for name, arr in arrays.items():
            if name in g:
                del g[name]
            g.create_dataset(name, data=np.asarray(arr))

    def _create(self, batches: dict[str, np.ndarray], attrs: dict[str, dict]) -> None:
        for path, arr in batches.items():
            row = arr.shape[1:]
            compression = attrs.get(path, {}).pop("compression", None)
            kw = {"compression": compression} if compression not in (None, "none") else {}
            ds = self._f.create_dataset(
                path, shape=(0, *row), maxshape=(None, *row), dtype=arr.dtype,
                chunks=chunk_shape(row, arr.dtype.itemsize, self.meta.get("batch_size")), **kw,
            )
            for k, v in attrs.get(path, {}).items():
                ds.attrs[k] = v
        seal(self._f)  # every string attribute exists now; SWMR mode adds none
        self._f.swmr_mode = True

    def write_batch(self, batches: dict[str, np.ndarray], attrs: dict[str, dict] | None = None) -> None:
        """Append one batch: every array has the batch on axis 0 (same size for all)."""
        sizes = {a.shape[0] for a in batches.values()}
        if len(sizes) != 1:
            raise ValueError(f"batch arrays disagree on the batch size: {sizes}")
        b = sizes.pop()
        if not self._f.swmr_mode:
            self._create(batches, dict(attrs or {}))
        for path, arr in batches.items():
            ds = self._f[path]
            if ds.shape[1:] != arr.shape[1:]:
                raise UserError(f"{path}: batch has per-prompt shape {arr.shape[1:]}, the recording has {ds.shape[1:]}")
            ds.resize(self.n_done + b, axis=0)
            self._put(ds, np.ascontiguousarray(arr, dtype=ds.dtype))
            self._write_behind(arr.nbytes)
        self.n_done += b
        self._f.flush()  # data first, then the progress marker that vouches for it
        self._f["progress"][0] = self.n_done
        self._f.flush()
        self._appear()

    def _write_behind(self, nbytes: int) -> None:
        """Count `nbytes` just written; every SYNC_BYTES start a sync of the file (`WriteBehind`). Counted per
        dataset, not per batch, so the disk starts on a batch while the rest of it is still being copied: the
        last batch's bytes are mostly on their way when the final fsync comes."""
        self._unsynced += nbytes
        if self._unsynced >= SYNC_BYTES:  # the page cache to the disk while the forward runs
            if self._behind is None:
                self._behind = WriteBehind(self._f.id.get_vfd_handle())
            self._behind()
            self._unsynced = 0

    def _stop_syncing(self, raise_error: bool) -> None:
        """Wait for the sync in flight (`WriteBehind.close`) before the file's descriptor closes. `finish` raises
        its disk error; `close`, which runs while an error of its own is on its way (an interrupt, a full disk),
        leaves the partial file for --resume whatever the sync said, and lets that error through."""
        behind, self._behind = self._behind, None
        if behind is None:
            return
        try:
            behind.close()
        except OSError:
            if raise_error:
                raise

    def _appear(self) -> None:
        """Move a new file to the partial file's name (a no-op once it is there)."""
        if self._new is not None:
            os.replace(self._new, self.partial)
            fsync_dir(self.partial.parent)
            self._new = None

    def _put(self, ds: h5py.Dataset, arr: np.ndarray) -> None:
        rows = ds.chunks[0]
        whole = ds.compression is None and ds.chunks[1:] == ds.shape[1:] and self.n_done % rows == 0
        if not whole or arr.shape[0] % rows:
            ds[self.n_done : self.n_done + arr.shape[0]] = arr
            return
        # whole uncompressed chunks: hand HDF5 the bytes directly, skipping its chunk cache
        zeros = (0,) * (arr.ndim - 1)
        for i in range(0, arr.shape[0], rows):
            ds.id.write_direct_chunk((self.n_done + i, *zeros), arr[i : i + rows])

    def finish(self) -> Path:
        """Mark complete and move into place atomically: the data reaches the disk (fsync) before
        the rename, the rename before the directory's fsync."""
        n_total = self.meta.get("n_total")
        if n_total is not None and self.n_done != n_total:
            raise UserError(f"{self.partial}: {self.n_done} of {n_total} prompts written; "
                            "a recording is published only when complete")
        self._appear()  # a recording of no batch
        self._stop_syncing(raise_error=True)  # a disk error of a sync in flight fails the recording
        self._f.close()
        self._f = None
        with h5py.File(self.partial, "r+") as f:
            f.attrs["complete"] = True
            f.attrs["n_prompts"] = self.n_done
            if INTEGRITY not in f.attrs:  # no batch was written, so it never went to SWMR mode
                seal(f)
        fd = os.open(self.partial, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self.partial, self.path)
        fsync_dir(self.path.parent)
        return self.path

    def close(self) -> None:
        """Leave the partial file as it is (resumable); a new file without a batch goes."""
        self._stop_syncing(raise_error=False)
        if self._f is not None:
            self._f.close()
            self._f = None
        if self._new is not None:
            self._new.unlink(missing_ok=True)
            self._new = None

    def discard(self) -> None:
        """Close and delete the partial file (a run refused midway, whose rows nobody will resume)."""
        self.close()
        self.partial.unlink(missing_ok=True)


# ------------------------------------------------------------------ reading
def _attr(f, key, default=None):
    v = f.attrs.get(key, default)
    return v.decode() if isinstance(v, bytes) else v


@runtime_checkable
class Rows(Protocol):
    """What the reader needs of a dataset: an h5py.Dataset, or a live one (`icrl_interp.recording.live`)."""

    shape: tuple
    attrs: Any

    def __getitem__(self, key): ...


class Recording:
    """Lazy read access to a finished recording. Use as a context manager or call close().

    Opening checks that the file is whole (`open_checked`) and reads all its metadata once, so a
    truncated or corrupt file is a one-line UserError at once (docs/integrity.md)."""

    read_ahead = 1
    """Chunks the analyzers' reader thread reads ahead of the analysis (`threads.ahead`): a file's chunks are large
    and each costs about the same read, so one suffices."""

    def __init__(self, path, allow_incomplete: bool = False):
        self.path = Path(path)
        if not self.path.exists():
            raise UserError(f"{self.path}: no such recording")
        # Without HDF5's chunk cache HDF5 reads a selection straight into its array; through the cache (8 MiB a
        # dataset) every chunk that fits is first read into a buffer of its own and copied: reading every dataset of
        # the 1.43 GB benchmark file chunk by chunk, as the analyzers do, took 0.58-0.75 s instead of 0.76-1.23 s
        # (docs/benchmarks.md). Only a file with compressed (filtered) or virtual datasets keeps the cache.
        self.f = open_checked(self.path, chunk_cache=False)
        try:
            cached = self._check(allow_incomplete)
        except HDF5_ERRORS as e:
            self.f.close()
            raise UserError(f"{self.path}: corrupt HDF5 file ({reason(e)})") from None
        except BaseException:
            self.f.close()
            raise
        if cached:  # compressed chunks: the cache decompresses a chunk once for the reads that share it
            self.f.close()
            self.f = open_checked(self.path)

    def _check(self, allow_incomplete: bool) -> bool:
        """Checks the file (a UserError where it fails); whether it should be read through HDF5's chunk cache: some
        dataset is filtered (compressed), or virtual (its sources, other files, may be)."""
        schema = _attr(self.f, "schema")
        if schema not in READABLE:
            found = "no schema attribute" if schema is None else f"schema {schema!r}"
            raise UserError(f"{self.path}: not an icrl_interp recording ({found}; expected "
                            f"{' or '.join(map(repr, READABLE))})")
        self.schema = schema
        if not allow_incomplete and not bool(_attr(self.f, "complete", False)):
            raise UserError(f"{self.path}: recording is incomplete (complete=false); finish it with --resume")

        # Read every object header, attribute and chunk index now: HDF5 checksums them, so
        # corrupt metadata fails here, in milliseconds, not halfway through an analysis.
        referenced: set[str] = set()
        cached = []

        def touch(_, obj):
            for key in obj.attrs:
                obj.attrs[key]
            if isinstance(obj, h5py.Dataset) and obj.chunks:
                obj.id.get_num_chunks()
                if obj.id.get_create_plist().get_nfilters():
                    cached.append(obj.name)
            if isinstance(obj, h5py.Dataset) and obj.is_virtual:
                referenced.update(vs.file_name for vs in obj.virtual_sources())
                cached.append(obj.name)

        self.f.visititems(touch)
        self._check_progress(bool(_attr(self.f, "complete", False)))
        self._check_shards(referenced)
        return bool(cached)

    STATIC_GROUPS = ("params", "theta_star")
    """Groups written once; every other group holds one row per prompt."""

    def _check_progress(self, complete: bool) -> None:
        """/progress must count the rows the per-prompt datasets hold (all of them, in a complete file;
        at most, in a partial one) and, in a complete file, equal its `n_prompts`: readers loop over
        /progress prompts, and a damaged or edited count past the rows would send them over rows that
        do not exist (10^9 of them: for hours)."""
        ds = self.f.get("progress")
        if not isinstance(ds, h5py.Dataset) or ds.shape != (1,) or ds.dtype.kind not in "iu":
            raise UserError(f"{self.path}: corrupt recording (no /progress counter of the prompts written)")
        n = int(ds[0])
        declared = _attr(self.f, "n_prompts")
        if n < 0 or (complete and declared is not None and int(declared) != n):
            raise UserError(f"{self.path}: corrupt recording (/progress says {n} prompts, its n_prompts attribute "
                            f"{declared})")
        for group in self.f:
            if group in self.STATIC_GROUPS or not isinstance(self.f[group], h5py.Group):
                continue
            rows: list[tuple[str, int]] = []
            self.f[group].visititems(lambda name, obj: rows.append((f"{group}/{name}", obj.shape[0]))
                                     if isinstance(obj, h5py.Dataset) and obj.ndim else None)
            for name, size in rows:
                if size < n or (complete and size != n):
                    raise UserError(f"{self.path}: corrupt recording (/progress says {n} prompts, but {name} "
                                    f"holds {size} rows)")

    def _check_shards(self, referenced: set[str]) -> None:
        """A master file (docs/formats.md, "Sharded recordings"): every file its virtual datasets read is
        a shard it lists, and every shard passes the checks of a recording and is the very file the
        master was made from (size and `integrity` digest). HDF5 itself would read a missing shard
        as fill values."""
        if SHARDS not in self.f.attrs:
            if referenced:
                raise UserError(f"{self.path}: its virtual datasets read other files ({', '.join(sorted(referenced))}) "
                                "but it lists no shards")
            return
        listed = self.attr(SHARDS)
        keys = ("file", "n_prompts", "bytes", "integrity_sha256")
        if not isinstance(listed, list) or not all(isinstance(e, dict) and all(k in e for k in keys) for e in listed):
            raise UserError(f"{self.path}: corrupt recording (unreadable {SHARDS} attribute)")
        names = [e["file"] for e in listed]
        if any(not isinstance(n, str) or n in ("", ".", "..") or Path(n).name != n for n in names):
            raise UserError(f"{self.path}: corrupt recording (a shard is not a file name beside it)")
        stray = sorted(referenced - set(names))
        if stray:
            raise UserError(f"{self.path}: its virtual datasets read files that are not its shards: {', '.join(stray)}")
        for entry in listed:
            shard = self.path.parent / entry["file"]
            if not shard.is_file():
                raise UserError(f"{self.path}: its shard {shard} is missing")
            try:
                with Recording(shard) as rec:
                    same = (os.path.getsize(shard) == entry["bytes"] and rec.n_prompts == entry["n_prompts"]
                            and integrity_digest(rec.f) == entry["integrity_sha256"])
            except UserError as e:
                raise UserError(f"{self.path}: bad shard: {e}") from None
            if not same:
                raise UserError(f"{self.path}: its shard {shard} is not the file the master was made from (rewritten "
                                f"since); delete {self.path.name} and run `record --shards {len(listed)} --resume` "
                                "to join the shards again")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self.f.close()

    # metadata
    def attr(self, key: str, default=None):
        """A root attribute, JSON-decoded where it was stored as JSON."""
        return json_decoded(_attr(self.f, key, default))

    @property
    def schema_version(self) -> int:
        """1 or 2 (see the module docstring)."""
        return 1 if self.schema == SCHEMA_V1 else 2

    def _legacy_family(self) -> str | None:
        v = self.attr("family")
        return None if not isinstance(v, str) or v in LEGACY_NO_FAMILY else v

    @property
    def task_family(self) -> str | None:
        """The family whose prompts were recorded (their layout, task data and reference algorithm),
        or None for prompts of no known task. Schema 1: its `family` (which named the model too)."""
        if self.schema_version == 1:
            return self._legacy_family()
        v = self.attr("task_family")
        return v if isinstance(v, str) and v else None

    @property
    def model_info(self) -> dict:
        """{"family", "architecture", "class"} of the model that produced the activations (each may
        be None). Schema 1 knew only the family; its architecture is looked up in the registry."""
        if self.schema_version == 1:
            from ..families import registry

            family = self._legacy_family()
            known = registry.find(family)
            return {"family": family, "architecture": known.architecture if known else None, "class": None}
        raw = self.attr("model")
        raw = raw if isinstance(raw, dict) else {}
        return {k: raw.get(k) if isinstance(raw.get(k), str) and raw.get(k) else None
                for k in ("family", "architecture", "class")}

    @property
    def family(self) -> str | None:
        """The model's family (None for a model of no known family); see `task_family` for the prompts'."""
        return self.model_info["family"]

    @property
    def checkpoint_config(self):
        """The checkpoint config (`models.CheckpointConfig`) the recording was made from, or None.

        Reads the format-2 dict of schema 2 and the format-1 dict of schema 1 alike; a config that
        does not parse is a UserError naming this file."""
        raw = self.attr("checkpoint_config")
        if not raw:
            return None
        from ..models.config import CheckpointConfig

        try:
            return CheckpointConfig.from_dict(raw)
        except UserError as e:
            raise UserError(f"{self.path}: unreadable checkpoint_config ({e})") from None

    @property
    def n_prompts(self) -> int:
        return int(self.f["progress"][0])

    @property
    def layout(self):
        from ..tasks.layouts import PromptLayout

        d = self.attr("layout")
        return None if d is None else PromptLayout.from_dict(d)

    def hooks(self) -> list[str]:
        return list(self.f["acts"].keys()) if "acts" in self.f else []

    def has(self, path: str) -> bool:
        return path in self.f

    def shape(self, hook: str) -> tuple[int, ...]:
        return self._act(hook).shape

    def _act(self, hook: str) -> "Rows":
        if "acts" not in self.f or hook not in self.f["acts"]:
            raise UserError(f"{self.path}: no recorded hook {hook!r} (recorded: {', '.join(self.hooks()) or 'none'})")
        return self.f["acts"][hook]

    @staticmethod
    def _decode(ds: "Rows", raw: np.ndarray) -> np.ndarray:
        return bf16_to_float32(raw) if ds.attrs.get("dtype") == BF16 else raw

    def _rows(self, ds: "Rows", start: int = 0, stop: int | None = None) -> np.ndarray:
        try:
            return ds[()] if ds.ndim == 0 else self._decode(ds, ds[start:stop])
        except OSError as e:  # e.g. a chunk address past the end of the file
            raise UserError(f"{self.path}: corrupt HDF5 data in {ds.name} ({reason(e)})") from None

    def read(self, hook: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Prompts [start, stop) of one hook (bfloat16 comes back as float32)."""
        return self._rows(self._act(hook), start, stop)

    def array(self, path: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Any dataset by path ('/prompts/state', '/tasks/values', ...), rows [start, stop)."""
        if path not in self.f:
            raise UserError(f"{self.path}: recording has no {path}")
        return self._rows(self.f[path], start, stop)

    def group(self, name: str) -> dict[str, np.ndarray]:
        """A small group read whole ('params', 'theta_star')."""
        if name not in self.f:
            return {}
        return {k: self._rows(v) for k, v in self.f[name].items()}

    def iter_batches(self, hooks=None, batch_size: int = 1024, extra=()) -> Iterator[dict[str, np.ndarray]]:
        """Dicts {hook or path: rows} of `batch_size` prompts at a time, never the whole file."""
        hooks = self.hooks() if hooks is None else list(hooks)
        for start in range(0, self.n_prompts, batch_size):
            stop = min(start + batch_size, self.n_prompts)
            out = {h: self.read(h, start, stop) for h in hooks}
            out.update({p: self.array(p, start, stop) for p in extra})
            yield out

    def to_cache_dict(self, start: int = 0, stop: int | None = None, hooks=None) -> dict[str, np.ndarray]:
        """A TransformerLens-style {hook name: activations} dict for a slice of prompts."""
        return {h: self.read(h, start, stop) for h in (self.hooks() if hooks is None else hooks)}
