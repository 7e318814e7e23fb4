"""Prompt layouts (named row blocks of the residual stream) and batched prompt builders.

A prompt is stored TransformerLens-style as `z[batch, pos, d_model]`: position j is
column j of the papers' matrix Z, and the last position is the query / parameter
column. A `PromptLayout` names the row blocks of d_model with [start, stop)
ranges; analyzers cut parameter matrices with it and recordings store it, so a
checkpoint can be analyzed without knowing the model code.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from jaxtyping import Float, Int

from . import validate as V
from .errors import UserError

Array = np.ndarray

FAMILIES = ("linear-td", "softmax-td", "sarsa", "actor-critic")


@dataclass(frozen=True)
class PromptLayout:
    """Row blocks of a family's prompt, in order, covering 0..d_model."""

    family: str
    """Model family the layout belongs to."""
    blocks: tuple[tuple[str, int, int], ...]
    """(name, start, stop) per row block, contiguous and in order."""
    readout_block: str
    """Block whose entries at the last position are the model's output."""
    readout_sign: int = 1
    """Output = readout_sign * z[..., -1, readout_block] (Wang's readout is negated)."""

    def __post_init__(self):
        dup = sorted({n for n in self.names if self.names.count(n) > 1})
        if dup:
            raise UserError(f"layout has duplicate block names: {', '.join(map(repr, dup))}")
        if self.readout_sign not in (1, -1):
            raise UserError(f"layout readout_sign must be +1 or -1, got {self.readout_sign}")
        stop = 0
        for name, a, b in self.blocks:
            if a != stop or b <= a:
                raise UserError(f"layout blocks must be contiguous and non-empty; block {name!r} is [{a}, {b})")
            stop = b
        if self.readout_block not in self.names:
            raise UserError(f"readout block {self.readout_block!r} is not a block of the layout")

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.blocks]

    @property
    def d_model(self) -> int:
        return self.blocks[-1][2]

    def slice(self, name: str) -> slice:
        """Row range of a named block."""
        for block, a, b in self.blocks:
            if block == name:
                return slice(a, b)
        raise UserError(f"layout of family {self.family!r} has no block {name!r} (blocks: {', '.join(self.names)})")

    def size(self, name: str) -> int:
        s = self.slice(name)
        return s.stop - s.start

    def readout(self, z: Float[Any, "*batch pos d_model"]):
        """The model output read from the last position (works for numpy and torch)."""
        return self.readout_sign * z[..., -1, self.slice(self.readout_block)]

    def to_dict(self) -> dict:
        return {
            "family": self.family,
            "blocks": {name: [a, b] for name, a, b in self.blocks},
            "readout_block": self.readout_block,
            "readout_sign": self.readout_sign,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict) -> "PromptLayout":
        try:
            # sorted by start: JSON writers may reorder keys
            blocks = tuple(sorted(((str(k), int(v[0]), int(v[1])) for k, v in data["blocks"].items()), key=lambda b: b[1]))
            return cls(
                family=str(data["family"]),
                blocks=blocks,
                readout_block=str(data["readout_block"]),
                readout_sign=int(data.get("readout_sign", 1)),
            )
        except (KeyError, TypeError, IndexError, AttributeError, ValueError) as e:
            if isinstance(e, UserError):
                raise
            raise UserError(f"malformed prompt layout: {e!r}") from None


def _layout(family: str, sizes: list[tuple[str, int]], readout: str, sign: int = 1) -> PromptLayout:
    blocks, start = [], 0
    for name, size in sizes:
        blocks.append((name, start, start + size))
        start += size
    return PromptLayout(family, tuple(blocks), readout, sign)


def td_layout(d: int) -> PromptLayout:
    """Wang et al.: rows phi (d), gamma_phi_next (d), reward (1); D = 2d + 1."""
    return _layout("linear-td", [("phi", d), ("gamma_phi_next", d), ("reward", 1)], "reward", -1)


def softmax_layout(d: int) -> PromptLayout:
    """Xie et al.: rows x (d), reward, target_mem, current_mem; D = d + 3."""
    return _layout("softmax-td", [("x", d), ("reward", 1), ("target_mem", 1), ("current_mem", 1)], "current_mem")


def sarsa_layout(d: int) -> PromptLayout:
    """Liang & Lai: transition block (phi, gamma_phi_next, reward), parameter block (param_one, w); D = 3d + 2."""
    return _layout(
        "sarsa", [("phi", d), ("gamma_phi_next", d), ("reward", 1), ("param_one", 1), ("w", d)], "w"
    )


