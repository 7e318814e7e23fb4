"""A writer thread with a bounded queue: the HDF5 writes of batch b overlap the forward passes of the
batches after it (torch, numpy's reductions, HDF5's dataset writes and fsync release the GIL).

The recorder (`recorder._stream`) hands each batch to `BackgroundWriter.put`; one thread runs the jobs in
the order they were put. At most `depth` jobs are pending (queued or running): `put` blocks until one
finishes, so memory is bounded by `depth` batches in the writer plus the one the forward pass fills,
whatever the number of prompts (docs/formats.md, "Recordings"). An exception of a job is never
swallowed: `put` and `close` raise it in the caller's thread, and the jobs put after it are dropped,
not run (a batch after a failed one must not be written: /progress would vouch for a gap). When the
caller's own code raises (an interrupt, a refused batch), the jobs already put still run: they hold whole,
checked batches that a `--resume` keeps.
No torch here: `budget` reads DEPTH before torch is imported.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable

DEPTH = 2
"""Batches handed to the writer and not yet written, at most: the recorder keeps DEPTH + 1 buffer sets of
activations (`BUFFER_SETS`), one being filled by the forward pass while the writer holds the others."""
BUFFER_SETS = DEPTH + 1

_STOP = object()


class BackgroundWriter:
    """Run `job()` callables in one thread, in order, at most `depth` pending. Use as a context manager:
    leaving the block waits for every job put (a file is never closed under a write) and then raises a
    job's error, unless the block is left by an exception of its own, which then goes through."""

    def __init__(self, depth: int = DEPTH, name: str = "icrl-interp-writer"):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.depth = depth
        self._slots = threading.BoundedSemaphore(depth)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # bounded by the slots
        self._error: BaseException | None = None
        # daemon: a process never hangs at exit on a writer that was not stopped (the recorder always stops it)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)  # pragma: no mutate
        self._thread.start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not _STOP:
            try:
                if self._error is None:
                    job()
            except BaseException as e:  # handed to the caller by put/close, never dropped
                self._error = e
            finally:
                self._slots.release()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def put(self, job: Callable[[], None]) -> None:
        """Queue `job`; blocks while `depth` jobs are pending (after a failed job the thread skips the rest,
        so a slot always comes). Raises the error of an earlier job."""
        self._slots.acquire()
        if self._error is not None:
            self._slots.release()
            self._raise()
        self._jobs.put(job)

    def close(self) -> None:
        """Wait for every pending job, stop the thread, and raise a job's error."""
        self.stop()
        self._raise()

    def stop(self) -> None:
        """Wait for every pending job and stop the thread; raises nothing."""
        if self._thread.is_alive():
            self._jobs.put(_STOP)
            self._thread.join()

    def __enter__(self) -> "BackgroundWriter":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.close()
        else:
            self.stop()
