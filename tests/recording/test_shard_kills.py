"""A sharded recording SIGKILLed in each phase (shards, publish) resumes to the uninterrupted recording.

The recording runs in a forked child of the test process (`_slow_child.main`: a model that sleeps 10 ms
per layer, so each of the two shards takes a few tenths of a second), which forks one writer per shard.

- shards: the test SIGKILLs the run's own process once both writers have a batch in their .partial.
  The writers must die with it (a writer that lived on would finish and publish its shard while a
  --resume takes it over): no process of the run survives and both shards stay unpublished.
- publish: the run SIGKILLs itself with the master written to its temporary file and not yet renamed
  (`ICRL_INTERP_KILL_AT=shards.publish`, icrl_interp/core/faults.py); the resume removes that file.

Either way `--resume` gives the uninterrupted recording's datasets, and leaves no .partial, temporary
or lock file.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import psutil
import pytest

from icrl_interp.core import faults, files
from icrl_interp.recording import shards
from icrl_interp.core.errors import UserError
from icrl_interp.recording.format import partial_path

from . import _slow_child
from .test_recorder import _progress
from .test_shards import _same_datasets

N = 320  # 20 batches of 16: two shards of 10
FORK = mp.get_context("fork")


def _record(out, resume=False, workers=2):
    _slow_child.main(str(out), N, resume, shards=2, workers=workers)


def _record_killed_at(point: str, out) -> None:
    os.environ[faults.ENV] = point
    _record(out)  # returning (exit status 0) means the kill point was never reached


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("shard-ref") / "ref.h5"
    _record(out)
    return out


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _resumes_to_the_reference(reference, out) -> None:
    assert shards.lock_path(out).is_file()  # the killed run's lock, free now: taken over
    _record(out, resume=True)
    _same_datasets(reference, out)
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name, *(p.name for p in shards.shard_paths(out, 2))]


def kill_mid_shards(proc, parts, rows: int) -> None:
    """SIGKILL the run `proc` once each of its shards' .partial holds `rows`; its writers must die with it (also
    test_episodes_kills.py)."""
    deadline = time.monotonic() + 120
    while min(_progress(partial_path(p)) for p in parts) < rows and proc.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    writers = psutil.Process(proc.pid).children()
    assert min(_progress(partial_path(p)) for p in parts) >= rows and len(writers) == len(parts), "not killed mid-shard"
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    deadline = time.monotonic() + 10
    while _alive(writers) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _alive(writers) == [], "a shard writer outlived its killed run"


def test_writers_die_with_a_killed_run_and_the_shards_resume(reference, tmp_path):
    out = tmp_path / "k.h5"
    parts = shards.shard_paths(out, 2)
    proc = FORK.Process(target=_record, args=(out,))
    proc.start()
    kill_mid_shards(proc, parts, 16)
    # a writer that had lived on would have finished and published its shard by now
    assert all(partial_path(p).exists() and not p.exists() for p in parts)
    assert not out.exists()
    _resumes_to_the_reference(reference, out)


def test_a_run_killed_while_publishing_resumes_and_removes_its_temporary_master(reference, tmp_path):
    out = tmp_path / "k.h5"
    proc = FORK.Process(target=_record_killed_at, args=("shards.publish", out))
    proc.start()
    proc.join(120)
    assert proc.exitcode == -signal.SIGKILL, f"not killed while publishing (exit {proc.exitcode})"
    assert all(p.exists() for p in shards.shard_paths(out, 2)) and not out.exists()
    assert len(shards.stale_masters(out)) == 1  # the joined master, never renamed into place
    _resumes_to_the_reference(reference, out)


def test_a_run_never_writes_beside_a_live_run_of_the_same_recording(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "LOCK_WAIT_S", 0.05)
    out = tmp_path / "r.h5"
    with files.locked(shards.lock_path(out), "another run"):  # a live run of `out` (this process holds it)
        for resume in (False, True):
            with pytest.raises(UserError, match=rf"the recording {out} is being written by process {os.getpid()} "):
                _slow_child.main(str(out), 64, resume, shards=2, workers=0)
    assert list(tmp_path.iterdir()) == []


def test_leftovers_are_only_what_killed_runs_of_this_recording_leave(tmp_path):
    out = tmp_path / "r.h5"
    ours = [".r.h5.abcd_123.tmp",  # a temporary master, killed before h5py wrote
            ".r.h5.efgh_456.tmp",  # ... and after
            "r.h5.partial.new", "r.h5.partial.resume",  # a writer's scratch files: before its first batch, a resume copy
            "r.shard-0-of-2.h5.partial.new", "r.shard-10-of-12.h5.partial.resume"]
    others = [".r.h5.ijkl_789.tmp",  # not an HDF5 file: not provably ours
              ".r.h5.toolong12.tmp",  # not mkstemp's 8 characters
              ".other.h5.abcd_123.tmp", "other.h5.partial.new", "r.h5.partial", "r.shard-0-of-2.h5.partial",
              "r.shard-0-of-2.h5.partial.old"]
    for name in ours + others:
        (tmp_path / name).write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64 if name == ".r.h5.efgh_456.tmp" else
                                      b"notes" if name == ".r.h5.ijkl_789.tmp" else b"")
    assert sorted(p.name for p in shards.leftovers(out)) == sorted(ours)
