"""An analyzer from outside the package, the one docs/adding-an-analyzer.md walks through: the mean
Euclidean norm of each layer's residual stream at the last recorded position.

Importing this module registers it; other processes find it through $ICRL_INTERP_ANALYZERS or an
entry point of the group `icrl_interp.analyzers` (tests/analyzers/test_analyzer_plugin.py does all three).
"""
from __future__ import annotations

import numpy as np

from icrl_interp.analyzers import Analyzer, Chunk, Column, register
from icrl_interp.analyzers.keys import ACTIVATIONS, get, num

NAME = "resid_norm"


class ResidNorm:
    """The stream of one recording: sums of the norms, per layer."""

    def __init__(self, layers: list[int]):
        self.layers = layers
        self.paths = [f"acts/blocks.{l}.hook_resid_post" for l in layers]
        self.total = np.zeros(len(layers))
        self.count = 0

    def update(self, chunk: Chunk) -> None:
        for i, path in enumerate(self.paths):
            last = np.asarray(chunk.data[path][:, -1], dtype=np.float64)  # [prompts, d_model]
            self.total[i] += np.linalg.norm(last, axis=-1).sum()
        self.count += chunk.stop - chunk.start

    def finalize(self) -> dict:
        means = self.total / self.count
        return {NAME: {"layers": self.layers, "mean_norm": means.tolist(), "n_prompts": self.count},
                "layers": {l: {NAME: float(m)} for l, m in zip(self.layers, means)}}


def open_resid_norm(ctx):
    """A stream when some layer's residual stream is recorded; else None, saying why."""
    layers = [l for l in range(ctx.n_layers) if f"blocks.{l}.hook_resid_post" in ctx.facts.hooks]
    if not layers:
        ctx.reasons[NAME] = "no blocks.{l}.hook_resid_post recorded"
        return None
    return ResidNorm(layers)


def last_norm(analysis: dict) -> float | None:
    """The report's column: the last layer's mean norm (None where the analysis has none)."""
    norms = get(analysis, ACTIVATIONS, NAME, "mean_norm")
    return num(norms[-1]) if isinstance(norms, list) and norms else None


ANALYZER = register(Analyzer(
    name=NAME, summary="mean norm of each layer's residual stream at the last position", open=open_resid_norm,
    roles=("resid_post",),
    columns=(Column("resid_norm_last", "residual norm (last layer)", last_norm, "{:.4g}", "|resid|",
                    "|resid|: mean norm of the residual stream at the last position (last layer)"),),
    line=lambda a: None if last_norm(a) is None else f"mean residual norm, last layer {last_norm(a):.4g}"))
