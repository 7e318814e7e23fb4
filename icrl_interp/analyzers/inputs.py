"""What an analyzer input is, where inputs are (the one discovery helper), and how to read a
recording in chunks of prompts.

Inputs: a checkpoint directory (config.json + model.safetensors), an HDF5 recording
(docs/formats.md), or a `.safetensors` file of TransformerLens weights (analyzed with a
user-supplied layout). A directory that is not a checkpoint is searched for checkpoints and
recordings (`discover`); `icrl-interp analyze` and `icrl-interp report` both use it. The report also
takes causal JSON files (`icrl-interp causal --json`, schema `icrl_interp.causal/2`; `discover(...,
causal=True)`).
"""
from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Iterator

import numpy as np

from ..core import threads
from ..core.errors import UserError
from ..core.outputs import HDF5_MAGIC
from ..families import registry
from ..tasks.layouts import PromptLayout
RECORDING_SUFFIXES = (".h5", ".hdf5")
STEP_DIR = re.compile(r"^step_(\d+)$")
"""Checkpoints of a training run: <run>/checkpoints/step_<n>/."""
CAUSAL_SCHEMA = "icrl_interp.causal/2"
"""Top-level `schema` of a causal JSON (`causal.SCHEMA`, written by `icrl-interp causal --json`)."""
CAUSAL_MAX_BYTES = 64 << 20
"""A .json file above this size found while scanning a directory is not read (a causal JSON is a few kB)."""
VERDICT_SCHEMA = "icrl_interp.verdict/2"
"""Top-level `schema` of a verdict JSON (`verdicts.behaviour.SCHEMA`, written by `icrl-interp verdict --json`)."""
EPISODE_VERDICT_SCHEMA = "icrl_interp.episode_verdict/2"
"""Top-level `schema` of a verdict on episodes (`verdicts.behaviour_fit`, `verdict --episodes --json` or `verdict
REC.h5 --json` of an episode recording)."""
EPISODE_VERDICT_SCHEMAS = (EPISODE_VERDICT_SCHEMA, "icrl_interp.episode_verdict/1")
"""The episode verdict schemas read (version 2 adds a baseline and the representation evidence to version 1)."""
VERDICT_SCHEMAS = (VERDICT_SCHEMA, "icrl_interp.verdict/1", *EPISODE_VERDICT_SCHEMAS)
"""The verdict schemas read (version 2 adds fields to version 1: fitted parameters, decoys, OOD checks; the episode
verdict has candidates and a verdict but no layers: `report.verdict.html_table` shows it as its own table)."""
SKIP_DIRS = ("cache",)
"""Directory names never searched (the report's analysis cache); hidden directories are skipped too."""


def is_checkpoint(path) -> bool:
    """A directory with config.json and model.safetensors."""
    path = Path(path)
    return path.is_dir() and (path / "config.json").is_file() and (path / "model.safetensors").is_file()


def is_step_dir(path) -> bool:
    """`checkpoints/step_<n>/` of a training run: a checkpoint even while incomplete (so that a
    half-written one is reported as failed instead of silently vanishing)."""
    path = Path(path)
    return bool(STEP_DIR.match(path.name)) and path.parent.name == "checkpoints"


