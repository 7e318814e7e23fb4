"""Training batches keep the project's prompt layouts, and the objectives equal their definitions
computed from the reference algorithms (float64, theta* models, ~1e-10)."""
import numpy as np
import pytest
import torch

from icrl_interp import reference
from icrl_interp.models import theta_star_model
from icrl_interp.train import config_for
from icrl_interp.train import objectives as O
from icrl_interp.train import tasks as T


def _wang(**kw):
    base = dict(d=3, n_states=6, n=8, n_layers=3, windows=5, trajectories_per_task=2, tasks_per_step=3, dtype="float64")
    return config_for("linear-td", **{**base, **kw})


def test_windows_slide_along_one_trajectory():
    cfg = _wang()
    b = T.sample_windows(cfg, np.random.default_rng(0))
    d, n, g = cfg.d, cfg.n, cfg.gamma
    z = b.z.numpy()
    assert z.shape == (6, cfg.windows + 1, n + 1, 2 * d + 1)
    # window t+1's context is window t's shifted by one transition
    np.testing.assert_array_equal(z[:, 1:, : n - 1], z[:, :-1, 1:n])
    # inside a window, gamma*phi(s_{i+1}) of column i is gamma times the phi of column i+1
    np.testing.assert_allclose(z[:, :, : n - 1, d : 2 * d], g * z[:, :, 1:n, :d], rtol=0, atol=1e-15)
    # the query of window t is s_{t+n+1}: it enters window t+2 as its last context column, with its reward
    np.testing.assert_array_equal(z[:, :-2, n, :d], z[:, 2:, n - 1, :d])
    np.testing.assert_array_equal(b.query_rewards.numpy()[:, :-1], z[:, 2:, n - 1, 2 * d])
    # query column holds [phi(s_q); 0; 0]
    assert np.all(z[:, :, n, d:] == 0)


def test_windows_are_seeded():
    cfg = _wang()
    a, b = (T.sample_windows(cfg, np.random.default_rng(5)) for _ in range(2))
    assert torch.equal(a.z, b.z) and torch.equal(a.query_rewards, b.query_rewards)


def test_mstde_and_msve_match_batch_td_under_theta_star():
    cfg = _wang()
    b = T.sample_windows(cfg, np.random.default_rng(1))
    model = theta_star_model("linear-td", cfg.d, n_layers=cfg.n_layers, gamma=cfg.gamma, alpha=0.7)
    z = b.z.numpy().reshape(-1, cfg.n + 1, 2 * cfg.d + 1)
    d = cfg.d
    tr = reference.batch_td(z[:, :-1, :d], z[:, :-1, d : 2 * d] / cfg.gamma, z[:, :-1, 2 * d], z[:, -1, :d],
                            cfg.gamma, 0.7, cfg.n_layers)
    v = tr.query_values[:, -1].reshape(b.z.shape[:2])
    want = np.mean((b.query_rewards.numpy() + cfg.gamma * v[:, 1:] - v[:, :-1]) ** 2)
    assert abs(O.mstde(model, b).item() - want) < 1e-10
    assert abs(O.msve(model, b).item() - np.mean((v - b.query_values.numpy()) ** 2)) < 1e-10


def test_mstde_is_semi_gradient():
    """The gradient flows only through v(Z_t), never through the bootstrapped target v(Z_{t+1})."""
    cfg = _wang(n_layers=1)
    b = T.sample_windows(cfg, np.random.default_rng(2))
    model = theta_star_model("linear-td", cfg.d, gamma=cfg.gamma, alpha=0.5)
    params = list(model.parameters())
    g_semi = torch.autograd.grad(O.mstde(model, b), params)
    v = O.window_values(model, b)
    delta = (b.query_rewards + cfg.gamma * v[:, 1:] - v[:, :-1]).detach()
    g_want = torch.autograd.grad((-2 * delta * v[:, :-1]).mean(), params)
    v2 = O.window_values(model, b)
    g_full = torch.autograd.grad((b.query_rewards + cfg.gamma * v2[:, 1:] - v2[:, :-1]).pow(2).mean(), params)
    for a, w, f in zip(g_semi, g_want, g_full):
        torch.testing.assert_close(a, w, rtol=1e-10, atol=1e-12)
        assert (a - f).abs().max() > 1e-6  # and it is not the full gradient


