"""`span_projection` of an LSA layer (SARSA): keep Adam's updates inside the subspace gradient flow stays in.

The layer's readout is TF(H) = w + V21 S P12 w~ (+ lazy terms), S = (1/n) sum_i x_i x_i^T, so every
gradient of P's transition rows and of V's transition columns is a combination of the prompts'
transition columns x_i = [phi_i; gamma phi+_i; r_i]. Gradient descent (and the paper's gradient
flow) therefore never moves those rows/columns along a direction orthogonal to every x_i; Adam's
per-coordinate scaling does. With one-hot state-action features there is exactly one such direction,
u = [1_d; -(1/gamma) 1_d; 0] (1^T phi = 1^T phi+ = 1), the loss cannot see it, and plain Adam lets
P12 and V21 drift along it. With `span_projection` each Adam update of P[one, :] and V[:, one] is
projected onto the span of the transition columns (estimated once from held-aside prompts of the
stream [seed, 3], so resumed runs use the same projector): the parameters move only where the loss
is defined, and the unexcited components keep their init values, as under gradient descent.
The held-aside prompts come from the config's own training recipe (`Recipe.batch`).
"""
from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from ..analyzers.weights import lsa_blocks
from .config import TrainConfig
from .recipe import recipe_of

SPAN_STREAM = 3
SPAN_TASKS = 256
"""Held-aside prompts for the span estimate (256 x n transitions: every state-action pair is seen)."""
SPAN_REL_TOL = 1e-9
"""Eigenvalues of the transition columns' second moment below this times the largest span nothing."""


def transition_span_projector(cfg: TrainConfig, layout) -> Float[Tensor, "k k"]:
    """Orthogonal projector (float64) onto the span of the transition columns x_i of the task distribution."""
    batch = recipe_of(cfg).batch(cfg, np.random.default_rng([cfg.seed, SPAN_STREAM]), SPAN_TASKS)
    one, _ = lsa_blocks(layout)
    x = batch.z[:, :-1, one].double().reshape(-1, one.stop)
    evals, evecs = torch.linalg.eigh(x.T @ x / x.shape[0])
    keep = evecs[:, evals > SPAN_REL_TOL * evals.max()]
    return keep @ keep.T


def project_updates(named: dict[str, Tensor], before: dict[str, Tensor], proj: Float[Tensor, "k k"], layout) -> None:
    """Replace the last update of P[one, :] and V[:, one] by its projection onto the transition span.

    Only those slices are rewritten, so every other entry (the lazy blocks included) is bit-for-bit
    what the optimizer left.
    """
    one, _ = lsa_blocks(layout)
    with torch.no_grad():
        for name, p in named.items():
            kind = name.rsplit(".", 1)[-1]
            pr = proj.to(p.device, p.dtype)
            if kind == "P":
                p[one, :] = before[name][one, :] + pr @ (p[one, :] - before[name][one, :])
            elif kind == "V":
                p[:, one] = before[name][:, one] + (p[:, one] - before[name][:, one]) @ pr
