"""Sharded recordings: K shard files written in parallel, joined by a master file of virtual datasets.

Layout (docs/formats.md, "Sharded recordings"): `record --shards K --out R.h5` writes the shards
`R.shard-{i}-of-{K}.h5` beside `R.h5`. Shard i is an ordinary recording (its own `.partial`, its
own atomic publish, its own `--resume`) of a contiguous range of batches, with a root attribute
`shard` saying which. Batch b of a sampled run draws its tasks from `Generator([seed, b])`
whichever file it lands in, so the shards hold exactly the rows of the single-file recording.
Once every shard is complete, `write_master` writes `R.h5`: the same root attributes as a
single file, an attribute `shards` listing each shard (file name, first prompt, prompts, size,
digest of its `integrity` attribute), and one HDF5 virtual dataset per dataset that maps each
shard's rows into place. `format.Recording` reads the master like any recording, after
checking every shard it references (`Recording._check_shards`).

The calls go one way: `recorder.record(shards=K)` asks `plan` for the shards (files, `shard` attributes,
their prompts as a `ShardSource`, what earlier runs left), records each with its own single-file
writer in `run`'s workers, and joins them with `write_master`; `recording.episodes` does the same with
`plan_files` (its rows are histories, not prompts). This module knows the files, not how a model is
recorded: it never imports the recorder.

Parallelism: shards run in forked worker processes (`run`), which inherit the model, so nothing
is pickled; on a GPU, or where fork is unavailable, they run one after another in this process.
A worker dies with the process that forked it (SIGKILL included: `_die_with_parent`), and the
whole run holds the lock `R.h5.lock` (`files.locked`, inherited by the workers), so a `--resume`
never runs beside a live writer of the same recording; under that lock it removes the files killed
runs left that nothing resumes (`leftovers`: a temporary master, a writer's scratch file).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from ..core.errors import UserError, one_line
from ..core.faults import kill_point
from ..core.files import atomic_path, json_clean, temporaries
from .format import SCRATCH, SHARDS, Recording, json_decoded, partial_path
from .integrity import HDF5_SIGNATURE, INTEGRITY, integrity_digest, seal
from .prompts import PromptSource

SHARD_ATTR = "shard"
"""Root attribute of a shard: JSON {"index", "count", "first_batch", "first_prompt", "n_total", "batch_size"}."""
PER_SHARD = (INTEGRITY, SHARD_ATTR, "n_total", "n_prompts", "complete", "created")
"""Root attributes of a shard that the master does not copy (it sets its own)."""
AGREE = ("schema", "task_family", "model", "probe_spec", "checkpoint_sha256", "seed", "source_sha256",
         "checkpoint_config", "layout", "gamma", "n_layers", "roles", "baseline", "task_data")
"""Root attributes every shard of one recording must share (not `batch_size`: a shard of one short last
batch records that batch's size; the `shard` attribute carries the run's)."""


PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process gets when the thread that forked it exits (Linux)."""


def lock_path(out) -> Path:
    """The lock a recording run holds while it writes `out`, its shards or their .partial files."""
    out = Path(out)
    return out.with_name(out.name + ".lock")


def stale_masters(out) -> list[Path]:
    """Temporary masters (`write_master`'s `.R.h5.XXXXXXXX.tmp`) that a run killed while publishing
    left: that name beside `out`, and an HDF5 file or an empty one (killed before h5py wrote). Only
    the holder of `lock_path(out)` may delete them: no other writer of `out` is alive then."""
    found = []
    for p in temporaries(Path(out).parent, Path(out).name):
        try:
            with open(p, "rb") as f:
                head = f.read(len(HDF5_SIGNATURE))
        except OSError:
            continue
        if head in (b"", HDF5_SIGNATURE):
            found.append(p)
    return found


