"""Ledge: a small cliff walk where Q-learning and SARSA, exploring, choose different paths.

A grid of `rows` × `cols` cells, observation `row * cols + col`. The start is the bottom-left cell, the
goal the bottom-right one; the cells between them on the bottom row are the ledge. Actions: 0 up, 1 down,
2 left, 3 right (a move into a wall stays). Reaching the goal pays `goal_reward` (1) and stepping onto the
ledge `ledge_reward` (-1); both end the episode (terminated). Other steps pay `step_reward` (0). Episodes are
truncated after `horizon` (50) steps. The layout is the task (the same for every instance).

Why these numbers. With discount gamma < 1 the goal is worth more the sooner it is reached, so the optimal
(greedy) path runs along the ledge: up, right along row rows-2, down (cols + 1 steps). A learner that
explores pays for its exploration next to the ledge: an exploratory step down ends the episode at -1. SARSA
learns the values of its own exploring policy (its on-policy fixed point) and so prefers the safe path two
rows up (2 steps longer); Q-learning learns the optimal values whatever it does, and prefers the edge. With
the default layout (4 × 6) and gamma = 0.9 the greedy paths of the two fixed points differ (SARSA's the
safe one) for epsilon-greedy exploration with epsilon in [0.1, 0.4] and for softmax(beta Q) with beta in
[0.5, 2] (at gamma = 0.95: epsilon in [0.08, 0.4], beta in [0.25, 2]); measured on the grids epsilon in
{0.02, 0.05, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4}, beta in {0.25, 0.5, ..., 2, 2.5, 3}. With less exploration
the two agree (the edge); with much more (beta 0.25 at gamma 0.9) SARSA's best first step is off the ledge. tests/tasks/test_environments.py computes
both fixed points from `model()` and checks this.

Rewards of order 1 matter for softmax exploration: its chance of an exploratory step down falls as
exp(-beta * (Q(right) - Q(down))), so a classic -100 cliff makes softmax-SARSA as bold as Q-learning.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ...core.errors import UserError
from ...core.validate import count

MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))
"""(d_row, d_col) of actions 0-3: up, down, left, right."""


class Ledge(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, rows: int = 4, cols: int = 6, goal_reward=1.0, ledge_reward=-1.0, step_reward=0.0,
                 horizon: int = 50):
        self.rows = count("Ledge rows", rows, minimum=2)
        self.cols = count("Ledge cols", cols, minimum=3)
        self.horizon = count("Ledge horizon", horizon)
        rewards = (goal_reward, ledge_reward, step_reward)
        if not all(isinstance(r, (int, float)) and not isinstance(r, bool) and np.isfinite(r) for r in rewards):
            raise UserError(f"Ledge rewards must be finite numbers, got {rewards}")
        self.goal_reward, self.ledge_reward, self.step_reward = (float(r) for r in rewards)
        self.start = (self.rows - 1) * self.cols
        self.goal = self.rows * self.cols - 1
        self.observation_space = spaces.Discrete(self.rows * self.cols)
        self.action_space = spaces.Discrete(len(MOVES))
        self._s, self._t = self.start, 0

    @property
    def task(self) -> dict:
        return {"rows": self.rows, "cols": self.cols, "goal_reward": self.goal_reward,
                "ledge_reward": self.ledge_reward, "step_reward": self.step_reward}

    def on_ledge(self, s: int) -> bool:
        return s // self.cols == self.rows - 1 and 0 < s % self.cols < self.cols - 1

    def transition(self, s: int, a: int) -> tuple[int, float, bool]:
        """(next observation, reward, terminated) of action `a` in cell `s`: the dynamics, deterministic."""
        dr, dc = MOVES[a]
        r = min(max(s // self.cols + dr, 0), self.rows - 1)
        c = min(max(s % self.cols + dc, 0), self.cols - 1)
        nxt = r * self.cols + c
        if nxt == self.goal:
            return nxt, self.goal_reward, True
        if self.on_ledge(nxt):
            return nxt, self.ledge_reward, True
        return nxt, self.step_reward, False

    def model(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The true MDP as tables over (cell, action): next cell int64 [S, A], reward float64 [S, A],
        terminated bool [S, A] (for value iteration and on-policy fixed points)."""
        table = [[self.transition(s, a) for a in range(len(MOVES))] for s in range(self.observation_space.n)]
        nxt, rew, term = (np.array([[cell[i] for cell in row] for row in table]) for i in range(3))
        return nxt.astype(np.int64), rew.astype(np.float64), term.astype(bool)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._s, self._t = self.start, 0
        return self._s, {}

    def step(self, action):
        self._s, reward, terminated = self.transition(self._s, int(action))
        self._t += 1
        return self._s, reward, terminated, self._t >= self.horizon and not terminated, {}
