"""Live recordings: the analyzers fed straight from the forward pass, no activation written to disk.

A recording run (`recorder.prepare`) produces a stream of batches: prompts, task data, the reference
algorithm's run and the hooked activations. `record` hands each batch to the HDF5 writer; this
module hands them to the analyzers instead: every registered analyzer (`icrl_interp.analyzers.registry`,
one of your own too) is fed by the same driver as for a file. `LiveRecording` answers the reader's
questions (root attributes, groups, dataset shapes, rows of prompts; the checkpoint config as the run's
own object, its families resolved once) exactly as `recording.Recording` does for the file that
`record` would have written, computing rows on demand:

* prompts, task data and the reference (`prompts/`, `tasks/`, `reference/`) come from the prompt
  source, which redraws batch i from Generator([seed, i]) and runs no model;
* activations, the model's output and its lenses (`acts/`, `baseline/`, `outputs/`, `lens/`) run the
  forward pass of the batches holding the rows asked for.

The most recent batches are cached (at least every batch of the largest span of activations asked
for, so one chunk of the analyzer is one forward pass per batch; prompt-only batches up to
PROMPT_CACHE_BYTES); older ones are dropped, so memory stays flat in the number of prompts. A read of a
chunk of a longer run takes the activations out of the cached batches it copies them from, so a chunk's
activations are held once. An analysis that reads the prompts twice (the tuned lens's held-out scoring, and the TD
probes' when their held-out prompts outgrow what they keep from the first pass: docs/analyzers.md, "Live
analysis") runs the forward pass of those batches again: it costs compute, never memory. Given an output file, every batch is also written in order as it is
first computed (`record --also-analyze`).
"""
from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from collections.abc import Iterator

import numpy as np

from ..core.errors import UserError
from .format import SCHEMA, Recording, RecordingWriter, _json_attr

MODEL_GROUPS = ("acts/", "baseline/", "outputs/", "lens/")
"""Dataset paths that need the forward pass; every other batch path comes from the prompt source."""


PROMPT_CACHE_BYTES = 64 * 2**20
"""At most this much of prompts / task data / reference kept for reads that need no forward pass (e.g.
the probes' partner targets, scattered over earlier prompts); beyond it batches are redrawn."""


def _nbytes(data: dict) -> int:
    return sum(int(getattr(v, "nbytes", 0)) for v in data.values())


class LiveDataset:
    """The h5py.Dataset surface the analyzers use (shape, dtype, attrs, slicing on the prompt axis)."""

    chunks = None  # nothing on disk: read-ahead has nothing to prefetch

    def __init__(self, file: "LiveFile", path: str, shape: tuple[int, ...], dtype, attrs: dict,
                 array: np.ndarray | None = None):
        self.file, self.path, self.shape, self.dtype = file, path, tuple(shape), np.dtype(dtype)
        self.attrs, self.array = dict(attrs), array

    @property
    def name(self) -> str:
        return "/" + self.path

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        if self.array is not None:  # a static array (parameters, theta*, progress)
            return self.array[key]
        first, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        n = self.shape[0]
        if isinstance(first, slice):
            idx, squeeze = np.arange(*first.indices(n)), False
        elif isinstance(first, (int, np.integer)):
            i = int(first) + (n if first < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"{self.path}: index {first} out of range for {n} prompts")
            idx, squeeze = np.array([i]), True
        else:  # a list of rows: negative ones count from the end, as h5py's do
            idx, squeeze = np.asarray(first, dtype=np.int64).reshape(-1), False
            if idx.size and (idx.min() < -n or idx.max() >= n):
                raise IndexError(f"{self.path}: indices out of range for {n} prompts")
            idx = np.where(idx < 0, idx + n, idx)
        rows = self.file.rows(self.path, idx)
        rows = rows[(slice(None), *rest)] if rest else rows
        return rows[0] if squeeze else rows


class LiveGroup:
    """The h5py.Group surface the reader uses (membership, keys, items)."""

    def __init__(self, file: "LiveFile", prefix: str):
        self.file, self.prefix = file, prefix.rstrip("/") + "/"

    def keys(self) -> list[str]:
        out = []
        for p in self.file.paths:
            if p.startswith(self.prefix):
                child = p[len(self.prefix):].split("/", 1)[0]
                if child not in out:
                    out.append(child)
        return out

    def __iter__(self):
        return iter(self.keys())

    def __contains__(self, name: str) -> bool:
        return (self.prefix + name) in self.file

    def __getitem__(self, name: str):
        return self.file[self.prefix + name]

    def items(self):
        return [(k, self[k]) for k in self.keys()]

    def values(self):
        return [self[k] for k in self.keys()]


