"""Small builders and comparisons shared by the model tests."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from icrl_interp.tasks import layouts
from icrl_interp.models import ModelConfig, build_model
from icrl_interp.families import linear_td


def assert_close(actual, expected, tol: float = 1e-10) -> None:
    """|actual - expected| <= tol * (1 + max|expected|): float64 agreement up to the values' scale."""
    a = actual.detach().cpu().numpy() if isinstance(actual, torch.Tensor) else np.asarray(actual)
    b = expected.detach().cpu().numpy() if isinstance(expected, torch.Tensor) else np.asarray(expected)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = 1.0 + (np.abs(b).max() if b.size else 0.0)
    err = np.abs(a - b).max() if a.size else 0.0
    assert err <= tol * scale, f"max error {err:.3e} > {tol:.0e} * {scale:.3g}"


def td_prompts(batch: int, n: int, d: int, seed: int, gamma: float = 0.9):
    """Wang prompts from random U(-1, 1) transitions: (z, phi, phi_next, rewards, phi_query)."""
    g = np.random.default_rng(seed)
    phi, phi_next = g.uniform(-1, 1, (batch, n, d)), g.uniform(-1, 1, (batch, n, d))
    rewards, phi_q = g.uniform(-1, 1, (batch, n)), g.uniform(-1, 1, (batch, d))
    z = linear_td.prompt(phi, phi_next, rewards, phi_q, gamma).z
    return torch.from_numpy(z), phi, phi_next, rewards, phi_q


def random_model(family: str, d: int = 3, seed: int = 0, gain: float = 0.5, **kw):
    """A float64 model with random (not theta*) weights, large enough to exercise every entry."""
    return build_model(ModelConfig(family, d, dtype="float64", **kw), seed=seed, gain=gain)


def random_prompt(model, batch: int, pos: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, pos, model.config.D, dtype=torch.float64, generator=g)


def cache(model, z, names=None):
    with torch.no_grad():
        return model.run_with_cache(z, names_filter=names)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """These tensors are tiny: intra-op threads only add contention on a shared CPU (100x seen)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
