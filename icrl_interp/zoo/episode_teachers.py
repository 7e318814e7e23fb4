"""Exact teachers and decoys that act in a Gymnasium environment: the episode zoo's models (docs/zoo.md,
"Episode zoo").

A teacher acts by softmax(beta Q(s, .)) of a tabular learning rule (Q-learning, SARSA, expected SARSA,
every-visit constant-alpha Monte-Carlo control), Q starting at 0, and learns from what it experiences,
one learning history per task. It is written from the textbook (Sutton & Barto, 2nd ed.: sections 6.4-6.6,
and 5.3 with the constant-alpha update of eq. 6.1) as plain per-history loops over a small numpy table, on
purpose *not* with `tasks/learners.py`: the verdict replays the candidates with that module, and a teacher
built from it would be recovered by construction (tests/zoo/test_episode_zoo.py checks that replaying a
teacher's own history reproduces, to 1e-12, the Q-values and log-probabilities it acted with: a cross-check
of both implementations).

Conventions (the ones `tasks/learners.py` documents; a mismatch shows in that test):

* the TD target of step t is r_t + gamma * B(s'_t), with B = 0 when step t terminated its episode; a time-limit
  end (truncation) bootstraps from s'_t like any other step;
* B(s') is max_a Q(s', a) (Q-learning), the expectation of Q(s', .) under the teacher's own policy
  softmax(beta Q(s', .)) (expected SARSA) or Q(s', a') of the action a' it takes next (SARSA: a' is drawn
  from Q *before* the update of step t, as in Sutton & Barto's box; after a truncation no next action is
  taken in s', and B is the expectation under the policy);
* Monte-Carlo control changes nothing during an episode; at its end (terminated or truncated: the returns
  stop there, nothing is bootstrapped) it computes every step's return G_k = r_k + gamma G_{k+1} and makes
  Q(s_k, a_k) += alpha (G_k - Q(s_k, a_k)) for every visit k, in time order.

Decoys act outside every candidate family (none of them learns from reward): a fixed stochastic policy, a
perseverating one, reward-blind cycling, and a "final-policy imitator" that acts by softmax(beta Q*) of the
task's converged values (value iteration on the true MDP) from its first step and learns nothing.

Every history h is seeded on its own: its environment's `reset(seed=...)` and its action draws use
`numpy.random.default_rng([seed, h])`, so a history does not depend on how many others are generated.
"""
from __future__ import annotations

import copy
import math

import numpy as np

from ..core.errors import UserError

TARGETS = ("max", "sample", "expected", "return")
"""What a teacher's update moves Q(s_t, a_t) towards, i.e. its rule: r_t + gamma max_b Q(s'_t, b) (Q-learning),
r_t + gamma Q(s'_t, a') of the next action (SARSA), r_t + gamma E_pi Q(s'_t, .) (expected SARSA), or the
episode's return G_t (Monte-Carlo control). The zoo's table names them by the verdict's candidate names."""


def _softmax_row(q: np.ndarray, beta: float) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, log-probabilities) of softmax(beta q) for one observation's action values."""
    z = beta * q
    z = z - z.max()
    lse = math.log(float(np.exp(z).sum()))
    logp = z - lse
    return np.exp(logp), logp


def _draw(rng: np.random.Generator, p: np.ndarray) -> int:
    """An action drawn from `p` by the inverse CDF of one uniform (one draw per step, whatever the policy)."""
    u = rng.random()
    a = int(np.searchsorted(np.cumsum(p), u * p.sum(), side="right"))
    return min(a, len(p) - 1)


# ------------------------------------------------------------------ the agents
class Agent:
    """Acts and learns step by step inside one history. `start(n_obs, n_actions, rng)` begins a history;
    `act(obs)` returns (action, the Q row it was drawn from or None, its log-probability or None);
    `observe(obs, a, r, next_obs, terminated, truncated)` follows every step."""

    def start(self, n_obs: int, n_actions: int, rng: np.random.Generator, env=None) -> None:
        self.n_obs, self.n_actions, self.rng = n_obs, n_actions, rng

    def act(self, obs: int):
        raise NotImplementedError

    def observe(self, obs, a, r, next_obs, terminated, truncated) -> None:
        pass


