"""The targets benchmark (benchmarks/bench_targets.py): its command line parses as docs/benchmarks.md shows it,
and its side-by-side timing alternates the order of the two sides (so load drift hits both)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_targets.py"


def _module():
    spec = importlib.util.spec_from_file_location("bench_targets", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rounds_alternate_the_order_and_pair_the_values():
    bt = _module()
    calls = []
    pairs = bt.rounds(lambda: calls.append("a") or len(calls), lambda: calls.append("b") or len(calls), 4)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    # each pair is (value of a, value of b) whatever ran first
    assert pairs == [(1, 2), (4, 3), (5, 6), (8, 7)]


def test_every_figure_has_a_target_and_unknown_figures_are_refused():
    bt = _module()
    assert set(bt.TARGETS) == set(bt.FIGURES)
    out = subprocess.run([sys.executable, str(SCRIPT), "--only", "live,nonsense"], capture_output=True, text=True)
    assert out.returncode == 2 and "unknown figure(s) nonsense" in out.stderr


def test_one_thread_children_get_the_limits_and_default_children_do_not(monkeypatch):
    bt = _module()
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "7")
    assert all(bt.child_env("one")[k] == "1" for k in bt.ONE_THREAD_ENV)
    assert not any(k in bt.child_env("default") for k in bt.ONE_THREAD_ENV)


@pytest.mark.parametrize("flag", ["--help"])
def test_help_parses(flag):
    out = subprocess.run([sys.executable, str(SCRIPT), flag], capture_output=True, text=True)
    assert out.returncode == 0 and "--repeats" in out.stdout


def test_the_episodes_benchmark_parses_as_documented():
    """docs/benchmarks.md shows `python benchmarks/bench_episodes.py --histories 1000 --steps 500 --repeats 3`."""
    script = SCRIPT.parent / "bench_episodes.py"
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--histories" in out.stdout and "--steps" in out.stdout


def test_the_record_floor_is_the_largest_lower_bound():
    bt = _module()  # exact comparisons: each floor is an input over 1.0, or a sum of binary fractions over 2
    # forward 1 s on one core, raw write 0.9 s: the forward bounds both
    assert bt.record_floors(1.0, 1.0, 0.9, 0.3, 0.5, 2) == (1.0, 1.0)
    # a slow disk: raw 1.5 s bounds (1); the disk's own 1.2 s bounds (2)
    assert bt.record_floors(1.0, 1.0, 1.5, 0.3, 1.2, 2) == (1.5, 1.2)
    # a forward on both cores (CPU 2 s in 1 s) leaves the copy no core: (2 + 0.5) / 2 cores
    assert bt.record_floors(1.0, 2.0, 0.9, 0.5, 0.4, 2) == (1.0, 1.25)
    # one core: the forward's and the copy's CPU add up
    assert bt.record_floors(2.0, 2.0, 1.0, 1.0, 0.5, 1) == (1.0, 1.5)

