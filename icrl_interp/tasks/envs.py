"""Task distributions: randomized Boyan chains (MRPs) and random tabular MDPs.

Everything is batched over tasks (leading axis B) and seeded through a numpy
`Generator`; sampling loops over time steps only, never over tasks.
Conventions follow docs/concepts.md, section Environments:

* Boyan chain: state i < s-2 moves to i+1 w.p. p_i ~ U(0.01, 0.99), else to i+2;
  state s-2 moves to s-1; the last state jumps to any state with random
  normalised weights. Rewards depend on the state: r_t = r(s_t).
* Tabular MDP (our choice, the paper gives none): transition rows
  P(.|s, a) ~ Dirichlet(concentration * 1), deterministic rewards
  R(s, a) ~ U(-1, 1), start distribution uniform. The reward of step i is
  r_{i+1} = R(s_i, a_i). State-action features: one-hot e_{s n_A + a} unless
  the batch carries its own per-task `phi` (random feature maps:
  `sampling.sa_feature_map`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from jaxtyping import Float, Int

from ..core import validate as V
from ..core.errors import UserError

Array = np.ndarray


# ----------------------------------------------------------------- features
def random_features(batch: int, n_states: int, d: int, rng) -> Float[Array, "batch states d"]:
    """Features U(-1, 1)^{states x d}, a fresh draw per task."""
    return V.rng(rng).uniform(-1.0, 1.0, size=(batch, n_states, d))


def onehot_features(batch: int, n_states: int, beta: float = 1.0) -> Float[Array, "batch states states"]:
    """One-hot state features scaled by beta (d = number of states)."""
    return np.broadcast_to(beta * np.eye(n_states), (batch, n_states, n_states)).copy()


def state_action_onehot(n_states: int, n_actions: int) -> Float[Array, "states actions d"]:
    """phi(s, a) = e_{s * n_actions + a}, d = n_states * n_actions."""
    return np.eye(n_states * n_actions).reshape(n_states, n_actions, n_states * n_actions)


# --------------------------------------------------------------- linear algebra
def stationary_distribution(P: Float[Array, "*batch s s"]) -> Float[Array, "*batch s"]:
    """Left eigenvector of P for eigenvalue 1, normalised to sum 1 (P ergodic)."""
    P = np.asarray(P, dtype=np.float64)
    s = P.shape[-1]
    A = np.eye(s) - np.swapaxes(P, -1, -2)
    A[..., -1, :] = 1.0  # replace one (redundant) balance equation by normalisation
    b = np.zeros(P.shape[:-1])
    b[..., -1] = 1.0
    mu = np.linalg.solve(A, b[..., None])[..., 0]
    return mu


def policy_values(P: Float[Array, "*batch s s"], r: Float[Array, "*batch s"], gamma: float) -> Float[Array, "*batch s"]:
    """Exact values v = (I - gamma P)^{-1} r."""
    s = P.shape[-1]
    return np.linalg.solve(np.eye(s) - gamma * np.asarray(P), np.asarray(r)[..., None])[..., 0]


# ------------------------------------------------------------------ sampling
def _sample_rows(cum_rows: Float[Array, "batch k"], rng: np.random.Generator) -> Int[Array, " batch"]:
    """One draw per row from categorical rows given as cumulative sums."""
    u = rng.random(cum_rows.shape[0]) * cum_rows[:, -1]
    # first index with cum > u; `<=` (not `<`) so u = 0 never picks a leading zero-probability entry
    idx = (cum_rows <= u[:, None]).sum(-1)
    return np.minimum(idx, cum_rows.shape[1] - 1)


def sample_categorical(probs: Float[Array, "batch k"], rng) -> Int[Array, " batch"]:
    """One index per row of a batch of probability vectors."""
    return _sample_rows(np.cumsum(probs, -1), V.rng(rng))


@dataclass
class Trajectories:
    """A batch of sampled trajectories (one per task)."""

    states: Int[Array, "batch steps_plus_one"]
    """Visited states s_0 .. s_n."""
    rewards: Float[Array, "batch steps"]
    """Reward of each transition: r(s_i) for MRPs, R(s_i, a_i) for MDPs."""
    actions: Int[Array, "batch steps_plus_one"] | None = None
    """Actions a_0 .. a_n (MDPs only; a_n is drawn so SARSA has a_{i+1} for the last step)."""


# ---------------------------------------------------------------------- MRPs
@dataclass
class MRPBatch:
    """A batch of finite Markov reward processes with state features."""

    P: Float[Array, "batch s s"]
    """Transition matrices, row-stochastic."""
    r: Float[Array, "batch s"]
    """Reward r(s) received when leaving state s."""
    phi: Float[Array, "batch s d"]
    """State features (one row per state)."""
    gamma: float
    """Discount factor in [0, 1)."""

    def __post_init__(self):
        self.P = V.stochastic("transition matrix P", np.asarray(self.P, dtype=np.float64))
        B, s = self.P.shape[0], self.P.shape[-1]
        V.shape("P", self.P, (None, s, s))
        self.r = V.finite("rewards r", V.shape("r", np.asarray(self.r, dtype=np.float64), (B, s)))
        self.phi = V.finite("features phi", V.shape("phi", np.asarray(self.phi, dtype=np.float64), (B, s, None)))
        self.gamma = V.discount(self.gamma)

    @property
    def batch(self) -> int:
        return self.P.shape[0]

    @property
    def n_states(self) -> int:
        return self.P.shape[-1]

    @property
    def d(self) -> int:
        return self.phi.shape[-1]

    def values(self) -> Float[Array, "batch s"]:
        """True values v = (I - gamma P)^{-1} r."""
        return policy_values(self.P, self.r, self.gamma)

    def stationary(self) -> Float[Array, "batch s"]:
        """Stationary distribution of each chain."""
        return stationary_distribution(self.P)

    def sample(self, n_steps: int, rng, start: str | Int[Array, " batch"] = "stationary") -> Trajectories:
        """Sample n_steps transitions per task; start 'stationary', 'uniform' or given states."""
        rng = V.rng(rng)
        n_steps = V.count("n_steps", n_steps, 0)
        B, s = self.batch, self.n_states
        if isinstance(start, str):
            if start == "stationary":
                s0 = sample_categorical(self.stationary().clip(min=0), rng)
            elif start == "uniform":
                s0 = rng.integers(0, s, size=B)
            else:
                raise UserError(f"unknown start {start!r} (use 'stationary', 'uniform' or an array of states)")
        else:
            s0 = V.states("start states", start, (B,), s)
        cum = np.cumsum(self.P, -1)
        states = np.empty((B, n_steps + 1), dtype=np.int64)
        states[:, 0] = s0
        rows = np.arange(B)
        for t in range(n_steps):
            states[:, t + 1] = _sample_rows(cum[rows, states[:, t]], rng)
        rewards = self.r[rows[:, None], states[:, :-1]]
        return Trajectories(states=states, rewards=rewards)


def boyan_transitions(batch: int, n_states: int, rng) -> Float[Array, "batch s s"]:
    """Random Boyan-chain transition matrices (see module docstring)."""
    if n_states < 3:
        raise UserError(f"a Boyan chain needs at least 3 states, got {n_states}")
    batch = V.count("number of tasks", batch)
    rng = V.rng(rng)
    P = np.zeros((batch, n_states, n_states))
    p = rng.uniform(0.01, 0.99, size=(batch, n_states - 2))
    i = np.arange(n_states - 2)
    P[:, i, i + 1] = p
    P[:, i, i + 2] += 1.0 - p
    P[:, n_states - 2, n_states - 1] = 1.0
    w = rng.random((batch, n_states))
    P[:, n_states - 1, :] = w / w.sum(-1, keepdims=True)
    return P


def sample_boyan_chains(
    batch: int,
    n_states: int = 10,
    d: int = 4,
    gamma: float = 0.9,
    rng=0,
    features: str = "random",
    beta: float = 1.0,
    rewards: str = "uniform",
) -> MRPBatch:
    """Draw `batch` randomized Boyan chains, each with fresh features and rewards.

    features: 'random' (U(-1,1)^{s x d}) or 'onehot' (d = n_states, scaled by beta).
    rewards: 'uniform' (U(-1,1)) or 'representable' (v = phi w, w ~ N(0, I), r = (I - gamma P) v).
    """
    rng = V.rng(rng)
    gamma = V.discount(gamma)
    P = boyan_transitions(batch, n_states, rng)
    if features == "random":
        phi = random_features(batch, n_states, d, rng)
    elif features == "onehot":
        phi = onehot_features(batch, n_states, beta)
    else:
        raise UserError(f"unknown features {features!r} (use 'random' or 'onehot')")
    if rewards == "uniform":
        r = rng.uniform(-1.0, 1.0, size=(batch, n_states))
    elif rewards == "representable":
        w = rng.standard_normal((batch, phi.shape[-1]))
        v = np.einsum("bsd,bd->bs", phi, w)
        r = v - gamma * np.einsum("bst,bt->bs", P, v)
    else:
        raise UserError(f"unknown rewards {rewards!r} (use 'uniform' or 'representable')")
    return MRPBatch(P=P, r=r, phi=phi, gamma=gamma)


# ---------------------------------------------------------------------- MDPs
def epsilon_greedy(q: Float[Array, "*batch s a"], epsilon: float) -> Float[Array, "*batch s a"]:
    """epsilon-greedy policy on action values (ties broken towards the first action)."""
    if not (0.0 <= epsilon <= 1.0):
        raise UserError(f"epsilon must lie in [0, 1], got {epsilon}")
    n_actions = q.shape[-1]
    pi = np.full(q.shape, epsilon / n_actions)
    best = np.argmax(q, axis=-1)
    np.put_along_axis(pi, best[..., None], 1.0 - epsilon + epsilon / n_actions, axis=-1)
    return pi


def softmax_policy(logits: Float[Array, "*batch s a"]) -> Float[Array, "*batch s a"]:
    """pi(a|s) proportional to exp(logits[s, a])."""
    z = logits - logits.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


@dataclass
class MDPBatch:
    """A batch of finite MDPs with deterministic rewards R(s, a)."""

    P: Float[Array, "batch s a s2"]
    """Transition probabilities P(s' | s, a)."""
    R: Float[Array, "batch s a"]
    """Reward of taking a in s."""
    start: Float[Array, "batch s"]
    """Start-state distribution (for discounted returns)."""
    gamma: float
    """Discount factor in [0, 1)."""
    phi: Float[Array, "batch s a d"] | None = None
    """Per-task state-action features phi(s, a) (random feature maps); None = one-hot e_{s n_A + a}."""

    def __post_init__(self):
        self.P = V.stochastic("transition tensor P", np.asarray(self.P, dtype=np.float64))
        S = V.shape("P", self.P, (None, None, None, None)).shape[1]
        B, S, A, _ = V.shape("P", self.P, (None, S, None, S)).shape
        self.R = V.finite("rewards R", V.shape("R", np.asarray(self.R, dtype=np.float64), (B, S, A)))
        self.start = V.stochastic("start distribution", V.shape("start", np.asarray(self.start, dtype=np.float64), (B, S)))
        self.gamma = V.discount(self.gamma)
        if self.phi is not None:
            self.phi = V.finite("features phi", V.shape("phi", np.asarray(self.phi, dtype=np.float64), (B, S, A, None)))

    @property
    def batch(self) -> int:
        return self.P.shape[0]

    @property
    def n_states(self) -> int:
        return self.P.shape[1]

    @property
    def n_actions(self) -> int:
        return self.P.shape[2]

    @property
    def d(self) -> int:
        """Feature dimension (n_states * n_actions for one-hot features)."""
        return self.n_states * self.n_actions if self.phi is None else self.phi.shape[-1]

    def features(self) -> Float[Array, "*batch s a d"]:
        """State-action features: one-hot phi(s, a) = e_{s*n_A + a} ([s, a, d], shared by every task), or
        the batch's own per-task `phi` ([batch, s, a, d])."""
        return state_action_onehot(self.n_states, self.n_actions) if self.phi is None else self.phi

    def feature_table(self) -> Float[Array, "batch s a d"]:
        """Per-task features [batch, s, a, d] in every case (one-hot broadcast over the batch, read-only)."""
        if self.phi is not None:
            return self.phi
        return np.broadcast_to(self.features(), (self.batch, self.n_states, self.n_actions, self.d))

    def with_features(self, phi: Float[Array, "batch s a d"] | None) -> "MDPBatch":
        """The same MDPs with per-task features `phi` (None: one-hot)."""
        return MDPBatch(P=self.P, R=self.R, start=self.start, gamma=self.gamma, phi=phi)

    def _check_policy(self, pi) -> np.ndarray:
        pi = np.asarray(pi, dtype=np.float64)
        V.shape("policy", pi, (self.batch, self.n_states, self.n_actions))
        return V.stochastic("policy", pi)

    def policy_mrp(self, pi: Float[Array, "batch s a"]) -> tuple[np.ndarray, np.ndarray]:
        """The MRP (P_pi, r_pi) that policy pi induces on states."""
        pi = self._check_policy(pi)
        return np.einsum("bsa,bsat->bst", pi, self.P), np.einsum("bsa,bsa->bs", pi, self.R)

    def state_values(self, pi: Float[Array, "batch s a"]) -> Float[Array, "batch s"]:
        """Exact v^pi."""
        P_pi, r_pi = self.policy_mrp(pi)
        return policy_values(P_pi, r_pi, self.gamma)

    def q_values(self, pi: Float[Array, "batch s a"]) -> Float[Array, "batch s a"]:
        """Exact Q^pi(s, a) = R(s, a) + gamma sum_s' P(s'|s,a) v^pi(s')."""
        v = self.state_values(pi)
        return self.R + self.gamma * np.einsum("bsat,bt->bsa", self.P, v)

    def discounted_return(self, pi: Float[Array, "batch s a"]) -> Float[Array, " batch"]:
        """Exact expected discounted return of pi from the start distribution."""
        return np.einsum("bs,bs->b", self.start, self.state_values(pi))

    def optimal(self, tol: float = 1e-12, max_iter: int = 100_000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Value iteration: (Q*, a greedy optimal policy, its exact return)."""
        q = np.zeros_like(self.R)
        for _ in range(max_iter):
            q_new = self.R + self.gamma * np.einsum("bsat,bt->bsa", self.P, q.max(-1))
            done = np.max(np.abs(q_new - q)) < tol
            q = q_new
            if done:
                break
        pi = epsilon_greedy(q, 0.0)
        return q, pi, self.discounted_return(pi)

    def sample(self, pi: Float[Array, "batch s a"], n_steps: int, rng, start_states=None) -> Trajectories:
        """Sample n_steps transitions under pi (plus the action a_n at the last state)."""
        rng = V.rng(rng)
        n_steps = V.count("n_steps", n_steps, 0)
        pi = self._check_policy(pi)
        B = self.batch
        rows = np.arange(B)
        if start_states is None:
            s = sample_categorical(self.start, rng)
        else:
            s = V.states("start states", start_states, (B,), self.n_states)
        cum_pi = np.cumsum(pi, -1)
        cum_P = np.cumsum(self.P, -1)
        states = np.empty((B, n_steps + 1), dtype=np.int64)
        actions = np.empty((B, n_steps + 1), dtype=np.int64)
        states[:, 0] = s
        for t in range(n_steps + 1):
            actions[:, t] = _sample_rows(cum_pi[rows, states[:, t]], rng)
            if t < n_steps:
                states[:, t + 1] = _sample_rows(cum_P[rows, states[:, t], actions[:, t]], rng)
        rewards = self.R[rows[:, None], states[:, :-1], actions[:, :-1]]
        return Trajectories(states=states, rewards=rewards, actions=actions)


def sample_tabular_mdps(
    batch: int,
    n_states: int = 9,
    n_actions: int = 4,
    gamma: float = 0.5,
    rng=0,
    concentration: float = 1.0,
) -> MDPBatch:
    """Random MDPs: Dirichlet(concentration) transition rows, R(s, a) ~ U(-1, 1), uniform start."""
    rng = V.rng(rng)
    batch, n_states = V.count("number of tasks", batch), V.count("number of states", n_states)
    n_actions = V.count("number of actions", n_actions)
    if concentration <= 0:
        raise UserError(f"Dirichlet concentration must be positive, got {concentration}")
    P = rng.gamma(concentration, size=(batch, n_states, n_actions, n_states))
    P /= P.sum(-1, keepdims=True)
    R = rng.uniform(-1.0, 1.0, size=(batch, n_states, n_actions))
    start = np.full((batch, n_states), 1.0 / n_states)
    return MDPBatch(P=P, R=R, start=start, gamma=gamma)
