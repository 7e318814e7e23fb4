"""linear-td's training recipe: sliding-window batches keep the project's prompt layout, and the
objectives equal their definitions computed from batch TD(0) (float64, theta* models, ~1e-10)."""
import numpy as np
import torch

from icrl_interp.tasks import reference
from icrl_interp.train.recipes import linear_td as L
from icrl_interp.models import theta_star_model
from icrl_interp.train import config_for


def _wang(**kw):
    base = dict(d=3, n_states=6, n=8, n_layers=3, windows=5, trajectories_per_task=2, tasks_per_step=3, dtype="float64")
    return config_for("linear-td", **{**base, **kw})


def test_windows_slide_along_one_trajectory():
    cfg = _wang()
    b = L.sample_windows(cfg, np.random.default_rng(0))
    d, n, g = cfg.d, cfg.n, cfg.gamma
    z = b.z.numpy()
    assert z.shape == (6, cfg.windows + 1, n + 1, 2 * d + 1)
    # window t+1's context is window t's shifted by one transition
    # exact: sliding windows are copies of one trajectory's columns
    np.testing.assert_array_equal(z[:, 1:, : n - 1], z[:, :-1, 1:n])
    # inside a window, gamma*phi(s_{i+1}) of column i is gamma times the phi of column i+1
    np.testing.assert_allclose(z[:, :, : n - 1, d : 2 * d], g * z[:, :, 1:n, :d], rtol=0, atol=1e-15)
    # the query of window t is s_{t+n+1}: it enters window t+2 as its last context column, with its reward
    np.testing.assert_array_equal(z[:, :-2, n, :d], z[:, 2:, n - 1, :d])
    np.testing.assert_array_equal(b.query_rewards.numpy()[:, :-1], z[:, 2:, n - 1, 2 * d])
    # query column holds [phi(s_q); 0; 0]
    assert np.all(z[:, :, n, d:] == 0)


def test_windows_are_seeded_and_sized():
    cfg = _wang()
    a, b = (L.sample_windows(cfg, np.random.default_rng(5)) for _ in range(2))
    assert torch.equal(a.z, b.z) and torch.equal(a.query_rewards, b.query_rewards)  # exact: the same draws
    assert L.sample_windows(cfg, np.random.default_rng(5), 4).z.shape[0] == 4 * cfg.trajectories_per_task
    assert L.TRAINING.batch is L.sample_windows


def test_mstde_and_msve_match_batch_td_under_theta_star():
    cfg = _wang()
    b = L.sample_windows(cfg, np.random.default_rng(1))
    model = theta_star_model("linear-td", cfg.d, n_layers=cfg.n_layers, gamma=cfg.gamma, alpha=0.7)
    z = b.z.numpy().reshape(-1, cfg.n + 1, 2 * cfg.d + 1)
    d = cfg.d
    tr = reference.batch_td(z[:, :-1, :d], z[:, :-1, d : 2 * d] / cfg.gamma, z[:, :-1, 2 * d], z[:, -1, :d],
                            cfg.gamma, 0.7, cfg.n_layers)
    v = tr.query_values[:, -1].reshape(b.z.shape[:2])
    want = np.mean((b.query_rewards.numpy() + cfg.gamma * v[:, 1:] - v[:, :-1]) ** 2)
    assert abs(L.mstde(model, b).item() - want) < 1e-10
    assert abs(L.msve(model, b).item() - np.mean((v - b.query_values.numpy()) ** 2)) < 1e-10


def test_mstde_is_semi_gradient():
    """The gradient flows only through v(Z_t), never through the bootstrapped target v(Z_{t+1})."""
    cfg = _wang(n_layers=1)
    b = L.sample_windows(cfg, np.random.default_rng(2))
    model = theta_star_model("linear-td", cfg.d, gamma=cfg.gamma, alpha=0.5)
    params = list(model.parameters())
    g_semi = torch.autograd.grad(L.mstde(model, b), params)
    v = L.window_values(model, b)
    delta = (b.query_rewards + cfg.gamma * v[:, 1:] - v[:, :-1]).detach()
    g_want = torch.autograd.grad((-2 * delta * v[:, :-1]).mean(), params)
    v2 = L.window_values(model, b)
    g_full = torch.autograd.grad((b.query_rewards + cfg.gamma * v2[:, 1:] - v2[:, :-1]).pow(2).mean(), params)
    for a, w, f in zip(g_semi, g_want, g_full):
        torch.testing.assert_close(a, w, rtol=1e-10, atol=1e-12)
        assert (a - f).abs().max() > 1e-6  # and it is not the full gradient


def test_the_config_objective_picks_the_loss():
    assert L.TRAINING.objective(_wang()) is L.mstde
    assert L.TRAINING.objective(_wang(objective="msve")) is L.msve


def test_evaluation_of_theta_star_is_batch_td():
    """theta* with step alpha is L-step batch TD(0): the fitted alpha is alpha, VD ~ 0, SS = IWS = 1."""
    cfg = _wang(eval_tasks=8)
    model = theta_star_model("linear-td", cfg.d, n_layers=cfg.n_layers, gamma=cfg.gamma, alpha=0.7)
    m = L.evaluate(model, cfg, np.random.default_rng(3))
    assert abs(m["alpha_fit"] - 0.7) < 0.02 and m["VD"] < 1e-4 and m["SS"] > 0.999 and m["IWS"] > 0.999
    assert set(L.TRAINING.trends.series([{"step": 1, **m}])) == {"SS", "IWS", "VD"}
