"""Tiny models with a KNOWN mechanism over `ad-step` bandit histories, for the episode probes and causal tests.

Every model reads the `ad-step` tokens of a bandit history (one window: context = T, so position t is step
t) and has two hook points `blocks.0.hook_resid_post`, `blocks.1.hook_resid_post` in a d-dim stream spanned by
fixed orthonormal directions: E (the token embedding), u_delta, U_q (A directions) and u_clock (a few).

* `q_reader`: layer 0 writes delta_{t-1} (the Q-learning teacher's TD error of the previous step, computed by
  its own recurrence, written here apart from `tasks.learners`) along u_delta; layer 1 sums alpha * delta read
  FROM THE STREAM over the past steps of each action (Q_t(a) = sum_{j<t, a_j = a} alpha delta_j, exactly
  Q-learning's table on a bandit) into U_q; logits = beta * Q read from U_q. Erasing delta moves the actions.
* `q_ignored`: the same stream, but the head perseverates (logits = beta * one-hot of the previous action, read
  from the embedding): delta and Q are carried, never read.
* `reward_decoy`: the stream holds the token (the reward included) and layer 1 writes win-stay-lose-shift
  logits (2 r_{t-1} - 1) one-hot(a_{t-1}), read from the stream; no value is carried.
* `clock`: the token plus functions of the step index only (a positional code); head as `q_ignored`.
* `memorizer`: the token plus a random code per history (the same at every step); head as `q_ignored`.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from icrl_interp.models.episode_tokens import TokenFormat
from icrl_interp.models.hooks import HookPoint
from icrl_interp.tasks.episodes import Episodes
from icrl_interp.tasks.learners import OnlineLearner

ALPHA, GAMMA, BETA = 0.3, 0.9, 3.0
DELTA_SCALE = 0.25
"""delta is written as DELTA_SCALE * delta along u_delta (and read back divided by it)."""
NOISE = 8
"""Distractor features nothing reads (pseudo-random functions of the history so far), as a real stream has."""
NOISE_SCALES = torch.logspace(-1.5, 0.0, NOISE, dtype=torch.float64)
"""Their amplitudes: a spread of variances, so variance-matched random directions find distractors of any size."""
KINDS = ("q_reader", "q_ignored", "reward_decoy", "clock", "memorizer")


def bandit_episodes(H: int = 64, T: int = 30, A: int = 2, seed: int = 0) -> Episodes:
    """H bandit histories of T one-step episodes of a Q-learning source (tasks.learners.OnlineLearner)."""
    rng = np.random.default_rng([seed, 11])
    p = rng.uniform(0.1, 0.9, (H, A))
    agent = OnlineLearner("q_learning", H, 1, A, alpha=ALPHA, gamma=GAMMA, beta=BETA, seed=seed)
    obs = np.zeros(H, np.int64)
    acts, rews = np.zeros((H, T), np.int64), np.zeros((H, T))
    for t in range(T):
        a = agent.act(obs)
        r = (rng.random(H) < p[np.arange(H), a]).astype(np.float64)
        agent.observe(obs, a, r, obs, np.ones(H, bool), np.zeros(H, bool))
        acts[:, t], rews[:, t] = a, r
    z = np.zeros((H, T), np.int64)
    return Episodes(observations=z, actions=acts, rewards=rews, next_observations=z,
                    terminations=np.ones((H, T), bool), truncations=np.zeros((H, T), bool),
                    valid=np.ones((H, T), bool), n_actions=A, n_observations=1, meta={"tasks": p.tolist()})


def token_format(ep: Episodes) -> TokenFormat:
    return TokenFormat("ad-step", 1, ep.n_actions, ep.n_steps)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.hook_resid_post = HookPoint()


class KnownModel(nn.Module):
    """forward(tokens [N, P, d_token]) -> logits [N, P, A] by the mechanism `kind` (module docstring)."""

    def __init__(self, fmt: TokenFormat, kind: str, d: int = 24, seed: int = 0, n_histories: int = 0):
        super().__init__()
        assert kind in KINDS
        self.kind, self.fmt, self.A = kind, fmt, fmt.n_actions
        g = torch.Generator().manual_seed(seed)
        basis, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
        D = fmt.d_token
        self.register_buffer("E", basis[:, :D].float())
        self.register_buffer("u_delta", basis[:, D].float())
        self.register_buffer("U_q", basis[:, D + 1:D + 1 + self.A].float())
        self.register_buffer("U_clock", basis[:, D + 1 + self.A:D + 4 + self.A].float())
        self.register_buffer("U_noise", basis[:, D + 4 + self.A:D + 4 + self.A + NOISE].float())
        self.register_buffer("w_noise", torch.randn(D, NOISE, generator=g, dtype=torch.float64))
        free = basis[:, D + 4 + self.A + NOISE:]  # the memorizer's codes: orthogonal to the rest (d > H for a leak)
        self.register_buffer("codes", (torch.randn(max(n_histories, 1), free.shape[1], generator=g, dtype=torch.float64)
                                       @ free.T).float())
        self.blocks = nn.ModuleList([Block(), Block()])
        self.scale = nn.Parameter(torch.ones(()))  # a parameter, so the runner finds the dtype and device
        self.seen_training: list[bool] = []
        self.calls = 0

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        self.seen_training.append(self.training)
        self.calls += 1
        cols = self.fmt.columns
        prev_a = tokens[..., cols["prev_action"]]
        r = tokens[..., cols["prev_reward"].start]
        N, P = tokens.shape[:2]
        x0 = tokens @ self.E.T
        if self.kind in ("q_reader", "q_ignored"):
            q = torch.zeros(N, self.A, dtype=torch.float64)
            delta = torch.zeros(N, P, dtype=torch.float64)
            for t in range(1, P):  # the teacher's own recurrence: delta_{t-1} = r_{t-1} - Q(a_{t-1}) (terminal)
                a1 = prev_a[:, t].double()
                delta[:, t] = r[:, t].double() - (q * a1).sum(-1)
                q = q + ALPHA * delta[:, t, None] * a1
            x0 = x0 + (DELTA_SCALE * delta).float()[..., None] * self.u_delta
        elif self.kind == "clock":
            t = torch.arange(P, dtype=torch.float32)
            x0 = x0 + torch.stack([t / P, torch.log1p(t), 1 / (1 + t)], -1) @ self.U_clock.T
        elif self.kind == "memorizer":
            x0 = x0 + self.codes[self.history_of(tokens)][:, None, :]
        if self.kind in ("q_reader", "q_ignored", "reward_decoy"):
            noise = torch.sin(1e3 * torch.cumsum(tokens.double(), 1) @ self.w_noise)  # unread, ~uncorrelated
            x0 = x0 + (noise * NOISE_SCALES).float() @ self.U_noise.T
        x0 = self.blocks[0].hook_resid_post(x0)
        x1 = x0
        if self.kind in ("q_reader", "q_ignored"):
            d_hat = x0 @ self.u_delta / DELTA_SCALE  # delta as the stream holds it (edited, if erased)
            a_hat = x0 @ self.E[:, cols["prev_action"]]
            x1 = x0 + (ALPHA * torch.cumsum(a_hat * d_hat[..., None], 1)) @ self.U_q.T
        elif self.kind == "reward_decoy":
            r_hat = x0 @ self.E[:, cols["prev_reward"].start]
            a_hat = x0 @ self.E[:, cols["prev_action"]]
            x1 = x0 + ((2 * r_hat - 1)[..., None] * a_hat) @ self.U_q.T
        x1 = self.blocks[1].hook_resid_post(x1)
        if self.kind in ("q_reader", "reward_decoy"):
            return BETA * self.scale * (x1 @ self.U_q)
        return BETA * self.scale * (x1 @ self.E[:, cols["prev_action"]])

    def history_of(self, tokens: torch.Tensor) -> torch.Tensor:
        """The memorizer's history id: set by the test (`self.ids`) for the tokens it runs."""
        return self.ids[: tokens.shape[0]]


def step_activations(model: KnownModel, ep: Episodes, layer: int) -> np.ndarray:
    """[H, T, d] the model's `blocks.{layer}.hook_resid_post` at each step (one window: position = step)."""
    from icrl_interp.models.episode_tokens import encode

    tokens, pmap = encode(ep, model.fmt)
    seen = {}
    h = model.blocks[layer].hook_resid_post.register_forward_hook(lambda m, i, o: seen.__setitem__("x", o))
    try:
        with torch.no_grad():
            model(torch.as_tensor(tokens))
    finally:
        h.remove()
    return pmap.to_steps(seen["x"].double().numpy())
