"""Reference RL algorithms in float64 numpy: the ground truth for the models.

Deliberately independent of the model code: nothing here builds a prompt or
applies an attention layer. Formulas: docs/concepts.md, sections Linear-attention TD(0),
Softmax TD, and SARSA and actor-critic (linear self-attention).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from jaxtyping import Float, Int

from ..core import validate as V

Array = np.ndarray


def _f64(name: str, a) -> np.ndarray:
    return V.finite(name, np.asarray(a, dtype=np.float64))


# --------------------------------------------------------------- batch TD(0)
@dataclass
class TDTrace:
    """Per-iteration record of batch TD(0); index l = 0..L (l = 0 is the start, w_0 = 0)."""

    w: Float[Array, "batch iters_plus_one d"]
    """Weights w_l."""
    query_values: Float[Array, "batch iters_plus_one"]
    """Value estimates w_l . phi(s_q) at the query."""
    td_errors: Float[Array, "batch iters_plus_one n"]
    """delta_i(w_l) = r_i + gamma w_l . phi(s_{i+1}) - w_l . phi(s_i)."""


def batch_td(
    phi: Float[Array, "batch n d"],
    phi_next: Float[Array, "batch n d"],
    rewards: Float[Array, "batch n"],
    phi_query: Float[Array, "batch d"],
    gamma: float,
    alpha: float,
    n_iters: int,
    C: Float[Array, "d d"] | None = None,
) -> TDTrace:
    """Batch TD(0) with preconditioner C: w_{l+1} = w_l + (alpha/n) C sum_i delta_i(w_l) phi_i."""
    phi, phi_next, rewards = _f64("phi", phi), _f64("phi_next", phi_next), _f64("rewards", rewards)
    B, n, d = phi.shape
    V.shape("phi_next", phi_next, (B, n, d))
    V.shape("rewards", rewards, (B, n))
    phi_query = V.shape("phi_query", _f64("phi_query", phi_query), (B, d))
    gamma = V.discount(gamma)
    C = np.eye(d) if C is None else V.shape("C", _f64("C", C), (d, d))
    n_iters = V.count("n_iters", n_iters, 0)
    w = np.zeros((B, n_iters + 1, d))
    deltas = np.zeros((B, n_iters + 1, n))
    diff = gamma * phi_next - phi  # [B, n, d]
    for l in range(n_iters + 1):
        deltas[:, l] = rewards + np.einsum("bnd,bd->bn", diff, w[:, l])
        if l < n_iters:
            step = np.einsum("bn,bnd->bd", deltas[:, l], phi) @ C.T
            w[:, l + 1] = w[:, l] + (alpha / n) * step
    return TDTrace(w=w, query_values=np.einsum("bld,bd->bl", w, phi_query), td_errors=deltas)


# ------------------------------------------------------- weighted softmax TD
@dataclass
class SoftmaxTDTrace:
    """Per-iteration record of weighted softmax TD; index l = 0..L (v_0 = 0)."""

    values: Float[Array, "batch iters_plus_one pos"]
    """v_l(S_j) for j = 0..n (every state of the trajectory, S_n included)."""
    td_errors: Float[Array, "batch iters_plus_one n"]
    """delta_k^{(l)} = R_k + gamma v_l(S_k) - v_l(S_{k-1}) for k = 1..n."""
    kernel: Float[Array, "batch n pos"]
    """K[k-1, j] = K(S_{k-1}, S_j): weight of source k on target S_j (sums to 1 over k)."""


def softmax_kernel(
    x: Float[Array, "batch pos d"], A11: Float[Array, "d d"] | None = None
) -> Float[Array, "batch n pos"]:
    """K(S_{k-1}, S_j) = softmax over k = 1..n of g(S_j, S_{k-1}) = x(S_{k-1})^T A11 x(S_j)."""
    x = _f64("x", x)
    d = x.shape[-1]
    A11 = np.eye(d) if A11 is None else V.shape("A11", _f64("A11", A11), (d, d))
    # sources S_0..S_{n-1}, targets S_0..S_n; matmul (BLAS), not a three-operand einsum (a Python-level loop)
    scores = (x[:, :-1] @ A11) @ np.swapaxes(x, 1, 2)
    scores -= scores.max(axis=1, keepdims=True)
    e = np.exp(scores)
    return e / e.sum(axis=1, keepdims=True)


def weighted_softmax_td(
    x: Float[Array, "batch pos d"],
    rewards: Float[Array, "batch n"],
    gamma: float,
    alpha: float,
    n_iters: int,
    A11: Float[Array, "d d"] | None = None,
    kernel: Float[Array, "batch n pos"] | None = None,
) -> SoftmaxTDTrace:
    """Synchronous weighted softmax TD on the states S_0..S_n of each trajectory.

    v_{t+1}(S_j) = v_t(S_j) + alpha sum_k K(S_{k-1}, S_j) delta_k^{(t)}. Pass `kernel`
    to use a given kernel (e.g. the sharp tabular one) instead of the softmax score.
    """
    x = _f64("x", x)
    B, pos, _ = x.shape
    n = pos - 1
    rewards = V.shape("rewards", _f64("rewards", rewards), (B, n))
    gamma = V.discount(gamma)
    n_iters = V.count("n_iters", n_iters, 0)
    K = softmax_kernel(x, A11) if kernel is None else V.shape("kernel", _f64("kernel", kernel), (B, n, pos))
    values = np.zeros((B, n_iters + 1, pos))
    deltas = np.zeros((B, n_iters + 1, n))
    for l in range(n_iters + 1):
        v = values[:, l]
        deltas[:, l] = rewards + gamma * v[:, 1:] - v[:, :-1]
        if l < n_iters:
            values[:, l + 1] = v + alpha * (deltas[:, l, None, :] @ K)[:, 0]
    return SoftmaxTDTrace(values=values, td_errors=deltas, kernel=K)


def tabular_kernel(states: Int[Array, "batch pos"]) -> Float[Array, "batch n pos"]:
    """The sharp-kernel limit: K(S_{k-1}, S_j) = 1{S_{k-1} = S_j} / #visits(S_j) as a source.

    A target state never visited as a source gets the uniform kernel (the beta -> inf
    limit of one-hot x beta features, where all its scores tie at zero).
    """
    states = np.asarray(states)
    match = (states[:, :-1, None] == states[:, None, :]).astype(np.float64)  # [B, n, pos]
    counts = match.sum(axis=1, keepdims=True)
    uniform = np.full_like(match, 1.0 / match.shape[1])
    return np.where(counts > 0, match / np.maximum(counts, 1.0), uniform)


def tabular_td(
    states: Int[Array, "batch pos"], rewards: Float[Array, "batch n"], gamma: float, alpha: float, n_iters: int
) -> SoftmaxTDTrace:
    """Batch tabular TD: weighted softmax TD with the sharp (visit-averaging) kernel."""
    rewards = V.shape("rewards", _f64("rewards", rewards), (None, None))
    states = V.shape("states", np.asarray(states), (rewards.shape[0], rewards.shape[1] + 1)).astype(np.int64)
    dummy = np.zeros(states.shape + (1,))
    return weighted_softmax_td(dummy, rewards, gamma, alpha, n_iters, kernel=tabular_kernel(states))


# ------------------------------------------------ SARSA and actor-critic
def td_errors(
    phi: Float[Array, "batch n d"],
    phi_next: Float[Array, "batch n d"],
    rewards: Float[Array, "batch n"],
    w: Float[Array, "batch d"],
    gamma: float,
) -> Float[Array, "batch n"]:
    """delta_i = r_{i+1} + gamma w.phi+_i - w.phi_i for every transition of every prompt."""
    return rewards + gamma * np.einsum("bnd,bd->bn", phi_next, w) - np.einsum("bnd,bd->bn", phi, w)


def sarsa_update(
    phi: Float[Array, "batch n d"],
    phi_next: Float[Array, "batch n d"],
    rewards: Float[Array, "batch n"],
    w: Float[Array, "batch d"],
    gamma: float,
    alpha: float,
) -> Float[Array, "batch d"]:
    """One batch semi-gradient SARSA step: w + (alpha/n) sum_i [r_{i+1} + gamma w.phi+_i - w.phi_i] phi_i."""
    phi, phi_next, rewards, w = _f64("phi", phi), _f64("phi_next", phi_next), _f64("rewards", rewards), _f64("w", w)
    B, n, d = phi.shape
    V.shape("phi_next", phi_next, (B, n, d))
    V.shape("rewards", rewards, (B, n))
    V.shape("w", w, (B, d))
    gamma = V.discount(gamma)
    delta = td_errors(phi, phi_next, rewards, w, gamma)
    return w + (alpha / n) * np.einsum("bn,bnd->bd", delta, phi)


def policy_score(
    lam: Float[Array, "batch m"], phi_pi: Float[Array, "batch s a m"], states: Int[Array, "batch k"],
    actions: Int[Array, "batch k"],
) -> Float[Array, "batch k m"]:
    """Score g_lambda(s, a) = grad_lambda log pi_lambda(a|s) = phi_pi(s,a) - E_{b~pi}[phi_pi(s,b)]."""
    logits = np.einsum("bsam,bm->bsa", phi_pi, lam)
    logits -= logits.max(-1, keepdims=True)
    pi = np.exp(logits)
    pi /= pi.sum(-1, keepdims=True)
    mean = np.einsum("bsa,bsam->bsm", pi, phi_pi)
    rows = np.arange(phi_pi.shape[0])[:, None]
    return phi_pi[rows, states, actions] - mean[rows, states]


def actor_critic_update(
    phi: Float[Array, "batch n d"],
    phi_next: Float[Array, "batch n d"],
    rewards: Float[Array, "batch n"],
    scores: Float[Array, "batch n m"],
    w: Float[Array, "batch d"],
    lam: Float[Array, "batch m"],
    gamma: float,
    alpha: float,
    beta: float,
) -> tuple[Float[Array, "batch d"], Float[Array, "batch m"]]:
    """One batch actor-critic step (critic step beta, actor step alpha, discounted score gamma^i g_i).

    critic: w + (beta/n) sum_i delta_i phi_i;  actor: lam + (alpha/n) sum_i gamma^i delta_i g_i,
    with delta_i = r_{i+1} + gamma w.phi+_i - w.phi_i and i = 0..n-1.
    """
    phi, phi_next, rewards = _f64("phi", phi), _f64("phi_next", phi_next), _f64("rewards", rewards)
    scores, w, lam = _f64("scores", scores), _f64("w", w), _f64("lam", lam)
    B, n, d = phi.shape
    V.shape("phi_next", phi_next, (B, n, d))
    V.shape("rewards", rewards, (B, n))
    V.shape("w", w, (B, d))
    V.shape("scores", scores, (B, n, None))
    V.shape("lam", lam, (B, scores.shape[-1]))
    gamma = V.discount(gamma)
    delta = td_errors(phi, phi_next, rewards, w, gamma)
    w_new = w + (beta / n) * np.einsum("bn,bnd->bd", delta, phi)
    disc = gamma ** np.arange(n)
    lam_new = lam + (alpha / n) * np.einsum("n,bn,bnm->bm", disc, delta, scores)
    return w_new, lam_new