class Teacher(Agent):
    """A tabular learner acting by softmax(beta Q): `target` one of `TARGETS` (its rule), step size alpha,
    discount gamma, inverse temperature beta."""

    def __init__(self, target: str, alpha: float, gamma: float, beta: float):
        if target not in TARGETS:
            raise UserError(f"unknown teacher target {target!r}; known: {', '.join(TARGETS)}")
        if not (0 < alpha <= 1 and 0 <= gamma <= 1 and beta >= 0):
            raise UserError(f"teacher parameters out of range: alpha {alpha}, gamma {gamma}, beta {beta}")
        self.target, self.alpha, self.gamma, self.beta = target, float(alpha), float(gamma), float(beta)

    def start(self, n_obs, n_actions, rng, env=None):
        super().start(n_obs, n_actions, rng, env)
        self.Q = np.zeros((n_obs, n_actions))
        self.next_action = None  # SARSA: a' drawn before the update, taken on the next step
        self.episode: list[tuple[int, int, float]] = []  # Monte-Carlo: the current episode's (s, a, r)

    def act(self, obs):
        row = self.Q[obs].copy()
        if self.next_action is not None:  # SARSA's a', drawn in `observe` from the Q row stored beside it
            a, row = self.next_action
            self.next_action = None
        else:
            p, _ = _softmax_row(row, self.beta)
            a = _draw(self.rng, p)
        _, logp = _softmax_row(row, self.beta)
        return a, row, float(logp[a])

    def _expected(self, s2: int) -> float:
        p, _ = _softmax_row(self.Q[s2], self.beta)
        return float(p @ self.Q[s2])

    def observe(self, obs, a, r, next_obs, terminated, truncated):
        if self.target == "return":
            self._observe_mc(obs, a, r, next_obs, terminated, truncated)
            return
        if terminated:
            boot = 0.0
        elif self.target == "max":
            boot = float(self.Q[next_obs].max())
        elif self.target == "expected" or truncated:  # no a' is taken in s' after a time-limit end
            boot = self._expected(next_obs)
        else:  # SARSA: draw a' in s' from Q before this step's update; it is the next action taken
            row = self.Q[next_obs].copy()
            p, _ = _softmax_row(row, self.beta)
            a2 = _draw(self.rng, p)
            self.next_action = (a2, row)
            boot = float(self.Q[next_obs, a2])
        self.Q[obs, a] += self.alpha * (r + self.gamma * boot - self.Q[obs, a])

    def _observe_mc(self, obs, a, r, next_obs, terminated, truncated):
        self.episode.append((obs, a, r))
        if not (terminated or truncated):
            return
        returns, g = [], 0.0  # G_k = r_k + gamma G_{k+1}, nothing bootstrapped after the episode's last step
        for _, _, rr in reversed(self.episode):
            g = rr + self.gamma * g
            returns.append(g)
        for (s, b, _), g in zip(self.episode, reversed(returns)):  # every visit, in time order
            self.Q[s, b] += self.alpha * (g - self.Q[s, b])
        self.episode = []


class FixedPolicy(Agent):
    """A fixed stochastic policy: one random action distribution per observation (Dirichlet(1)), drawn once
    for all histories from `policy_seed` (so the task's static-policy baseline can learn it), never updated."""

    def __init__(self, policy_seed: int = 0):
        self.policy_seed = int(policy_seed)

    def start(self, n_obs, n_actions, rng, env=None):
        super().start(n_obs, n_actions, rng, env)
        self.policy = np.random.default_rng([self.policy_seed, 7]).dirichlet(np.ones(n_actions), size=n_obs)

    def act(self, obs):
        return _draw(self.rng, self.policy[obs]), None, None


class Perseverating(Agent):
    """Repeats its last action whatever the reward, across episode boundaries; its first action is uniform."""

    def start(self, n_obs, n_actions, rng, env=None):
        super().start(n_obs, n_actions, rng, env)
        self.last = None

    def act(self, obs):
        if self.last is None:
            self.last = _draw(self.rng, np.full(self.n_actions, 1.0 / self.n_actions))
        return self.last, None, None


class Cycling(Agent):
    """Actions 0, 1, 2, ... cyclically, whatever the observation and reward, from a uniform per-history offset."""

    def start(self, n_obs, n_actions, rng, env=None):
        super().start(n_obs, n_actions, rng, env)
        self.next = int(rng.integers(n_actions))

    def act(self, obs):
        a = self.next
        self.next = (a + 1) % self.n_actions
        return a, None, None


