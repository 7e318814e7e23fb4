"""The same architecture at random initialization: the baseline that the recorder (`record
--baseline random-init`), the causal test and the verdict compare a trained model with."""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..core import devices

SCALE_NAMES = ("w", "weight", "scale", "gamma", "g")
"""1-D parameters by these names (a LayerNorm's gain, e.g. TransformerLens' `ln1.w`) start at 1 when no
module resets them; other 1-D parameters (biases) start at 0."""


def random_init_copy(model: nn.Module, seed: int) -> tuple[nn.Module, dict]:
    """The same architecture at random initialization: a deep copy re-initialized under `seed` by every
    submodule's own `reset_parameters()` (nn.MultiheadAttention: `_reset_parameters()`) and a model-level
    `init_weights()` where there is one (TransformerLens' HookedTransformer). Parameters none of these
    owns are redrawn N(0, 1/fan_in) (matrices), or set to 1 (gains, `SCALE_NAMES`) or 0 (biases).
    Returns (copy, what was done)."""
    clone = copy.deepcopy(model)
    home = devices.of(clone)
    clone.to("cpu")  # drawn from the CPU generator: the same copy whatever device the model is on
    covered: set[int] = set()
    n_reset, redrawn = 0, []
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for module in clone.modules():
            reset = getattr(module, "reset_parameters", None) or getattr(module, "_reset_parameters", None)
            if callable(reset) and any(True for _ in module.parameters(recurse=False)):
                reset()
                n_reset += 1
                covered.update(id(p) for p in module.parameters(recurse=False))
        for name, p in clone.named_parameters():
            if id(p) in covered:
                continue
            if p.ndim >= 2:
                p.normal_(0.0, float(p.shape[-1]) ** -0.5)
            else:
                p.fill_(1.0 if name.rsplit(".", 1)[-1] in SCALE_NAMES else 0.0)
            redrawn.append(name)
        for module in clone.modules():  # a model's own initializer has the last word on what it owns
            init = getattr(module, "init_weights", None)
            if callable(init) and hasattr(module, "cfg"):
                init()
                n_reset += 1
    clone.to(home)
    return clone, {"kind": "random-init", "seed": int(seed), "reset_modules": n_reset, "redrawn": redrawn}