class LiveFile:
    """The h5py.File surface of a recording whose rows are computed on demand from a `RecordRun`."""

    def __init__(self, run, sink=None):
        self.run, self.sink = run, sink
        first = run.first
        n = run.source.n_total
        self.attrs: dict = {}
        for key, value in {"schema": SCHEMA, **run.meta}.items():
            # stored as the writer stores them: scalars as they are, the rest as JSON text
            self.attrs[key] = value if isinstance(value, (str, int, float, bool, np.number)) else _json_attr(value)
        self.attrs.update({"complete": True, "n_prompts": n})
        self.datasets: dict[str, LiveDataset] = {}
        for path, arr in first.items():
            attrs = {k: v for k, v in run.dataset_attrs(path).items() if k != "compression"}
            self.datasets[path] = LiveDataset(self, path, (n, *arr.shape[1:]), arr.dtype, attrs)
        for group, arrays in run.statics.items():
            for name, arr in arrays.items():
                arr = np.asarray(arr)
                self.datasets[f"{group}/{name}"] = LiveDataset(self, f"{group}/{name}", arr.shape, arr.dtype, {}, arr)
        self.datasets["progress"] = LiveDataset(self, "progress", (1,), np.int64, {}, np.array([n], dtype=np.int64))
        self.paths = list(self.datasets)
        self.model_paths = {p for p in first if p.startswith(MODEL_GROUPS)}
        self._full: OrderedDict[int, dict] = OrderedDict()  # batch -> every path (forward pass run)
        self._prompts: OrderedDict[int, dict] = OrderedDict()  # batch -> the prompt source's paths only
        self.capacity = 2
        """Batches with activations kept: at least every batch of the largest span of activations read."""
        self._prompt_bytes = 0
        self.forward_batches = 0
        """Forward passes run (batch 0 of `prepare` not counted): the cost of the analysis in batches."""
        self._first: dict | None = self._own(first)
        """Batch 0 as `prepare` computed it, copied out of the probes' buffers now: the next batch that
        uses the same buffers (batch 2) would overwrite it, and batch 0 may be read after that one."""
        self.written = 0
        """Batches handed to the sink so far (they go in order)."""

    # ---------------------------------------------------------------- h5py surface
    def __contains__(self, path: str) -> bool:
        path = path.strip("/")
        return path in self.datasets or any(p.startswith(path + "/") for p in self.paths)

    def __getitem__(self, path: str):
        path = path.strip("/")
        if path in self.datasets:
            return self.datasets[path]
        if path in self:
            return LiveGroup(self, path)
        raise KeyError(f"live recording has no {path}")

    def get(self, path: str, default=None):
        return self[path] if path in self else default

    def keys(self) -> list[str]:
        return LiveGroup(self, "").keys()

    def close(self) -> None:
        self._full.clear()
        self._prompts.clear()
        self._prompt_bytes = 0

    # ---------------------------------------------------------------- rows
    def rows(self, path: str, idx: np.ndarray) -> np.ndarray:
        """Rows `idx` of one batch path, computing the batches that hold them."""
        ds = self.datasets[path]
        bs = self.run.batch_size
        batches = np.unique(idx // bs)
        model = path in self.model_paths
        if model:  # the analyzer's chunk: keep all of its batches while its paths are read one by one
            self.capacity = max(self.capacity, batches.size + 1)
        if batches.size == 1 and idx[-1] - idx[0] + 1 == idx.size and np.all(idx[1:] > idx[:-1]):
            # consecutive prompts of one batch: a read-only view of the cached batch, no copy
            lo = int(idx[0]) - int(batches[0]) * bs
            view = self._batch(int(batches[0]), model, path)[path][lo : lo + idx.size]
            view = view.view()
            view.flags.writeable = False
            return view
        out = np.empty((idx.size, *ds.shape[1:]), dtype=ds.dtype)
        if not idx.size:
            return out
        if idx.size > 1 and not np.all(idx[1:] > idx[:-1]):  # unsorted: gather one batch at a time
            which = idx // bs
            for b in batches:
                sel = which == b
                out[sel] = self._batch(int(b), model, path)[path][idx[sel] - int(b) * bs]
            return out
        starts, ends = np.searchsorted(idx, batches * bs), np.searchsorted(idx, (batches + 1) * bs)
        # A read of a chunk of a longer run copies the activations out of the cached batches: the
        # batches then give up that path, so a chunk's activations are held once (in the chunk), not
        # twice (chunk + cache); a later read runs the forward pass again. A run read whole in one chunk
        # keeps them: its second pass finds them cached. Prompt paths stay (the probes' second pass
        # reads the partners' targets again, which would redraw their batches).
        consume = model and batches.size < self.run.n_batches
        for b, a, c in zip(batches.tolist(), starts.tolist(), ends.tolist()):
            batch = self._batch(b, model, path)
            rows = batch[path]
            part = idx[a:c] - b * bs
            whole = part[-1] - part[0] + 1 == part.size
            # a run of consecutive prompts (the analyzers' chunks) is one slice copy, not a gather
            out[a:c] = rows[part[0] : part[-1] + 1] if whole else rows[part]
            if consume and whole and part.size == len(rows) and (self.sink is None or b < self.written):
                del batch[path]  # every row copied out (and written, with a sink)
        return out

    def _batch(self, index: int, model: bool, path: str | None = None) -> dict:
        """Batch `index` (cached, or computed: the forward pass for `model` paths, the prompt source
        otherwise); a cached batch that gave up `path` (`rows`) is computed again."""
        if index in self._full and (path is None or path in self._full[index]):
            self._full.move_to_end(index)
            return self._full[index]
        if not model:
            if index == 0 and self._first is not None:  # batch 0 as `prepare` ran it: its prompt paths too
                return self._first
            if index not in self._prompts:
                lo, hi = self.run.batch_rows(index)
                data = self.run.source.batch(index, lo, hi)
                data["prompts/task_id"] = self.run.source.task_ids(lo, hi)
                self._prompts[index] = data
                self._prompt_bytes += _nbytes(data)
                while self._prompt_bytes > PROMPT_CACHE_BYTES and len(self._prompts) > 1:
                    self._prompt_bytes -= _nbytes(self._prompts.popitem(last=False)[1])
            self._prompts.move_to_end(index)
            return self._prompts[index]
        if index == 0 and self._first is not None:
            data, self._first = self._first, None
        else:
            probes = self.run.probe_sets[index % 2]
            data = self._own(self.run.run_batch(index, probes))
            self.forward_batches += 1
        self._full[index] = data
        if index in self._prompts:
            self._prompt_bytes -= _nbytes(self._prompts.pop(index))
        while len(self._full) > self.capacity:
            self._full.popitem(last=False)
        self._feed_sink()
        return data

    @staticmethod
    def _own(data: dict) -> dict:
        """The batch with its activations copied out of the probes' buffers (reused by later batches);
        everything else is a fresh array per batch already."""
        return {k: np.array(v) if "acts/" in k else v for k, v in data.items()}

    def _feed_sink(self) -> None:
        """Hand the sink every batch that is next in order and still cached."""
        while self.sink is not None and self.written in self._full:
            data = self._full[self.written]
            self.sink.write_batch(data, {k: self.run.dataset_attrs(k) for k in data if "acts/" in k})
            self.written += 1

    def drain(self, progress: bool = False) -> None:
        """Write to the sink every batch not written yet (in order; recomputed where it was dropped)."""
        if self.sink is None:
            return
        from tqdm.auto import tqdm

        bar = tqdm(total=self.run.n_batches, initial=self.written, unit="batch", desc="record",
                   disable=not progress, leave=False)
        while self.written < self.run.n_batches:
            before = self.written
            self._batch(self.written, True)
            self._feed_sink()
            bar.update(self.written - before)
        bar.close()


class LiveRecording(Recording):
    """A `Recording` whose rows come from the forward pass (`LiveFile`); read it like a recording file."""

    read_ahead = 2
    """Where a live chunk is smaller than a forward batch (a `--chunk-mib` below a batch, or a batch over
    `analyze.LIVE_BATCH_MIB`), its reads are lumpy: one chunk runs the next batch's forward pass, the following one
    finds it cached. Reading two ahead lets that forward pass run while the analysis works on the chunk that needed
    none (docs/benchmarks.md, "Live analysis"); with whole-batch chunks (the default) one ahead measured the same."""

    def __init__(self, run, name: str = "<live>", sink=None):  # noqa: D107 - no file to check
        self.path = Path(name)
        self.schema = SCHEMA
        self.f = LiveFile(run, sink)

    @property
    def forward_batches(self) -> int:
        return self.f.forward_batches

    @property
    def batch_rows(self) -> int:
        """Prompts per forward batch: what one forward pass computes, so the smallest chunk worth reading
        (`analyze.LIVE_BATCH_MIB`)."""
        return int(self.f.run.batch_size)

    @property
    def checkpoint_config(self):
        """The run's own checkpoint config (None: none), the object the file's `checkpoint_config` would be
        parsed back into: the analysis reads its families as resolved already, not looked up again."""
        return self.f.run.source.config

    def close(self) -> None:
        self.f.close()


@contextmanager
def open_live(model, spec, source, *, name: str = "<live>", out=None, batch_size: int = 128,
              checkpoint_sha256: str = "", baseline: str = "none", baseline_seed: int = 0,
              outputs: str = "auto", progress: bool = False, device=None) -> Iterator[LiveRecording]:
    """A live recording of `model` on `source` (arguments as `recorder.record`); the model stays in eval
    mode inside the block. With `out`, every batch is also written to that HDF5 file as it is first
    computed, the rest after the block, and the file is published (atomically) when the block ends
    without an error; after an interruption its `.partial` stays for `record --resume`, after a refused
    batch (the model raised, or gave NaN) it is deleted: resuming would refuse it again."""
    from .recorder import check_disk, prepare

    with prepare(model, spec, source, batch_size, False, checkpoint_sha256, baseline, baseline_seed,
                 outputs, device=device) as run:
        if out is not None:
            check_disk(run, out)
        writer = RecordingWriter(out, run.meta) if out is not None else None
        rec = LiveRecording(run, name, writer)
        try:
            if writer is not None:
                for group, arrays in run.statics.items():
                    writer.write_static(group, arrays)
            yield rec
            if writer is not None:
                rec.f.drain(progress)
                writer.finish()
        except UserError:
            if writer is not None:
                writer.discard()
            raise
        except BaseException:
            if writer is not None:
                writer.close()
            raise
        finally:
            rec.close()
