"""Xie et al.'s softmax ICTD transformer: Z <- Z + V Z softmax(Z^T A Z + M), then a shift.

Softmax over sources (each target's weights sum to 1), query column masked as a
source (-inf score). Two equivalent forms of the target-memory update:

* 'tsm': resid_mid = Z + V Z K, then the parameter-free temporal shift module
  Z' = U resid_mid + W resid_mid Pi (clear the target row, refill it with gamma x the
  current row of the next column);
* 'dual': Z' = Z + V Z K + V_target Z K Pi (a second head on the same pattern, shifted).
"""
from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from .base import AttentionParams, ICRLModel, apply_rows, attention_hook_shapes, project, shift_back, weighted_values
from .hooks import HookPoint


class SoftmaxAttention(AttentionParams):
    """`blocks.{l}.attn`: scores, masked source softmax, current-value head."""

    def forward(
        self, z: Float[Tensor, "batch pos d_model"], A: Float[Tensor, "d_model d_model"], V: Float[Tensor, "d_model d_model"]
    ) -> tuple[Float[Tensor, "batch 1 pos pos"], Float[Tensor, "batch pos d_model"]]:
        v = self.hook_v(project(z, V))
        # scores[b, q, k] = z_k^T A z_q (source k, target q); the query column is never a source.
        scores = apply_rows(z, A) @ z.transpose(1, 2)
        query_source = torch.zeros(z.shape[1], dtype=torch.bool, device=z.device)
        query_source[-1] = True
        scores = self.hook_attn_scores(scores.masked_fill(query_source, float("-inf"))[:, None])
        pattern = self.hook_pattern(torch.softmax(scores, dim=-1))
        return pattern, self.hook_z(weighted_values(pattern, v))[:, :, 0, :]


class SoftmaxTDBlock(nn.Module):
    """`blocks.{l}` of either form (see the module docstring)."""

    def __init__(self, D: int, dtype: torch.dtype, owns_params: bool, form: str, gamma: float, target: int, current: int):
        super().__init__()
        self.form, self.gamma, self.target, self.current = form, gamma, target, current
        names = ("A", "V", "V_target") if form == "dual" else ("A", "V")
        self.hook_resid_pre = HookPoint()
        self.attn = SoftmaxAttention(names, D, dtype, owns_params)
        if form == "dual":
            self.hook_v_target = HookPoint()
            self.hook_z_target = HookPoint()
        self.hook_attn_out = HookPoint()
        if form == "tsm":
            self.hook_resid_mid = HookPoint()
            self.hook_tsm_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def tsm_delta(self, mid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """U mid + W mid Pi - mid: replace the target row by gamma x the next column's current row."""
        e_target = torch.zeros(mid.shape[-1], dtype=mid.dtype, device=mid.device)
        e_target[self.target] = 1.0
        new_target = self.gamma * shift_back(mid[..., self.current : self.current + 1])
        return (new_target - mid[..., self.target : self.target + 1]) * e_target

    def forward(self, resid: Float[Tensor, "batch pos d_model"], params: dict[str, Tensor]) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        pattern, z_current = self.attn(resid, params["A"], params["V"])
        if self.form == "dual":
            v_target = self.hook_v_target(project(resid, params["V_target"]))
            z_target = self.hook_z_target(weighted_values(pattern, v_target))
            out = self.hook_attn_out(z_current + shift_back(z_target[:, :, 0, :]))
            return self.hook_resid_post(resid + out)
        mid = self.hook_resid_mid(resid + self.hook_attn_out(z_current))
        return self.hook_resid_post(mid + self.hook_tsm_out(self.tsm_delta(mid)))

    def hook_shapes(self, batch: int, pos: int, D: int) -> dict[str, tuple[int, ...]]:
        shapes = attention_hook_shapes(batch, pos, D)
        if self.form == "dual":
            shapes.update({"hook_v_target": (batch, pos, 1, D), "hook_z_target": (batch, pos, 1, D)})
        else:
            shapes.update({"hook_resid_mid": (batch, pos, D), "hook_tsm_out": (batch, pos, D)})
        return shapes


class SoftmaxICTDModel(ICRLModel):
    """Parameters blocks.{l}.attn.A, blocks.{l}.attn.V (+ blocks.{l}.attn.V_target in the dual form)."""

    def make_block(self, owns_params: bool, dtype: torch.dtype) -> SoftmaxTDBlock:
        lay = self.config.layout
        return SoftmaxTDBlock(self.config.D, dtype, owns_params, self.config.form, self.config.gamma,
                              lay.slice("target_mem").start, lay.slice("current_mem").start)
