"""A sequence model over episodes acting in closed loop: the policy that `tasks.collect.collect` runs when the
agent is a model (`icrl-interp collect --model`, `train.ad.rollout`).

`ModelPolicy` has a learning agent's interface (`start`, `probs`, `observe`: `tasks.learners.OnlineLearner`'s),
so the one loop of `tasks.collect` steps the environments, draws the actions and writes the histories for
source agents and models alike (tasks import no torch: the model enters as this object).

At step t each history's model input is the documented sequence of its format (`episode_tokens`, whose
token writers `encode` uses too) for that history's own steps before t and o_t, and the action is read at
its last position, which is the read position `encode` maps step t to:

* `ad-step`: the tokens of steps t-K+1 .. t (K = context), token t = [obs(o_t), one-hot(a_{t-1}), r_{t-1},
  new-episode flag];
* `ad-element`: the o, a, r tokens of steps t-K+1 .. t-1, then o_t's token (a_t and r_t are not known yet;
  `encode` puts them after the read position, where a causal model does not see them);
* `dpt`: the query token of o_t, then the transitions (s, a, r, s') of steps t-k .. t-1, k = min(t, K): the
  context is the agent's own history so far (DPT's online deployment, Lee et al. 2023, except that the
  context grows after every step, not after every episode: what `encode` writes for the same history).

So the logits it acts on at step t are those a single forward pass over the finished history, encoded with
stride 1 (every AD window ends at the step it is read at; `dpt` has no windows), gives at the read position
of step t (tests/models/test_closed_loop.py; with T <= K every stride agrees). Only the last K steps'
tokens are kept between steps: the work per step is bounded by the context, not the history's length.
`probs` returns softmax of those logits, or one-hot of their argmax with `greedy`; a_t and r_t enter the
history by `observe`.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..core import devices
from ..core.errors import UserError
from . import episode_tokens as et
from .modes import eval_mode


STEP_TOKENS = {"ad-step": 1, "ad-element": 3, "dpt": 1}
"""Positions step t itself takes in a full sequence of its format (dpt: its query): the sequence of step t holds
at most `fmt.positions` minus these tokens of the steps before t."""


class ModelPolicy:
    """`model` as the agent of `tasks.collect.collect`, reading the tokens of its `token_format` attribute, or of
    `token_format` given: a `TokenFormat` (or its dict), or a format name with `context` for a model without the
    attribute (fitted to the environment's spaces at `start`; a model's own format must agree with them).
    `user`: the model's exceptions are one-line errors (default: a model that is not the package's
    `ADTransformer`); non-finite logits always are."""

    def __init__(self, model: nn.Module, token_format: et.TokenFormat | dict | str | None = None, *,
                 greedy: bool = False, user: bool | None = None, name: str = "model", context: int | None = None):
        own = getattr(model, "token_format", None)
        self.fmt: et.TokenFormat | None = None
        self.named: tuple[str, int] | None = None  # (format name, context) fitted to the spaces at start
        if isinstance(token_format, (et.TokenFormat, dict)):
            self.fmt = _format(token_format)
        elif own is not None:
            self.fmt = _format(own)
            if token_format not in (None, self.fmt.name) or context not in (None, self.fmt.context):
                raise UserError(f"the model reads {self.fmt.name} tokens with context {self.fmt.context}; drop "
                                "--token-format and --context or make them agree")
        elif token_format is None or context is None:
            raise UserError("the model has no token_format attribute: give the token format and its context "
                            "(--token-format NAME --context K)")
        else:
            et.TokenFormat(token_format, 1, 1, context)  # the name and the context checked now, in one line
            self.named = (token_format, int(context))
        if self.fmt is not None and context is not None and context != self.fmt.context:
            raise UserError(f"context {context} given with a token format of context {self.fmt.context}")
        if user is None:  # as record_episodes: the package's own model keeps its tracebacks (there it is a bug)
            from .ad_transformer import ADTransformer

            user = not isinstance(model, ADTransformer)
        self.model, self.greedy, self.user, self.name = model, bool(greedy), user, name
        self.past: np.ndarray | None = None

    @property
    def meta(self) -> dict:
        return {"greedy": self.greedy, "token_format": self.fmt.to_dict()}

    def start(self, n: int, obs_width: int, n_actions: int, discrete: bool) -> None:
        """`n` fresh histories in an environment of these spaces (refused if the model reads others)."""
        if self.named is not None:
            self.fmt = et.TokenFormat(self.named[0], obs_width, n_actions, self.named[1])
        if (obs_width, n_actions) != (self.fmt.obs_width, self.fmt.n_actions):
            raise UserError(f"the model reads observations of width {self.fmt.obs_width} and {self.fmt.n_actions} "
                            f"actions; the environment has {obs_width} and {n_actions}")
        self.discrete, self.t = discrete, 0
        self.past = np.zeros((n, 0, self.fmt.d_token), np.float32)  # tokens of the steps before t still in view
        self.now: np.ndarray | None = None  # the ad-step token of t, once `probs` wrote it
        self.prev_action, self.prev_reward, self.new_episode = np.full(n, -1), np.zeros(n), np.ones(n, bool)

    def _features(self, obs) -> np.ndarray:
        return np.eye(self.fmt.obs_width, dtype=np.float32)[obs] if self.discrete else np.asarray(obs, np.float32)

    def _sequence(self, obs) -> np.ndarray:
        """[n, P_t, d_token]: what the model reads at step t, its action read at the last position."""
        fmt, feats, n = self.fmt, self._features(obs), len(obs)
        if fmt.name == "dpt":
            return np.concatenate([et.dpt_query_tokens(fmt, feats)[:, None], self.past], 1)
        if fmt.name == "ad-step":
            self.now = et.ad_step_tokens(fmt, feats, self.prev_action, self.prev_reward, self.new_episode)[:, None]
            return np.concatenate([self.past, self.now], 1)
        # ad-element: o_t's token alone; a_t's and r_t's follow it once known (`observe`)
        return np.concatenate([self.past, et.ad_element_tokens(fmt, feats, np.full(n, -1), np.zeros(n),
                                                               self.new_episode)[:, :1]], 1)

    def probs(self, obs: np.ndarray) -> np.ndarray:
        """[n, A] float64: the model's action distribution at this step, having read its history and o_t."""
        from .user import check_output, forward

        x = torch.from_numpy(self._sequence(obs)).to(devices.of(self.model))
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
        """Step t's outcome: its tokens join the past (those of the last steps in view stay, `STEP_TOKENS`); a_t,
        r_t and whether an episode starts at t + 1 go into the tokens of t + 1."""
        fmt, actions, rewards = self.fmt, np.asarray(actions).copy(), np.asarray(rewards, float).copy()
        if fmt.name == "ad-step":
            done = self.now
        elif fmt.name == "ad-element":  # o_t's token as `probs` wrote it (the flag not yet updated), a_t's, r_t's
            done = et.ad_element_tokens(fmt, self._features(obs), actions, rewards, self.new_episode)
        else:
            done = et.dpt_transition_tokens(fmt, self._features(obs), actions, rewards, self._features(next_obs))[:, None]
        past = np.concatenate([self.past, done], 1)
        self.past = past[:, max(0, past.shape[1] - fmt.positions + STEP_TOKENS[fmt.name]):]  # O(context) a step
        self.prev_action, self.prev_reward = actions, rewards
        self.new_episode = np.asarray(terminated) | np.asarray(truncated)


def _format(fmt) -> et.TokenFormat:
    return fmt if isinstance(fmt, et.TokenFormat) else et.TokenFormat.from_dict(fmt)
