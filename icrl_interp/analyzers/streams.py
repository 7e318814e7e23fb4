"""What every streaming analyzer shares: the per-task means of per-prompt metrics (`PerTask`), the key
of a chunk's task ids, reading scattered prompts back for a second pass, and small helpers.

The streams themselves live with their analyses (`kernel`, `convergence`, `probes`, `td_step`,
`readout`): each is fed the same chunk of prompts (`base.Chunk`) and keeps only fixed-size statistics,
so a recording of any length is analyzed in one pass (`analyze.py` drives them; `base.py` is the
protocol).
"""
from __future__ import annotations

import math

import numpy as np


def mean_or_none(total: float, count: int):
    return total / count if count else None


def layer_param(params: dict, layer: int, key: str):
    """Layer l's parameter, or blocks.0's when weights are tied (only blocks.0 stored)."""
    return params.get(f"blocks.{layer}.attn.{key}", params.get(f"blocks.0.attn.{key}") if layer > 0 else None)


def read_rows(rec, paths: list[str], rows: np.ndarray, chunk: int, select: dict | None = None):
    """(rows, {path: those rows}) for sorted prompt indices, by the analyzer's chunks of `chunk`
    prompts (so memory stays within its budget; bfloat16 decoded). A chunk holding a fair share of
    the rows (>= 1/16: the usual 25% held out) is read as one slice and subset, which HDF5 does much
    faster than a point selection; a sparse one (a small probed subset of a large file) by index.
    `select` ({path: a tuple of slices of the axes after the prompt's}) reads only that part of a path's
    rows (e.g. the one query row of an attention pattern that a probe uses: HDF5 copies 1/pos of it)."""
    from ..core import threads

    which = rows // chunk
    handles = _handles(rec, paths, select)  # looked up once: an h5py lookup costs as much as a small read
    yield from threads.ahead(lambda idx: (idx, _read(handles, idx)), [rows[which == c] for c in np.unique(which)])


def read_at(rec, paths: list[str], idx: np.ndarray) -> dict:
    """{path: rows idx} (sorted, unique): one slice when they are dense (>= 1/16 of their span), else
    by index; bfloat16 decoded."""
    return _read(_handles(rec, paths), idx)


def _handles(rec, paths: list[str], select: dict | None = None) -> list[tuple]:
    """(path, dataset, whether its values are bfloat16 bit patterns, selection of the axes after the prompt's)
    per path."""
    from ..recording.format import BF16

    select = select or {}
    return [(p, rec.f[p], dtype_attr(rec.f[p]) == BF16, tuple(select.get(p, ()))) for p in paths]


def _read(handles: list[tuple], idx: np.ndarray) -> dict:
    from ..recording.format import bf16_to_float32

    lo, hi = int(idx[0]), int(idx[-1]) + 1
    data = {}
    for p, ds, bf16, sel in handles:
        raw = ds[(slice(lo, hi), *sel)][idx - lo] if 16 * idx.size >= hi - lo else ds[(idx, *sel)]
        data[p] = bf16_to_float32(raw) if bf16 else raw
    return data


def dtype_attr(ds) -> str:
    """The dtype a dataset's values were recorded in (its `dtype` attribute; '' when it has none): the
    stored dtype of bfloat16 activations is not theirs."""
    v = ds.attrs.get("dtype", "")
    return v.decode() if isinstance(v, bytes) else str(v)


TASK_KEY = "_task_id"
"""Key of a chunk's task ids in the data dict the analyzer feeds the streams (`prompts/task_id`, else
the prompt index)."""


class PerTask:
    """Per-task means of per-prompt metrics, keyed by task id (prompts with equal id are one task),
    kept while at most `limit` distinct tasks have been seen; past that only the fact is kept, so
    memory stays bounded (`result` is then None)."""

    def __init__(self, names: tuple[str, ...] | list[str], limit: int):
        self.names, self.limit = tuple(names), int(limit)
        self.ids = np.zeros(0, dtype=np.int64)
        self.count = np.zeros(0)
        self.sum = {k: np.zeros(0) for k in self.names}
        self.n = {k: np.zeros(0) for k in self.names}
        self.over = self.limit <= 0

    def update(self, task: np.ndarray, **values: np.ndarray) -> None:
        if self.over:
            return
        task = np.asarray(task, dtype=np.int64)
        ids = np.union1d(self.ids, task)
        if ids.size > self.limit:
            self.over = True
            self.ids, self.count, self.sum, self.n = np.zeros(0, dtype=np.int64), np.zeros(0), {}, {}
            return
        if ids.size != self.ids.size:  # new tasks: widen the tables
            at = np.searchsorted(ids, self.ids)
            grow = lambda a: np.bincount(at, weights=a, minlength=ids.size) if a.size else np.zeros(ids.size)  # noqa: E731
            self.count = grow(self.count)
            self.sum = {k: grow(v) for k, v in self.sum.items()}
            self.n = {k: grow(v) for k, v in self.n.items()}
            self.ids = ids
        slot = np.searchsorted(self.ids, task)
        np.add.at(self.count, slot, 1.0)
        for k, v in values.items():
            v = np.asarray(v, dtype=np.float64)
            ok = np.isfinite(v)
            np.add.at(self.sum[k], slot[ok], v[ok])
            np.add.at(self.n[k], slot[ok], 1.0)

    def result(self) -> dict | None:
        """{"task_id": [...], "n_prompts": [...], name: [per-task mean or None], ...} sorted by task id;
        None past the limit."""
        if self.over:
            return None
        out = {"task_id": self.ids.tolist(), "n_prompts": self.count.astype(np.int64).tolist()}
        for k in self.names:
            with np.errstate(invalid="ignore", divide="ignore"):
                m = self.sum[k] / self.n[k]
            out[k] = [float(x) if math.isfinite(x) else None for x in m]
        return out
