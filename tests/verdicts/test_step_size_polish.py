"""Known answers of the step-size polish (issue 24): on control tasks one large step and several small ones nearly
coincide, so every step k is scored at its own least-squares step sizes (Gauss-Newton from the best point tried,
`candidates._runs`); actor-critic's two step sizes are polished jointly the same way. Each test names the mutant
it kills.

The teachers are written here as per-prompt, per-column loops (not with candidates.py): batch SARSA and batch
actor-critic on small tabular MDP trajectories (one-hot state-action features, the prompt's own w_0 and lam_0), at
step sizes that lie between the grid's values.
"""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.verdicts import behaviour as VD
from icrl_interp.verdicts import candidates as C

S, A, N, B, M = 4, 2, 24, 48, 3
GAMMA = 0.5
POLISHED = 1e-7
"""Relative distance of a polished step size from the teacher's: Gauss-Newton on a zero-residual fit ends at rounding
(measured ~1e-12); a grid or refined value is at least ~1e-3 away (refined values are 2.2 % apart)."""


def _tr(seed: int = 0, actor: bool = True) -> C.Transitions:
    """B trajectories of N transitions on a random MDP's state-action one-hots (with policy scores g_i and lam_0
    for an actor)."""
    rng = np.random.default_rng(seed)
    s = rng.integers(0, S, size=(B, N + 1))
    a = rng.integers(0, A, size=(B, N + 1))
    hot = np.eye(S * A)[s * A + a]  # [B, N + 1, d]
    scores, lam0 = rng.normal(size=(B, N, M)), rng.normal(size=(B, M))
    return C.Transitions(hot[:, :-1], hot[:, 1:], rng.normal(size=(B, N)), GAMMA, w0=rng.normal(size=(B, S * A)),
                         scores=scores if actor else None, lam0=lam0 if actor else None)


def _teacher(tr: C.Transitions, alpha: float, beta: float | None, k: int) -> np.ndarray:
    """k batch steps per prompt, one column at a time: the critic w += (beta / n) sum_i delta_i phi_i (SARSA: beta
    is alpha and there is no actor), the actor lam += (alpha / n) sum_i gamma^i delta_i g_i; deltas from the w
    before the step. Output [B, d] (SARSA) or [B, d + m] (actor-critic)."""
    out = []
    for b in range(tr.phi.shape[0]):
        w, lam = tr.w0[b].copy(), None if beta is None else tr.lam0[b].copy()
        for _ in range(k):
            dw, dlam = np.zeros_like(w), np.zeros(M)
            for i in range(N):
                delta = tr.rewards[b, i] + GAMMA * w @ tr.phi_next[b, i] - w @ tr.phi[b, i]
                dw += delta * tr.phi[b, i]
                if beta is not None:
                    dlam += GAMMA ** i * delta * tr.scores[b, i]
            w = w + (alpha if beta is None else beta) / N * dw
            lam = None if beta is None else lam + alpha / N * dlam
        out.append(w if beta is None else np.concatenate([w, lam]))
    return np.stack(out)


def _fit(name: str, tr: C.Transitions, target: np.ndarray) -> C.Fit:
    W = VD.train_resamples(np.arange(B), 0, 20)
    (f,) = C.fit(C.CANDIDATES[name], tr, target[None], 8, W)
    return f


def test_one_large_sarsa_step_is_not_traded_for_several_small_ones():
    """One SARSA step of alpha 1.16 (off the grid) on tabular features: k = 1 with alpha polished to rounding, the
    intervals holding both. Mutant: Gauss-Newton only at the steps next to the best *grid* k (as before issue 24's
    fix): several small steps at a grid step size beat one large step at its nearest grid value, and the fit says
    k > 1 with alpha ~ 1.16 / k (the zoo's sarsa_a1_k1_L1 got k 6, alpha 0.20)."""
    tr = _tr(actor=False)
    f = _fit("batch_sarsa", tr, _teacher(tr, 1.16, None, 1))
    assert f.step == 1 and f.interval("step") == [1, 1]
    assert f.hyper["alpha"] == pytest.approx(1.16, rel=POLISHED)
    lo, hi = f.interval("alpha")
    assert lo <= 1.16 <= hi and hi / lo < 1.1  # covered, and by the polish's resolution, not a grid gap
    assert f.hyper["gamma"] == GAMMA and f.sse <= 1e-20 * f.sst


def test_actor_critics_two_step_sizes_are_polished_jointly():
    """Actor-critic with actor step 2.3 and critic step 0.37 (both between grid values), one step: both recovered
    to rounding and inside their intervals. Mutants: the grid alone (or the coarse grid of every third value) /
    the polish disabled (GAUSS_NEWTON = 0) / beta not polished (STEP_SIZES without it): a step size a grid or
    refined spacing away."""
    tr = _tr(1)
    f = _fit("actor_critic", tr, _teacher(tr, 2.3, 0.37, 1))
    assert f.step == 1
    for name, truth in (("alpha", 2.3), ("beta", 0.37)):
        assert f.hyper[name] == pytest.approx(truth, rel=POLISHED)
        lo, hi = f.interval(name)
        assert lo <= truth <= hi and hi / lo < 1.1
    assert f.sse <= 1e-20 * f.sst


def test_actor_critic_over_step_size_pairs_is_the_one_pair_run():
    """The vectorized actor-critic (one critic run per distinct beta, the actor linear in alpha) equals the one-pair
    run for every pair, two steps. Mutant: the actor's discount gamma^i or the pairing (alphas[j] with betas[j])
    dropped."""
    tr = _tr(2)
    alphas, betas = np.array([0.0, 0.3, 2.3, 2.3]), np.array([0.37, 0.37, 1.0, 0.0])
    many = C.actor_critic(tr, alphas, betas, 2).outputs
    for j in range(alphas.size):
        one = C.actor_critic(tr, float(alphas[j]), float(betas[j]), 2).outputs
        scale = np.abs(one).max()
        np.testing.assert_allclose(many[j], one, rtol=0, atol=64 * np.finfo(float).eps * scale)
    np.testing.assert_allclose(C.actor_critic(tr, 2.3, 0.37, 1).outputs[:, 1], _teacher(tr, 2.3, 0.37, 1),
                               rtol=0, atol=64 * np.finfo(float).eps * scale)