class FinalPolicy(Agent):
    """The source agent's *final* policy: softmax(beta Q*) of the task's converged action values (value
    iteration on the true MDP, read off the environment at the history's first step), from the first step on;
    it learns nothing."""

    def __init__(self, gamma: float, beta: float):
        self.gamma, self.beta = float(gamma), float(beta)

    def start(self, n_obs, n_actions, rng, env=None):
        super().start(n_obs, n_actions, rng, env)
        self.env, self.Q = env, None

    def act(self, obs):
        if self.Q is None:  # the environment stands at its reset state, `obs`
            self.Q = optimal_q(self.env, obs, self.n_obs, self.n_actions, self.gamma)
        p, logp = _softmax_row(self.Q[obs], self.beta)
        a = _draw(self.rng, p)
        return a, self.Q[obs].copy(), float(logp[a])


# ------------------------------------------------------------------ the true MDP
def tabular_model(env, obs: int, n_obs: int, n_actions: int):
    """(next observation [S, A], reward [S, A], terminal [S, A]) of a *deterministic* environment whose
    discrete observation identifies its state, standing at observation `obs`: found by trying every action
    from a copy of the environment at every reachable state (breadth-first). A one-observation task that
    says its arms' mean rewards (`task["probs"]`: the bandit) is read from them. Time limits are ignored
    (Q* of the untimed task)."""
    task = getattr(env.unwrapped, "task", None) or {}
    if "probs" in task and n_obs == 1:
        probs = np.asarray(task["probs"], dtype=float)
        return np.zeros((1, n_actions), int), probs[None, :], np.ones((1, n_actions), bool)
    nxt = np.zeros((n_obs, n_actions), int)  # unreachable observations keep successor 0: never used
    rew = np.zeros((n_obs, n_actions))
    term = np.zeros((n_obs, n_actions), bool)
    frontier, seen = [(int(obs), copy.deepcopy(env))], {int(obs)}
    while frontier:
        s, e = frontier.pop()
        for a in range(n_actions):
            e2 = copy.deepcopy(e)
            o2, r, te, _, _ = e2.step(a)
            nxt[s, a], rew[s, a], term[s, a] = int(o2), float(r), bool(te)
            if not te and int(o2) not in seen:
                seen.add(int(o2))
                frontier.append((int(o2), e2))
    return nxt, rew, term


def optimal_q(env, obs: int, n_obs: int, n_actions: int, gamma: float, tol: float = 1e-12) -> np.ndarray:
    """Q* of the environment's task by value iteration (to `tol` in the max norm), from its state at `obs`."""
    nxt, rew, term = tabular_model(env, obs, n_obs, n_actions)
    q = np.zeros((n_obs, n_actions))
    for _ in range(100_000):
        new = rew + gamma * np.where(term, 0.0, q.max(axis=1)[nxt])
        if np.abs(new - q).max() <= tol:
            return new
        q = new
    raise UserError("value iteration did not converge (gamma = 1 on a task with a reachable cycle?)")


# ------------------------------------------------------------------ acting in an environment
def run_history(env, agent: Agent, steps: int, seed: int, h: int) -> dict:
    """One learning history of `steps` steps: `agent` acting in `env` (reset with a seed from [seed, h] once;
    later episodes reset without one, so the task stays the history's), episodes back to back. Returns the
    `Episodes` arrays of one row by their field names ([T] each), and "q" [T, A] / "log_prob" [T] (the Q row
    and log-probability each action was drawn with; None for an agent without them) and the "task"."""
    n_obs, n_actions = int(env.observation_space.n), int(env.action_space.n)
    rng = np.random.default_rng([seed, h])
    obs, _ = env.reset(seed=int(np.random.SeedSequence([seed, h]).generate_state(1)[0]))
    agent.start(n_obs, n_actions, rng, env)
    names = ("observations", "actions", "rewards", "next_observations", "terminations", "truncations", "q", "log_prob")
    cols = {k: [] for k in names}
    for _ in range(steps):
        a, row, logp = agent.act(int(obs))
        o2, r, te, tr, _ = env.step(a)
        agent.observe(int(obs), a, float(r), int(o2), bool(te), bool(tr))
        for k, v in zip(names, (int(obs), a, float(r), int(o2), bool(te), bool(tr), row, logp)):
            cols[k].append(v)
        obs = env.reset()[0] if (te or tr) else o2
    out = {k: np.array(v) for k, v in cols.items()}
    if cols["q"][0] is None:
        out["q"] = out["log_prob"] = None
    out["task"] = dict(getattr(env.unwrapped, "task", None) or {})
    return out
