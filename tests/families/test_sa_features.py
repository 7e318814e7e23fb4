"""State-action feature maps of tabular MDP tasks (sampling.sa_feature_map): known shapes and scaling,
the excitation ordering random > low-randomness > one-hot's blind direction, theta* exact on random
features, one-hot checkpoints unchanged, and a short training run that random features make far more
identifiable than the one-hot floor."""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.models import checkpoint
from icrl_interp.tasks import envs, sampling
from icrl_interp.models.construct import construct
from icrl_interp.families import actor_critic, sarsa
from icrl_interp.train.recipes import actor_critic as AC
from icrl_interp.train.recipes import sarsa as S
from icrl_interp.models import theta_star_model
from icrl_interp.train import config_for, train

from helpers import float_tol, raises_user


@pytest.mark.parametrize("kind", ["gaussian", "uniform"])
def test_random_maps_have_unit_mean_square_norm_and_entry_variance_one_over_d(kind):
    phi = sampling.sa_feature_map(kind, 400, 9, 4, 8, np.random.default_rng(0))
    assert phi.shape == (400, 9, 4, 8)
    assert np.mean(np.sum(phi**2, -1)) == pytest.approx(1.0, rel=0.02)  # E||phi(s, a)||^2 = 1, as one-hot
    assert np.var(phi) == pytest.approx(1 / 8, rel=0.02) and abs(np.mean(phi)) < 0.01
    if kind == "uniform":
        assert np.abs(phi).max() <= np.sqrt(3 / 8)
    else:
        assert np.abs(phi).max() > np.sqrt(3 / 8)  # unbounded draws
    # a fresh map per task
    assert not np.allclose(phi[0], phi[1])


def test_randomness_knob_interpolates_to_the_fixed_map_at_unit_mean_square_norm():
    fixed = sampling.fixed_sa_features(3, 2, 4)
    # phi0(s, a) = e_{(s n_A + a) mod d}: the one-hot map folded into d = 4 dimensions
    np.testing.assert_array_equal(fixed.reshape(6, 4), np.eye(4)[[0, 1, 2, 3, 0, 1]])  # exact: literal 0s and 1s
    np.testing.assert_array_equal(sampling.fixed_sa_features(3, 2, 6), envs.state_action_onehot(3, 2))
    rho0 = sampling.sa_feature_map("gaussian", 5, 3, 2, 4, np.random.default_rng(1), randomness=0.0)
    np.testing.assert_array_equal(rho0, np.broadcast_to(fixed, rho0.shape))  # exact: 1 * fixed + 0 * noise
    G = sampling.sa_feature_map("gaussian", 5, 3, 2, 4, np.random.default_rng(1))
    half = sampling.sa_feature_map("gaussian", 5, 3, 2, 4, np.random.default_rng(1), randomness=0.5)
    np.testing.assert_allclose(half, np.sqrt(0.75) * fixed[None] + 0.5 * G, atol=1e-15)
    big = sampling.sa_feature_map("uniform", 2000, 3, 2, 4, np.random.default_rng(2), randomness=0.3)
    assert np.mean(np.sum(big**2, -1)) == pytest.approx(1.0, rel=0.02)


def test_one_hot_draws_nothing_and_bad_maps_are_one_line_errors():
    rng = np.random.default_rng(3)
    assert sampling.sa_feature_map("onehot", 4, 3, 2, None, rng) is None
    assert rng.random() == np.random.default_rng(3).random()  # the stream is untouched
    with raises_user("unknown state-action features 'fourier'"):
        sampling.sa_feature_map("fourier", 1, 3, 2, 4, rng)
    with raises_user("sa_randomness must lie in [0, 1]"):
        sampling.sa_feature_map("gaussian", 1, 3, 2, 4, rng, randomness=1.5)
    with raises_user("applies to random feature maps"):
        sampling.sa_feature_map("onehot", 1, 3, 2, None, rng, randomness=0.5)
    with raises_user("d = n_states*n_actions = 6, got d = 4"):
        sampling.sa_feature_map("onehot", 1, 3, 2, 4, rng)
    with raises_user("unknown state-action features"):
        sampling.TaskSpec.from_dict({"kind": "mdp", "sa_features": "fourier"})


