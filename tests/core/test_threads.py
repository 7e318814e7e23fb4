"""Thread discipline (icrl_interp/core/threads.py): every BLAS / OpenMP pool and torch's intra-op pool at
most the cores the process may use, inside the analyzers' entry points, and restored afterwards; one core
fewer for torch beside the recorder's writer thread and a live analysis's reader (`beside`), and for the analyzers'
BLAS pools beside their reader (`limited(busy=1)`); the analyzers' reads one item ahead (a live recording's two) in a
thread only where a core is spare (`ahead`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from importlib import import_module
from pathlib import Path

import pytest
import torch
from threadpoolctl import threadpool_info, threadpool_limits

from icrl_interp.core import threads
from icrl_interp.core.errors import UserError
from icrl_interp.core.resources import checkpoints_dir

REPO = Path(__file__).resolve().parents[2]
analyze_mod = import_module("icrl_interp.analyzers.analyze")  # the module (the package exports a function of that name)

CHILD = textwrap.dedent("""
    import json, os
    import numpy
    from threadpoolctl import threadpool_info, threadpool_limits
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})   # this process may use one core
    threadpool_limits(2)                                      # pools as a 2-core machine starts them
    from icrl_interp.core import threads
    pools = lambda: sorted({p["num_threads"] for p in threadpool_info()})
    with threads.limited():
        inside = pools()
    print(json.dumps({"inside": inside, "after": pools()}))
