"""Write-behind: the disk writes a recording's batches while the writer thread copies the next ones into the
page cache, and the final fsync finds little left to write.

The writer used to `fdatasync` every `format.SYNC_BYTES`: each call waits until the disk holds everything
written so far and commits the file system's journal (the file grew), and the writer copies nothing
meanwhile, so its time per batch was the copy plus the disk plus a journal commit. On Linux
`sync_file_range` starts the writeback of the dirty pages without waiting and without touching the
journal; `WriteBehind` then waits only for the writeback it started one call earlier, so the disk writes
batch k while the writer copies batch k + 1, and at most two steps of the file are dirty at a time. Where
`sync_file_range` is missing (macOS, Windows) it `fdatasync`s, as before.

Neither is a durability guarantee (sync_file_range writes no metadata and flushes no disk cache; the
periodic fdatasync never ordered the data before /progress either): a recording is on the disk when
`RecordingWriter.finish` has fsynced it, before the rename that publishes it.
No torch here.
"""
from __future__ import annotations

import ctypes
import os
import sys

WAIT_BEFORE, WRITE, WAIT_AFTER = 1, 2, 4
"""sync_file_range's flags (linux/fs.h)."""


def _sync_file_range():
    """libc's sync_file_range(fd, offset, nbytes, flags), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range  # ctypes releases the GIL during the call
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


SYNC_FILE_RANGE = _sync_file_range()


class WriteBehind:
    """Call after each step of writes to file descriptor `fd`: waits for the writeback the previous call
    started, then starts the writeback of everything dirty now (`fdatasync` where the platform lacks
    sync_file_range). Raises OSError when the disk reports an error."""

    def __init__(self, fd: int):
        self.fd = fd
        self.started = 0
        """The file's size at the previous call: bytes [0, started) are being written back."""

    def __call__(self) -> None:
        if SYNC_FILE_RANGE is None:
            os.fdatasync(self.fd)
            return
        size = os.fstat(self.fd).st_size
        if self.started:  # wait for the previous step (pages rewritten since then are written too)
            self._call(0, self.started, WAIT_BEFORE | WRITE | WAIT_AFTER)
        self._call(0, 0, WRITE)  # nbytes 0: to the end of the file; returns once the writes are queued
        self.started = size

    def _call(self, offset: int, nbytes: int, flags: int) -> None:
        if SYNC_FILE_RANGE(self.fd, offset, nbytes, flags) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"sync_file_range: {os.strerror(err)}")
