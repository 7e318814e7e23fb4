"""The token formats of in-context RL models over episodes (AD, DPT), as documented tensors, and the map
from every token position back to its history step (docs/episodes.md, "Token formats").

Learning histories are an `Episodes` grid [H, T] (`tasks.episodes`). A model reads a float32 tensor
`tokens[N, P, d_token]` (N sequences of P positions) and returns action logits `[N, P, A]`; the
`PositionMap` says, per sequence and position, which history h, step t, episode, step within the episode
and element the token holds, and at which positions the logits of which step's action are read. Every
valid step of every history is read exactly once, so whatever is stored at the read positions (the
residual stream of a layer, the logits) comes back aligned to steps, [H, T, ...] (`PositionMap.to_steps`).

Formats (o: observation, a: action, r: reward; `obs` is one-hot(o) for Discrete observations, the
observation vector itself for Box ones):

* `ad-step` (Algorithm Distillation, one token per step): token t = [obs(o_t), one-hot(a_{t-1}), r_{t-1},
  new-episode flag]. a_{t-1}, r_{t-1} are the history's previous step, also across an episode boundary
  (AD reads across episodes; the flag marks the first step of an episode), zeros at t = 0. The logits at
  position t are those of a_t (a causal model has not seen a_t there).
* `ad-element` (one token per element, 3 per step): positions 3i, 3i+1, 3i+2 hold o_t, a_t, r_t of the
  window's i-th step t; token = [type one-hot (o, a, r), obs(o_t) | one-hot(a_t) | r_t in its own
  columns, new-episode flag on the o token]. Logits of a_t are read at the o token 3i.
* `dpt` (Decision-Pretrained Transformer): one sequence per step t: position 0 is the query token
  [0, ..., obs(o_t) in the query columns, query flag 1], positions 1..k hold the k = min(t, context)
  transitions (s, a, r, s') before t in the same history, [obs(s), one-hot(a), r, obs(s'), present flag];
  the context is a set (nothing in a token says its order or time). Padding follows. Logits of a_t are
  read at the last present position (a causal model has seen the query and the whole context there).

AD formats cut a history of T steps into windows of `context` steps starting at 0, stride, 2 stride, ...
(`stride` defaults to `context`: disjoint windows). Window 0 reads all its steps; every later window reads
only its last `stride` steps, so each step is read once, with at least `context - stride` steps before it
in its window. Padding (steps past a history's end) is a zero token, mapped to -1 everywhere, never read.

Only numpy here: the recording's readers and the analyzers use the map without torch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import UserError

FORMATS = ("ad-step", "ad-element", "dpt")
ELEMENTS = ("step", "observation", "action", "reward", "query", "transition")
"""`PositionMap.element` codes: index into ELEMENTS; -1 on padding."""
PAD = -1


@dataclass(frozen=True)
class TokenFormat:
    """A format's name, sizes and the column layout of its tokens."""

    name: str
    obs_width: int
    """Columns of one observation: n_observations (one-hot) or the Box observation's size."""
    n_actions: int
    context: int
    """Steps per window (AD) or transitions of context (DPT)."""
    stride: int | None = None
    """AD: steps between window starts (None: context)."""

    def __post_init__(self):
        if self.name not in FORMATS:
            raise UserError(f"token format must be one of {', '.join(FORMATS)}, got {self.name!r}")
        for what, v in (("context", self.context), ("obs_width", self.obs_width), ("n_actions", self.n_actions)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise UserError(f"token format {what} must be a positive integer, got {v!r}")
        if self.stride is not None and (not isinstance(self.stride, (int, np.integer)) or not 1 <= self.stride <= self.context):
            raise UserError(f"token format stride must be an integer in [1, context = {self.context}], got {self.stride!r}")

    @property
    def step_stride(self) -> int:
        return self.context if self.stride is None else int(self.stride)

    @property
    def columns(self) -> dict[str, slice]:
        """Named column blocks of a token (docs/episodes.md lists them per format)."""
        O, A = self.obs_width, self.n_actions
        if self.name == "ad-step":
            blocks = (("obs", O), ("prev_action", A), ("prev_reward", 1), ("new_episode", 1))
        elif self.name == "ad-element":
            blocks = (("type", 3), ("obs", O), ("action", A), ("reward", 1), ("new_episode", 1))
        else:
            blocks = (("obs", O), ("action", A), ("reward", 1), ("next_obs", O), ("present", 1), ("query", 1))
        out, at = {}, 0
        for name, width in blocks:
            out[name] = slice(at, at + width)
            at += width
        return out

    @property
    def d_token(self) -> int:
        return max(s.stop for s in self.columns.values())

    @property
    def positions(self) -> int:
        """P: positions per sequence."""
        return {"ad-step": self.context, "ad-element": 3 * self.context, "dpt": 1 + self.context}[self.name]

    def to_dict(self) -> dict:
        return {"name": self.name, "obs_width": int(self.obs_width), "n_actions": int(self.n_actions),
                "context": int(self.context), "stride": None if self.stride is None else int(self.stride)}

    @classmethod
    def from_dict(cls, d: dict) -> "TokenFormat":
        if not isinstance(d, dict) or not {"name", "obs_width", "n_actions", "context"} <= set(d):
            raise UserError(f"a token format needs name, obs_width, n_actions and context, got {d!r}")
        return cls(d["name"], d["obs_width"], d["n_actions"], d["context"], d.get("stride"))


def format_for(episodes, name: str, context: int, stride: int | None = None) -> TokenFormat:
    """The token format `name` for these episodes' observation and action spaces."""
    obs = np.asarray(episodes.observations)
    width = int(episodes.n_observations) if obs.ndim == 2 else int(obs.shape[-1])
    return TokenFormat(name, width, int(episodes.n_actions), int(context), stride)


@dataclass(frozen=True)
class PositionMap:
    """Where every token of a [N, P] batch of sequences comes from, and where action logits are read.

    Per position (arrays [N, P], -1 on padding): `history` h (index into the encoded histories), `step` t, `episode` (episode index within the history), `episode_step` (step within
    its episode), `element` (index into ELEMENTS). Read positions (arrays [M], one per valid step):
    sequence `read_seq`, position `read_pos`, and the step they predict the action of: `read_history`,
    `read_step`."""

    history: np.ndarray
    step: np.ndarray
    episode: np.ndarray
    episode_step: np.ndarray
    element: np.ndarray
    read_seq: np.ndarray
    read_pos: np.ndarray
    read_history: np.ndarray
    read_step: np.ndarray
    n_histories: int
    n_steps: int

    def read(self, values: np.ndarray) -> np.ndarray:
        """values[N, P, ...] at the read positions: [M, ...]."""
        return values[self.read_seq, self.read_pos]

    def to_steps(self, values: np.ndarray, fill=np.nan) -> np.ndarray:
        """values[N, P, ...] (numpy) aligned to steps: [H, T, ...], `fill` where a step is not valid."""
        picked = self.read(values)
        dtype = np.result_type(picked.dtype, np.asarray(fill).dtype)
        out = np.full((self.n_histories, self.n_steps, *picked.shape[1:]), fill, dtype=dtype)
        out[self.read_history, self.read_step] = picked
        return out


def _features(obs: np.ndarray, n_observations, valid: np.ndarray) -> np.ndarray:
    """[H, T, O] float32: one-hot of Discrete observations [H, T], Box observations [H, T, O] as they are;
    zeros on padding."""
    if obs.ndim == 2:
        return _one_hot(obs, int(n_observations), valid)
    return np.where(valid[..., None], obs, 0).astype(np.float32)


def _grid(episodes):
    """(obs features [H, T, O], actions, rewards, valid, episode index, step within episode) of the episodes."""
    valid = np.asarray(episodes.valid, dtype=bool)
    feats = _features(np.asarray(episodes.observations), episodes.n_observations, valid)
    return (feats, np.asarray(episodes.actions), np.asarray(episodes.rewards, dtype=np.float32), valid,
            np.asarray(episodes.episode_index), np.asarray(episodes.episode_step))


def _one_hot(a: np.ndarray, n: int, on: np.ndarray) -> np.ndarray:
    out = np.zeros((*a.shape, n), dtype=np.float32)
    np.put_along_axis(out, np.where(on, a, 0)[..., None], 1.0, axis=-1)
    out[~on] = 0.0
    return out


def ad_step_tokens(fmt: TokenFormat, obs: np.ndarray, prev_action: np.ndarray, prev_reward: np.ndarray,
                   new_episode: np.ndarray) -> np.ndarray:
    """`ad-step` tokens [..., d_token] of steps given their observation features [..., O], previous action
    (-1: none, at a history's first step), previous reward and new-episode flag: what `encode` writes, and
    what a model acting in closed loop appends step by step (`train.ad.rollout`)."""
    cols = fmt.columns
    out = np.zeros((*np.shape(prev_action), fmt.d_token), dtype=np.float32)
    out[..., cols["obs"]] = obs
    out[..., cols["prev_action"]] = _one_hot(np.asarray(prev_action), fmt.n_actions, np.asarray(prev_action) >= 0)
    out[..., cols["prev_reward"].start] = prev_reward
    out[..., cols["new_episode"].start] = new_episode
    return out


def ad_element_tokens(fmt: TokenFormat, obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
                      new_episode: np.ndarray) -> np.ndarray:
    """`ad-element` tokens [..., 3, d_token]: the o, a and r tokens of steps given their observation features
    [..., O], action (-1: a zero action column), reward and new-episode flag: what `encode` writes, and what a
    model acting in closed loop appends (the o token of step t before it acts, a_t and r_t once known)."""
    cols = fmt.columns
    action = np.asarray(action)
    out = np.zeros((*action.shape, 3, fmt.d_token), dtype=np.float32)
    for e in range(3):  # type one-hot: o, a, r
        out[..., e, cols["type"].start + e] = 1.0
    out[..., 0, cols["obs"]] = obs
    out[..., 0, cols["new_episode"].start] = new_episode
    out[..., 1, cols["action"]] = _one_hot(action, fmt.n_actions, action >= 0)
    out[..., 2, cols["reward"].start] = reward
    return out


def dpt_query_tokens(fmt: TokenFormat, obs: np.ndarray) -> np.ndarray:
    """`dpt` query tokens [..., d_token] of observation features [..., O] (position 0 of a step's sequence)."""
    out = np.zeros((*np.shape(obs)[:-1], fmt.d_token), dtype=np.float32)
    out[..., fmt.columns["obs"]] = obs
    out[..., fmt.columns["query"].start] = 1.0
    return out


def dpt_transition_tokens(fmt: TokenFormat, obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
                          next_obs: np.ndarray) -> np.ndarray:
    """`dpt` context tokens [..., d_token] of transitions (s, a, r, s'): features [..., O], action (-1: a zero
    action column), reward, next features [..., O]; what `encode` writes and a model in closed loop appends."""
    cols, action = fmt.columns, np.asarray(action)
    out = np.zeros((*action.shape, fmt.d_token), dtype=np.float32)
    out[..., cols["obs"]] = obs
    out[..., cols["action"]] = _one_hot(action, fmt.n_actions, action >= 0)
    out[..., cols["reward"].start] = reward
    out[..., cols["next_obs"]] = next_obs
    out[..., cols["present"].start] = 1.0
    return out


def window_starts(n_steps: int, fmt: TokenFormat) -> np.ndarray:
    """Start steps of the AD windows over a history of `n_steps` steps."""
    stride = fmt.step_stride
    return np.arange(1 + -(-max(n_steps - fmt.context, 0) // stride)) * stride


def check_fits(fmt: TokenFormat, episodes) -> None:
    """Refuse episodes whose observation width or action count is not the format's (one line)."""
    obs_shape = np.asarray(episodes.observations).shape
    width = int(episodes.n_observations) if len(obs_shape) == 2 else int(obs_shape[-1])
    if width != fmt.obs_width or int(episodes.n_actions) != fmt.n_actions:
        raise UserError(f"the episodes have {width} observation columns and {episodes.n_actions} actions, the token "
                        f"format {fmt.name} expects {fmt.obs_width} and {fmt.n_actions}")


def encode(episodes, fmt: TokenFormat) -> tuple[np.ndarray, PositionMap]:
    """(tokens float32 [N, P, d_token], PositionMap) of every history of `episodes` in format `fmt`."""
    check_fits(fmt, episodes)
    if fmt.name == "dpt":
        return _encode_dpt(episodes, fmt)
    return _encode_ad(episodes, fmt)


def _encode_ad(episodes, fmt: TokenFormat):
    feats, actions, rewards, valid, ep_index, ep_step = _grid(episodes)
    H, T = valid.shape
    K = fmt.context
    starts = window_starts(T, fmt)
    W = len(starts)
    steps = starts[:, None] + np.arange(K)[None, :]  # [W, K] history step of each window slot
    inside = steps < T
    t_idx = np.minimum(steps, T - 1)
    on = valid[:, t_idx] & inside[None]  # [H, W, K]
    hist = np.broadcast_to(np.arange(H)[:, None, None], on.shape)
    first = np.broadcast_to((np.arange(K)[None, :] >= np.where(np.arange(W) == 0, 0, K - fmt.step_stride)[:, None]), on.shape)
    new_ep = ((ep_step == 0) & valid).astype(np.float32)
    if fmt.name == "ad-step":
        prev = np.maximum(t_idx - 1, 0)
        prev_on = (t_idx > 0)[None] & on  # valid is a prefix: step t valid, so is t - 1
        tokens = ad_step_tokens(fmt, feats[:, t_idx], np.where(prev_on, actions[:, prev], -1),
                                np.where(prev_on, rewards[:, prev], 0.0), new_ep[:, t_idx] > 0)
        tokens[~on] = 0.0
        per_pos = 1
        element = np.where(on, ELEMENTS.index("step"), PAD)
    else:
        tokens = ad_element_tokens(fmt, feats[:, t_idx], np.where(on, actions[:, t_idx], -1), rewards[:, t_idx],
                                   new_ep[:, t_idx])
        tokens[~on] = 0.0
        per_pos = 3
        element = np.where(on[..., None], np.array([ELEMENTS.index(e) for e in ("observation", "action", "reward")]), PAD)
    N, P = H * W, K * per_pos

    def per_position(values: np.ndarray) -> np.ndarray:  # [H, W, K] -> [N, P]
        v = np.where(on, values, PAD)
        return np.repeat(v[..., None], per_pos, axis=-1).reshape(N, P)

    step_grid = np.broadcast_to(steps, on.shape)
    read = on & first
    h_r, w_r, k_r = np.nonzero(read)
    pmap = PositionMap(
        history=per_position(hist), step=per_position(step_grid),
        episode=per_position(ep_index[:, t_idx]), episode_step=per_position(ep_step[:, t_idx]),
        element=element.reshape(N, P).astype(np.int8),
        read_seq=h_r * W + w_r, read_pos=k_r * per_pos, read_history=h_r,
        read_step=step_grid[h_r, w_r, k_r], n_histories=H, n_steps=T)
    return tokens.reshape(N, P, fmt.d_token), pmap


def _encode_dpt(episodes, fmt: TokenFormat):
    feats, actions, rewards, valid, ep_index, ep_step = _grid(episodes)
    nxt = _features(np.asarray(episodes.next_observations), episodes.n_observations, valid)
    H, T = valid.shape
    K = fmt.context
    # sequence (h, t): query o_t at 0, then transitions t-k .. t-1 (k = min(t, K)) at 1..k
    lag = np.arange(K)[None, :] - np.minimum(np.arange(T), K)[:, None]  # [T, K]: slot j holds step t + lag
    src = np.arange(T)[:, None] + lag
    ctx_on = (lag < 0)[None] & valid[:, :, None]  # [H, T, K]: the query step is valid (so is its past: a prefix)
    src = np.clip(src, 0, T - 1)  # slots past the context (lag >= 0) are masked; clipped, a context > T indexes too
    tokens = np.zeros((H, T, 1 + K, fmt.d_token), dtype=np.float32)
    tokens[:, :, 0] = np.where(valid[..., None], dpt_query_tokens(fmt, feats), 0.0)
    tokens[:, :, 1:] = dpt_transition_tokens(fmt, feats[:, src], np.where(valid[:, src], actions[:, src], -1),
                                             rewards[:, src], nxt[:, src])
    tokens[:, :, 1:][~ctx_on] = 0.0
    on = np.concatenate([valid[..., None], ctx_on], axis=-1)  # [H, T, 1 + K]
    step_of = np.concatenate([np.arange(T)[:, None], src], axis=-1)  # [T, 1 + K]
    N, P = H * T, 1 + K

    def per_position(values: np.ndarray) -> np.ndarray:
        return np.where(on, values, PAD).reshape(N, P)

    element = np.where(on, np.array([ELEMENTS.index("query")] + [ELEMENTS.index("transition")] * K), PAD)
    h_r, t_r = np.nonzero(valid)
    pmap = PositionMap(
        history=per_position(np.broadcast_to(np.arange(H)[:, None, None], on.shape)),
        step=per_position(np.broadcast_to(step_of, on.shape)),
        episode=per_position(ep_index[:, step_of]), episode_step=per_position(ep_step[:, step_of]),
        element=element.reshape(N, P).astype(np.int8),
        read_seq=h_r * T + t_r, read_pos=np.minimum(t_r, K), read_history=h_r, read_step=t_r, n_histories=H, n_steps=T)
    return tokens.reshape(N, P, fmt.d_token), pmap
