"""A Bernoulli K-armed bandit: one observation (always 0), `arms` actions, every step a one-step episode.

Arm a pays 1 with probability probs[a], else 0 (drawn from the env's generator); each step terminates its
episode. The task is the arm probabilities: `probs=[...]`, or drawn uniformly in [0, 1) from the
`reset(seed=...)` generator on the first reset, then fixed for the instance (`task`).
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ...core.errors import UserError
from ...core.validate import count


class Bandit(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, arms: int = 5, probs=None):
        self.arms = count("Bandit arms", arms)
        if probs is not None:
            probs = np.asarray(probs, dtype=np.float64)
            if probs.shape != (self.arms,) or not np.all((probs >= 0) & (probs <= 1)):
                raise UserError(f"Bandit probs must be {self.arms} probabilities in [0, 1], got {probs.tolist()}")
        self.probs = probs
        self.observation_space = spaces.Discrete(1)
        self.action_space = spaces.Discrete(self.arms)

    @property
    def task(self) -> dict:
        """{"probs": [p_0, ..., p_K-1]} (None before the first reset when no probs were given)."""
        return {"probs": None if self.probs is None else self.probs.tolist()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.probs is None:
            self.probs = self.np_random.uniform(0.0, 1.0, size=self.arms)
        return 0, {}

    def step(self, action):
        reward = 1.0 if self.np_random.random() < self.probs[int(action)] else 0.0
        return 0, reward, True, False, {}