def leftovers(out) -> list[Path]:
    """What killed runs of `out` left that no run resumes: temporary masters (`stale_masters`) and the
    writers' scratch files (`format.scratch_paths`) of `out` and of its shards (of any count).
    Only the holder of `lock_path(out)` may delete them."""
    out = Path(out)
    shard = re.escape(out.stem) + r"\.shard-\d+-of-\d+" + re.escape(out.suffix)
    scratch = re.compile(f"({re.escape(out.name)}|{shard})" + re.escape(".partial") + f"({'|'.join(map(re.escape, SCRATCH))})")
    found = [p for p in sorted(out.parent.iterdir()) if scratch.fullmatch(p.name) and p.is_file() and not p.is_symlink()]
    return stale_masters(out) + found


def shard_paths(out, count: int) -> list[Path]:
    """The shard files of a master `out`: `R.shard-{i}-of-{count}.h5` beside `R.h5`."""
    out = Path(out)
    width = len(str(count - 1))
    return [out.with_name(f"{out.stem}.shard-{i:0{width}d}-of-{count}{out.suffix}") for i in range(count)]


def batch_ranges(n_batches: int, count: int) -> list[tuple[int, int]]:
    """Contiguous batch ranges [first, stop) of `count` shards, as equal as whole batches allow."""
    if not 1 <= count <= n_batches:
        raise UserError(f"--shards {count}: a recording of {n_batches} batch(es) splits into 1 to {n_batches} shards "
                        "(a shard holds whole batches; lower --batch-size for more)")
    edges = [i * n_batches // count for i in range(count + 1)]
    return list(zip(edges[:-1], edges[1:]))


def shard_meta(index: int, count: int, first_batch: int, first_prompt: int, n_total: int, batch_size: int) -> dict:
    """The `shard` root attribute of shard `index` (part of its identity when it is resumed)."""
    return {"index": int(index), "count": int(count), "first_batch": int(first_batch),
            "first_prompt": int(first_prompt), "n_total": int(n_total), "batch_size": int(batch_size)}


def check_outputs(out, paths: list[Path], resume: bool) -> list[str]:
    """Refuse what a sharded run must not touch, before any work; returns, per shard, 'done'
    (complete: kept), 'resume' (its .partial continues) or 'new'."""
    out = Path(out)
    if out.exists():
        raise UserError(f"{out} exists; remove it or choose another --out")
    states = []
    for p in paths:
        part = partial_path(p)
        if not resume and (p.exists() or part.exists()):
            found = p if p.exists() else part
            raise UserError(f"{found} exists from an earlier run; pass --resume to continue it or delete it")
        states.append("done" if p.exists() else "resume" if part.exists() else "new")
    if resume and all(s == "new" for s in states):
        raise UserError(f"nothing to resume: no shard of {out} ({paths[0].name}, ...) nor its .partial exists")
    return states


@dataclass(kw_only=True)
class ShardSource(PromptSource):
    """Batches [first_batch, first_batch + n_batches) of another source as a source of their own: batch i
    of the shard is batch first_batch + i of the whole (same tasks, same task ids), so a shard holds
    exactly the rows the single-file recording holds there (made by `of`)."""

    whole: PromptSource
    """The source of the whole run."""
    first_batch: int
    """The whole run's index of the shard's first batch."""
    whole_batch_size: int
    """Prompts per batch of the whole run."""

    @classmethod
    def of(cls, whole: PromptSource, first_batch: int, stop_batch: int, batch_size: int) -> "ShardSource":
        lo, hi = first_batch * batch_size, min(stop_batch * batch_size, whole.n_total)
        return cls(config=whole.config, arrays=whole.arrays, n_total=hi - lo, seed=whole.seed,
                   task_note=whole.task_note, sha256=whole.sha256, gamma=whole.gamma, whole=whole,
                   first_batch=first_batch, whole_batch_size=batch_size)

    @property
    def first_prompt(self) -> int:
        return self.first_batch * self.whole_batch_size

    def task_ids(self, start: int, stop: int) -> np.ndarray:
        return self.whole.task_ids(start + self.first_prompt, stop + self.first_prompt)

    def batch(self, index: int, start: int, stop: int) -> dict[str, np.ndarray]:
        return self.whole.batch(index + self.first_batch, start + self.first_prompt, stop + self.first_prompt)

    def where(self, index: int, start: int, stop: int, batch_size: int) -> str:
        """The place of the shard's batch in the whole run (the last shard's batch size may be smaller)."""
        return self.whole.where(index + self.first_batch, start + self.first_prompt, stop + self.first_prompt,
                                self.whole_batch_size)


@dataclass(frozen=True)
class Shard:
    """One shard of a run: its file, its `shard` root attribute, its prompts, and what earlier runs left
    of it ('done': complete, kept; 'resume': its .partial continues; 'new')."""

    path: Path
    meta: dict
    source: ShardSource
    state: str


def plan(out, source: PromptSource, batch_size: int, count: int, resume: bool) -> list[Shard]:
    """The `count` shards of recording `source` in batches of `batch_size` into the master `out`: whole
    batches each (`batch_ranges`), checked against what earlier runs left before any work (`check_outputs`)."""
    return [Shard(path, meta, ShardSource.of(source, b0, b1, batch_size), state)
            for path, meta, (b0, b1), state in plan_files(out, source.n_total, batch_size, count, resume)]


def plan_files(out, n_total: int, batch_size: int, count: int,
               resume: bool) -> list[tuple[Path, dict, tuple[int, int], str]]:
    """(file, `shard` attribute, the whole run's batches [first, stop) it holds, state) of each of the `count`
    shards of a run of `n_total` rows: `plan` without the prompts (the episode recorder's rows are histories)."""
    ranges = batch_ranges(-(-n_total // batch_size), count)
    paths = shard_paths(out, count)
    states = check_outputs(out, paths, resume)
    return [(path, shard_meta(i, count, b0, b0 * batch_size, n_total, batch_size), (b0, b1), state)
            for i, (path, (b0, b1), state) in enumerate(zip(paths, ranges, states))]


def _same(a, b) -> bool:
    """Two attribute values alike once JSON-decoded (`Recording.attr`): what a stored attribute is compared by
    (a run's own value may still be the JSON text it is stored as, e.g. a probe spec's `to_json()`)."""
    return (json.dumps(json_clean(json_decoded(a)), sort_keys=True)
            == json.dumps(json_clean(json_decoded(b)), sort_keys=True))


def check_done(path: Path, meta: dict, run_meta: dict | None = None, keys: tuple[str, ...] = ()) -> dict:
    """A shard found complete on --resume: it must be the shard this run would write (its `shard` attribute,
    and the root attributes `keys` of the run's `run_meta`: what a resumed .partial's writer checks)."""
    with Recording(path) as rec:
        have = rec.attr(SHARD_ATTR)
        if have != meta:
            raise UserError(f"cannot resume: {path} is not shard {meta['index']} of this run "
                            f"(its shard attribute is {json.dumps(have)})")
        for key in keys:
            if key in (run_meta or {}) and not _same(rec.attr(key), run_meta[key]):
                raise UserError(f"cannot resume: {path} was recorded with a different {key}; delete it to record "
                                "that shard again")
        hooks = {h: list(rec.shape(h)[1:]) for h in rec.hooks()}
        return {"n_prompts": rec.n_prompts, "bytes": 0, "resumed_from": rec.n_prompts, "notes": [], "hooks": hooks}


# ------------------------------------------------------------------ running the shards
def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(1)


def _die_with_parent(parent: int) -> None:
    """Make this forked worker die with the process `parent` that forked it, SIGKILL included (a
    writer outliving its run would go on writing files a --resume is about to take over): Linux's
    PR_SET_PDEATHSIG (the fork happens in the thread that waits for the workers, so that thread's end
    is the run's), then a check for a parent that died before it was set; elsewhere a thread that
    watches os.getppid()."""
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            raise OSError(ctypes.get_errno(), "prctl failed")
    except (OSError, AttributeError):  # not Linux
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:
        os._exit(1)


def _child(fn: Callable[[int], dict], index: int, conn, threads: int, parent: int) -> None:
    """A forked worker: run shard `index`, send back JSON (never a pickle)."""
    _die_with_parent(parent)
    import torch
    from tqdm.std import TqdmDefaultWriteLock, tqdm

    tqdm.set_lock(TqdmDefaultWriteLock())  # the parent's progress thread may have held the old one at the fork
    torch.set_num_threads(threads)
    try:
        reply = {"ok": fn(index)}
    except UserError as e:
        reply = {"error": str(e)}
    except BaseException as e:  # noqa: BLE001 - a bug: the parent raises it with this traceback
        reply = {"error": one_line(e), "traceback": traceback.format_exc()}
    conn.send_bytes(json.dumps(reply).encode())
    conn.close()


def run(fn: Callable[[int], dict], count: int, workers: int | None, labels: list[str], progress=None) -> list[dict]:
    """[fn(i) for i in range(count)]: in `workers` forked processes at a time (None: one per shard up
    to the CPU count; 0 or 1: one after another in this process). `fn` returns JSON-able dicts.
    Every shard runs even when one fails (its finished work is kept); then the first failure is
    raised, naming its shard (`labels[i]`). `progress(result)` is called as each shard finishes."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    if workers is None:
        workers = min(count, os.cpu_count() or 1)
    if workers <= 1 or "fork" not in mp.get_all_start_methods():
        results = []
        for i in range(count):
            try:
                results.append(fn(i))
            except UserError as e:
                raise UserError(f"{labels[i]}: {e}") from None
            if progress is not None:
                progress(results[-1])
        return results
    ctx = mp.get_context("fork")  # the children inherit the model: nothing is pickled
    threads = max(1, (os.cpu_count() or 1) // workers)
    replies: dict[int, dict] = {}
    running: dict = {}
    pending = list(range(count))
    try:
        while pending or running:
            while pending and len(running) < workers:
                i = pending.pop(0)
                reader, writer = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child, args=(fn, i, writer, threads, os.getpid()), daemon=True)
                proc.start()
                writer.close()
                running[reader] = (i, proc)
            for reader in wait(list(running)):
                i, proc = running.pop(reader)
                try:
                    replies[i] = json.loads(reader.recv_bytes())
                except EOFError:  # killed, or died in C code
                    proc.join()
                    replies[i] = {"error": f"its worker process died (exit status {proc.exitcode}); "
                                           "--resume continues it"}
                reader.close()
                proc.join()
                if "ok" in replies[i] and progress is not None:
                    progress(replies[i]["ok"])
    finally:
        for reader, (_, proc) in running.items():  # interrupted: stop the others (their .partial stays)
            proc.terminate()
            proc.join()
            reader.close()
    for i in range(count):
        reply = replies[i]
        if "traceback" in reply:
            raise RuntimeError(f"{labels[i]} failed:\n{reply['traceback']}")
        if "error" in reply:
            raise UserError(f"{labels[i]}: {reply['error']}")
    return [replies[i]["ok"] for i in range(count)]


# ------------------------------------------------------------------ the master file
def shard_entry(path: Path, rec: Recording) -> dict:
    """The master's record of one shard (checked by every reader of the master)."""
    shard = rec.attr(SHARD_ATTR)
    return {"file": path.name, "first_prompt": int(shard["first_prompt"]), "n_prompts": int(rec.n_prompts),
            "bytes": os.path.getsize(path), "integrity_sha256": integrity_digest(rec.f)}


def _datasets(f: h5py.File) -> tuple[list[str], dict[str, h5py.Dataset]]:
    groups, datasets = [], {}
    f.visititems(lambda name, obj: datasets.__setitem__(name, obj) if isinstance(obj, h5py.Dataset)
                 else groups.append(name))
    datasets.pop("progress", None)
    return groups, datasets


def _per_prompt(ds: h5py.Dataset) -> bool:
    """A dataset with one row per prompt (appended batch by batch), not a static one ('params', ...)."""
    return ds.maxshape is not None and len(ds.maxshape) > 0 and ds.maxshape[0] is None


def write_master(out, paths: list[Path]) -> Path:
    """Join complete shards into the master file `out` (atomically: a temporary sibling, fsync,
    rename). Every shard is opened with all the reader's checks first; they must agree on what
    was recorded (`AGREE`), follow each other without gap, and hold the same datasets."""
    out = Path(out)
    recs: list[Recording] = []
    try:
        for p in paths:
            recs.append(Recording(p))
        first = recs[0]
        for p, rec in zip(paths[1:], recs[1:]):
            for key in (*AGREE, SHARD_ATTR):
                mine, theirs = rec.attr(key), first.attr(key)
                if key == SHARD_ATTR:  # the same run: count, batch size and total agree
                    mine, theirs = ({k: v for k, v in d.items() if k in ("count", "n_total", "batch_size")}
                                    if isinstance(d, dict) else d for d in (mine, theirs))
                if not _same(mine, theirs):
                    raise UserError(f"{p} was recorded with a different {key} than {paths[0]}; "
                                    "delete the stale shard and --resume")
        entries = [shard_entry(p, r) for p, r in zip(paths, recs)]
        n_total = int(first.attr(SHARD_ATTR)["n_total"])
        at = 0
        for p, e in zip(paths, entries):
            if e["first_prompt"] != at:
                raise UserError(f"{p} starts at prompt {e['first_prompt']}, expected {at}")
            at += e["n_prompts"]
        if at != n_total:
            raise UserError(f"the shards of {out} hold {at} prompts, the run has {n_total}")
        groups, datasets = _datasets(first.f)
        with atomic_path(out, suffix=".tmp") as tmp:
            with h5py.File(tmp, "w", libver="latest") as f:
                for key, value in first.f.attrs.items():
                    if key not in PER_SHARD:
                        f.attrs[key] = value
                f.attrs["n_total"] = n_total
                f.attrs[SHARDS] = json.dumps(entries)
                f.attrs["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
                f.attrs["complete"] = True
                f.attrs["n_prompts"] = n_total
                f.create_dataset("progress", data=np.array([n_total], dtype=np.int64))
                for name in groups:
                    f.require_group(name)
                for name, ds in datasets.items():
                    _join(f, name, ds, paths, recs, entries, n_total)
                seal(f)
            kill_point("shards.publish")
    finally:
        for rec in recs:
            rec.close()
    return out


def _join(f: h5py.File, name: str, ds: h5py.Dataset, paths, recs, entries, n_total: int) -> None:
    """One dataset of the master: the shards' rows in order (per-prompt), or shard 0's (static)."""
    if ds.ndim == 0:
        f.create_dataset(name, data=ds[()])
    else:
        shape = (n_total, *ds.shape[1:]) if _per_prompt(ds) else ds.shape
        layout = h5py.VirtualLayout(shape=shape, dtype=ds.dtype)
        for p, rec, e in zip(paths, recs, entries) if _per_prompt(ds) else [(paths[0], recs[0], entries[0])]:
            if name not in rec.f:
                raise UserError(f"{p} has no {name}, which {paths[0]} has")
            src = rec.f[name]
            if src.dtype != ds.dtype or src.shape[1:] != ds.shape[1:]:
                raise UserError(f"{p}: {name} has {src.dtype} {src.shape[1:]}, {paths[0]} has {ds.dtype} {ds.shape[1:]}")
            source = h5py.VirtualSource(p.name, name, shape=src.shape)  # relative: found beside the master
            if _per_prompt(ds):
                layout[e["first_prompt"] : e["first_prompt"] + src.shape[0]] = source
            else:
                layout[...] = source
        f.create_virtual_dataset(name, layout)
    for key, value in ds.attrs.items():
        f[name].attrs[key] = value
