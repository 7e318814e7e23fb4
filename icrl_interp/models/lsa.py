"""Liang & Lai's linear self-attention layer: H <- H + (1/n) (V H)(H^T P H), no mask.

Value map V, kernel P; the readout is the parameter block of the last column. The
layer only needs a layout, so the same class serves SARSA (D = 3d + 2) and the
actor-critic variant (families.actor_critic.layout(d, m), D = 3d + 2m + 2).
"""
from __future__ import annotations

import torch

from .base import ICRLModel
from .linear_attention import LinearAttentionModel, LinearBlock


class LSAModel(LinearAttentionModel, ICRLModel):
    """Parameters blocks.{l}.attn.P (kernel) and blocks.{l}.attn.V (value); theta* uses one layer."""

    def make_block(self, owns_params: bool, dtype: torch.dtype) -> LinearBlock:
        return LinearBlock("V", "P", self.config.D, dtype, owns_params, mask_query_source=False, activation=None)
