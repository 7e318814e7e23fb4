"""Gradients of the softmax-td objectives against float64 hand derivatives (a mutation sweep found that
turning the semi-gradient 'td' objective into a full-gradient one failed no test: the loss VALUE is the
same, only the gradient differs).

With v[b, s] the model's value of state s in task b (the query set to s), dbar = r + gamma P v - v:
  'td'  (semi-gradient) L = mean_b sum_s mu dbar^2,     P v held fixed:  dL/dv = -(2/B) mu dbar
  'neu' (full gradient) L = mean_b sum_s (mu dbar)^2:  dL/dv = (2/B) (gamma P^T (mu^2 dbar) - mu^2 dbar)
The model is replaced by a leaf tensor of values, so the gradient is exactly dL/dv.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from icrl_interp.train.recipes import softmax_td as S


@pytest.fixture
def batch_and_values(monkeypatch):
    cfg = S.SoftmaxTDTrainConfig(n_states=4, n=12, tasks_per_step=3, dtype="float64")
    batch = S.sample_state_queries(cfg, np.random.default_rng(0))
    v = torch.tensor(np.random.default_rng(1).normal(size=(3, 4)), dtype=torch.float64, requires_grad=True)
    monkeypatch.setattr(S, "values", lambda model, z: v)
    P, r, mu = (batch.P.double().numpy(), batch.r.double().numpy(), batch.mu.double().numpy())
    vn = v.detach().numpy()
    dbar = r + cfg.gamma * np.einsum("bst,bt->bs", P, vn) - vn
    return batch, v, P, mu, dbar, cfg.gamma


def test_td_objective_is_semi_gradient(batch_and_values):
    batch, v, P, mu, dbar, gamma = batch_and_values
    B = v.shape[0]
    loss = S.expected_td(None, batch)
    assert loss.item() == pytest.approx(np.mean(np.sum(mu * dbar**2, -1)), abs=1e-12)
    (grad,) = torch.autograd.grad(loss, v)
    semi = -(2.0 / B) * mu * dbar
    full = semi + (2.0 / B) * gamma * np.einsum("bst,bs->bt", P, mu * dbar)
    np.testing.assert_allclose(grad.numpy(), semi, atol=1e-12)
    assert np.abs(full - semi).max() > 1e-2  # a full gradient would be visibly different


def test_neu_objective_is_full_gradient(batch_and_values):
    batch, v, P, mu, dbar, gamma = batch_and_values
    B = v.shape[0]
    loss = S.neu(None, batch)
    assert loss.item() == pytest.approx(np.mean(np.sum((mu * dbar) ** 2, -1)), abs=1e-12)
    (grad,) = torch.autograd.grad(loss, v)
    m2 = mu**2 * dbar
    want = (2.0 / B) * (gamma * np.einsum("bst,bs->bt", P, m2) - m2)
    np.testing.assert_allclose(grad.numpy(), want, atol=1e-12)
    assert np.abs(want + (2.0 / B) * m2).max() > 1e-3  # the bootstrap term matters here


def test_the_td_objective_is_what_a_td_config_trains():
    assert S.TRAINING.objective(S.SoftmaxTDTrainConfig(objective="td")) is S.expected_td
    assert S.TRAINING.objective(S.SoftmaxTDTrainConfig(objective="neu")) is S.neu