def actor_critic_layout(d: int, m: int) -> PromptLayout:
    """Liang & Lai actor-critic: transition block adds the discounted score (m rows),
    parameter block adds the policy parameters lambda (m rows); D = 3d + 2m + 2.
    The readout block is the critic `w`; the actor's output is the `lam` block of the last position."""
    return _layout(
        "actor-critic",
        [("phi", d), ("gamma_phi_next", d), ("reward", 1), ("score", m), ("param_one", 1), ("w", d), ("lam", m)],
        "w",
    )


def layout_for(family: str, d: int, m: int | None = None) -> PromptLayout:
    """The layout of a family for feature dimension d (and policy dimension m)."""
    if family == "linear-td":
        return td_layout(d)
    if family == "softmax-td":
        return softmax_layout(d)
    if family == "sarsa":
        return sarsa_layout(d)
    if family == "actor-critic":
        if m is None:
            raise UserError("the actor-critic layout needs the policy dimension m")
        return actor_critic_layout(d, m)
    raise UserError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")


# ------------------------------------------------------------------ prompts
@dataclass
class Prompt:
    """A batch of prompts with per-column labels."""

    z: Float[Array, "batch pos d_model"]
    """Prompt matrices, TransformerLens orientation (pos = n + 1; last = query)."""
    layout: PromptLayout
    """Named row blocks."""
    states: Int[Array, "batch pos"]
    """State index of each column (-1 where a column holds no state)."""
    rewards: Float[Array, "batch pos"]
    """Reward carried by each column (0 on the query column)."""
    actions: Int[Array, "batch pos"] = field(default=None)
    """Action of each column (-1 where none)."""

    def __post_init__(self):
        if self.actions is None:
            self.actions = np.full(self.states.shape, -1, dtype=np.int64)

    @property
    def n(self) -> int:
        """Number of context columns."""
        return self.z.shape[1] - 1

    def labels(self) -> dict[str, np.ndarray]:
        return {"state": self.states, "action": self.actions, "reward": self.rewards}


def _gather(table: Float[Array, "batch s d"], idx: Int[Array, "batch k"]) -> Float[Array, "batch k d"]:
    return table[np.arange(table.shape[0])[:, None], idx]


def td_prompt(
    phi: Float[Array, "batch n d"],
    phi_next: Float[Array, "batch n d"],
    rewards: Float[Array, "batch n"],
    phi_query: Float[Array, "batch d"],
    gamma: float,
    states: Int[Array, "batch pos"] | None = None,
) -> Prompt:
    """Wang et al. prompt: column i = [phi(s_i); gamma phi(s_{i+1}); r_i], query [phi(s_q); 0; 0]."""
    gamma = V.discount(gamma)
    phi = V.finite("phi", np.asarray(phi, dtype=np.float64))
    B, n, d = phi.shape
    V.shape("phi_next", phi_next, (B, n, d))
    V.shape("rewards", rewards, (B, n))
    V.shape("phi_query", phi_query, (B, d))
    layout = td_layout(d)
    z = np.zeros((B, n + 1, layout.d_model))
    z[:, :n, layout.slice("phi")] = phi
    z[:, :n, layout.slice("gamma_phi_next")] = gamma * V.finite("phi_next", phi_next)
    z[:, :n, layout.slice("reward")] = V.finite("rewards", rewards)[..., None]
    z[:, n, layout.slice("phi")] = V.finite("phi_query", phi_query)
    r = np.zeros((B, n + 1))
    r[:, :n] = rewards
    states = _column_labels("states", states, (B, n + 1))
    return Prompt(z=z, layout=layout, states=states, rewards=r)


def td_prompt_from_mrp(mrp, traj, query_states: Int[Array, " batch"]) -> Prompt:
    """TD prompt from sampled trajectories (n = number of transitions) and a query state per task."""
    s = traj.states
    q = np.asarray(query_states, dtype=np.int64)
    states = np.concatenate([s[:, :-1], q[:, None]], axis=1)
    phi_q = mrp.phi[np.arange(mrp.batch), q]
    return td_prompt(_gather(mrp.phi, s[:, :-1]), _gather(mrp.phi, s[:, 1:]), traj.rewards, phi_q, mrp.gamma, states)


