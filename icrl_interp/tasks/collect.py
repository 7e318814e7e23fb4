"""Source agents acting in an environment: learning histories (Algorithm Distillation's training data) as
`Episodes`.

One copy of the environment per history (its own task: a Dark Room goal, a bandit's arm probabilities),
each history T steps of one agent that learns as it acts; an episode that ends is reset at once and the
history goes on. Agents: `random` (uniform actions), and every rule of `tasks.learners` (`q-learning`,
`sarsa`, `expected-sarsa`, `sarsa-lambda`, `mc-control`, `model-based`), acting by softmax(beta Q) or, with
`epsilon`, epsilon-greedy on Q (ties shared). The rules' own updates keep their softmax(beta Q): expected
SARSA's target, and SARSA's at a truncation, are expectations under it even when the actions are
epsilon-greedy.

The agent may also be a policy object with a learning agent's interface, `start(n, obs_width, n_actions,
discrete)`, `probs(obs) -> [n, A]` and `observe(obs, actions, rewards, next_obs, terminated, truncated)`, and
`name` and `meta` (JSON) attributes: a sequence model acting in closed loop on its own history
(`models.closed_loop.ModelPolicy`; this layer imports no torch). Its actions are drawn from `probs` exactly as
a learning agent's are.

Seeding: history h has its own streams, `SeedSequence(seed, spawn_key=(h, 0))` for the environment (its
first `reset(seed=...)` draws the task) and `(h, 1)` for the agent's action draws, so history h is the same
whichever other histories are collected with it (`histories=[h]` reproduces it alone).
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from .._version import __version__
from ..core.errors import UserError
from ..core.validate import count
from . import learners
from .episodes import Episodes

AGENTS = ("random", *(name.replace("_", "-") for name in learners.NAMES))
"""The source agents, as the CLI spells them."""
DEFAULTS = {"alpha": 0.1, "gamma": 0.9, "beta": 1.0, "lam": 0.8}
"""The learning rules' parameters when not given (each rule takes those of `learners.Rule.params`)."""


def agent_params(agent: str, alpha=None, gamma=None, beta=None, lam=None, epsilon=None) -> dict:
    """The parameters `agent` runs with: the given ones, the `DEFAULTS` for the rest of those it has; a given
    parameter it does not have is a UserError (it would be silently ignored)."""
    if agent not in AGENTS:
        raise UserError(f"unknown agent {agent!r} (known: {', '.join(AGENTS)})")
    given = {"alpha": alpha, "gamma": gamma, "beta": beta, "lam": lam}
    has = () if agent == "random" else learners.rule_class(agent.replace("-", "_")).params
    extra = [k for k, v in given.items() if v is not None and k not in has]
    if extra or (agent == "random" and epsilon is not None):
        raise UserError(f"agent {agent} has no parameter {(extra or ['epsilon'])[0]} (it has: {', '.join(has) or 'none'})")
    params = {k: float(DEFAULTS[k] if given[k] is None else given[k]) for k in has}
    if params:
        learners.check_params(agent.replace("-", "_"), **params)  # ranges, one line each
    if epsilon is not None:
        if not 0.0 <= epsilon <= 1.0:
            raise UserError(f"epsilon must lie in [0, 1], got {epsilon}")
        params["epsilon"] = float(epsilon)
    return params


def epsilon_greedy(q: np.ndarray, epsilon: float) -> np.ndarray:
    """[N, A] epsilon uniform plus 1 - epsilon shared by the maximal actions of q [N, A]."""
    best = q == q.max(-1, keepdims=True)
    return epsilon / q.shape[1] + (1.0 - epsilon) * best / best.sum(-1, keepdims=True)


def _history_ids(histories) -> list[int]:
    ids = list(range(histories)) if isinstance(histories, (int, np.integer)) else [int(h) for h in histories]
    if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
        raise UserError(f"histories must be a positive count or distinct non-negative indices, got {histories!r}")
    return ids


