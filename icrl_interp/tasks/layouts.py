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

from ..core import validate as V
from ..core.errors import UserError

Array = np.ndarray

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


def build_layout(family: str, sizes: list[tuple[str, int]], readout: str, sign: int = 1) -> PromptLayout:
    """A layout from (block name, size) pairs in row order."""
    blocks, start = [], 0
    for name, size in sizes:
        blocks.append((name, start, start + size))
        start += size
    return PromptLayout(family, tuple(blocks), readout, sign)


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


def gather(table: Float[Array, "batch s d"], idx: Int[Array, "batch k"]) -> Float[Array, "batch k d"]:
    return table[np.arange(table.shape[0])[:, None], idx]


def check_transitions(phi, phi_next, rewards, gamma) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Validated (phi [B, n, d], phi_next [B, n, d], rewards [B, n], gamma) of a transition prompt."""
    gamma = V.discount(gamma)
    phi = V.finite("phi", np.asarray(phi, dtype=np.float64))
    B, n, d = phi.shape
    phi_next = V.finite("phi_next", V.shape("phi_next", phi_next, (B, n, d)))
    rewards = V.finite("rewards", V.shape("rewards", rewards, (B, n)))
    return phi, phi_next, rewards, gamma


def fill_transitions(z, layout, phi, gamma_phi_next, rewards) -> None:
    """Write transition columns (rows phi, gamma_phi_next, reward) of the context positions."""
    n = phi.shape[1]
    z[:, :n, layout.slice("phi")] = phi
    z[:, :n, layout.slice("gamma_phi_next")] = gamma_phi_next
    z[:, :n, layout.slice("reward")] = rewards[..., None]


def labelled_prompt(z, layout, rewards, states, actions) -> Prompt:
    """A Prompt of z with per-column rewards (query column 0) and state / action labels (-1 when absent)."""
    B, pos = z.shape[:2]
    r = np.zeros((B, pos))
    r[:, :-1] = rewards
    return Prompt(z=z, layout=layout, states=column_labels("states", states, (B, pos)), rewards=r,
                  actions=column_labels("actions", actions, (B, pos)))


def column_labels(name: str, labels, expected: tuple[int, int]) -> np.ndarray:
    """Per-column integer labels of the given shape; -1 everywhere when not given."""
    if labels is None:
        return np.full(expected, -1, dtype=np.int64)
    return V.shape(name, np.asarray(labels), expected).astype(np.int64)


def mdp_columns(mdp, traj) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """phi_i, phi+_i and the column labels of an MDP trajectory batch."""
    feats = mdp.features()  # [s, a, d] shared (one-hot) or [B, s, a, d] per task (random feature maps)
    sa = traj.states * mdp.n_actions + traj.actions
    if feats.ndim == 4:
        phi_all = gather(feats.reshape(feats.shape[0], mdp.n_states * mdp.n_actions, -1), sa)
    else:
        phi_all = feats.reshape(mdp.n_states * mdp.n_actions, -1)[sa]  # [B, n+1, d]
    B, n = traj.rewards.shape
    states = np.concatenate([traj.states[:, :-1], np.full((B, 1), -1)], axis=1)
    actions = np.concatenate([traj.actions[:, :-1], np.full((B, 1), -1)], axis=1)
    return phi_all[:, :-1], phi_all[:, 1:], states, actions
