"""Shared fixtures. Runtime shape checking (jaxtyping + beartype) is switched on for
the package by the `--jaxtyping-packages` option in pyproject.toml."""
import os
import random

import numpy as np
import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

try:
    import torch

    # the tests run small batched products, where torch's own threading on a
    # shared 2-core machine costs far more than it gains
    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass


@pytest.fixture(autouse=True)
def seed_everything():
    """Global RNGs seeded per test, so a test that forgets its own Generator is still repeatable."""
    random.seed(0)
    np.random.seed(0)
    try:
        import torch

        torch.manual_seed(0)
    except ImportError:  # pragma: no cover
        pass
    yield


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def no_figures(monkeypatch):
    """`build_report` (and the `report` command) without drawing: matplotlib is most of a small report's time.
    For tests of what a report (or a sweep's report) analyzes, caches and exits with, none of which reads a
    figure; the figures themselves are tested on tests/report/conftest.py's `built` (test_report_figures.py,
    test_report_html.py), by the control, causal and verdict report tests and by train/test_sweep_kills.py."""
    from icrl_interp.report import figures

    monkeypatch.setattr(figures, "make_figures", lambda results, report_dir, **options: [])