def collect(env: str, agent, *, histories: int | Sequence[int], steps: int, seed: int = 0,
            env_kwargs: dict | None = None, alpha=None, gamma=None, beta=None, lam=None, epsilon=None,
            progress: bool = False) -> Episodes:
    """`histories` learning histories (a count H, or the indices of the histories to collect) of `steps` steps of
    `agent` in the environment `env` (a Gymnasium id or module:Class, `environments.env_from_spec`, made with
    `env_kwargs`), seeded by `seed` per history (module docstring). `agent`: a name of `AGENTS`, or a policy
    object (module docstring) that takes none of the rules' parameters."""
    from . import environments
    import gymnasium

    ids = _history_ids(histories)
    steps, seed = count("steps per history", steps), count("the seed", seed, minimum=0)
    policy = None if isinstance(agent, str) else agent
    if policy is not None:
        given = [k for k, v in (("alpha", alpha), ("gamma", gamma), ("beta", beta), ("lam", lam), ("epsilon", epsilon))
                 if v is not None]
        if given:
            raise UserError(f"a model acting in closed loop has no parameter {given[0]} (its policy is its own)")
    params = {} if policy is not None else agent_params(agent, alpha, gamma, beta, lam, epsilon)
    kwargs = dict(env_kwargs or {})
    envs = [environments.env_from_spec(env, **kwargs) for _ in ids]
    obs_space, act_space = envs[0].observation_space, envs[0].action_space
    if not isinstance(act_space, gymnasium.spaces.Discrete):
        raise UserError(f"--env {env}: collect needs Discrete actions, got {act_space}")
    discrete = isinstance(obs_space, gymnasium.spaces.Discrete)
    if not discrete and policy is None and agent != "random":
        raise UserError(f"--env {env}: the learning agents need Discrete observations, got {obs_space}")
    if not discrete and not isinstance(obs_space, gymnasium.spaces.Box):
        raise UserError(f"--env {env}: collect needs Discrete or Box observations, got {obs_space}")
    H, T, A = len(ids), steps, int(act_space.n)
    first = [e.reset(seed=int(np.random.SeedSequence(seed, spawn_key=(h, 0)).generate_state(1)[0]))[0]
             for e, h in zip(envs, ids)]
    uniforms = np.stack([np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(h, 1))).random(T) for h in ids])

    def encode(o):
        return int(o) - int(obs_space.start) if discrete else np.asarray(o, np.float32).reshape(-1)

    obs = np.array([encode(o) for o in first])
    learner = policy
    if policy is not None:
        policy.start(H, int(obs_space.n) if discrete else int(obs.shape[1]), A, discrete)
    elif agent != "random":
        rule = {k: v for k, v in params.items() if k != "epsilon"}
        learner = learners.OnlineLearner(agent.replace("-", "_"), H, int(obs_space.n), A, **rule)
    cols = {k: np.zeros((H, T, *obs.shape[1:]), obs.dtype) for k in ("observations", "next_observations")}
    cols.update(actions=np.zeros((H, T), np.int64), rewards=np.zeros((H, T)), terminations=np.zeros((H, T), bool),
                truncations=np.zeros((H, T), bool))
    from tqdm import tqdm

    name = agent if policy is None else policy.name
    for t in tqdm(range(T), desc=f"collect {name}", unit="step", disable=not progress, file=sys.stderr):
        if learner is None:
            p = np.full((H, A), 1.0 / A)
        elif "epsilon" in params:
            p = epsilon_greedy(learner.rule.values(obs), params["epsilon"])
        else:
            p = learner.probs(obs)
        a = learners.sample(p, uniforms[:, t])
        out = [e.step(int(x) + int(act_space.start)) for e, x in zip(envs, a)]
        nxt = np.array([encode(o[0]) for o in out])
        r = np.array([float(o[1]) for o in out])
        term, trunc = np.array([bool(o[2]) for o in out]), np.array([bool(o[3]) for o in out])
        if learner is not None:
            learner.observe(obs, a, r, nxt, term, trunc)
        for k, v in (("observations", obs), ("next_observations", nxt), ("actions", a), ("rewards", r),
                     ("terminations", term), ("truncations", trunc)):
            cols[k][:, t] = v
        obs = nxt.copy()
        for i in np.flatnonzero(term | trunc):
            obs[i] = encode(envs[i].reset()[0])
    tasks = [getattr(e.unwrapped, "task", None) for e in envs]
    for e in envs:
        e.close()
    meta = {"source": "collect", "env": env, "env_kwargs": kwargs, "agent": name, "params": params,
            "policy": "random" if learner is None else "model" if policy is not None
            else "epsilon-greedy" if "epsilon" in params else "softmax",
            "seed": int(seed), "histories": ids, "steps": T, "gymnasium_version": gymnasium.__version__,
            "package_version": __version__, "tasks": tasks}
    if policy is not None:
        meta["model"] = policy.meta
    return Episodes(**cols, valid=np.ones((H, T), bool), n_actions=A,
                    n_observations=int(obs_space.n) if discrete else None, meta=meta)
