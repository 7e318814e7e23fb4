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
