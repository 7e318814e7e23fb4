"""Attach forward hooks by name to any torch module, and always take them off again.

Names are TransformerLens hook names for a `HookedRootModule` (its `hook_dict`), or
module paths (`named_modules()`) for any other `torch.nn.Module`. A module whose
output is a tuple (e.g. `nn.MultiheadAttention` returns (output, weights)) is
recorded through element 0, or element k when the name ends in `#k`.
"""
from __future__ import annotations

from contextlib import contextmanager
from collections.abc import Callable, Iterator

import torch
from torch import nn

from .errors import UserError


def hookable(model: nn.Module) -> dict[str, nn.Module]:
    """Name -> module for every point a probe can attach to."""
    hook_dict = getattr(model, "hook_dict", None)
    if isinstance(hook_dict, dict) and hook_dict:
        return dict(hook_dict)
    return {name: m for name, m in model.named_modules() if name}


def _split(name: str) -> tuple[str, int | None]:
    path, sep, idx = name.partition("#")
    if not sep:
        return name, None
    if not idx.isdigit():
        raise UserError(f"hook name {name!r}: the part after '#' must be an output index")
    return path, int(idx)


def hook_names(model: nn.Module) -> list[str]:
    """The names a spec can match for this model."""
    return list(hookable(model))


def _pick(output, index: int | None, name: str) -> torch.Tensor:
    if isinstance(output, (tuple, list)):
        output = output[0 if index is None else index]
    elif index not in (None, 0):
        raise UserError(f"hook {name!r}: the module's output is not a tuple, so it has no element {index}")
    if not isinstance(output, torch.Tensor):
        raise UserError(f"hook {name!r}: the module returned {type(output).__name__}, not a tensor")
    return output


@contextmanager
def capture(model: nn.Module, names, on_activation: Callable[[str, torch.Tensor], None]) -> Iterator[None]:
    """Call `on_activation(name, tensor)` for each named point during forward passes in the block.

    The hooks are removed in `finally`, also when the forward pass or the callback raises.
    """
    modules = hookable(model)
    targets = []
    for name in names:
        path, index = _split(name)
        if path not in modules:
            raise UserError(f"model {type(model).__name__} has no hook point {path!r}")
        targets.append((name, modules[path], index))
    handles = []
    try:
        for name, module, index in targets:
            def hook(_module, _inputs, output, _name=name, _index=index):
                on_activation(_name, _pick(output, _index, _name))

            handles.append(module.register_forward_hook(hook))
        yield
    finally:
        for h in handles:
            h.remove()


def attached_hook_count(model: nn.Module) -> int:
    """Forward hooks currently attached anywhere in the model (0 after a clean capture)."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
