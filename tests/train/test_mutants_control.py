"""In-context control known answers that a mutation sweep found missing. The expected policies and
returns are computed here independently in float64 (explicit softmax / argmax loops, a linear solve for
v = (I - gamma P_pi)^-1 r_pi), never through the package's own policy or return code.

Mutants caught: actor-critic acting on w instead of lam (teacher and transformer share the rule, so
tracking alone cannot see it); the "greedy" return computed for the exploring policy.
"""
from __future__ import annotations

import math

import numpy as np

from icrl_interp.train import control
from icrl_interp.tasks import reference
from icrl_interp.families import actor_critic, sarsa

N_S, N_A, GAMMA = 3, 2, 0.5


def _softmax_policy_from_lam(lam: np.ndarray) -> np.ndarray:
    """pi_lam(a|s) = exp(lam[s * n_A + a]) / sum_a' exp(lam[s * n_A + a']), by loops."""
    B = lam.shape[0]
    pi = np.zeros((B, N_S, N_A))
    for b in range(B):
        for s in range(N_S):
            e = [math.exp(lam[b, s * N_A + a]) for a in range(N_A)]
            for a in range(N_A):
                pi[b, s, a] = e[a] / sum(e)
    return pi


def _greedy_policy(q: np.ndarray) -> np.ndarray:
    """Deterministic greedy policy of q[b, s*n_A + a] (ties to the first action), by loops."""
    B = q.shape[0]
    pi = np.zeros((B, N_S, N_A))
    for b in range(B):
        for s in range(N_S):
            row = [q[b, s * N_A + a] for a in range(N_A)]
            pi[b, s, row.index(max(row))] = 1.0
    return pi


def _exact_return(mdp, pi: np.ndarray) -> np.ndarray:
    """start . (I - gamma P_pi)^-1 r_pi per MDP (a linear solve, not the package's code)."""
    out = np.empty(mdp.P.shape[0])
    for b in range(mdp.P.shape[0]):
        P_pi = np.einsum("sa,sat->st", pi[b], mdp.P[b])
        r_pi = np.einsum("sa,sa->s", pi[b], mdp.R[b])
        out[b] = mdp.start[b] @ np.linalg.solve(np.eye(N_S) - mdp.gamma * P_pi, r_pi)
    return out


# ------------------------------------------------------- actor-critic acts on lam
def test_actor_critic_policy_is_the_softmax_of_lam_not_of_w():
    algo = actor_critic.Control(N_S, N_A, GAMMA, 5.0, 1.0)
    g = np.random.default_rng(0)
    w, lam = g.normal(size=(4, N_S * N_A)), 2.0 * g.normal(size=(4, N_S * N_A))
    params = np.concatenate([w, lam], -1)
    want = _softmax_policy_from_lam(lam)
    np.testing.assert_allclose(algo.policy(params), want, atol=1e-14)
    assert np.abs(_softmax_policy_from_lam(w) - want).max() > 0.1  # acting on w would be a different policy
    np.testing.assert_array_equal(algo.greedy(params), want.argmax(-1))


def test_actor_critic_closed_loop_returns_are_those_of_pi_lam():
    """Along the teacher's loop the recorded return after the last update is the exact return of
    pi_lam for the final lam, and the greedy return is that of argmax_a lam(s, a)."""
    algo = actor_critic.Control(N_S, N_A, GAMMA, 5.0, 1.0)
    mdp = control.draw_mdps(control.ControlConfig(mdps=5, iterations=4, n=12, seed=2), algo)
    trace = control.closed_loop(mdp, algo, 12, 4, np.random.default_rng(3))
    w, lam = trace.params[:, : N_S * N_A], trace.params[:, N_S * N_A :]
    assert np.abs(lam).max() > 0.1 and np.abs(w - lam).max() > 0.1  # w and lam really differ
    want = _exact_return(mdp, _softmax_policy_from_lam(lam))
    np.testing.assert_allclose(trace.returns[:, -1], want, atol=1e-12)
    assert np.abs(_exact_return(mdp, _softmax_policy_from_lam(w)) - want).max() > 1e-3
    np.testing.assert_allclose(trace.greedy_returns, _exact_return(mdp, _greedy_policy(lam)), atol=1e-12)


# ------------------------------------------------------- greedy return
def test_sarsa_greedy_return_is_that_of_the_greedy_policy_not_the_exploring_one():
    eps = 0.3
    algo = sarsa.Control(N_S, N_A, GAMMA, 1.0, 1.0, epsilon=eps)
    mdp = control.draw_mdps(control.ControlConfig(mdps=6, iterations=5, n=10, seed=1), algo)
    trace = control.closed_loop(mdp, algo, 10, 5, np.random.default_rng(4))
    greedy = _greedy_policy(trace.params)
    exploring = (1 - eps) * greedy + eps / N_A  # epsilon-greedy on w . phi
    np.testing.assert_allclose(trace.greedy_returns, _exact_return(mdp, greedy), atol=1e-12)
    np.testing.assert_allclose(trace.returns[:, -1], _exact_return(mdp, exploring), atol=1e-12)
    assert np.abs(trace.greedy_returns - trace.returns[:, -1]).max() > 1e-3  # the two really differ


def test_greedy_return_of_the_transformer_loop_too():
    """The same for a tracked loop (a `step` given): the greedy return is computed from the final
    parameters, here a model that outputs the teacher's step scaled by 1/2."""
    eps = 0.2
    algo = sarsa.Control(N_S, N_A, GAMMA, 1.0, 1.0, epsilon=eps)
    mdp = control.draw_mdps(control.ControlConfig(mdps=4, iterations=3, n=8, seed=5), algo)
    lay = sarsa.layout(N_S * N_A)

    def half_step(z):
        ctx = z[:, :-1]
        w = z[:, -1, lay.slice("w")]
        phi = ctx[..., lay.slice("phi")]
        phi_next = ctx[..., lay.slice("gamma_phi_next")] / GAMMA
        full = reference.sarsa_update(phi, phi_next, ctx[..., lay.slice("reward")][..., 0], w, GAMMA, 1.0)
        return w + 0.5 * (full - w)

    trace = control.closed_loop(mdp, algo, 8, 3, np.random.default_rng(6), step=half_step)
    greedy = _greedy_policy(trace.params)
    np.testing.assert_allclose(trace.greedy_returns, _exact_return(mdp, greedy), atol=1e-12)
    exploring = (1 - eps) * greedy + eps / N_A
    np.testing.assert_allclose(trace.returns[:, -1], _exact_return(mdp, exploring), atol=1e-12)
    assert np.abs(trace.greedy_returns - trace.returns[:, -1]).max() > 1e-3
