"""Write-behind: the disk syncs a recording's batches in a thread of its own while the writer thread copies the
next ones into the page cache, so the final fsync finds almost nothing left to write.

Each `WriteBehind` call (the writer makes one per `format.SYNC_BYTES` of batches) waits for the sync the
previous call started, then starts an `fdatasync` of everything written so far in a sync thread and returns. At
most one sync is in flight, so at most two steps of the file are unsynced at any time, and the writer waits for
the disk only when the disk is slower than the copies.

Why a thread and not the kernel's asynchronous writeback: the previous version started the writeback with
Linux's `sync_file_range` and waited only for the previous step's; on the project's virtual disks those waits
returned at once (0.05 s over a 739 MiB recording) and the final fsync still took 0.7-0.9 s, the disk's own
flush of every byte, after the last forward pass (docs/benchmarks.md, "Recorder"). An `fdatasync` in the writer
itself flushes during the run but stops the copies meanwhile (the writer's time was copy + disk); in a thread of
its own the flush overlaps both the copies and the forward passes.

Neither step is a durability guarantee for the batches before /progress (an fdatasync orders nothing against
later writes): a recording is on the disk when `RecordingWriter.finish` has fsynced it, before the rename that
publishes it. `close()` waits for the sync in flight and must come before the file is closed: a sync thread
must never flush a descriptor that was closed (and maybe reused).
No torch here.
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor

FDATASYNC = getattr(os, "fdatasync", os.fsync)
"""fdatasync (the data and the size, not the other metadata); fsync where the platform has none (macOS)."""


class WriteBehind:
    """Call after each step of writes to file descriptor `fd`: waits for the sync the previous call started,
    then starts the sync of everything written so far (`FDATASYNC`) in a thread and returns. A failed sync's
    OSError is raised by the next call or by `close`, never dropped."""

    def __init__(self, fd: int):
        self.fd = fd
        self._pending: Future | None = None
        """The sync in flight."""
        self._pool: ThreadPoolExecutor | None = None

    def __call__(self) -> None:
        self.wait()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="icrl-interp-sync")
        self._pending = self._pool.submit(FDATASYNC, self.fd)

    def wait(self) -> None:
        """Wait for the sync in flight (if any); raise its OSError."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Wait for the sync in flight and stop the thread; raise the sync's OSError. Idempotent."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