def softmax_prompt(
    x: Float[Array, "batch pos d"],
    rewards: Float[Array, "batch n"],
    states: Int[Array, "batch pos"] | None = None,
) -> Prompt:
    """Xie et al. prompt: column k (k = 1..n) holds x(S_{k-1}) and R_k; column n+1 holds x(S_n).

    `x` has the features of S_0..S_n (n + 1 rows); the memory rows start at zero.
    """
    x = V.finite("x", np.asarray(x, dtype=np.float64))
    B, pos, d = x.shape
    V.shape("rewards", rewards, (B, pos - 1))
    layout = softmax_layout(d)
    z = np.zeros((B, pos, layout.d_model))
    z[:, :, layout.slice("x")] = x
    z[:, :-1, layout.slice("reward")] = V.finite("rewards", rewards)[..., None]
    r = np.zeros((B, pos))
    r[:, :-1] = rewards
    states = _column_labels("states", states, (B, pos))
    return Prompt(z=z, layout=layout, states=states, rewards=r)


def softmax_prompt_from_mrp(mrp, traj) -> Prompt:
    """Softmax ICTD prompt from trajectories S_0..S_n of an MRP batch."""
    return softmax_prompt(_gather(mrp.phi, traj.states), traj.rewards, traj.states)


def sarsa_prompt(
    phi: Float[Array, "batch n d"],
    phi_next: Float[Array, "batch n d"],
    rewards: Float[Array, "batch n"],
    w: Float[Array, "batch d"],
    gamma: float,
    states: Int[Array, "batch pos"] | None = None,
    actions: Int[Array, "batch pos"] | None = None,
) -> Prompt:
    """Liang & Lai prompt: column i = [phi_i; gamma phi+_i; r_{i+1}; 0; 0], last column [0; 0; 0; 1; w]."""
    gamma = V.discount(gamma)
    phi = V.finite("phi", np.asarray(phi, dtype=np.float64))
    B, n, d = phi.shape
    V.shape("phi_next", phi_next, (B, n, d))
    V.shape("rewards", rewards, (B, n))
    V.shape("w", w, (B, d))
    layout = sarsa_layout(d)
    z = np.zeros((B, n + 1, layout.d_model))
    _fill_transitions(z, layout, phi, gamma * V.finite("phi_next", phi_next), V.finite("rewards", rewards))
    z[:, n, layout.slice("param_one")] = 1.0
    z[:, n, layout.slice("w")] = V.finite("w", w)
    return _labelled(z, layout, rewards, states, actions)


def _fill_transitions(z, layout, phi, gamma_phi_next, rewards) -> None:
    n = phi.shape[1]
    z[:, :n, layout.slice("phi")] = phi
    z[:, :n, layout.slice("gamma_phi_next")] = gamma_phi_next
    z[:, :n, layout.slice("reward")] = rewards[..., None]


def _labelled(z, layout, rewards, states, actions) -> Prompt:
    B, pos = z.shape[:2]
    r = np.zeros((B, pos))
    r[:, :-1] = rewards
    return Prompt(z=z, layout=layout, states=_column_labels("states", states, (B, pos)), rewards=r,
                  actions=_column_labels("actions", actions, (B, pos)))


def _column_labels(name: str, labels, expected: tuple[int, int]) -> np.ndarray:
    """Per-column integer labels of the given shape; -1 everywhere when not given."""
    if labels is None:
        return np.full(expected, -1, dtype=np.int64)
    return V.shape(name, np.asarray(labels), expected).astype(np.int64)


def _mdp_columns(mdp, traj) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """phi_i, phi+_i and the column labels of an MDP trajectory batch."""
    feats = mdp.features().reshape(mdp.n_states * mdp.n_actions, -1)
    sa = traj.states * mdp.n_actions + traj.actions
    phi_all = feats[sa]  # [B, n+1, d]
    B, n = traj.rewards.shape
    states = np.concatenate([traj.states[:, :-1], np.full((B, 1), -1)], axis=1)
    actions = np.concatenate([traj.actions[:, :-1], np.full((B, 1), -1)], axis=1)
    return phi_all[:, :-1], phi_all[:, 1:], states, actions


def sarsa_prompt_from_mdp(mdp, traj, w: Float[Array, "batch d"]) -> Prompt:
    """SARSA prompt from MDP trajectories (s_0, a_0, ..., s_n, a_n) and current parameters w."""
    phi, phi_next, states, actions = _mdp_columns(mdp, traj)
    return sarsa_prompt(phi, phi_next, traj.rewards, w, mdp.gamma, states, actions)
