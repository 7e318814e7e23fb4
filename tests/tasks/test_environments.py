"""The package's Gymnasium environments (icrl_interp.tasks.environments): Gymnasium's own checker, known
answers of their dynamics, the Ledge's two fixed points (computed here, independently of the learning rules),
and `env_from_spec`."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

gymnasium = pytest.importorskip("gymnasium")

from gymnasium.utils.env_checker import check_env  # noqa: E402

from icrl_interp.tasks.environments import IDS, Bandit, DarkRoom, Ledge, env_from_spec  # noqa: E402

from helpers import raises_user, se_tolerance  # noqa: E402


@pytest.mark.parametrize("env_id, kwargs", [(i, {}) for i in IDS] + [
    ("icrl_interp/DarkRoom-v0", {"size": 4, "horizon": 3, "goal": (0, 3)}),
    ("icrl_interp/Bandit-v0", {"arms": 2, "probs": [0.0, 1.0]}), ("icrl_interp/Ledge-v0", {"rows": 2, "cols": 3})])
def test_gymnasium_s_checker_passes_without_a_warning(env_id, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(gymnasium.make(env_id, **kwargs).unwrapped, skip_render_check=True)


# ------------------------------------------------------------------ Dark Room
def test_dark_room_moves_clip_at_walls_and_pay_only_on_the_goal():
    env = DarkRoom(size=5, horizon=7, goal=(1, 2))
    obs, _ = env.reset(seed=0)
    assert obs == 12  # the centre (2, 2): y * size + x
    moved = []
    for a in range(5):
        env.reset()
        moved.append(env.step(a)[0])
    assert moved == [7, 17, 11, 13, 12]  # up (y - 1), down, left, right, stay
    env.reset()
    for _ in range(3):
        obs, *_ = env.step(0)
    assert obs == 2  # three steps up from y = 2 stop at the wall y = 0
    rng = np.random.default_rng(1)
    env.reset()
    ends, paid = [], []
    for t in range(70):
        obs, r, term, trunc, _ = env.step(int(rng.integers(5)))
        assert not term and r == float(obs == 2 * 5 + 1)  # exact: 1 on the goal cell (1, 2), else 0
        paid.append(r)
        if trunc:
            ends.append(t)
            assert env.reset()[0] == 12
    assert ends == list(range(6, 70, 7)) and sum(paid) > 0  # a time limit of 7 steps, and the goal was found


def test_dark_room_draws_its_goal_from_the_first_reset_s_seed():
    goals = []
    for seed in range(8):
        env = DarkRoom(size=9)
        assert env.task == {"goal": None}
        env.reset(seed=seed)
        goals.append(tuple(env.task["goal"]))
        env.reset(seed=seed + 100)  # later resets keep the task
        assert tuple(env.task["goal"]) == goals[-1]
        twin = DarkRoom(size=9)
        twin.reset(seed=seed)
        assert twin.task == env.task
    assert len(set(goals)) > 4 and all(0 <= x < 9 and 0 <= y < 9 for x, y in goals)
    with raises_user("goal must be (x, y)"):
        DarkRoom(size=3, goal=(3, 0))


# ------------------------------------------------------------------ Bandit
def test_bandit_rewards_are_bernoulli_with_the_arm_s_probability():
    probs = np.array([0.1, 0.5, 0.9, 0.0])
    env = Bandit(arms=4, probs=probs)
    assert env.reset(seed=3) == (0, {})
    n = 1500
    means = []
    for a in range(4):
        steps = [env.step(a) for _ in range(n)]
        assert all(s[0] == 0 and s[2] and not s[3] for s in steps)  # one observation; every step terminates
        means.append(np.mean([s[1] for s in steps]))
    assert np.all(np.abs(np.array(means) - probs) <= se_tolerance(probs, np.full(4, n)))
    assert means[3] == 0.0  # exact: an arm of probability 0 never pays
    drawn = Bandit(arms=6)
    drawn.reset(seed=5)
    again = Bandit(arms=6)
    again.reset(seed=5)
    p = np.array(drawn.task["probs"])
    assert p.shape == (6,) and np.all((p >= 0) & (p < 1)) and drawn.task == again.task
    with raises_user("Bandit probs must be 2 probabilities"):
        Bandit(arms=2, probs=[0.5, 1.5])


# ------------------------------------------------------------------ Ledge
def test_ledge_dynamics_known_answers():
    env = Ledge()  # 4 x 6: start 18 (row 3, col 0), goal 23, ledge 19..22
    assert env.reset(seed=0) == (18, {})
    assert env.transition(18, 3) == (19, -1.0, True)  # right from the start: onto the ledge
    assert env.transition(18, 0) == (12, 0.0, False)
    assert env.transition(17, 1) == (23, 1.0, True)  # down into the goal
    assert env.transition(18, 2) == (18, 0.0, False)  # a wall
    assert env.transition(14, 1) == (20, -1.0, True)
    env.reset()
    ends = []
    for t in range(120):  # up forever: only the time limit ends an episode
        if env.step(0)[3]:
            ends.append(t)
            env.reset()
    assert ends == [49, 99]
    nxt, rew, term = env.model()
    assert nxt.shape == (24, 4)
    live = slice(0, 19)  # the cells an episode can be in: rows 0-2 and the start (ledge and goal end it)
    assert term[live].sum() == 4 + 1 + 1  # down onto the 4 ledge cells, down into the goal, right from the start
    assert sorted(rew[live][term[live]]) == [-1.0] * 5 + [1.0] and rew[live][~term[live]].max() == 0.0


def q_star(nxt, rew, term, gamma):
    """Value iteration on the true MDP: Q-learning's fixed point."""
    q = np.zeros(rew.shape)
    for _ in range(2000):
        q = rew + gamma * np.where(term, 0.0, q.max(1)[nxt])
    return q


