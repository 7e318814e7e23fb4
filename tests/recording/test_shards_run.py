"""`shards.run`, the runner of a sharded recording's shards, on plain functions: every shard's result
in order, the progress callback called once per finished shard (in this process and in forked
workers), a failing shard named while the others still finish, and an interrupted run stopping the
workers it started (none goes on writing after the run has given up).

Mutants caught (tests/mutation.py): the progress calls skipped or made with no callback (`is not None`
-> `is None`), `proc.terminate()` of an interrupted run removed (the run then waits for every worker).
"""
from __future__ import annotations

import os
import time

import pytest

from icrl_interp.recording import shards
from icrl_interp.core.errors import UserError

LABELS = [f"shard {i}" for i in range(3)]


@pytest.mark.parametrize("workers", [0, 2])
def test_results_in_order_and_one_progress_call_per_shard(workers):
    seen = []
    results = shards.run(lambda i: {"i": i, "square": i * i}, 3, workers, LABELS, progress=seen.append)
    assert results == [{"i": i, "square": i * i} for i in range(3)]
    assert sorted(seen, key=lambda r: r["i"]) == results
    assert shards.run(lambda i: {"i": i}, 3, workers, LABELS) == [{"i": i} for i in range(3)]  # no callback


def test_a_failing_shard_is_named_and_the_others_finish(tmp_path):
    def fn(i):
        if i == 1:
            raise UserError("no room")
        (tmp_path / f"done-{i}").write_text("")
        return {"i": i}

    with pytest.raises(UserError, match=r"^shard 1: no room$"):
        shards.run(fn, 3, 2, LABELS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done-0", "done-2"]


def test_an_interrupted_run_stops_the_workers_it_started(tmp_path):
    """The caller's progress callback is interrupted (Ctrl-C) when shard 0 finishes; shard 1's worker,
    still sleeping, is terminated instead of being waited for, and never writes its file."""
    def fn(i):
        if i == 1:
            time.sleep(20)
            (tmp_path / "late").write_text(str(os.getpid()))
        return {"i": i}

    def interrupt(result):
        raise KeyboardInterrupt

    t = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        shards.run(fn, 2, 2, LABELS[:2], progress=interrupt)
    assert time.perf_counter() - t < 15  # not the 20 s of shard 1
    time.sleep(0.5)
    assert not (tmp_path / "late").exists()
