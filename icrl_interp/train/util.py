"""Small torch helpers shared by the families' training recipes (no family knowledge here).

Tensor conversion of sampled numpy batches, the readout of value-predicting models, numpy copies
of learned parameters, and the lazy parameter blocks of families that name one
(`registry.Hints.lazy_from`): their rows/columns, a random init for the ablation, a log diagnostic.
"""
from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from ..core.errors import UserError
from ..families import registry
from ..tasks import layouts

Array = np.ndarray


def torch_dtype(name: str) -> torch.dtype:
    """'float32' / 'float64' -> the torch dtype."""
    return {"float32": torch.float32, "float64": torch.float64}[name]


def tensor(a, dtype: torch.dtype) -> Tensor:
    """A numpy array as a (contiguous) torch tensor of `dtype`."""
    return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype)


def values(model, z: Float[Tensor, "*batch pos d_model"]) -> Float[Tensor, "*batch"]:
    """Scalar readout of a value-predicting model for prompts with any leading batch axes (one forward pass)."""
    lead = z.shape[:-2]
    out = model.readout(model(z.reshape((-1,) + z.shape[-2:])))
    return out.reshape(lead)


def param(model, layer: int, name: str) -> Array:
    """Parameter `name` of `layer` as a float64 numpy array (a copy, detached)."""
    return model.layer_params(layer)[name].detach().double().numpy()


# ------------------------------------------------------------------ lazy blocks
def lazy_slice(layout: layouts.PromptLayout) -> slice:
    """Rows (and columns) of the lazy parameter block of the layout's family: [lazy, lazy] of each
    parameter stays zero under theta* (from block `Hints.lazy_from` to the end)."""
    start = registry.get(layout.family).hints.lazy_from
    if start is None:
        raise UserError(f"family {layout.family!r} has no lazy parameter block")
    return slice(layout.slice(start).start, layout.d_model)


def randomize_lazy_blocks(model: torch.nn.Module, gain: float, generator: torch.Generator) -> dict[str, Tensor]:
    """Give the lazy blocks a Xavier-normal draw too (the zero-init ablation); no gradient masks.

    Parameters are visited in sorted name order and each draws a full matrix from `generator`, of
    which only the lazy block is kept.
    """
    named = dict(model.named_parameters())
    two = lazy_slice(model.layout)
    for name in sorted(named):
        p = named[name]
        draw = torch.empty_like(p)
        torch.nn.init.xavier_normal_(draw, gain=gain, generator=generator)
        with torch.no_grad():
            p[two, two] = draw[two, two]
    return {}


def lazy_max_abs(model) -> float:
    """max |entry| of the lazy blocks over all parameters (0.0 while they stay at their zero init)."""
    two = lazy_slice(model.layout)
    return max(float(p.detach()[two, two].abs().max()) for p in model.parameters())