def test_mdps_carry_their_features_into_the_prompt_columns():
    mdp = sampling.draw_mdps(5, 3, 2, 0.5, np.random.default_rng(0), features="gaussian", d=4)
    plain = envs.sample_tabular_mdps(5, 3, 2, 0.5, np.random.default_rng(0))
    np.testing.assert_array_equal(mdp.P, plain.P)  # the features are drawn after the MDPs (same draws: exact)
    assert mdp.d == 4 and mdp.features().shape == (5, 3, 2, 4) and mdp.feature_table() is mdp.phi
    traj = mdp.sample(np.full((5, 3, 2), 0.5), 7, np.random.default_rng(1))
    from icrl_interp.tasks import layouts

    phi, phi_next, _, _ = layouts.mdp_columns(mdp, traj)
    rows = np.arange(5)[:, None]
    np.testing.assert_array_equal(phi, mdp.phi[rows, traj.states[:, :-1], traj.actions[:, :-1]])  # exact: looked up
    np.testing.assert_array_equal(phi_next, mdp.phi[rows, traj.states[:, 1:], traj.actions[:, 1:]])
    w = np.random.default_rng(2).standard_normal((5, 4))
    np.testing.assert_allclose(sampling.q_values(mdp, w)[2, 1, 0], mdp.phi[2, 1, 0] @ w[2], atol=1e-15)
    # one-hot: Q_w is the reshape of w, exactly as before (products with 0 and 1 do not round)
    np.testing.assert_array_equal(sampling.q_values(plain, np.arange(30.0).reshape(5, 6)),
                                  np.arange(30.0).reshape(5, 3, 2))
    assert plain.feature_table().shape == (5, 3, 2, 6)


def test_excitation_ordering_random_over_low_randomness_over_the_one_hot_blind_direction():
    """lambda_min of the column, regression and TD-target second moments: random > rho = 0.1 > one-hot = 0."""
    out = {}
    for label, kw in [("onehot", {}), ("random", {"sa_features": "gaussian"}),
                      ("low", {"sa_features": "gaussian", "sa_randomness": 0.1})]:
        cfg = config_for("sarsa", n_states=3, n_actions=2, n=16, dtype="float64", **kw)
        batch = S.sample_sarsa(cfg, np.random.default_rng(5), 256)
        out[label] = sampling.excitation(batch.z.numpy(), S.TRAINING.model_config(cfg).layout, cfg.gamma)
    for moment in ("columns", "regression", "td_target"):
        assert out["random"][moment]["min"] > 10 * out["low"][moment]["min"] > 0
        assert abs(out["onehot"][moment]["min"]) < 1e-12 * out["onehot"][moment]["max"]
    # one-hot features never excite u: u^T E[x x^T] u is 0 up to the rounding of the moment's entries
    assert out["onehot"]["blind_u"] <= float_tol(scale=out["onehot"]["columns"]["max"])
    assert out["random"]["blind_u"] > 10 * out["low"]["blind_u"] > 0
    assert out["random"]["params"]["min"] > 0.1  # E[w~ w~^T] = diag(1, 0.25 I), the same for every map


