"""Wang et al.'s linear-attention TD transformer: theta* runs batch TD(0) exactly (float64),
both evaluation orders agree, the gauge (cP, Q/c) is a symmetry, and the activation variant
is the documented formula."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from icrl_interp.tasks import reference
from icrl_interp.models import ModelConfig, build_model, theta_star_model
from icrl_interp.models.linear_attention import associative_is_cheaper

from helpers import plain, raises_user
from .model_cases import assert_close, cache, one_torch_thread, random_model, random_prompt, td_prompts  # noqa: F401

GAMMA = 0.9


def _forward(model, z, **kw):
    with torch.no_grad():
        return model(z, **kw)


# ------------------------------------------------------------------ theta*
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("n_layers", range(1, 11))
def test_theta_star_readout_is_batch_td(n_layers, tied):
    """Readout after L layers = w_L . phi(s_q) of batch TD(0), with and without a preconditioner,
    on contexts shorter than D (quadratic path) and longer (associative path)."""
    d = 3
    C = np.random.default_rng(n_layers).uniform(-0.5, 0.5, (d, d)) + np.eye(d)
    for seed, n, precond in [(0, 4, None), (1, 25, None), (2, 25, C), (3, 60, C)]:
        z, phi, phi_next, r, phi_q = td_prompts(16, n, d, seed, GAMMA)
        model = theta_star_model("linear-td", d, n_layers=n_layers, gamma=GAMMA, alpha=0.8, C=precond, tied=tied)
        out = model.readout(_forward(model, z))[:, 0]
        ref = reference.batch_td(phi, phi_next, r, phi_q, GAMMA, 0.8, n_layers, precond)
        assert_close(out, ref.query_values[:, n_layers])
        assert model.blocks[0].attn.last_path == ("associative" if associative_is_cheaper(n + 1, 2 * d + 1) else "quadratic")


@pytest.mark.parametrize("tied", [True, False])
def test_every_layer_writes_the_td_errors_into_the_reward_row(tied):
    """After layer l, reward row of context column i = delta_i(w_{l+1}); query cell = -w_{l+1}.phi_q."""
    d, L, n = 4, 6, 30
    z, phi, phi_next, r, phi_q = td_prompts(12, n, d, seed=5)
    model = theta_star_model("linear-td", d, n_layers=L, gamma=GAMMA, alpha=0.5, tied=tied)
    _, acts = cache(model, z)
    ref = reference.batch_td(phi, phi_next, r, phi_q, GAMMA, 0.5, L)
    reward = model.layout.slice("reward").start
    assert_close(acts["blocks.0.hook_resid_pre"][:, :n, reward], ref.td_errors[:, 0])
    for layer in range(L):
        post = acts[f"blocks.{layer}.hook_resid_post"]
        assert_close(post[:, :n, reward], ref.td_errors[:, layer + 1])
        assert_close(post[:, n, reward], -ref.query_values[:, layer + 1])
        # only the reward row ever changes
        torch.testing.assert_close(post[..., :reward], z[..., :reward], rtol=0, atol=0)


@pytest.mark.parametrize("n_layers", [1, 2, 4, 6])
def test_per_layer_step_sizes_match_td_iterations(n_layers):
    """Untied theta* with a distinct alpha per layer = TD iterations w <- w + (alpha_l/n) sum delta phi."""
    d, n = 3, 20
    alphas = list(np.random.default_rng(n_layers).uniform(0.2, 1.5, n_layers))
    z, phi, phi_next, r, phi_q = td_prompts(10, n, d, seed=n_layers)
    model = theta_star_model("linear-td", d, n_layers=n_layers, gamma=GAMMA, alpha=alphas, tied=False)
    w = np.zeros((10, d))
    for alpha in alphas:  # one semi-gradient TD(0) step from w is the same formula as one SARSA step
        w = reference.sarsa_update(phi, phi_next, r, w, GAMMA, alpha)
    assert_close(model.readout(_forward(model, z))[:, 0], np.einsum("bd,bd->b", w, phi_q))
    if n_layers > 1:
        assert model.origin["alphas"] == alphas
        with raises_user("untied"):
            theta_star_model("linear-td", d, n_layers=n_layers, alpha=alphas, tied=True)
        with raises_user("step sizes", "layers"):
            theta_star_model("linear-td", d, n_layers=n_layers, alpha=alphas[:-1], tied=False)


# ---------------------------------------------------------- both orders
@pytest.mark.parametrize("family", ["linear-td", "sarsa"])
@pytest.mark.parametrize("pos", [2, 5, 12, 64])
def test_quadratic_and_associative_paths_agree(family, pos):
    for seed in range(3):
        model = random_model(family, d=2, seed=seed, n_layers=3, tied=seed != 1)
        z = random_prompt(model, 8, pos, seed)
        outs, caches = {}, {}
        for path in ("quadratic", "associative"):
            model.set_attention_path(path)
            outs[path] = _forward(model, z)
            _, caches[path] = cache(model, z, lambda name: name.endswith(("hook_v", "hook_z", "hook_resid_post")))
            assert model.blocks[-1].attn.last_path == path
        assert_close(outs["associative"], outs["quadratic"])
        assert caches["quadratic"].keys() == caches["associative"].keys()
        for name in caches["quadratic"]:
            assert_close(caches["associative"][name], caches["quadratic"][name])


def test_auto_path_materialises_the_pattern_only_when_observed():
    model = theta_star_model("linear-td", 2, n_layers=2)  # D = 5
    z = td_prompts(4, 40, 2, seed=0)[0]
    _forward(model, z)
    assert [b.attn.last_path for b in model.blocks] == ["associative"] * 2
    out_q, acts = cache(model, z, ["blocks.1.attn.hook_pattern"])
    assert [b.attn.last_path for b in model.blocks] == ["associative", "quadratic"]
    assert acts["blocks.1.attn.hook_pattern"].shape == (4, 1, 41, 41)
    _, acts = cache(model, z, ["blocks.0.attn.hook_attn_scores"])
    assert model.blocks[0].attn.last_path == "quadratic"
    _forward(model, z)  # the caching hooks are gone again
    assert [b.attn.last_path for b in model.blocks] == ["associative"] * 2
    # a short context is cheaper quadratically
    _forward(model, td_prompts(4, 3, 2, seed=0)[0])
    assert model.blocks[0].attn.last_path == "quadratic"


def test_hook_v_intervention_is_honoured_on_both_paths():
    model = random_model("linear-td", d=2, seed=3, n_layers=2)
    doubled = random_model("linear-td", d=2, seed=3, n_layers=2)
    with torch.no_grad():
        doubled.blocks[0].attn.P.mul_(2.0)
    z = random_prompt(model, 4, 30, 0)
    expected = _forward(doubled, z)
    for path in ("quadratic", "associative"):
        model.set_attention_path(path)
        with torch.no_grad():
            out = model.run_with_hooks(z, fwd_hooks=[(lambda name: name.endswith("hook_v"), lambda v, hook: 2 * v)])
        assert_close(out, expected)


def test_unknown_path_is_refused():
    model = random_model("linear-td")
    with raises_user("path", "bogus"):
        model.set_attention_path("bogus")


# ------------------------------------------------------------------ gauge
@pytest.mark.parametrize("tied", [True, False])
def test_gauge_cP_Q_over_c_leaves_the_model_unchanged(tied):
    base = random_model("linear-td", d=3, seed=7, n_layers=3, tied=tied)
    z = random_prompt(base, 6, 15, 1)
    expected = _forward(base, z)
    for cs in ([-3.0, -3.0, -3.0], [0.5, 2.0, -1.5]):
        gauged = random_model("linear-td", d=3, seed=7, n_layers=3, tied=tied)
        with torch.no_grad():
            for layer in gauged.config.stored_layers():
                gauged.blocks[layer].attn.P.mul_(cs[layer])
                gauged.blocks[layer].attn.Q.div_(cs[layer])
        assert_close(_forward(gauged, z), expected, tol=1e-12)
    # the theta* gauge constant is the same symmetry
    zt, *_ = td_prompts(6, 15, 3, seed=2)
    ref = _forward(theta_star_model("linear-td", 3, n_layers=3, tied=tied), zt)
    assert_close(_forward(theta_star_model("linear-td", 3, n_layers=3, c=-2.5, tied=tied), zt), ref, tol=1e-12)


# ------------------------------------------------------------- activation
def _numpy_forward(P, Q, z, n_layers, act):
    """Wang's layer in the paper orientation: Z <- Z + (1/n) P Z M act(Z^T Q Z)."""
    out = []
    for zb in z:
        Z = zb.T.copy()
        n = Z.shape[1] - 1
        M = np.eye(n + 1)
        M[-1, -1] = 0.0
        for _ in range(n_layers):
            Z = Z + (1.0 / n) * P @ Z @ M @ act(Z.T @ Q @ Z)
        out.append(Z.T)
    return np.stack(out)


