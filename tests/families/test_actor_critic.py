"""Liang & Lai's actor-critic construction: one LSA layer with theta* outputs the reference
actor-critic step exactly (float64, many random instances, any alpha, beta, c != 0), has the
documented block structure, a one-dimensional scaling manifold and lazy blocks that get no gradient."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from icrl_interp.models import checkpoint
from icrl_interp.tasks import layouts, reference
from icrl_interp.models.construct import construct
from icrl_interp.families import actor_critic
from icrl_interp.models import ModelConfig, build_model, theta_star_model

from helpers import mdps, plain, raises_user

GAMMA = 0.5
TOL = 1e-10


def _close(actual, expected, tol=TOL):
    a = actual.detach().numpy() if isinstance(actual, torch.Tensor) else np.asarray(actual)
    scale = 1.0 + np.abs(expected).max()
    assert np.abs(a - expected).max() <= tol * scale, np.abs(a - expected).max()


def _forward(model, z):
    with torch.no_grad():
        return model(torch.as_tensor(z))


def _random_instance(seed: int, d: int = 3, m: int = 2, n: int = 17, batch: int = 8, gamma: float = GAMMA):
    """Arbitrary real transitions and scores (the construction does not need tabular features)."""
    g = np.random.default_rng(seed)
    return dict(phi=g.normal(size=(batch, n, d)), phi_next=g.normal(size=(batch, n, d)), rewards=g.normal(size=(batch, n)),
                scores=g.normal(size=(batch, n, m)), w=g.normal(size=(batch, d)), lam=g.normal(size=(batch, m)), gamma=gamma)


def _mdp_instance(seed: int, n: int = 40, batch: int = 12, n_states: int = 3, n_actions: int = 2):
    mdp = mdps(batch=batch, n_states=n_states, n_actions=n_actions, gamma=GAMMA, seed=seed)
    g = np.random.default_rng(seed + 100)
    d = n_states * n_actions
    phi_pi = actor_critic.policy_features(n_states, n_actions)
    w, lam = g.normal(0, 1, (batch, d)), g.normal(0, 1.5, (batch, d))
    traj = mdp.sample(actor_critic.policy(lam, phi_pi), n, g)
    c = actor_critic.mdp_columns(mdp, traj, lam, phi_pi)
    return dict(phi=c["phi"], phi_next=c["phi_next"], rewards=c["rewards"], scores=c["scores"], w=w, lam=lam, gamma=GAMMA)


def _reference(x, alpha, beta):
    w, lam = reference.actor_critic_update(x["phi"], x["phi_next"], x["rewards"], x["scores"], x["w"], x["lam"],
                                           x["gamma"], alpha, beta)
    return np.concatenate([w, lam], -1)


def _ac_model(d, m, gamma=GAMMA, alpha=1.0, beta=1.0, c=1.0):
    return theta_star_model("actor-critic", d, m=m, gamma=gamma, alpha=alpha, beta=beta, c=c)


def _save(out, n_states=3, n_actions=2, n=64, alpha=1.0, beta=1.0, c=1.0):
    return construct("actor-critic", {"n_states": n_states, "n_actions": n_actions, "n": n, "alpha": alpha,
                                      "critic_step": beta, "scale": c}, out)


def _steps(config):
    return config.model.alpha, config.constants["critic_step"]


def _prompt(x):
    return actor_critic.prompt(x["phi"], x["phi_next"], x["rewards"], x["scores"], x["w"], x["lam"], x["gamma"])


# ------------------------------------------------------------------ exactness
@pytest.mark.parametrize("alpha,beta,c", [(1.0, 1.0, 1.0), (0.3, 2.0, -1.0), (5.0, 0.1, 0.25), (256.0, 0.25, -3.0)])
def test_theta_star_outputs_the_reference_actor_critic_step(alpha, beta, c):
    for seed in range(4):
        for x in (_random_instance(seed, n=5 + 20 * seed), _mdp_instance(seed, n=10 + 25 * seed)):
            d, m = x["w"].shape[1], x["lam"].shape[1]
            model = _ac_model(d, m, GAMMA, alpha, beta, c)
            z = _prompt(x).z
            out = _forward(model, z)
            _close(actor_critic.readout(out, model.layout), _reference(x, alpha, beta))
            _close(out[:, -1, model.layout.slice("param_one")], np.ones((z.shape[0], 1)), tol=1e-14)
            _close(out[:, :-1], z[:, :-1], tol=0)  # context columns are untouched


def test_many_random_instances_float64():
    """200 random prompts of varying (d, m, n, gamma): max relative error well under 1e-10."""
    g = np.random.default_rng(0)
    worst = 0.0
    for seed in range(40):
        d, m, n = int(g.integers(1, 6)), int(g.integers(1, 5)), int(g.integers(1, 50))
        gamma, alpha, beta, c = g.uniform(0, 0.99), g.uniform(0.01, 10), g.uniform(0.01, 10), g.choice([-1, 1]) * g.uniform(0.1, 5)
        x = _random_instance(seed, d, m, n, batch=5, gamma=gamma)
        model = _ac_model(d, m, gamma, alpha, beta, c)
        ref = _reference(x, alpha, beta)
        err = np.abs(actor_critic.readout(_forward(model, _prompt(x).z), model.layout).numpy() - ref).max() / (1 + np.abs(ref).max())
        worst = max(worst, err)
    assert worst < 1e-12, worst


def test_prompt_columns():
    x = _random_instance(3, d=2, m=3, n=4, batch=2)
    p = _prompt(x)
    lay = p.layout
    assert lay.d_model == 3 * 2 + 2 * 3 + 2 and p.z.shape == (2, 5, lay.d_model)
    # exact: the prompt holds copies and the same elementwise products the package computes
    np.testing.assert_array_equal(p.z[:, :-1, lay.slice("score")], GAMMA ** np.arange(4)[None, :, None] * x["scores"])
    np.testing.assert_array_equal(p.z[:, :-1, lay.slice("gamma_phi_next")], GAMMA * x["phi_next"])
    np.testing.assert_array_equal(p.z[:, -1, lay.slice("lam")], x["lam"])
    np.testing.assert_array_equal(p.z[:, -1, lay.slice("param_one")], 1.0)
    assert np.all(p.z[:, :-1, lay.slice("param_one").start :] == 0) and np.all(p.z[:, -1, : lay.slice("param_one").start] == 0)


def test_scores_are_the_softmax_policy_gradient():
    """g(s, a) = grad_lam log pi_lam(a|s), checked by finite differences on the tabular policy."""
    x_lam = np.random.default_rng(1).normal(size=(1, 6))
    phi_pi = actor_critic.policy_features(3, 2)
    g = reference.policy_score(x_lam, phi_pi[None], np.array([[2]]), np.array([[1]]))[0, 0]
    eps = 1e-6
    num = np.zeros(6)
    for k in range(6):
        e = np.zeros((1, 6))
        e[0, k] = eps
        num[k] = (np.log(actor_critic.policy(x_lam + e, phi_pi)[0, 2, 1]) - np.log(actor_critic.policy(x_lam - e, phi_pi)[0, 2, 1])) / (2 * eps)
    np.testing.assert_allclose(g, num, atol=1e-8)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.9])
def test_reference_from_prompt_recovers_the_step(gamma):
    x = _mdp_instance(2)
    x["gamma"] = gamma
    ref = actor_critic.reference_step(_prompt(x).z, 6, 6, gamma, 0.7, 1.3)
    _close(ref["output"], _reference(x, 0.7, 1.3), tol=1e-12)
    delta = x["rewards"] + gamma * np.einsum("bnd,bd->bn", x["phi_next"], x["w"]) - np.einsum("bnd,bd->bn", x["phi"], x["w"])
    _close(ref["td_errors"][:, 0], delta, tol=1e-12)


# ----------------------------------------------------------------- structure
def test_nonzero_blocks_of_theta_star():
    d, m = 3, 2
    lay = actor_critic.layout(d, m)
    mats = actor_critic.theta_star(d, m, alpha=0.5, beta=2.0, c=1.5)
    P, Vm = mats["P"], mats["V"]
    nonzero_P = {(r, c) for r in lay.names for c in lay.names if np.any(P[lay.slice(r), lay.slice(c)])}
    nonzero_V = {(r, c) for r in lay.names for c in lay.names if np.any(Vm[lay.slice(r), lay.slice(c)])}
    assert nonzero_P == {("phi", "w"), ("gamma_phi_next", "w"), ("reward", "param_one")}
    assert nonzero_V == {("w", "phi"), ("lam", "score")}
    # exact: theta* is written entry by entry, c times 0 or 1
    np.testing.assert_array_equal(P[lay.slice("phi"), lay.slice("w")], -1.5 * np.eye(d))
    np.testing.assert_array_equal(P[lay.slice("gamma_phi_next"), lay.slice("w")], 1.5 * np.eye(d))
    assert P[lay.slice("reward"), lay.slice("param_one")].item() == 1.5
    np.testing.assert_allclose(Vm[lay.slice("w"), lay.slice("phi")], 2.0 / 1.5 * np.eye(d))
    np.testing.assert_allclose(Vm[lay.slice("lam"), lay.slice("score")], 0.5 / 1.5 * np.eye(m))


def test_scaling_manifold_is_one_dimensional():
    """(c P, V/c) keeps the output for every c; one scale per output block (actor rows of V
    rescaled alone, with any compensation in the shared P) does not."""
    x = _mdp_instance(5)
    z = _prompt(x).z
    base = actor_critic.readout(_forward(_ac_model(6, 6, GAMMA, 2.0, 0.5), z), actor_critic.layout(6, 6))
    for c in (-4.0, 0.1, 3.0):
        _close(actor_critic.readout(_forward(_ac_model(6, 6, GAMMA, 2.0, 0.5, c), z), actor_critic.layout(6, 6)),
               base.numpy(), tol=1e-12)
    model = _ac_model(6, 6, GAMMA, 2.0, 0.5)
    lay = model.layout
    with torch.no_grad():
        model.blocks[0].attn.V[lay.slice("lam")] *= 2.0  # actor scale 2, critic scale 1
        model.blocks[0].attn.P.mul_(0.5)  # the only compensation available: P is shared by both outputs
    out = actor_critic.readout(_forward(model, z), lay).numpy()
    base = base.numpy()
    d = 6
    assert np.abs(out[:, d:] - base[:, d:]).max() < 1e-12  # actor restored ...
    assert np.abs(out[:, :d] - base[:, :d]).max() > 1e-3  # ... but the critic is now off


def test_lazy_blocks_get_no_gradient_under_teacher_mimicking():
    model = build_model(ModelConfig("actor-critic", 6, m=6, dtype="float64"), seed=3, gain=0.5)
    lay = model.layout
    two = slice(lay.slice("param_one").start, lay.d_model)
    one = slice(0, lay.slice("param_one").start)
    x = _mdp_instance(1)
    out = actor_critic.readout(model(torch.from_numpy(_prompt(x).z)), lay)
    loss = (out - torch.from_numpy(_reference(x, 1.0, 1.0))).pow(2).sum(-1).mean()
    loss.backward()
    P, Vm = model.blocks[0].attn.P, model.blocks[0].attn.V
    # exact: each of these entries is a sum of products with a literal 0 (a zero block, a masked or empty
    # row of the prompt), which no kernel rounds away from 0
    assert torch.all(P.grad[two, two] == 0) and torch.all(Vm.grad[two, two] == 0)  # P22, V22 (zero init) stay 0
    assert torch.all(P.grad[:, one] == 0)  # P11, P21: multiplied by the query's empty transition block
    assert torch.all(Vm.grad[one] == 0)  # V11, V12: rows that are not read out
    assert torch.all(Vm.grad[lay.slice("param_one")] == 0)  # first row of V21 / V22: the '1' is not read out
    assert P.grad[one, two].abs().max() > 0 and Vm.grad[lay.slice("lam"), one].abs().max() > 0


# ------------------------------------------------------ registration, files
def test_generic_theta_star_model_with_one_step_for_both():
    model = theta_star_model("actor-critic", 6, m=6, gamma=GAMMA, alpha=0.8, c=-2.0)  # beta defaults to alpha
    x = _mdp_instance(4)
    _close(actor_critic.readout(_forward(model, _prompt(x).z), model.layout), _reference(x, 0.8, 0.8))


def test_checkpoint_round_trip_and_steps(tmp_path):
    out = _save(tmp_path / "ac", n_states=3, n_actions=2, n=20, alpha=4.0, beta=0.5, c=2.0)
    config, tensors = checkpoint.read(out)
    assert config.family == "actor-critic" and config.model.m == 6 and _steps(config) == (4.0, 0.5)
    model = checkpoint.load(out)
    x = _mdp_instance(6)
    _close(actor_critic.readout(_forward(model, _prompt(x).z), model.layout), _reference(x, 4.0, 0.5))
    plain_config = checkpoint.make_config(ModelConfig("actor-critic", 6, m=6, alpha=2.0), {"origin": {"kind": "x"}})
    assert _steps(plain_config) == (2.0, 2.0)
    trained = checkpoint.make_config(ModelConfig("actor-critic", 6, m=6, alpha=2.0),
                                     {"origin": {"kind": "trained"}, "training": {"critic_step": 0.1}})
    assert _steps(trained) == (2.0, 0.1)


def test_recording_batch_matches_the_model(tmp_path):
    out = _save(tmp_path / "ac", n_states=3, n_actions=2, n=15, alpha=3.0, beta=0.5)
    config, _ = checkpoint.read(out)
    pb = config.sample(6, np.random.default_rng(0))
    model = checkpoint.load(out)
    assert pb.prompt.layout == model.layout
    _close(actor_critic.readout(_forward(model, pb.prompt.z), model.layout), pb.reference["output"])
    assert pb.tasks["policy"].shape == (6, 3, 2) and np.all(pb.prompt.actions[:, :-1] >= 0)


def test_analyzer_sees_theta_star_as_exact(tmp_path):
    out = _save(tmp_path / "ac", n_states=3, n_actions=2, alpha=2.0, beta=0.5, c=1.0)
    config, tensors = checkpoint.read(out)
    theta = config.theta_star(tensors)
    assert set(theta) == {"blocks.0.attn.P", "blocks.0.attn.V"}
    from icrl_interp.analyzers import weights

    res = weights.analyze_weights("actor-critic", tensors, theta, actor_critic.layout(6, 6))
    assert res["block_sparsity"]["in_support_energy"] == pytest.approx(1.0)
    assert res["block_sparsity"]["lazy_drift"] == 0.0  # exact: the trainer masks the lazy blocks to literal zeros
    assert res["manifold"]["scale"] == pytest.approx(1.0) and res["manifold"]["gauge_cosine"] == pytest.approx(1.0)


# --------------------------------------------------------------- bad input
def test_bad_input_raises_user_error():
    x = _random_instance(0)
    with raises_user("lam", "shape"):
        plain(actor_critic.prompt)(x["phi"], x["phi_next"], x["rewards"], x["scores"], x["w"], x["lam"][:, :1], GAMMA)
    with raises_user("scores", "nan"):
        bad = x["scores"].copy()
        bad[0, 0, 0] = np.nan
        actor_critic.prompt(x["phi"], x["phi_next"], x["rewards"], bad, x["w"], x["lam"], GAMMA)
    with raises_user("gamma"):
        actor_critic.prompt(x["phi"], x["phi_next"], x["rewards"], x["scores"], x["w"], x["lam"], 1.0)
    with raises_user("scaling-manifold", "non-zero"):
        actor_critic.theta_star(3, 2, c=0.0)
    with raises_user("alpha", "finite"):
        actor_critic.theta_star(3, 2, alpha=float("inf"))
    with raises_user("one-hot", "d = m"):
        actor_critic.tabular_policy_features(12, 5, 3, 4)
    with raises_user("m"):
        actor_critic.theta_star_blocks(3, 0)


# ------------------------------------------------------ teacher mimicking
def test_teacher_mimicking_training_learns_and_keeps_lazy_blocks_zero(tmp_path):
    from icrl_interp.train.control import ControlConfig, run_checkpoint
    from icrl_interp.train import config_for, train

    cfg = config_for("actor-critic", n_states=3, n_actions=2, n=24, batch=32, steps=100, lr=1e-2, lr_decay=1.0,
                     checkpoint_every=100, log_every=10, eval_tasks=32, dtype="float64", alpha=2.0, beta=0.5)
    result = train(cfg, tmp_path / "run", progress=False)
    lines = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["loss"] < 0.5 * lines[0]["loss"]
    assert all(line["lazy_max_abs"] == 0.0 for line in lines)  # exact: the trainer masks them to literal zeros
    fm = result.final_metrics
    assert fm["lazy_P22"] == 0.0 and fm["lazy_V22"] == 0.0 and set(fm["block_scales"]) == {"critic", "actor"}
    ckpt = tmp_path / "run" / "checkpoints" / "step_000100"
    config, _ = checkpoint.read(ckpt)
    assert config.family == "actor-critic" and _steps(config) == (2.0, 0.5)
    res = run_checkpoint(ckpt, ControlConfig(mdps=3, iterations=2, n=8), progress=False)
    assert res["settings"]["alpha"] == 2.0 and res["settings"]["beta"] == 0.5