""")  # torch's pool takes the same `target` (test_override_...): not imported here, it costs seconds


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_one_core_affinity_gives_one_thread_per_pool():
    env = {k: v for k, v in os.environ.items() if k != threads.ENV}
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=120,
                         cwd=REPO, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["inside"] == [1]  # thread counts: integers
    assert got["after"] == [2]  # restored


def test_override_sets_the_count_and_a_lower_limit_stays(monkeypatch):
    monkeypatch.setenv(threads.ENV, "3")
    with threadpool_limits(1), threads.limited():
        assert {p["num_threads"] for p in threadpool_info()} == {3}  # exactly the override, above the cores too
        assert torch.get_num_threads() == 3
    monkeypatch.delenv(threads.ENV)
    with threadpool_limits(1), threads.limited():  # a limit the user set (1) is never raised to the cores
        assert {p["num_threads"] for p in threadpool_info()} == {1}
    assert threads.target(10 * threads.allowed_cores()) == threads.allowed_cores()


@pytest.mark.parametrize("bad", ["0", "-2", "two"])
def test_bad_override_is_a_user_error(monkeypatch, bad):
    monkeypatch.setenv(threads.ENV, bad)
    with pytest.raises(UserError, match=threads.ENV):
        threads.target(2)


def test_entry_points_run_limited(monkeypatch):
    """`analyze` and `analyze_model` run their work with the pools capped (here by the override, 1)."""
    seen = []
    monkeypatch.setenv(threads.ENV, "1")
    monkeypatch.setattr(analyze_mod, "_analyze_checkpoint",
                        lambda path, opts: seen.append({p["num_threads"] for p in threadpool_info()}) or {})
    monkeypatch.setattr(analyze_mod, "analyze_open",
                        lambda rec, opts, **kw: seen.append({p["num_threads"] for p in threadpool_info()}) or {})
    ckpt = checkpoints_dir() / "linear-td"
    with threadpool_limits(2):
        analyze_mod.analyze(ckpt)
        analyze_mod.analyze_model(analyze_mod_model(), "linear-td", task_options={"d": 2, "n": 4}, tasks=4,
                                  batch_size=4, baseline="none")
    assert seen == [{1}, {1}]  # thread counts: integers


def test_entry_points_leave_their_reader_thread_a_core(monkeypatch):
    """Without the override, `analyze` and `analyze_model` run the BLAS pools one thread short of the cores (4 here:
    3), so the reader thread that reads ahead (`ahead`) has a core of its own, and restore them after; one core stays
    one thread. Kills `busy` dropped from either entry point or ignored by `limited`."""
    blas = lambda: {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}  # noqa: E731
    monkeypatch.delenv(threads.ENV, raising=False)
    seen = []
    monkeypatch.setattr(analyze_mod, "_analyze_checkpoint", lambda path, opts: seen.append(blas()) or {})
    monkeypatch.setattr(analyze_mod, "analyze_open", lambda rec, opts, **kw: seen.append(blas()) or {})
    ckpt = checkpoints_dir() / "linear-td"
    for cores, want in ((4, {3}), (1, {1})):
        monkeypatch.setattr(threads, "allowed_cores", lambda cores=cores: cores)
        with threadpool_limits(4, user_api="blas"):
            analyze_mod.analyze(ckpt)
            analyze_mod.analyze_model(analyze_mod_model(), "linear-td", task_options={"d": 2, "n": 4}, tasks=4,
                                      batch_size=4, baseline="none")
            assert blas() == {4}  # restored
        assert seen == [want, want], cores  # thread counts: integers
        seen.clear()


def analyze_mod_model():
    from icrl_interp.models import theta_star_model

    return theta_star_model("linear-td", d=2, n_layers=1)


@pytest.mark.parametrize("current, cores, env, want", [(4, 4, None, 3), (8, 2, None, 1), (1, 4, None, 1),
                                                        (4, 4, "3", 3)])
def test_beside_leaves_the_writer_its_core(monkeypatch, current, cores, env, want):
    monkeypatch.setattr(threads, "allowed_cores", lambda: cores)
    if env is None:
        monkeypatch.delenv(threads.ENV, raising=False)
    else:
        monkeypatch.setenv(threads.ENV, env)  # the override is the count, exactly
    before = torch.get_num_threads()
    torch.set_num_threads(current)
    try:
        with threads.beside(1):
            assert torch.get_num_threads() == want
        assert torch.get_num_threads() == current
    finally:
        torch.set_num_threads(before)


def _readers() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name.startswith("icrl-interp-reader")]


@pytest.mark.parametrize("cores", [1, 2])
def test_ahead_gives_every_result_in_order_and_reads_the_next_meanwhile(monkeypatch, cores):
    monkeypatch.setattr(threads, "allowed_cores", lambda: cores)
    monkeypatch.delenv(threads.ENV, raising=False)
    started = []

    def fn(i):
        started.append(i)
        return i * i

    got = []
    for x in threads.ahead(fn, range(5)):
        # with a spare core the next item starts while the caller holds this one (waited for: the thread
        # picks it up when it gets the CPU); on one core nothing runs ahead
        ahead = min(len(got) + 2, 5) if cores > 1 else len(got) + 1
        deadline = time.monotonic() + 5
        while len(started) < ahead and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(started) == ahead and len(_readers()) == (cores > 1)
        got.append(x)
    assert got == [0, 1, 4, 9, 16] and not _readers()


@pytest.mark.parametrize("depth", [1, 2])
def test_ahead_raises_at_the_failing_item_and_runs_nothing_after_the_caller_stops(monkeypatch, depth):
    """`depth` items computed while the caller holds one (2: a live recording's `read_ahead`), results in order, an
    error at its own item, nothing started after the caller stops beyond what was already queued."""
    monkeypatch.setattr(threads, "allowed_cores", lambda: 2)
    monkeypatch.delenv(threads.ENV, raising=False)
    started = []

    def fn(i):
        started.append(i)
        if i == 4:
            raise OSError("bad chunk")
        return -i

    got = []
    with pytest.raises(OSError, match="bad chunk"):
        for x in threads.ahead(fn, range(7), depth=depth):
            want = min(len(got) + 1 + depth, 7)  # this item and the `depth` after it
            deadline = time.monotonic() + 5
            while len(started) < want and time.monotonic() < deadline:
                time.sleep(0.001)
            assert len(started) == want, (got, started)
            got.append(x)
    assert got == [0, -1, -2, -3] and not _readers()
    started.clear()
    gen = threads.ahead(fn, [10, 11, 12, 13, 14], depth=depth)
    assert next(gen) == -10
    gen.close()  # the caller stops: the items queued finish if they started, no other starts
    assert set(started) <= set(range(10, 11 + depth)) and not _readers()


def test_a_live_analysis_shares_the_cores_with_its_reader_thread(monkeypatch):
    """The forward passes of a live analysis run in the reader thread with torch one core short (`beside(1)`: the
    analyzers work in the caller meanwhile), and the pool is restored after; kills dropping it from `analyze_model`."""
    monkeypatch.setattr(threads, "allowed_cores", lambda: 4)
    monkeypatch.delenv(threads.ENV, raising=False)
    model = analyze_mod_model()
    seen = []
    handle = model.register_forward_hook(lambda *a: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        analyze_mod.analyze_model(model, "linear-td", task_options={"d": 2, "n": 4}, tasks=24, batch_size=4,
                                  baseline="none")
        assert torch.get_num_threads() == 4
    finally:
        handle.remove()
        torch.set_num_threads(before)
    assert len(seen) > 1 and set(seen[1:]) == {3}  # batch 0 is run by prepare(), before the analysis starts


def test_a_live_analysis_reads_two_chunks_ahead(monkeypatch):
    """The analyzers' chunk reader takes its depth from the recording (`read_ahead`): a live one's chunks are lumpy
    (one runs a forward pass, the next finds it cached), so it reads two ahead; kills the reader ignoring it."""
    monkeypatch.setattr(threads, "allowed_cores", lambda: 2)
    monkeypatch.delenv(threads.ENV, raising=False)
    depths, real = [], threads.ahead
    monkeypatch.setattr(threads, "ahead", lambda fn, items, depth=1, waiting=None: depths.append(depth) or
                        real(fn, items, depth, waiting))
    analyze_mod.analyze_model(analyze_mod_model(), "linear-td", task_options={"d": 2, "n": 4}, tasks=24, batch_size=4,
                              baseline="none")
    assert depths and set(depths) == {2}


@pytest.mark.parametrize("cores", [1, 2])
def test_spread_runs_items_side_by_side_with_one_blas_thread_each(monkeypatch, cores):
    """With 2 cores two items run at once (each waits for the other at a barrier: run one by one, the first would time
    out), every BLAS pool at one thread meanwhile and restored after; on one core in the caller, pools untouched.
    Results in the items' order."""
    import threading

    monkeypatch.setattr(threads, "allowed_cores", lambda: cores)
    monkeypatch.delenv(threads.ENV, raising=False)
    barrier = threading.Barrier(2, timeout=10)
    seen = []
    # OpenBLAS's count is the process's; an OpenMP pool's is per thread (a new thread starts with the default)
    blas = lambda: max(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")  # noqa: E731

    def fn(i):
        if cores > 1 and i < 2:
            barrier.wait()  # both first items in flight together
        seen.append((threading.current_thread().name, blas()))
        return i * 10

    with threadpool_limits(2):
        with threads.spread() as run:
            assert run(fn, range(6)) == [0, 10, 20, 30, 40, 50]
            assert run(fn, []) == []
        assert blas() == 2  # restored
    names = {name for name, _ in seen}
    if cores > 1:
        assert all(name.startswith("icrl-interp-spread") for name in names) and len(names) == 2
        assert {n for _, n in seen} == {1}
    else:
        assert names == {threading.current_thread().name} and {n for _, n in seen} == {2}
    assert not [t for t in threading.enumerate() if t.name.startswith("icrl-interp-spread")]


def test_spread_raises_an_items_error_and_leaves_no_thread(monkeypatch):
    import threading

    monkeypatch.setattr(threads, "allowed_cores", lambda: 2)
    monkeypatch.delenv(threads.ENV, raising=False)

    def fn(i):
        if i == 3:
            raise ValueError("bad item")
        return i

    with pytest.raises(ValueError, match="bad item"):
        with threads.spread() as run:
            run(fn, range(6))
    assert not [t for t in threading.enumerate() if t.name.startswith("icrl-interp-spread")]


def test_ahead_says_when_the_caller_waits(monkeypatch):
    """`waiting` is set while the caller waits for an item not done yet (the item sees it: it holds the caller up), not
    while the caller works on the item before, and clear once the caller has its item."""
    import threading

    monkeypatch.setattr(threads, "allowed_cores", lambda: 2)
    monkeypatch.delenv(threads.ENV, raising=False)
    waiting, seen = threading.Event(), {}

    def fn(i):
        if i == 1:  # the caller asks for it at once
            seen[i] = waiting.wait(10)
        elif i == 2:  # computed while the caller holds item 1
            seen[i] = waiting.is_set()
        return i

    gen = threads.ahead(fn, range(3), 1, waiting)
    assert next(gen) == 0
    assert next(gen) == 1 and seen[1] and not waiting.is_set()
    time.sleep(0.2)  # item 2 is done meanwhile
    assert next(gen) == 2 and seen[2] is False and not waiting.is_set()