@pytest.mark.parametrize("kind", ["gaussian", "uniform"])
def test_theta_star_is_exact_on_random_features(kind):
    cfg = config_for("sarsa", n_states=3, n_actions=2, n=16, batch=12, sa_features=kind, d=5, epsilon=0.3,
                     dtype="float64")
    b = S.sample_sarsa(cfg, np.random.default_rng(0))
    for c in (1.0, -2.5):
        model = theta_star_model("sarsa", 5, gamma=cfg.gamma, alpha=cfg.alpha, c=c)
        assert np.abs(model.readout(model(b.z)).detach().numpy() - b.target.numpy()).max() < 1e-10
    acfg = config_for("actor-critic", n_states=3, n_actions=2, n=16, batch=12, sa_features=kind, d=5, alpha=8.0,
                      beta=0.5, dtype="float64")
    b = AC.sample_actor_critic(acfg, np.random.default_rng(1))
    model = theta_star_model("actor-critic", 5, m=5, gamma=0.5, alpha=8.0, beta=0.5, c=0.7)
    out = actor_critic.readout(model(b.z), model.layout).detach().numpy()
    assert np.abs(out - b.target.numpy()).max() < 1e-10
    want = actor_critic.reference_step(b.z.numpy(), 5, 5, 0.5, 8.0, 0.5)["output"]
    np.testing.assert_allclose(b.target.numpy(), want, atol=1e-12)


def test_construct_record_and_control_see_the_feature_map(tmp_path):
    out = construct("sarsa", {"n_states": 3, "n_actions": 2, "n": 12, "d": 4, "sa_features": "uniform",
                              "sa_randomness": 0.5}, tmp_path / "sa")
    config, _ = checkpoint.read(out)
    assert (config.model.d, config.task.sa_features, config.task.sa_randomness) == (4, "uniform", 0.5)
    batch = sarsa.sample(config, config.task, 6, np.random.default_rng(0))
    model = checkpoint.load(out)
    out_tf = model.readout(model(model.as_input(batch.prompt.z))).detach().numpy()
    assert np.abs(batch.reference["output"] - out_tf).max() < 1e-10
    algo = sarsa.control(config)
    assert (algo.sa_features, algo.d, algo.sa_randomness) == ("uniform", 4, 0.5)
    # one-hot checkpoints read as before: no feature keys in their task, and the defaults are one-hot
    hot = construct("sarsa", {"n_states": 3, "n_actions": 2, "n": 12}, tmp_path / "hot")
    cfg_hot, _ = checkpoint.read(hot)
    assert cfg_hot.task.sa_features == "onehot" and cfg_hot.task.sa_randomness == 1.0
    assert "sa_features" not in S.mdp_task(config_for("sarsa"))
    with raises_user("d must be states*actions = 6"):
        construct("sarsa", {"n_states": 3, "n_actions": 2, "d": 4}, tmp_path / "bad")
    with raises_user("m must equal d"):
        actor_critic.tabular_policy_features(4, 5, 3, 2, "gaussian")


def test_random_feature_sarsa_trains_far_below_the_one_hot_floor(tmp_path):
    """Short run: one-hot's raw errors cannot fall below the null floor (u is not identifiable); on random
    features the same schedule reaches the construction itself."""
    common = dict(n_states=3, n_actions=2, n=16, steps=300, batch=32, lr=3e-2, lr_decay=0.99, lr_decay_every=10,
                  eval_tasks=64, checkpoint_every=1000, log_every=50)
    hot = train(config_for("sarsa", **common), tmp_path / "hot", progress=False).final_metrics
    rnd = train(config_for("sarsa", sa_features="gaussian", **common), tmp_path / "rnd", progress=False).final_metrics
    floor = hot["null_floor"]  # theta* without its u-part: where a u-blind optimizer lands at best
    assert floor["rel_err_P12"] > 0.1 and floor["rel_err_V21"] > 0.05
    assert hot["loss"] < 1e-6 and hot["rel_err_P12"] > 0.1 and hot["rel_err_V21"] > 0.05  # converged, yet far off
    assert rnd["rel_err_P12"] < floor["rel_err_P12"] / 100 and rnd["rel_err_V21"] < floor["rel_err_V21"] / 100
    assert rnd["rel_err_P12"] < 0.015 and rnd["rel_err_V21"] < 0.012  # the paper's bar
    assert rnd["lazy_P22"] == 0.0 and rnd["lazy_V22"] == 0.0  # exact: masked to literal zeros