@pytest.mark.parametrize("activation", [None, "tanh", "relu", "elu"])
def test_forward_is_the_documented_formula(activation):
    acts = {None: lambda x: x, "tanh": np.tanh, "relu": lambda x: np.maximum(x, 0), "elu": lambda x: np.where(x > 0, x, np.expm1(x))}
    model = random_model("linear-td", d=2, seed=1, n_layers=2, activation=activation)
    z = random_prompt(model, 5, 9, 4)
    P, Q = (model.blocks[0].attn.P.detach().numpy(), model.blocks[0].attn.Q.detach().numpy())
    assert_close(_forward(model, z), _numpy_forward(P, Q, z.numpy(), 2, acts[activation]), tol=1e-12)
    if activation is not None:
        assert model.blocks[0].attn.last_path == "quadratic"
        model.set_attention_path("associative")
        with raises_user("associative", activation):
            _forward(model, z)


# ------------------------------------------------------------- stop_at_layer
def test_stop_at_layer_follows_transformer_lens():
    model = random_model("linear-td", d=2, seed=2, n_layers=3, tied=False)
    z = random_prompt(model, 3, 6, 0)
    _, acts = cache(model, z)
    torch.testing.assert_close(_forward(model, z, stop_at_layer=0), z, rtol=0, atol=0)
    for k in (1, 2):
        assert_close(_forward(model, z, stop_at_layer=k), acts[f"blocks.{k}.hook_resid_pre"], tol=0)
        assert_close(_forward(model, z, stop_at_layer=k - 3), acts[f"blocks.{k}.hook_resid_pre"], tol=0)
    assert_close(_forward(model, z, stop_at_layer=3), acts["blocks.2.hook_resid_post"], tol=0)
    with raises_user("stop_at_layer", "3-layer"):
        _forward(model, z, stop_at_layer=4)


