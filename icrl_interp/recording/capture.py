"""Attach forward hooks by name to any torch module, and always take them off again.

Names are TransformerLens hook names for a `HookedRootModule` (its `hook_dict`; also when the
HookedRootModule sits inside the user's own wrapper module), or module paths (`named_modules()`)
for any other `torch.nn.Module`. A module whose output is a tuple (e.g. `nn.MultiheadAttention`
returns (output, weights)) is recorded through element 0, or element k when the name ends in `#k`.

Roles (`ROLES`) map the analyzers' canonical TransformerLens names (`blocks.{l}.hook_resid_post`, ...)
onto a model's own module paths, so every recording stores activations under the canonical names
whatever the model (docs/byom.md).
"""
from __future__ import annotations

from contextlib import contextmanager
from collections.abc import Callable, Iterator

import torch
from torch import nn

from ..core.errors import UserError


ROLES: dict[str, str] = {
    "resid_pre": "blocks.{layer}.hook_resid_pre",
    "resid_post": "blocks.{layer}.hook_resid_post",
    "pattern": "blocks.{layer}.attn.hook_pattern",
    "attn_out": "blocks.{layer}.hook_attn_out",
}
"""Per-layer role -> the canonical (TransformerLens) name its activations are recorded under."""
READOUT = "readout"
"""The role naming the modules that map a residual stream to the model's output (logit lens)."""
MAX_LAYERS = 4096


def _hooked_root(model: nn.Module) -> tuple[str, nn.Module] | None:
    """(path, module) of the model itself or its first submodule with a TransformerLens `hook_dict`."""
    for path, m in model.named_modules():
        hook_dict = getattr(m, "hook_dict", None)
        if isinstance(hook_dict, dict) and hook_dict:
            return path, m
    return None


def hookable(model: nn.Module) -> dict[str, nn.Module]:
    """Name -> module for every point a probe can attach to: TransformerLens hook names (unprefixed, also
    for a HookedTransformer wrapped in the user's module), then every module path."""
    points = {name: m for name, m in model.named_modules() if name}
    root = _hooked_root(model)
    if root is not None:
        points = {**dict(root[1].hook_dict), **points}
        if not root[0]:
            return dict(root[1].hook_dict)
    return points


def parameters(model: nn.Module) -> dict:
    """Name -> parameter, with a wrapped HookedTransformer's parameters also under their own names."""
    params = dict(model.named_parameters())
    root = _hooked_root(model)
    if root is not None and root[0]:
        params = {**dict(root[1].named_parameters()), **params}
    return params


def default_readout(model: nn.Module) -> list[str]:
    """A TransformerLens model's readout (final LayerNorm, then unembed), as module paths; [] if none."""
    root = _hooked_root(model)
    if root is None:
        return []
    prefix = f"{root[0]}." if root[0] else ""
    names = dict(model.named_modules())
    return [prefix + n for n in ("ln_final", "unembed") if prefix + n in names]


def role_points(model: nn.Module, roles: dict) -> dict[str, str]:
    """{canonical name: the model's hook or module path} for the per-layer roles of a probe spec.

    A role is a template with '{layer}' (expanded for l = 0, 1, ... while the path exists) or a list
    of one path per layer. A role that maps to nothing is an error naming it."""
    points = hookable(model)
    out: dict[str, str] = {}
    for role, target in roles.items():
        if role == READOUT:
            continue
        canonical = ROLES[role]
        paths = list(target) if isinstance(target, (list, tuple)) else []
        if not paths:
            for layer in range(MAX_LAYERS):
                path = str(target).replace("{layer}", str(layer))
                if _split(path)[0] not in points:
                    break
                paths.append(path)
                if "{layer}" not in str(target):
                    break
        if not paths:
            example = str(target).replace("{layer}", "0")
            raise UserError(f"role {role} = {target!r} maps to nothing: the model has no module {_split(example)[0]!r} "
                            f"(some of its modules: {', '.join(list(points)[:6])})")
        for layer, path in enumerate(paths):
            if _split(path)[0] not in points:
                raise UserError(f"role {role}: layer {layer} maps to {path!r}, which is not a module of the model")
            out[canonical.format(layer=layer)] = path
    return out


def readout_modules(model: nn.Module, roles: dict) -> list[nn.Module]:
    """The modules of the readout role (or a TransformerLens model's own readout), in order."""
    target = roles.get(READOUT)
    paths = default_readout(model) if target is None else ([target] if isinstance(target, str) else list(target))
    names = dict(model.named_modules())
    for path in paths:
        if path not in names:
            raise UserError(f"role readout: the model has no module {path!r}")
    return [names[p] for p in paths]


def as_pattern(name: str, t: torch.Tensor) -> torch.Tensor:
    """An attention pattern with a head axis: [batch, q, k] (e.g. nn.MultiheadAttention's head-averaged
    weights) becomes [batch, 1, q, k]."""
    if name.endswith("hook_pattern") and t.ndim == 3:
        return t.unsqueeze(1)
    return t


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

    `names` is a list of hook names, or a dict {name reported to the callback: hook name or module path}
    (roles). The hooks are removed in `finally`, also when the forward pass or the callback raises.
    """
    modules = hookable(model)
    sources = dict(names) if isinstance(names, dict) else {n: n for n in names}
    targets = []
    for name, source in sources.items():
        path, index = _split(source)
        if path not in modules:
            raise UserError(f"model {type(model).__name__} has no hook point {path!r}")
        targets.append((name, modules[path], index))
    handles = []
    try:
        for name, module, index in targets:
            def hook(_module, _inputs, output, _name=name, _index=index):
                on_activation(_name, as_pattern(_name, _pick(output, _index, _name)))

            handles.append(module.register_forward_hook(hook))
        yield
    finally:
        for h in handles:
            h.remove()


def attached_hook_count(model: nn.Module) -> int:
    """Forward hooks currently attached anywhere in the model (0 after a clean capture)."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@contextmanager
def intervene(model: nn.Module, point: str, edit: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Replace the output of one hook point (element k of a tuple output for 'path#k') by `edit(output)`
    during forward passes in the block; the hook is removed in `finally`."""
    modules = hookable(model)
    path, index = _split(point)
    if path not in modules:
        raise UserError(f"model {type(model).__name__} has no hook point {path!r}")

    def hook(_module, _inputs, output):
        if isinstance(output, (tuple, list)):
            k = 0 if index is None else index
            items = list(output)
            items[k] = edit(items[k])
            return type(output)(items) if isinstance(output, tuple) else items
        return edit(output)

    handle = modules[path].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
