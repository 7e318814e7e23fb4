"""Liang & Lai's linear self-attention layer: theta* outputs the SARSA update exactly for any
alpha and any c != 0 (the scaling manifold), keeps the constant slot at 1, and random weights
follow H + (1/n)(VH)(H^T P H); the same class serves the actor-critic layout."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from icrl_interp.tasks import layouts, reference
from icrl_interp.models import ModelConfig, build_model, theta_star_model
from icrl_interp.families import sarsa

from helpers import mdps, raises_user, random_policy
from .model_cases import assert_close, one_torch_thread, random_model, random_prompt  # noqa: F401

GAMMA = 0.5


def _sarsa_prompts(seed: int, n: int = 40, batch: int = 16):
    mdp = mdps(batch=batch, n_states=3, n_actions=2, gamma=GAMMA, seed=seed)
    g = np.random.default_rng(seed)
    traj = mdp.sample(random_policy(mdp, seed), n, g)
    w = g.normal(0.0, 0.5, (batch, 6))
    prompt = sarsa.prompt_from_mdp(mdp, traj, w)
    lay = prompt.layout
    ctx = prompt.z[:, :-1]
    phi, phi_next = ctx[..., lay.slice("phi")], ctx[..., lay.slice("gamma_phi_next")] / GAMMA
    return prompt, phi, phi_next, ctx[..., lay.slice("reward")][..., 0], w


def _forward(model, z):
    with torch.no_grad():
        return model(z)


@pytest.mark.parametrize("c", [1.0, -1.0, 0.3, -2.5])
@pytest.mark.parametrize("alpha", [0.1, 0.5, 1.0, 2.0])
def test_theta_star_readout_is_the_sarsa_update(alpha, c):
    for seed in range(3):
        prompt, phi, phi_next, r, w = _sarsa_prompts(seed, n=10 + 30 * seed)
        model = theta_star_model("sarsa", 6, alpha=alpha, c=c)
        z = torch.from_numpy(prompt.z)
        out = _forward(model, z)
        assert_close(model.readout(out), reference.sarsa_update(phi, phi_next, r, w, GAMMA, alpha))
        lay = model.layout
        assert_close(out[:, -1, lay.slice("param_one")], np.ones((16, 1)), tol=1e-14)  # the '1' stays 1
        assert_close(out[:, :-1], z[:, :-1], tol=0)  # context columns are untouched


def test_output_is_invariant_along_the_scaling_manifold():
    prompt, *_ = _sarsa_prompts(7)
    z = torch.from_numpy(prompt.z)
    base = _forward(theta_star_model("sarsa", 6, alpha=0.8), z)
    for c in (-3.0, 0.2, 7.0, -0.05):
        assert_close(_forward(theta_star_model("sarsa", 6, alpha=0.8, c=c), z), base, tol=1e-12)
    # (c P, V / c) is a symmetry of any LSA weights, not only theta*
    model = random_model("sarsa", d=2, seed=1)
    zr = random_prompt(model, 4, 7, 0)
    expected = _forward(model, zr)
    with torch.no_grad():
        model.blocks[0].attn.P.mul_(-1.7)
        model.blocks[0].attn.V.div_(-1.7)
    assert_close(_forward(model, zr), expected, tol=1e-12)


def test_stacked_layers_are_repeated_sarsa_steps():
    """Context columns never change under theta*, so L layers run L SARSA steps on one batch."""
    prompt, phi, phi_next, r, w = _sarsa_prompts(2)
    model = theta_star_model("sarsa", 6, n_layers=3, alpha=0.6, c=-1.5)
    for _ in range(3):
        w = reference.sarsa_update(phi, phi_next, r, w, GAMMA, 0.6)
    assert_close(model.readout(_forward(model, torch.from_numpy(prompt.z))), w)


def _numpy_lsa(P, V, z):
    out = []
    for zb in z:
        H = zb.T
        n = H.shape[1] - 1
        out.append((H + (1.0 / n) * (V @ H) @ (H.T @ P @ H)).T)
    return np.stack(out)


@pytest.mark.parametrize("family,m", [("sarsa", None), ("actor-critic", 2)])
def test_random_weights_follow_the_formula(family, m):
    model = random_model(family, d=2, seed=3, m=m)
    D = model.config.D
    assert D == (3 * 2 + 2 if m is None else 3 * 2 + 2 * m + 2)
    assert {n: tuple(p.shape) for n, p in model.named_parameters()} == {"blocks.0.attn.P": (D, D), "blocks.0.attn.V": (D, D)}
    z = random_prompt(model, 5, 11, 2)
    P, V = model.blocks[0].attn.P.detach().numpy(), model.blocks[0].attn.V.detach().numpy()
    for path in ("quadratic", "associative"):
        model.set_attention_path(path)
        assert_close(_forward(model, z), _numpy_lsa(P, V, z.numpy()), tol=1e-12)


def test_lazy_blocks_start_at_zero_and_actor_critic_theta_star_registers_itself():
    for family, m in (("sarsa", None), ("actor-critic", 3)):
        model = build_model(ModelConfig(family, 2, m=m), seed=0)
        two = slice(model.layout.slice("param_one").start, model.config.D)
        for name in ("P", "V"):
            matrix = getattr(model.blocks[0].attn, name).detach()
            assert not matrix[two, two].any() and matrix.abs().sum() > 0  # exact: initialized as literal zeros
    assert build_model(ModelConfig("actor-critic", 2, m=3)).layout.names[-1] == "lam"
    star = theta_star_model("actor-critic", 2, m=3)
    two = slice(star.layout.slice("param_one").start, star.config.D)
    assert not star.blocks[0].attn.P.detach()[two, two].any() and star.blocks[0].attn.P.detach().abs().sum() > 0
