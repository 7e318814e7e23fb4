"""Wang et al.'s linear-attention TD transformer: Z <- Z + (1/n) P Z M (Z^T Q Z).

Value map P, kernel Q, query column masked as a source; readout -Z_L[2d+1, n+1].
`config.activation` gives the nonlinear comparison variant of (c):
Z <- Z + (1/n) P Z M act(Z^T Q Z).
"""
from __future__ import annotations

import torch

from .base import ICRLModel
from .linear_attention import LinearAttentionModel, LinearBlock


class MaskedLinearAttentionModel(LinearAttentionModel, ICRLModel):
    """Parameters blocks.{l}.attn.P (value) and blocks.{l}.attn.Q (kernel)."""

    def make_block(self, owns_params: bool, dtype: torch.dtype) -> LinearBlock:
        return LinearBlock("P", "Q", self.config.D, dtype, owns_params, mask_query_source=True,
                           activation=self.config.activation)
