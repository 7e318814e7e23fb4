"""Linear attention (Wang's TD layer and Liang-Lai's LSA layer) with two exact evaluation orders.

One layer adds `(1/n) W_v Z M act(Z^T W_k Z)` to the prompt, n = pos - 1 context columns,
M = diag of the source weights (query column masked for Wang, unmasked for the LSA).

* quadratic path: scores Z^T W_k Z ([pos, pos]) first, O(pos^2 D);
* associative path (linear attention only, no activation): G = sum_k m_k v_k z_k^T first
  ([D, D]), then (1/n) G W_k z_q for every target q, O(pos D^2 + D^3).

`path = 'auto'` takes the cheaper order by shape, except that the pattern is always
materialised (quadratic path) when anything listens to hook_attn_scores or hook_pattern,
so those hooks fire and interventions on them take effect. hook_v and hook_z fire on
both paths, and an intervention on hook_v is honoured by both.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..core.errors import UserError
from .base import AttentionParams, apply_rows, attention_hook_shapes, observed, project, weighted_values
from .hooks import HookPoint

PATHS = ("auto", "quadratic", "associative")
_ACT = {"relu": F.relu, "tanh": torch.tanh, "leaky_relu": F.leaky_relu, "elu": F.elu, "selu": F.selu}


def associative_is_cheaper(pos: int, D: int) -> bool:
    """2 pos^2 D multiply-adds (scores + mix) against 2 pos D^2 + D^3 (G, G W_k, apply)."""
    return 2 * pos * pos * D > 2 * pos * D * D + D**3


class LinearAttention(AttentionParams):
    """`blocks.{l}.attn` of a linear-attention model: parameters, hook points, both paths."""

    def __init__(self, names, D, dtype, owns_params, mask_query_source: bool, activation: str | None):
        super().__init__(names, D, dtype, owns_params)
        self.mask_query_source = mask_query_source
        self.activation = activation
        self.path = "auto"
        """'auto', 'quadratic' or 'associative' (see the module docstring)."""
        self.last_path: str | None = None
        """The path the last forward took (for tests and the benchmark)."""

    def choose_path(self, pos: int, D: int) -> str:
        if self.path not in PATHS:
            raise UserError(f"unknown attention path {self.path!r} (use {', '.join(PATHS)})")
        if observed(self.hook_attn_scores) or observed(self.hook_pattern):
            return "quadratic"
        if self.activation is not None:
            if self.path == "associative":
                raise UserError(f"the associative path needs linear attention; this model uses {self.activation}")
            return "quadratic"
        if self.path != "auto":
            return self.path
        return "associative" if associative_is_cheaper(pos, D) else "quadratic"

    def source_weights(self, pos: int, like: Tensor) -> Float[Tensor, " pos"]:
        """Diagonal of M: 1 for every source, 0 for the query column when it is masked."""
        m = torch.ones(pos, dtype=like.dtype, device=like.device)
        if self.mask_query_source:
            m[-1] = 0.0
        return m

    def forward(
        self, z: Float[Tensor, "batch pos d_model"], W_value: Float[Tensor, "d_model d_model"],
        W_kernel: Float[Tensor, "d_model d_model"],
    ) -> Float[Tensor, "batch pos d_model"]:
        """(1/n) W_value Z M act(Z^T W_kernel Z), in the TL orientation."""
        pos, D = z.shape[1], z.shape[2]
        n = pos - 1
        m = self.source_weights(pos, z)
        v = self.hook_v(project(z, W_value))
        self.last_path = self.choose_path(pos, D)
        if self.last_path == "quadratic":
            # scores[b, q, k] = z_k^T W_kernel z_q: source k's weight on target q.
            scores = self.hook_attn_scores((apply_rows(z, W_kernel) @ z.transpose(1, 2))[:, None])
            kernel = scores if self.activation is None else _ACT[self.activation](scores)
            pattern = self.hook_pattern(kernel * (m / n))
            mixed = weighted_values(pattern, v)
        else:
            G = (v[:, :, 0, :] * m[:, None]).transpose(1, 2) @ z  # sum_k m_k v_k z_k^T, [batch, D, D]
            GW = apply_rows(G, W_kernel.T)  # G W_kernel
            mixed = ((z @ GW.transpose(1, 2)) / n)[:, :, None, :]
        return self.hook_z(mixed)[:, :, 0, :]


class LinearBlock(nn.Module):
    """`blocks.{l}`: resid_post = resid_pre + attn(resid_pre); no output map, no MLP."""

    def __init__(self, value: str, kernel: str, D: int, dtype: torch.dtype, owns_params: bool,
                 mask_query_source: bool, activation: str | None):
        super().__init__()
        self.value, self.kernel = value, kernel
        self.hook_resid_pre = HookPoint()
        self.attn = LinearAttention((value, kernel), D, dtype, owns_params, mask_query_source, activation)
        self.hook_attn_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, resid: Float[Tensor, "batch pos d_model"], params: dict[str, Tensor]) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        out = self.hook_attn_out(self.attn(resid, params[self.value], params[self.kernel]))
        return self.hook_resid_post(resid + out)

    def hook_shapes(self, batch: int, pos: int, D: int) -> dict[str, tuple[int, ...]]:
        return attention_hook_shapes(batch, pos, D)


class LinearAttentionModel:
    """Mixin: choose the evaluation order of every layer at once."""

    def set_attention_path(self, path: str) -> None:
        """'auto' (default), 'quadratic' or 'associative' for every layer."""
        if path not in PATHS:
            raise UserError(f"unknown attention path {path!r} (use {', '.join(PATHS)})")
        for block in self.blocks:
            block.attn.path = path