def exploring(q, kind, x):
    """The exploring policy on q: epsilon-greedy (ties broken to the first maximum) or softmax(x q)."""
    if kind == "epsilon":
        p = np.full(q.shape, x / q.shape[1])
        p[np.arange(len(q)), q.argmax(1)] += 1 - x
        return p
    z = np.exp(x * (q - q.max(1, keepdims=True)))
    return z / z.sum(1, keepdims=True)


def on_policy_q(nxt, rew, term, gamma, kind, x):
    """SARSA's fixed point: Q = Q^pi with pi the exploring policy of Q itself, by damped exact evaluation."""
    S, A = rew.shape
    q = q_star(nxt, rew, term, gamma)
    for _ in range(400):
        pi = exploring(q, kind, x)
        m = np.zeros((S * A, S * A))
        for s in range(S):
            for a in range(A):
                if not term[s, a]:
                    m[s * A + a, nxt[s, a] * A:(nxt[s, a] + 1) * A] = gamma * pi[nxt[s, a]]
        new = np.linalg.solve(np.eye(S * A) - m, rew.ravel()).reshape(S, A)
        if np.abs(new - q).max() < 1e-12:
            break
        q = 0.5 * q + 0.5 * new
    return q


def greedy_path(q, nxt, term, start):
    s, path = start, [start]
    for _ in range(len(q)):
        a = int(q[s].argmax())
        path.append(int(nxt[s, a]))
        if term[s, a]:
            break
        s = path[-1]
    return path


EDGE = [18, 12, 13, 14, 15, 16, 17, 23]
"""The optimal path on the default Ledge: up, right along row 2 beside the ledge, down into the goal."""


@pytest.mark.parametrize("kind, x", [("epsilon", 0.1), ("epsilon", 0.3), ("softmax", 1.0), ("softmax", 2.0)])
def test_ledge_q_learning_and_sarsa_fixed_points_choose_different_paths(kind, x):
    env = Ledge()
    nxt, rew, term = env.model()
    qs = q_star(nxt, rew, term, 0.9)
    assert greedy_path(qs, nxt, term, env.start) == EDGE
    sarsa = greedy_path(on_policy_q(nxt, rew, term, 0.9, kind, x), nxt, term, env.start)
    assert sarsa[-1] == env.goal and min(s // env.cols for s in sarsa) <= 1  # the safe path, two rows up


@pytest.mark.parametrize("kind, x", [("epsilon", 0.02), ("softmax", 3.0)])
def test_ledge_fixed_points_agree_when_exploration_is_rare(kind, x):
    """The other side of the documented ranges: the difference comes from the exploration."""
    env = Ledge()
    nxt, rew, term = env.model()
    assert greedy_path(on_policy_q(nxt, rew, term, 0.9, kind, x), nxt, term, env.start) == EDGE


# ------------------------------------------------------------------ env_from_spec
def test_env_from_spec_takes_ids_and_classes_of_your_own():
    assert isinstance(env_from_spec("icrl_interp/DarkRoom-v0", size=5).unwrapped, DarkRoom)
    own = env_from_spec("icrl_interp.tasks.environments.bandit:Bandit", arms=3)
    assert type(own) is Bandit and own.arms == 3
    assert env_from_spec("FrozenLake-v1").observation_space.n == 16


@pytest.mark.parametrize("spec, kwargs, words", [
    ("Nope-v0", {}, ("--env Nope-v0", "doesn't exist")),
    ("no_such_module_x:Env", {}, ("cannot import", "no_such_module_x")),
    ("icrl_interp.tasks.environments.bandit:Missing", {}, ("has no 'Missing'",)),
    ("os:getcwd", {}, ("getcwd is not a gymnasium.Env class",)),
    ("icrl_interp/Bandit-v0", {"colour": 1}, ("--env icrl_interp/Bandit-v0", "colour")),
    ("icrl_interp.tasks.environments.bandit:Bandit", {"colour": 1}, ("colour",)),
    ("", {}, ("must name an environment",)),
])
def test_a_bad_spec_is_one_line(spec, kwargs, words):
    with raises_user(*words):
        env_from_spec(spec, **kwargs)
