"""`recording.writeback.WriteBehind`: the writer starts the writeback of each step and waits only for the
previous step's (sync_file_range on Linux), fdatasync where sync_file_range is missing, and a disk error is
raised, never dropped."""
import ctypes
import errno
import os
import sys

import pytest

from icrl_interp.recording import writeback
from icrl_interp.recording.writeback import WAIT_AFTER, WAIT_BEFORE, WRITE, WriteBehind


def _file(tmp_path):
    f = open(tmp_path / "f.bin", "wb")
    return f, f.fileno()


def test_each_call_waits_for_the_previous_step_and_starts_the_next(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(writeback, "SYNC_FILE_RANGE", lambda *a: calls.append(a) or 0)
    f, fd = _file(tmp_path)
    with f:
        behind = WriteBehind(fd)
        for size in (1000, 5000):
            f.write(b"x" * (size - f.tell()))
            f.flush()
            behind()
    # first step: nothing to wait for, start everything; second: wait for the first step's bytes, start the rest
    assert calls == [(fd, 0, 0, WRITE), (fd, 0, 1000, WAIT_BEFORE | WRITE | WAIT_AFTER), (fd, 0, 0, WRITE)]


def test_without_sync_file_range_it_fdatasyncs(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(writeback, "SYNC_FILE_RANGE", None)
    monkeypatch.setattr(writeback.os, "fdatasync", synced.append)
    f, fd = _file(tmp_path)
    with f:
        WriteBehind(fd)()
    assert synced == [fd]


def test_a_disk_error_is_raised(tmp_path, monkeypatch):
    def failing(*a):
        ctypes.set_errno(errno.EIO)
        return -1

    monkeypatch.setattr(writeback, "SYNC_FILE_RANGE", failing)
    f, fd = _file(tmp_path)
    with f, pytest.raises(OSError, match="sync_file_range") as e:
        WriteBehind(fd)()
    assert e.value.errno == errno.EIO


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_linux_uses_sync_file_range_and_the_bytes_stay(tmp_path):
    assert writeback.SYNC_FILE_RANGE is not None  # found in libc, not silently the fdatasync fallback
    f, fd = _file(tmp_path)
    data = os.urandom(3 * 4096 + 5)
    with f:
        behind = WriteBehind(fd)
        for part in (data[:4096], data[4096:]):
            f.write(part)
            f.flush()
            behind()
    assert (tmp_path / "f.bin").read_bytes() == data  # exact: bytes
