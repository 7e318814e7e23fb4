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
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from collections.abc import Iterator

import h5py
import numpy as np

from .errors import UserError
from .files import json_clean

SCHEMA = "icrl_interp.recording/2"
"""Schema written by `RecordingWriter`."""
SCHEMA_V1 = "icrl_interp.recording/1"
"""The previous schema (attribute `family` for both the task and the model), still read."""
READABLE = (SCHEMA, SCHEMA_V1)
LEGACY_NO_FAMILY = ("", "generic")
"""Schema-1 `family` values that named no family (a model of no known family, prompts of no task)."""
CHUNK_MIN, CHUNK_MAX = 10 * 1024, 1024 * 1024
BF16 = "bfloat16"


def partial_path(path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".partial")


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


class RecordingWriter:
    """Append batches of prompts to `<path>.partial`; `finish()` moves it to `path`.

    `meta` holds the root attributes (JSON-able values; dicts are stored as JSON text).
    `identity` keys of meta must match when resuming (spec, checkpoint hash, seed, ...).
    """

    IDENTITY = ("schema", "task_family", "model", "probe_spec", "checkpoint_sha256", "seed", "batch_size",
                "source_sha256")

    def __init__(self, path, meta: dict, resume: bool = False):
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self.meta = {"schema": SCHEMA, **meta}
        self._f: h5py.File | None = None
        self.n_done = 0
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
            self._f = h5py.File(self.partial, "w", libver="latest")
            for key, value in self.meta.items():
                self._f.attrs[key] = value if isinstance(value, (str, int, float, bool, np.number)) else _json_attr(value)
            self._f.attrs["complete"] = False
            self._f.create_dataset("progress", data=np.zeros(1, dtype=np.int64))

    # ------------------------------------------------------------ resume
    def _open_for_resume(self) -> None:
        # A writer killed in SWMR mode leaves the file's "open for write" flags set, so
        # it cannot be reopened for writing; SWMR *reading* works. Copy the finished
        # rows into a fresh file beside it, then swap it in: the old partial stays
        # intact until the copy is complete.
        try:
            src = h5py.File(self.partial, "r", libver="latest", swmr=True)
        except OSError as e:
            raise UserError(f"cannot resume: {self.partial} is not a readable HDF5 file ({e})") from None
        fresh = self.partial.with_name(self.partial.name + ".resume")
        try:
            for key in self.IDENTITY:
                if key in self.meta:
                    want = self.meta[key]
                    want = want if isinstance(want, (str, int, float, bool)) else _json_attr(want)
                    if _attr(src, key) != want:
                        raise UserError(f"cannot resume {self.partial}: it was recorded with a different {key}")
            self.n_done = int(src["progress"][0])
            with h5py.File(fresh, "w", libver="latest") as dst:
                for k, v in src.attrs.items():
                    dst.attrs[k] = v
                for name in src:
                    src.copy(src[name], dst, name=name)
                for _, ds in self._datasets(dst):
                    if ds.maxshape[0] is None and ds.shape[0] != self.n_done:
                        ds.resize(self.n_done, axis=0)
        except BaseException:
            fresh.unlink(missing_ok=True)
            raise
        finally:
            src.close()
        os.replace(fresh, self.partial)
        self._f = h5py.File(self.partial, "r+", libver="latest")
        if "acts" in self._f:
            self._f.swmr_mode = True

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
        self._f.flush()
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
        self.n_done += b
        self._f.flush()  # data first, then the progress marker that vouches for it
        self._f["progress"][0] = self.n_done
        self._f.flush()

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
        """Mark complete and move into place atomically."""
        self._f.close()
        with h5py.File(self.partial, "r+") as f:
            f.attrs["complete"] = True
            f.attrs["n_prompts"] = self.n_done
        fd = os.open(self.partial, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self.partial, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._f = None
        return self.path

    def close(self) -> None:
        """Leave the partial file as it is (resumable)."""
        if self._f is not None:
            self._f.close()
            self._f = None


# ------------------------------------------------------------------ reading
def _attr(f, key, default=None):
    v = f.attrs.get(key, default)
    return v.decode() if isinstance(v, bytes) else v


def _open_read(path) -> h5py.File:
    try:
        return h5py.File(path, "r")
    except OSError:
        # a .partial left by a killed SWMR writer still reads in SWMR mode
        return h5py.File(path, "r", libver="latest", swmr=True)


class Recording:
    """Lazy read access to a finished recording. Use as a context manager or call close()."""

    def __init__(self, path, allow_incomplete: bool = False):
        self.path = Path(path)
        if not self.path.exists():
            raise UserError(f"{self.path}: no such recording")
        try:
            self.f = _open_read(self.path)
        except OSError:
            raise UserError(f"{self.path}: not an HDF5 file (or a corrupt one)") from None
        schema = _attr(self.f, "schema")
        if schema not in READABLE:
            self.f.close()
            found = "no schema attribute" if schema is None else f"schema {schema!r}"
            raise UserError(f"{self.path}: not an icrl_interp recording ({found}; expected "
                            f"{' or '.join(map(repr, READABLE))})")
        self.schema = schema
        if not allow_incomplete and not bool(_attr(self.f, "complete", False)):
            self.f.close()
            raise UserError(f"{self.path}: recording is incomplete (complete=false); finish it with --resume")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self.f.close()

    # metadata
    def attr(self, key: str, default=None):
        """A root attribute, JSON-decoded where it was stored as JSON."""
        v = _attr(self.f, key, default)
        if isinstance(v, str) and v[:1] in "{[" or v == "null":
            try:
                return json.loads(v)
            except json.JSONDecodeError:
                return v
        return v.item() if isinstance(v, np.generic) else v

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
            from . import registry

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
        from .models.config import CheckpointConfig

        try:
            return CheckpointConfig.from_dict(raw)
        except UserError as e:
            raise UserError(f"{self.path}: unreadable checkpoint_config ({e})") from None

    @property
    def n_prompts(self) -> int:
        return int(self.f["progress"][0])

    @property
    def layout(self):
        from .layouts import PromptLayout

        d = self.attr("layout")
        return None if d is None else PromptLayout.from_dict(d)

    def hooks(self) -> list[str]:
        return list(self.f["acts"].keys()) if "acts" in self.f else []

    def has(self, path: str) -> bool:
        return path in self.f

    def shape(self, hook: str) -> tuple[int, ...]:
        return self._act(hook).shape

    def _act(self, hook: str) -> h5py.Dataset:
        if "acts" not in self.f or hook not in self.f["acts"]:
            raise UserError(f"{self.path}: no recorded hook {hook!r} (recorded: {', '.join(self.hooks()) or 'none'})")
        return self.f["acts"][hook]

    @staticmethod
    def _decode(ds: h5py.Dataset, raw: np.ndarray) -> np.ndarray:
        return bf16_to_float32(raw) if ds.attrs.get("dtype") == BF16 else raw

    def read(self, hook: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Prompts [start, stop) of one hook (bfloat16 comes back as float32)."""
        ds = self._act(hook)
        return self._decode(ds, ds[start:stop])

    def array(self, path: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Any dataset by path ('/prompts/state', '/tasks/values', ...), rows [start, stop)."""
        if path not in self.f:
            raise UserError(f"{self.path}: recording has no {path}")
        ds = self.f[path]
        return ds[()] if ds.ndim == 0 else self._decode(ds, ds[start:stop])

    def group(self, name: str) -> dict[str, np.ndarray]:
        """A small group read whole ('params', 'theta_star')."""
        if name not in self.f:
            return {}
        return {k: v[()] for k, v in self.f[name].items()}

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
