"""`recording.writeback.WriteBehind`: each call waits for the sync the previous one started and starts the next in
a thread of its own (at most one in flight); `close` waits for it; a disk error is raised, never dropped. And the
recording writer: its descriptor is never closed under a sync, and `finish` fails on a sync's disk error."""
import errno
import os
import threading
import time

import numpy as np
import pytest

from icrl_interp.recording import format as fmt
from icrl_interp.recording import writeback
from icrl_interp.recording.format import RecordingWriter, partial_path
from icrl_interp.recording.writeback import WriteBehind

PAUSE = 0.3
"""Seconds a test gives a wrong implementation to show itself (a call that should block but does not)."""


class GatedSync:
    """A fake FDATASYNC: each sync records its fd and thread, then waits until the test releases it."""

    def __init__(self):
        self.started, self.finished, self.threads = [], [], []
        self.release = threading.Semaphore(0)

    def __call__(self, fd):
        self.started.append(fd)
        self.threads.append(threading.get_ident())
        assert self.release.acquire(timeout=30)
        self.finished.append(fd)


def _in_thread(fn):
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def test_a_call_returns_while_its_sync_runs_and_the_next_waits_for_it(tmp_path, monkeypatch):
    sync = GatedSync()
    monkeypatch.setattr(writeback, "FDATASYNC", sync)
    behind = WriteBehind(7)
    behind()  # returns with the sync still held: it runs in another thread
    deadline = time.monotonic() + 10
    while not sync.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sync.started == [7] and sync.finished == [] and threading.get_ident() not in sync.threads
    second = _in_thread(behind)
    time.sleep(PAUSE)
    assert second.is_alive() and sync.started == [7]  # the second call waits for the first sync: one in flight
    sync.release.release()
    second.join(10)
    assert not second.is_alive()
    closer = _in_thread(behind.close)
    time.sleep(PAUSE)
    assert closer.is_alive() and sync.finished == [7]  # close waits for the sync the second call started
    sync.release.release()
    closer.join(10)
    assert not closer.is_alive() and sync.finished == [7, 7]
    behind.close()  # idempotent


@pytest.mark.parametrize("where", ["next call", "close"])
def test_a_disk_error_is_raised_by_the_next_call_or_by_close(monkeypatch, where):
    def failing(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(writeback, "FDATASYNC", failing)
    behind = WriteBehind(7)
    behind()
    with pytest.raises(OSError) as e:
        behind() if where == "next call" else behind.close()
    assert e.value.errno == errno.EIO
    behind.close()  # the error was handed over once; the thread stops


def test_a_real_sync_keeps_the_bytes(tmp_path):
    data = os.urandom(3 * 4096 + 5)
    with open(tmp_path / "f.bin", "wb") as f:
        behind = WriteBehind(f.fileno())
        for part in (data[:4096], data[4096:]):
            f.write(part)
            f.flush()
            behind()
        behind.close()
    assert (tmp_path / "f.bin").read_bytes() == data  # exact: bytes


META = {"model": "m", "seed": 0, "batch_size": 4, "n_total": 8}


def _write_two_batches(out):
    w = RecordingWriter(out, dict(META))
    batch = {"acts/x": np.ones((4, 64), dtype=np.float32), "prompts/task_id": np.arange(4)}
    w.write_batch(batch)
    w.write_batch({k: v + 4 for k, v in batch.items()})
    return w


def test_the_writer_never_closes_its_file_under_a_sync(tmp_path, monkeypatch):
    """A slow sync is still running when the last batch is written: `finish` and `close` wait for it before the
    HDF5 file (and its descriptor) closes."""
    log = []

    def slow(fd):
        time.sleep(PAUSE)
        os.fstat(fd)  # EBADF if the descriptor were closed already
        log.append("sync done")

    monkeypatch.setattr(writeback, "FDATASYNC", slow)
    monkeypatch.setattr(fmt, "SYNC_BYTES", 1)  # a sync after every dataset written
    real_close = fmt.h5py.File.close
    monkeypatch.setattr(fmt.h5py.File, "close", lambda self: (log.append("file closed"), real_close(self))[1])
    for end in ("finish", "close"):
        log.clear()
        out = tmp_path / f"{end}.h5"
        w = _write_two_batches(out)
        getattr(w, end)()
        first_close = log.index("file closed")
        assert "sync done" in log[:first_close] and "sync done" not in log[first_close:]
        assert out.exists() == (end == "finish") and partial_path(out).exists() == (end == "close")


def test_a_sync_error_fails_the_recording_and_close_leaves_the_partial_file(tmp_path, monkeypatch):
    failed = []

    def failing_last(fd):  # the sync started by the last dataset of the last batch fails
        if len(failed) == 3:
            raise OSError(errno.EIO, "Input/output error")
        failed.append(fd)

    monkeypatch.setattr(writeback, "FDATASYNC", failing_last)
    monkeypatch.setattr(fmt, "SYNC_BYTES", 1)
    out = tmp_path / "r.h5"
    w = _write_two_batches(out)  # four syncs started; the fourth fails in its thread
    with pytest.raises(OSError) as e:
        w.finish()
    assert e.value.errno == errno.EIO and not out.exists()  # never published after a disk error
    w.close()  # the failure path: no second error, the partial file stays for --resume
    assert partial_path(out).exists()
