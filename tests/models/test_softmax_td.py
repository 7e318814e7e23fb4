"""Xie et al.'s softmax ICTD transformer: theta* in the dual-head form and in the single-head +
temporal-shift form both run weighted softmax TD exactly on every column (float64), and
random weights follow the documented formula."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from icrl_interp.tasks import layouts, reference
from icrl_interp.models import ModelConfig, build_model, theta_star_model
from icrl_interp.families import softmax_td

from helpers import boyan
from .model_cases import assert_close, cache, one_torch_thread, random_model, random_prompt  # noqa: F401

GAMMA = 0.9


def _prompts(features: str, beta: float, seed: int, n: int = 40, batch: int = 12):
    mrp = boyan(batch=batch, n_states=5, d=3, gamma=GAMMA, seed=seed, features=features, beta=beta)
    traj = mrp.sample(n, np.random.default_rng(seed))
    return softmax_td.prompt_from_mrp(mrp, traj)


CASES = [("onehot", 1.0, 1.0), ("onehot", 2.0, 1.0), ("onehot", 1.0, 4.0), ("random", 1.0, 1.0), ("random", 1.0, 2.5)]


@pytest.mark.parametrize("n_layers", [1, 2, 7, 20])
@pytest.mark.parametrize("features,beta,score_scale", CASES)
def test_both_forms_are_weighted_softmax_td_on_every_column(features, beta, score_scale, n_layers):
    prompt = _prompts(features, beta, seed=n_layers)
    z = torch.from_numpy(prompt.z)
    lay = prompt.layout
    x = prompt.z[..., lay.slice("x")]
    ref = reference.weighted_softmax_td(x, prompt.rewards[:, :-1], GAMMA, 0.7, n_layers, A11=score_scale * np.eye(x.shape[-1]))
    cur, tgt = lay.slice("current_mem").start, lay.slice("target_mem").start
    outs = {}
    for form in ("tsm", "dual"):
        model = theta_star_model("softmax-td", x.shape[-1], n_layers=n_layers, gamma=GAMMA, alpha=0.7,
                                 score_scale=score_scale, form=form)
        out, acts = cache(model, z, lambda name: name.endswith("hook_resid_post"))
        for layer in range(n_layers):
            post = acts[f"blocks.{layer}.hook_resid_post"]
            assert_close(post[..., cur], ref.values[:, layer + 1])                  # v_{l+1}(S_j), every column
            assert_close(post[:, :-1, tgt], GAMMA * ref.values[:, layer + 1, 1:])   # gamma v_{l+1}(S_{k+1})
            assert not post[:, -1, tgt].any()  # exact: nothing writes there (literal zeros of theta*)
        assert_close(model.readout(out)[:, 0], ref.values[:, n_layers, -1])        # v_L(S_n)
        outs[form] = out
    assert_close(outs["tsm"], outs["dual"], tol=1e-12)


def test_tabular_limit_of_sharp_scores():
    """One-hot features with a large score scale approach batch tabular TD (known limit)."""
    prompt = _prompts("onehot", 1.0, seed=3, n=60)
    model = theta_star_model("softmax-td", 5, n_layers=5, gamma=GAMMA, alpha=0.5, score_scale=60.0)
    with torch.no_grad():
        out = model(torch.from_numpy(prompt.z))
    ref = reference.tabular_td(prompt.states, prompt.rewards[:, :-1], GAMMA, 0.5, 5)
    visited = (prompt.states[:, :-1, None] == prompt.states[:, None, :]).any(1)  # targets seen as a source
    cur = prompt.layout.slice("current_mem").start
    np.testing.assert_allclose(out[..., cur].numpy()[visited], ref.values[:, 5][visited], atol=1e-12)


def test_pattern_is_a_source_softmax_with_the_query_masked():
    model = random_model("softmax-td", d=3, seed=0, n_layers=2)
    z = random_prompt(model, 4, 9, 0)
    _, acts = cache(model, z)
    for layer in range(2):
        pattern = acts[f"blocks.{layer}.attn.hook_pattern"]
        scores = acts[f"blocks.{layer}.attn.hook_attn_scores"]
        assert pattern.shape == scores.shape == (4, 1, 9, 9)
        assert_close(pattern.sum(-1), torch.ones(4, 1, 9, dtype=torch.float64), tol=1e-14)
        assert torch.all(pattern[..., -1] == 0) and torch.all(scores[..., -1] == float("-inf"))  # exp(-inf) = 0
        assert torch.isfinite(scores[..., :-1]).all()


def _numpy_forward(z, layers, form, gamma, lay):
    """Paper orientation: Zhat = Z + V Z K, K = softmax over sources of Z^T A Z + M; then
    TSM: U Zhat + W Zhat Pi, or dual: Z + V Z K + V_tgt Z K Pi."""
    out = []
    for zb in z:
        Z = zb.T.copy()
        D, pos = Z.shape
        Pi = np.eye(pos, k=-1)  # Pi[k+1, k] = 1
        t, c = lay.slice("target_mem").start, lay.slice("current_mem").start
        U = np.eye(D)
        U[t, t] = 0.0
        W = np.zeros((D, D))
        W[t, c] = gamma
        for p in layers:
            S = Z.T @ p["A"] @ Z
            S[-1, :] = -np.inf  # source n+1 (row) is masked
            K = np.exp(S - S.max(0))
            K /= K.sum(0)
            if form == "tsm":
                Zhat = Z + p["V"] @ Z @ K
                Z = U @ Zhat + W @ Zhat @ Pi
            else:
                Z = Z + p["V"] @ Z @ K + p["V_target"] @ Z @ K @ Pi
        out.append(Z.T)
    return np.stack(out)


@pytest.mark.parametrize("form", ["tsm", "dual"])
@pytest.mark.parametrize("tied", [True, False])
def test_random_weights_follow_the_formula(form, tied):
    model = random_model("softmax-td", d=3, seed=4, n_layers=3, form=form, tied=tied, gamma=0.7)
    z = random_prompt(model, 5, 8, 1)
    layers = [{k: v.detach().numpy() for k, v in model.layer_params(l).items()} for l in range(3)]
    with torch.no_grad():
        out = model(z)
    assert_close(out, _numpy_forward(z.numpy(), layers, form, 0.7, model.layout), tol=1e-12)


def test_gradients_reach_every_parameter():
    model = build_model(ModelConfig("softmax-td", 3, n_layers=2, form="dual", tied=False, dtype="float64"), seed=0)
    z = random_prompt(model, 3, 6, 0)
    z[:, :, 5] = torch.randn(3, 6, dtype=torch.float64)  # non-zero memory rows, so V's memory columns get gradient
    # the whole residual: the last layer's shifted head never reaches the readout column
    model(z).pow(2).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