def input_kind(path) -> str:
    """'checkpoint', 'recording' or 'tl-weights'; UserError for anything else."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    if path.is_dir():
        if is_checkpoint(path):
            return "checkpoint"
        raise UserError(f"{path}: a directory but not a checkpoint (needs config.json and model.safetensors)")
    with open(path, "rb") as f:
        head = f.read(8)
    if head == HDF5_MAGIC:
        return "recording"
    if path.suffix == ".safetensors":
        return "checkpoint" if path.name == "model.safetensors" and is_checkpoint(path.parent) else "tl-weights"
    raise UserError(f"{path}: neither a checkpoint directory, an HDF5 recording nor a .safetensors file")


def json_schema(path) -> str | None:
    """The top-level `schema` of a `.json` file holding a JSON object (None for files over CAUSAL_MAX_BYTES,
    unreadable ones and anything else)."""
    path = Path(path)
    try:
        if path.suffix.lower() != ".json" or not path.is_file() or path.stat().st_size > CAUSAL_MAX_BYTES:
            return None
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
        return None
    schema = data.get("schema") if isinstance(data, dict) else None
    return schema if isinstance(schema, str) else None


def is_causal_json(path) -> bool:
    """A `.json` file holding a JSON object whose top-level `schema` is exactly `CAUSAL_SCHEMA`
    (files over CAUSAL_MAX_BYTES and unreadable ones are not)."""
    return json_schema(path) == CAUSAL_SCHEMA


def is_verdict_json(path) -> bool:
    """A `.json` file whose top-level `schema` is one of `VERDICT_SCHEMAS` (`icrl-interp verdict --json`)."""
    return json_schema(path) in VERDICT_SCHEMAS


@dataclass(frozen=True)
class Found:
    """One input found by `discover`."""

    path: Path
    """The path, as given or joined below a given directory (never made absolute here)."""
    kind: str
    """'checkpoint' (a directory), 'file' (a file named on the command line: recording, TL weights or
    junk, `input_kind` tells), 'recording' (an .h5 / .hdf5 file found in a directory), 'causal' (with
    `discover(..., causal=True)`: a causal JSON found in a directory, or any `.json` file named on the
    command line: the report says why when it is not one), 'verdict' (with `causal`: a verdict JSON found
    in a directory) or 'missing'."""
    problem: str = ""
    """Why a 'missing' input cannot be analyzed ('does not exist', 'holds no checkpoints or recordings')."""


def _scan(root: Path, causal: bool = False) -> list[Found]:
    found: list[Found] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames.sort()
        if is_checkpoint(here) or is_step_dir(here):
            found.append(Found(here, "checkpoint"))
            dirnames[:] = []
            continue
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
        for f in sorted(filenames):
            if f.endswith(RECORDING_SUFFIXES):
                found.append(Found(here / f, "recording"))
            elif causal and f.endswith(".json"):  # any other .json found here is not an input
                schema = json_schema(here / f)
                if schema == CAUSAL_SCHEMA or schema in VERDICT_SCHEMAS:
                    found.append(Found(here / f, "causal" if schema == CAUSAL_SCHEMA else "verdict"))
    return found


def discover(paths, unique: bool = True, causal: bool = False) -> list[Found]:
    """The inputs named by `paths`, in order.

    A file is taken as named (with `causal`, a `.json` file is kind 'causal'). A checkpoint directory
    (or a directory with a config.json and no `checkpoints/` folder: a broken checkpoint, to be
    reported as such) is one input. Any other directory expands to the checkpoints and recordings
    below it, in sorted walk order: checkpoint directories (and `checkpoints/step_*` ones, complete
    or not) are not entered, `cache` and hidden directories are skipped. With `causal` (the report)
    it also holds the causal JSON files below the directory: only `.json` files whose top-level
    `schema` is `CAUSAL_SCHEMA`, other JSON is ignored. A path that does not exist, or a directory
    holding nothing, is a 'missing' input with its problem. `unique` drops repeats of a path already
    found.
    """
    out: list[Found] = []
    seen: set[Path] = set()
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            items = [Found(p, "missing", "does not exist")]
        elif p.is_file():
            items = [Found(p, "causal" if causal and p.suffix.lower() == ".json" else "file")]
        elif is_checkpoint(p) or ((p / "config.json").is_file() and not (p / "checkpoints").is_dir()):
            items = [Found(p, "checkpoint")]
        else:
            items = _scan(p, causal) or [Found(p, "missing", "holds no checkpoints or recordings")]
        for item in items:
            if unique and item.path in seen:
                continue
            seen.add(item.path)
            out.append(item)
    return out


def expand_inputs(paths) -> list[str]:
    """Each path as given, except directories that are not checkpoints: those expand to the
    checkpoints and recordings found below them (`discover`); a path that holds nothing stays as
    given (and fails with the analyzer's reason). Repeats are kept: one row per path named."""
    return [str(f.path) for f in discover(paths, unique=False)]


def layout_from_dict(data: dict) -> PromptLayout:
    """PromptLayout.from_dict with a one-line error for a non-dict (from_dict orders blocks by row)."""
    if not isinstance(data, dict):
        raise UserError(f"malformed prompt layout: {data!r}")
    return PromptLayout.from_dict(data)


def layout_from_config(config) -> PromptLayout:
    """A checkpoint's prompt layout: a `CheckpointConfig`, or a config.json dict (format 1 or 2)."""
    from ..models.config import CheckpointConfig

    if not isinstance(config, CheckpointConfig):
        if not isinstance(config, dict):
            raise UserError(f"malformed checkpoint config: {config!r}")
        config = CheckpointConfig.from_dict(config)
    return config.model.layout


def family_dims(family: str, layout: PromptLayout) -> tuple[int, int | None]:
    """(d, m) for which the family's layout is `layout` (block names and sizes); UserError if none."""
    fam = registry.get(family)
    want = [(name, layout.size(name)) for name in layout.names]
    D = layout.d_model
    for d in range(1, D + 1):
        for m in (range(1, D + 1) if fam.needs_m else (None,)):
            try:
                cand = fam.layout(d, m)
            except UserError:
                continue
            if cand.d_model == D and [(n, cand.size(n)) for n in cand.names] == want:
                return d, m
    raise UserError(f"the layout (blocks {', '.join(layout.names)}, d_model {D}) is not a {family} layout "
                    f"for any dimensions")


def read_layout_file(path) -> PromptLayout:
    """A layout JSON file (PromptLayout.to_dict format)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read layout file {path}: {e}") from None
    if not isinstance(data, dict):
        raise UserError(f"layout file {path} must hold a JSON object")
    return layout_from_dict(data)


def positions(attrs, shape: tuple[int, ...], axis: int, pos: int, name: str) -> np.ndarray:
    """Absolute positions held along `axis` of a recorded hook (its 'positions' slice attribute)."""
    raw = attrs.get("positions", attrs.get("pos_slice", ":"))
    raw = raw.decode() if isinstance(raw, bytes) else str(raw)
    if raw in ("", ":", "None", "null"):
        sl = slice(None)
    else:
        try:
            parts = raw.split(":")
            if len(parts) not in (2, 3):
                raise ValueError
            sl = slice(*(int(p) if p.strip() else None for p in parts))
        except ValueError:
            raise UserError(f"hook {name}: cannot parse its positions attribute {raw!r}") from None
    idx = np.arange(pos)[sl]
    if len(idx) != shape[axis]:
        raise UserError(f"hook {name}: axis {axis} has {shape[axis]} positions but its positions {raw!r} "
                        f"of a {pos}-position prompt give {len(idx)}")
    return idx


def chunk_rows(bytes_per_prompt: int, budget_bytes: int, n_prompts: int) -> int:
    """Prompts per chunk: within the memory budget, at least 2, and even (pairs stay together)."""
    rows = max(2, int(budget_bytes // max(bytes_per_prompt, 1)))
    rows -= rows % 2
    return max(2, min(rows, n_prompts + n_prompts % 2))


TRIM_SLACK: float | None = 0.0
"""How `iter_chunks` gives the heap's freed pages back: after a chunk when the heap's free bytes have grown by this
fraction of one chunk's arrays since the last trim (`heap.OnGrowth`; 0: whenever they have grown at all); None:
after every chunk (`heap.release_free_memory`). Measured 2026-12-02 on an idle machine (docs/benchmarks.md): live
analysis / (forward + source), one thread, 3.28x at 0, 3.86x at 0.25, 4.82x every chunk (the next chunk faults the
returned pages in again); peak RSS of the 100k-prompt live run (linear-td theta*) 345-346 MiB at 0 (1.19-1.20x the
1k run's 289 MiB), 346-371 MiB at 0.25 (1.20-1.28x), 341-343 MiB every chunk (1.18x)."""


def chunk_spans(ds) -> list[tuple[int, int, int, int]]:
    """(first prompt, last prompt + 1, byte offset, bytes) of every stored chunk of the chunked dataset `ds`, in
    the index's order. One walk of the chunk index (`chunk_iter`, HDF5 >= 1.12.3) where h5py has it: asking
    for the chunks one by one (`get_chunk_info(i)`, the fallback) searches the index again for each, 10x
    slower on a 1.4 GB recording's 1,728 chunks (0.05 s against 0.005 s)."""
    rows = ds.chunks[0]
    spans = []

    def add(info):
        if info.byte_offset is not None:  # an unwritten chunk has no place in the file
            spans.append((info.chunk_offset[0], info.chunk_offset[0] + rows, info.byte_offset, info.size))

    if hasattr(ds.id, "chunk_iter"):
        ds.id.chunk_iter(add)
    else:
        for i in range(ds.id.get_num_chunks()):
            add(ds.id.get_chunk_info(i))
    return spans


class ReadAhead:
    """Asks the OS to fetch the file regions of the next prompts while the current ones are analyzed.

    The byte ranges come from the HDF5 chunk index of every dataset read, so the
    hint is exact; `posix_fadvise(WILLNEED)` returns at once and the kernel reads
    in the background. A no-op where the platform or the layout does not allow it.
    Linux fetches only the first read-ahead window (`read_ahead_kb`) of each range;
    handing the ranges over in pieces that size fetched all of them, but measured
    slower (docs/analyzers.md, "Reading large recordings"), so one call per range.
    """

    def __init__(self, path, datasets):
        self.fd = None
        spans = []
        if not hasattr(os, "posix_fadvise"):
            return
        try:
            for ds in datasets:
                if ds.chunks is not None:
                    spans += chunk_spans(ds)
            self.fd = os.open(path, os.O_RDONLY)
        except (AttributeError, OSError, RuntimeError):  # old HDF5, odd layout: just read normally
            return
        spans.sort(key=lambda t: t[2])
        self.first, self.last, self.offset, self.size = (np.array(col, dtype=np.int64).reshape(-1)
                                                         for col in zip(*spans)) if spans else ([],) * 4

    def hint(self, start: int, stop: int) -> None:
        """Prefetch the chunks holding prompts [start, stop), merged into contiguous byte ranges."""
        if self.fd is None or not len(self.offset):
            return
        pick = (self.first < stop) & (self.last > start)
        off, size = self.offset[pick], self.size[pick]
        if not off.size:
            return
        end = off + size
        # coalesce ranges separated by less than 1 MiB (the file is written batch by batch)
        breaks = np.nonzero(off[1:] - np.maximum.accumulate(end)[:-1] > 2**20)[0] + 1
        for a, b in zip(np.split(off, breaks), np.split(end, breaks)):
            os.posix_fadvise(self.fd, int(a[0]), int(b.max() - a[0]), os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def iter_chunks(rec, paths: list[str], rows: int, progress: bool = False,
                prepare: Callable[[dict, Callable[[], bool]], None] | None = None) -> Iterator[tuple[int, int, dict]]:
    """(start, stop, {path: rows}) for consecutive chunks of prompts (bfloat16 decoded to float32).

    `prepare(data, hurry)`, when given, runs on each chunk where it is read, so in the reader thread, ahead of the
    caller, where there is one: work that needs nothing but the chunk (`Stream.prepare`). `hurry()` turns True once the
    caller waits for that chunk: the prepare should then stop and leave the rest to the caller, so that the two threads
    share the work, whichever side is the slower (a file's reads leave the reader time; a live recording's forward
    passes do not).

    Dataset handles and their dtype attributes are looked up once, not per chunk; while the caller works on
    a chunk, the next one is read in a thread where a core is spare (`threads.ahead`) and the OS fetches the
    one after it (ReadAhead). After each chunk the heap's free pages go back to the OS (`TRIM_SLACK`).
    """
    from tqdm.auto import tqdm

    from ..core import heap
    from ..recording.format import BF16, bf16_to_float32

    N = rec.n_prompts
    handles = {}
    for p in paths:
        if p not in rec.f:
            raise UserError(f"{rec.path}: recording has no {p}")
        ds = rec.f[p]
        dtype = ds.attrs.get("dtype", "")
        handles[p] = (ds, (dtype.decode() if isinstance(dtype, bytes) else str(dtype)) == BF16)
    def read(start: int) -> tuple[int, int, dict]:
        stop = min(start + rows, N)
        data = {}
        for p, (ds, bf16) in handles.items():
            raw = ds[start:stop]
            data[p] = bf16_to_float32(raw) if bf16 else raw
        ahead.hint(stop, stop + rows)
        if prepare is not None:
            prepare(data, waiting.is_set)
        return start, stop, data

    waiting = threading.Event()  # set while the caller waits for a chunk (`threads.ahead`)

    ahead = ReadAhead(rec.path, [ds for ds, _ in handles.values()])
    bar = tqdm(total=N, unit="prompt", desc=f"analyze {rec.path.name}", disable=not progress, leave=False)
    chunk_bytes = rows * sum(int(np.prod(ds.shape[1:])) * ds.dtype.itemsize for ds, _ in handles.values())
    trim = (heap.release_free_memory if TRIM_SLACK is None  # chunk_bytes as read: bfloat16 counts 2 bytes
            else heap.OnGrowth(int(TRIM_SLACK * chunk_bytes)))
    chunks = threads.ahead(read, range(0, N, rows), getattr(rec, "read_ahead", 1), waiting)  # the next ones meanwhile
    try:
        ahead.hint(0, rows)
        for start, stop, data in chunks:
            yield start, stop, data
            del data
            trim()  # the chunk's arrays are freed: keep peak memory flat in the prompts
            bar.update(stop - start)
    finally:
        chunks.close()  # the reader thread ends before the file handles close
        bar.close()
        ahead.close()
