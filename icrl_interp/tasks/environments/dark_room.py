"""Dark Room (Laskin et al. 2022, Algorithm Distillation's benchmark): a `size` × `size` room with a hidden goal.

The agent starts at the centre cell (size // 2, size // 2) and sees only its own cell, `y * size + x`; the
goal is not in the observation. Actions: 0 up (y - 1), 1 down (y + 1), 2 left (x - 1), 3 right (x + 1),
4 stay; a move into a wall stays. The reward is 1 on every step that ends on the goal, else 0 (the agent may
stay there and keep earning it). Episodes never terminate; they are truncated after `horizon` steps. The
task is the goal: `goal=(x, y)`, or drawn uniformly over the cells from the `reset(seed=...)` generator on
the first reset, then fixed for the instance (`task`).
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ...core.errors import UserError
from ...core.validate import count

MOVES = ((0, -1), (0, 1), (-1, 0), (1, 0), (0, 0))
"""(dx, dy) of actions 0-4: up, down, left, right, stay."""


class DarkRoom(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, size: int = 9, horizon: int = 20, goal=None):
        self.size = count("DarkRoom size", size)
        self.horizon = count("DarkRoom horizon", horizon)
        if goal is not None:
            goal = tuple(goal)
            if len(goal) != 2 or not all(isinstance(v, (int, np.integer)) and 0 <= v < self.size for v in goal):
                raise UserError(f"DarkRoom goal must be (x, y) with integers in [0, {self.size}), got {goal!r}")
            goal = (int(goal[0]), int(goal[1]))
        self.goal = goal
        self.observation_space = spaces.Discrete(self.size * self.size)
        self.action_space = spaces.Discrete(len(MOVES))
        self._pos = (self.size // 2, self.size // 2)
        self._t = 0

    @property
    def task(self) -> dict:
        """{"goal": [x, y]} (None before the first reset when no goal was given)."""
        return {"goal": None if self.goal is None else list(self.goal)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.goal is None:
            self.goal = tuple(int(v) for v in self.np_random.integers(0, self.size, size=2))
        self._pos = (self.size // 2, self.size // 2)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        dx, dy = MOVES[int(action)]
        x, y = self._pos
        self._pos = (min(max(x + dx, 0), self.size - 1), min(max(y + dy, 0), self.size - 1))
        self._t += 1
        reward = 1.0 if self._pos == self.goal else 0.0
        return self._obs(), reward, False, self._t >= self.horizon, {}

    def _obs(self) -> int:
        x, y = self._pos
        return y * self.size + x
