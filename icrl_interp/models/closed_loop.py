"""A sequence model over episodes acting in closed loop: the policy that `tasks.collect.collect` runs when the
agent is a model (`icrl-interp collect --model`, `train.ad.rollout`).

`ModelPolicy` has a learning agent's interface (`start`, `probs`, `observe`: `tasks.learners.OnlineLearner`'s),
so the one loop of `tasks.collect` steps the environments, draws the actions and writes the histories for
source agents and models alike (tasks import no torch: the model enters as this object). At step t it
appends to each history's own token buffer the documented `ad-step` token of t, [obs(o_t), one-hot(a_{t-1}),
r_{t-1}, new-episode flag] (`episode_tokens.ad_step_tokens`, what `encode` writes for the same history), runs
the model on the last `context` tokens and returns softmax of the logits read at the last position, or
one-hot of their argmax with `greedy`. a_t is only known after `probs` returns; it enters the history by
`observe`, and the token of t + 1.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..core import devices
from ..core.errors import UserError
from . import episode_tokens as et
from .modes import eval_mode


class ModelPolicy:
    """`model` (reading `ad-step` tokens: its `token_format` attribute, or `token_format` given) as the agent
    of `tasks.collect.collect`; `user`: the model's exceptions are one-line errors (default: a model that is not
    the package's `ADTransformer`); non-finite logits always are."""

    def __init__(self, model: nn.Module, token_format: et.TokenFormat | dict | None = None, *, greedy: bool = False,
                 user: bool | None = None, name: str = "model"):
        fmt = token_format if token_format is not None else getattr(model, "token_format", None)
        if fmt is None:
            raise UserError("the model has no token_format attribute (the format and context of the tokens it reads)")
        fmt = fmt if isinstance(fmt, et.TokenFormat) else et.TokenFormat.from_dict(fmt)
        if fmt.name != "ad-step":
            raise UserError(f"a model acts in closed loop reading ad-step tokens; this model reads {fmt.name} "
                            "(not supported in closed loop yet)")
        if user is None:  # as record_episodes: the package's own model keeps its tracebacks (there it is a bug)
            from .ad_transformer import ADTransformer

            user = not isinstance(model, ADTransformer)
        self.model, self.fmt, self.greedy, self.user, self.name = model, fmt, bool(greedy), user, name
        self.tokens: np.ndarray | None = None

    @property
    def meta(self) -> dict:
        return {"greedy": self.greedy, "token_format": self.fmt.to_dict()}

    def start(self, n: int, obs_width: int, n_actions: int, discrete: bool) -> None:
        """A fresh buffer for `n` histories in an environment of these spaces (refused if the model reads others)."""
        if (obs_width, n_actions) != (self.fmt.obs_width, self.fmt.n_actions):
            raise UserError(f"the model reads observations of width {self.fmt.obs_width} and {self.fmt.n_actions} "
                            f"actions; the environment has {obs_width} and {n_actions}")
        self.discrete, self.t = discrete, 0
        self.tokens = np.zeros((n, 0, self.fmt.d_token), np.float32)
        self.prev_action, self.prev_reward, self.new_episode = np.full(n, -1), np.zeros(n), np.ones(n, bool)

    def probs(self, obs: np.ndarray) -> np.ndarray:
        """[n, A] float64: the model's action distribution at this step, having read its history and o_t."""
        from .user import check_output, forward

        feats = np.eye(self.fmt.obs_width, dtype=np.float32)[obs] if self.discrete else np.asarray(obs, np.float32)
        token = et.ad_step_tokens(self.fmt, feats, self.prev_action, self.prev_reward, self.new_episode)
        self.tokens = np.concatenate([self.tokens, token[:, None]], 1)[:, -self.fmt.context:]
        x = torch.from_numpy(self.tokens).to(devices.of(self.model))
        with eval_mode(self.model), torch.no_grad():
            y = forward(self.model, x) if self.user else self.model(x)
        logits = y[0] if isinstance(y, (tuple, list)) else y
        if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (*x.shape[:2], self.fmt.n_actions):
            shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise UserError(f"the model's logits have shape {shape}; expected [{x.shape[0]}, {x.shape[1]}, "
                            f"{self.fmt.n_actions}] (one per token position)")
        last = logits[:, -1].double().cpu()
        check_output(last.numpy(), "the model's action logits", f"closed-loop step {self.t}")
        self.t += 1
        if self.greedy:
            return np.eye(self.fmt.n_actions)[last.argmax(-1).numpy()]
        return torch.softmax(last, -1).numpy()

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        """Step t's outcome: a_t, r_t and whether an episode starts at t + 1 go into the token of t + 1."""
        self.prev_action, self.prev_reward = np.asarray(actions).copy(), np.asarray(rewards, float).copy()
        self.new_episode = np.asarray(terminated) | np.asarray(truncated)
