"""Thread discipline (icrl_interp/core/threads.py): every BLAS / OpenMP pool and torch's intra-op pool at
most the cores the process may use, inside the analyzers' entry points, and restored afterwards; one core
fewer for torch beside the recorder's writer thread (`beside`); the analyzers' reads one item ahead in a
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


def test_ahead_raises_at_the_failing_item_and_runs_nothing_after_the_caller_stops(monkeypatch):
    monkeypatch.setattr(threads, "allowed_cores", lambda: 2)
    monkeypatch.delenv(threads.ENV, raising=False)
    ran = []

    def fn(i):
        ran.append(i)
        if i == 2:
            raise OSError("bad chunk")
        return i

    got = []
    with pytest.raises(OSError, match="bad chunk"):
        for x in threads.ahead(fn, range(6)):
            got.append(x)
    assert got == [0, 1] and ran == [0, 1, 2] and not _readers()
    ran.clear()
    gen = threads.ahead(fn, [10, 11, 12, 13])
    assert next(gen) == 10
    gen.close()  # the caller stops: the item read ahead finishes if it started, no other starts
    assert ran in ([10], [10, 11]) and not _readers()
