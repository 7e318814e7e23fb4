"""Give freed heap memory back to the operating system between chunks of a long stream.

Streaming analyzers allocate and free arrays of a few hundred KiB to tens of MiB per chunk. glibc's
malloc raises its mmap threshold to the largest block freed so far, so after the first chunks such
arrays come from the brk heap, whose freed middle parts stay resident: measured on a live analysis of
linear-td theta* with 16 MiB chunks, peak RSS rose from 715 MiB at 100,000 prompts to 897 MiB at 200,000
while the Python-visible allocations (tracemalloc) stayed at 84-94 MiB. `malloc_trim(0)` after each chunk
returns those pages (675 MiB at 200,000 prompts, +8 MiB over 100,000). Elsewhere (macOS, musl) it is a
no-op: those allocators return large blocks themselves.

Trimming has a price: the next chunk faults the returned pages in again. `OnGrowth` trims only when the
heap's free bytes have grown (its fragmentation), which is how the analyzers' chunk loop uses it.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.lru_cache(maxsize=None)
def _libc(symbol: str):
    """The C library's function `symbol`, or None where the library or the function is missing."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), symbol) if name else None
    except (OSError, AttributeError):
        return None


def release_free_memory() -> bool:
    """Return the heap's free pages to the OS (glibc's malloc_trim(0)); False where there is no such call."""
    trim = _libc("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.lru_cache(maxsize=1)
def _mallinfo2():
    fn = _libc("mallinfo2")  # glibc >= 2.33
    if fn is not None:
        fn.restype = _MallInfo2
    return fn


def free_heap_bytes() -> int | None:
    """Bytes the heap holds free, resident or not (glibc's mallinfo2 `fordblks`, every arena); None elsewhere."""
    info = _mallinfo2()
    return None if info is None else int(info().fordblks)


class OnGrowth:
    """Trims the heap after a unit of work (a chunk) only when its free bytes have grown more than `slack`
    since the last trim (since the first unit at the start).

    Trimming after every chunk cost more than the trim itself: the next chunk's arrays fault the returned
    pages in again (in the live analysis of docs/benchmarks.md, 0.24 s of 0.73 s of CPU). Without a trim, a
    chunk like the last one reuses the heap's free pages, so they stay resident but do not grow; what grows
    with the prompts is the heap's fragmentation (freed blocks too small for the next arrays, which made peak
    RSS rise with the prompts), and that shows as free bytes growing. Trimming when they have grown by
    `slack` returns the free pages, so the resident free memory stays within about one chunk's arrays plus
    `slack`, whatever the number of chunks. Where the free bytes cannot be read (not glibc), every call trims."""

    def __init__(self, slack: int):
        self.slack = int(slack)
        self.limit: int | None = None
        self.trims = 0

    def __call__(self) -> bool:
        """After a unit of work: trim if the heap's free bytes are past the limit; whether it trimmed."""
        free = free_heap_bytes()
        if free is not None and self.limit is None:
            self.limit = free + self.slack  # the first unit's free pages serve the next units
            return False
        if free is not None and free <= self.limit:
            return False
        self.trims += 1
        done = release_free_memory()
        after = free_heap_bytes()
        self.limit = None if after is None else after + self.slack
        return done
