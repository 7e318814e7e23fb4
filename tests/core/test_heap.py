"""The heap trimming policy of the analyzers' chunk loop (icrl_interp/core/heap.py, `OnGrowth`)."""
from __future__ import annotations

import ctypes.util
import platform

import pytest

from icrl_interp.core import heap


def _policy(monkeypatch, free: list[int | None], slack: int = 10) -> tuple[heap.OnGrowth, list[int]]:
    """An OnGrowth whose readings of the heap's free bytes are `free`, in turn (two per trim: before and
    after); returns it and the list of calls (their index) that trimmed."""
    readings, trims = iter(free), []
    monkeypatch.setattr(heap, "free_heap_bytes", lambda: next(readings))
    monkeypatch.setattr(heap, "release_free_memory", lambda: trims.append(len(trims)) or True)
    return heap.OnGrowth(slack), trims


def test_trims_only_when_the_free_bytes_grew_past_the_slack(monkeypatch):
    # call:        1st (sets the limit 110)   2nd 3rd (<= 110)   4th: 111 > 110 -> trim, then 105: limit 115
    #              5th 115 (== limit)          6th 116 -> trim, then 90: limit 100    7th 100
    pol, trims = _policy(monkeypatch, [100, 110, 50, 111, 105, 115, 116, 90, 100])
    got = [pol() for _ in range(7)]
    assert got == [False, False, False, True, False, True, False]
    assert pol.trims == 2 and len(trims) == 2


def test_trims_every_time_where_the_free_bytes_cannot_be_read(monkeypatch):
    pol, trims = _policy(monkeypatch, [None] * 6)
    assert [pol() for _ in range(3)] == [True, True, True] and len(trims) == 3


@pytest.mark.skipif(platform.system() != "Linux" or not ctypes.util.find_library("c"), reason="glibc only")
def test_free_heap_bytes_reads_glibc():
    free = heap.free_heap_bytes()
    if heap._mallinfo2() is None:  # glibc older than 2.33
        assert free is None
    else:
        assert isinstance(free, int) and free >= 0