def _softmax(**kw):
    return config_for("softmax-td", **{**dict(n_states=5, n=30, n_layers=4, batch=6, beta=1.5, dtype="float64"), **kw})


def test_state_queries_put_each_state_in_the_query():
    cfg = _softmax()
    b = T.sample_state_queries(cfg, np.random.default_rng(0))
    S = cfg.n_states
    z = b.z.numpy()
    np.testing.assert_array_equal(z[:, :, -1, :S], np.broadcast_to(cfg.beta * np.eye(S), (6, S, S)))
    np.testing.assert_array_equal(z[:, :, :-1], np.broadcast_to(z[:, :1, :-1], z[:, :, :-1].shape))
    np.testing.assert_allclose(b.v_true.numpy(), b.r.numpy() + cfg.gamma * np.einsum("bst,bt->bs", b.P.numpy(), b.v_true.numpy()), atol=1e-12)


@pytest.mark.parametrize("form", ["tsm", "dual"])
def test_neu_matches_weighted_softmax_td(form):
    cfg = _softmax(form=form)
    b = T.sample_state_queries(cfg, np.random.default_rng(3))
    model = theta_star_model("softmax-td", cfg.n_states, n_layers=cfg.n_layers, gamma=cfg.gamma, alpha=0.8, form=form)
    S, B = cfg.n_states, cfg.batch
    z = b.z.numpy().reshape(B * S, cfg.n + 1, -1)
    tr = reference.weighted_softmax_td(z[:, :, :S], z[:, :-1, S], cfg.gamma, 0.8, cfg.n_layers)
    v = tr.values[:, -1, -1].reshape(B, S)
    P, r, mu = b.P.numpy(), b.r.numpy(), b.mu.numpy()
    dbar = r + cfg.gamma * np.einsum("bst,bt->bs", P, v) - v
    assert abs(O.neu(model, b).item() - np.mean(np.sum((mu * dbar) ** 2, -1))) < 1e-10
    assert abs(O.expected_td(model, b).item() - np.mean(np.sum(mu * dbar**2, -1))) < 1e-10


def test_sarsa_teacher_is_the_reference_update_and_theta_star_mimics_it():
    cfg = config_for("sarsa", n_states=3, n_actions=2, n=16, batch=20, epsilon=0.3, dtype="float64")
    b = T.sample_sarsa(cfg, np.random.default_rng(0))
    d = 6
    z = b.z.numpy()
    want = reference.sarsa_update(z[:, :-1, :d], z[:, :-1, d : 2 * d] / cfg.gamma, z[:, :-1, 2 * d], z[:, -1, 2 * d + 2 :],
                                  cfg.gamma, cfg.alpha)
    np.testing.assert_allclose(b.target.numpy(), want, atol=1e-12)
    assert np.all(z[:, -1, 2 * d + 1] == 1.0)
    for c in (1.0, -2.5):
        model = theta_star_model("sarsa", d, gamma=cfg.gamma, alpha=cfg.alpha, c=c)
        assert O.teacher_mimicking(model, b).item() < 1e-24
    # a wrong step alpha' leaves exactly ||(alpha'/alpha - 1)(target - w)||^2
    model = theta_star_model("sarsa", d, gamma=cfg.gamma, alpha=1.5)
    want = np.mean(np.sum((0.5 * (b.target - b.w).numpy()) ** 2, -1))
    assert abs(O.teacher_mimicking(model, b).item() - want) < 1e-12