def test_bad_prompts_are_refused():
    model = random_model("linear-td", d=2)
    forward = plain(type(model).forward)
    with raises_user("d_model 6", "expects 5"):
        forward(model, torch.zeros(2, 4, 6, dtype=torch.float64))
    with raises_user("pos = 1"):
        forward(model, torch.zeros(2, 1, 5, dtype=torch.float64))
    with raises_user("[batch, pos, d_model]"):
        forward(model, torch.zeros(4, 5, dtype=torch.float64))


def test_float32_model_casts_prompts_and_tracks_float64():
    z, phi, phi_next, r, phi_q = td_prompts(8, 20, 3, seed=0)
    m32 = theta_star_model("linear-td", 3, n_layers=3, dtype="float32")
    assert all(p.dtype == torch.float32 for p in m32.parameters())
    with torch.no_grad():
        out = m32.readout(m32(z))
    assert out.dtype == torch.float32
    ref = reference.batch_td(phi, phi_next, r, phi_q, GAMMA, 1.0, 3)
    np.testing.assert_allclose(out[:, 0].numpy(), ref.query_values[:, 3], atol=1e-4)


def test_config_validation():
    with raises_user("unknown family"):
        ModelConfig("linear-tdd", 3)
    with raises_user("activation", "softmax-td"):
        ModelConfig("softmax-td", 3, activation="tanh")
    with raises_user("unknown activation"):
        ModelConfig("linear-td", 3, activation="softmax")
    with raises_user("gamma"):
        ModelConfig("linear-td", 3, gamma=1.0)
    with raises_user("n_layers"):
        ModelConfig("linear-td", 3, n_layers=0)
    with raises_user("dtype"):
        ModelConfig("linear-td", 3, dtype="float16")
    with raises_user("m ", "actor-critic"):
        ModelConfig("linear-td", 3, m=2)
    assert ModelConfig("linear-td", 3, form="dual").form is None  # the form only matters for softmax
    with raises_user("c ", "softmax-td"):
        theta_star_model("softmax-td", 3, c=2.0)
    with raises_user("score_scale", "linear-td"):
        theta_star_model("linear-td", 3, score_scale=2.0)
    with raises_user("non-zero"):
        theta_star_model("linear-td", 3, c=0.0)


def test_build_model_is_seeded_and_small():
    cfg = ModelConfig("linear-td", 3, n_layers=4, tied=False, dtype="float64")
    a, b, c = build_model(cfg, seed=1), build_model(cfg, seed=1), build_model(cfg, seed=torch.Generator().manual_seed(2))
    for (name, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(pa, pb) and not torch.equal(pa, pc)  # exact: the same seeded draws
        assert 0 < pa.abs().max() < 0.5  # Xavier gain 0.1 / L


@pytest.mark.parametrize("family", ["linear-td", "sarsa"])
def test_both_paths_give_the_same_parameter_gradients(family):
    """Training takes the associative order on long contexts: its gradients must be the quadratic ones."""
    grads = {}
    for path in ("quadratic", "associative"):
        model = random_model(family, d=2, seed=5, n_layers=2, tied=False)
        model.set_attention_path(path)
        z = random_prompt(model, 4, 30, 1)
        model.readout(model(z)).pow(2).sum().backward()
        grads[path] = {name: p.grad.clone() for name, p in model.named_parameters()}
    for name, g in grads["quadratic"].items():
        assert g.abs().sum() > 0
        assert_close(grads["associative"][name], g)
