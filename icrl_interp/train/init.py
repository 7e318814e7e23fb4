"""Family-specific changes to `models.build_model`'s init, and the fixed masks that keep blocks at zero.

`build_model` already gives the papers' init: Xavier-normal with gain `init_gain`
(`init_gain / L` for per-layer linear-td weights, as Wang et al.'s code) and, for the
LSA families, zero lazy blocks P22 and V22. On top of it:

* Xie (a) with `masks`: only the paper's sparsity pattern (App. F.2) stays non-zero and
  trainable: A's x-x block, and V's value row over (R, target, current) (the target row
  for the dual form's second head).
* Liang-Lai (b) with `lazy_ablation`: the lazy blocks get a Xavier-normal draw too. Without
  it no mask is needed: each lazy block's gradient is a product with the other lazy block,
  so both stay exactly 0.0 under any gradient method (Prop. 3.1); the tests check it.

A masked entry starts at 0.0 and its gradient is zeroed before each Adam step, so its
Adam moments stay 0 and the entry stays exactly 0.0 (Adam's L2 term wd * p is 0 there too).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import layouts
from .config import TrainConfig


def softmax_masks(layout: layouts.PromptLayout) -> dict[str, Tensor]:
    """Masks (1 = trainable) for the softmax family's A, V and V_target, by parameter suffix."""
    D = layout.d_model
    x = layout.slice("x")
    mem = [layout.slice(b).start for b in ("reward", "target_mem", "current_mem")]
    A = torch.zeros(D, D)
    A[x, x] = 1.0
    V = torch.zeros(D, D)
    V[layout.slice("current_mem").start, mem] = 1.0
    Vt = torch.zeros(D, D)
    Vt[layout.slice("target_mem").start, mem] = 1.0
    return {"A": A, "V": V, "V_target": Vt}


def lazy_slice(layout: layouts.PromptLayout) -> slice:
    """Rows (and columns) of the LSA parameter block: the lazy blocks are [two, two] of P and V."""
    return slice(layout.slice("param_one").start, layout.d_model)


def adjust_init(model: torch.nn.Module, cfg: TrainConfig, generator: torch.Generator) -> dict[str, Tensor]:
    """Apply the config's masks / ablation to a freshly built model; returns {parameter: 0/1 gradient mask}."""
    masks: dict[str, Tensor] = {}
    named = dict(model.named_parameters())
    layout = model.layout
    for name in sorted(named):
        p = named[name]
        suffix = name.rsplit(".", 1)[-1]
        if cfg.family == "softmax-td" and cfg.masks and suffix in ("A", "V", "V_target"):
            masks[name] = softmax_masks(layout)[suffix].to(p.dtype)
            with torch.no_grad():
                p.mul_(masks[name])
        if cfg.family in ("sarsa", "actor-critic") and cfg.lazy_ablation:
            draw = torch.empty_like(p)
            torch.nn.init.xavier_normal_(draw, gain=cfg.init_gain, generator=generator)
            two = lazy_slice(layout)
            with torch.no_grad():
                p[two, two] = draw[two, two]
    return masks
