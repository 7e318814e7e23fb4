"""Thread discipline: BLAS, OpenMP and torch intra-op threads at most the cores this process may use.

numpy's OpenBLAS and torch each start one thread per core of the machine, whatever the process may
use: a process pinned to one core (`taskset`, a cgroup's cpuset, a Slurm job) or sharing the machine
with other jobs then runs two threads on that core, and on the project's loaded 2-core machine one
analysis used 7-11x more CPU than with one BLAS thread (docs/benchmarks.md). `limited()` caps every
thread pool for the duration of a block at

* `ICRL_INTERP_THREADS` (an integer >= 1), when set: the count, exactly (also above the cores, e.g.
  to measure oversubscription);
* else the cores in the process's CPU affinity (`os.sched_getaffinity`; `os.cpu_count()` where the
  platform has no affinity), never more, and never more than a pool already had: a limit the user
  set (`OPENBLAS_NUM_THREADS=1`, `torch.set_num_threads(1)`) stays.

The analyzers' entry points (`analyze.analyze`, `analyze.analyze_model`) run inside it with their BLAS / OpenMP pools
one thread short (`busy=1`: their reader thread, `ahead`, has a core of its own), and the previous limits are
restored afterwards. The pools are found by threadpoolctl (every BLAS and OpenMP
library loaded in the process); torch's intra-op pool is set through torch, and only if torch is
imported already: capping threads never imports it.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager

from .errors import UserError

ENV = "ICRL_INTERP_THREADS"
"""Environment variable that sets the thread count of every pool, overriding the affinity."""


def allowed_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def override() -> int | None:
    """`ICRL_INTERP_THREADS` as a positive integer; None when unset or empty."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise UserError(f"{ENV} must be a positive integer (threads per pool), got {raw!r}")
    return n


def target(current: int) -> int:
    """The thread count for a pool that has `current` threads now."""
    forced = override()
    return forced if forced is not None else max(1, min(current, allowed_cores()))


@contextmanager
def limited(busy: int = 0):
    """Every BLAS / OpenMP pool and torch's intra-op pool capped (`target`) inside the block, restored after.

    `busy`: threads of the package's own that work beside the BLAS / OpenMP pools (the analyzers' reader thread,
    `ahead`): those pools get that many fewer (at least 1), so the reader and the pools never compete for a core. On
    2 cores an analysis of a 1.19 GB recording took 4.4 s with 2 BLAS threads beside its reader and 3.7 s with 1
    (docs/benchmarks.md). torch's pool keeps `target`; `beside` takes it one short where its forward passes run in
    the reader. `ICRL_INTERP_THREADS` sets every count exactly."""
    from threadpoolctl import ThreadpoolController

    pools = [(lib, lib.num_threads) for lib in ThreadpoolController().lib_controllers]
    torch = sys.modules.get("torch")
    torch_before = torch.get_num_threads() if torch is not None else None
    forced = override()
    try:
        for lib, before in pools:
            lib.set_num_threads(forced if forced is not None else max(1, target(before) - busy))
        if torch is not None:
            torch.set_num_threads(target(torch_before))
        yield
    finally:
        for lib, before in pools:
            lib.set_num_threads(before)
        if torch is not None:
            torch.set_num_threads(torch_before)


@contextmanager
def beside(busy: int = 1):
    """torch's intra-op pool at `target` minus `busy` threads (at least 1) inside the block, restored after:
    the cores left beside `busy` threads of the package's own that work alongside the forward passes (the
    recorder's writer thread), so the two never compete for a core (on 2 cores, 2 torch threads beside the
    writer made a recording 2.4x slower than 1: docs/benchmarks.md). `ICRL_INTERP_THREADS` sets the count
    exactly. Nothing is imported: without torch loaded this does nothing."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    if torch is not None:
        forced = override()
        torch.set_num_threads(forced if forced is not None else max(1, target(before) - busy))
    try:
        yield
    finally:
        if torch is not None:
            torch.set_num_threads(before)


@contextmanager
def spread():
    """`run(fn, items)` -> [fn(item) for item in items], on as many threads as the process may use cores
    (`target(allowed_cores())`) with every BLAS / OpenMP pool at one thread meanwhile, so n threads use n cores and
    never more; inline where that is one. For independent items whose work is numpy's (its GEMMs and ufunc loops
    release the GIL) once nothing else of the package's runs beside it: the TD probes' held-out scoring and bootstrap
    after the reader thread has ended. Each item's numbers are those of the same call in one thread; `run` returns
    when every item is done (the first error raised), so items of one call may share nothing they write."""
    n = target(allowed_cores())
    if n <= 1:
        yield lambda fn, items: [fn(item) for item in items]
        return
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_limits

    with threadpool_limits(1), ThreadPoolExecutor(n, thread_name_prefix="icrl-interp-spread") as pool:
        yield lambda fn, items: list(pool.map(fn, items))


def ahead(fn, items, depth: int = 1, waiting=None):
    """`fn(item)` for each item, in order; with a core to spare (`target(allowed_cores())` > 1) the next `depth`
    items are computed in a thread while the caller works on this one (the analyzers' reads: h5py releases the GIL
    while HDF5 reads, so reading chunk k + 1 overlaps the analysis of chunk k, at the cost of `depth` results more
    in memory; a live recording reads two ahead, `Recording.read_ahead`). An error of `fn` is raised at its item;
    none of `fn` runs after the caller stops, beyond the items already queued. `waiting` (a threading.Event), when
    given, is set while the caller waits for an item not done yet, so `fn` can tell that it is holding the caller up."""
    items = list(items)
    if target(allowed_cores()) <= 1 or len(items) < 2:
        yield from (fn(item) for item in items)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    depth = max(1, int(depth))
    pool = ThreadPoolExecutor(1, thread_name_prefix="icrl-interp-reader")
    try:
        pending = deque(pool.submit(fn, item) for item in items[:depth])
        for nxt in items[depth:]:
            done = _result(pending.popleft(), waiting)
            pending.append(pool.submit(fn, nxt))
            yield done
        while pending:
            yield _result(pending.popleft(), waiting)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # no read outlives the caller's file handles


def _result(future, waiting):
    """future.result(), with `waiting` set meanwhile where it is given and the result not ready."""
    if waiting is None or future.done():
        return future.result()
    waiting.set()
    try:
        return future.result()
    finally:
        waiting.clear()
