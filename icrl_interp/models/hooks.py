"""TransformerLens' hook API for the package's own models, without importing TransformerLens.

TransformerLens 3.9's `transformer_lens.hook_points` imports its weight-conversion utilities, and they
import `transformers`: ~4.8 CPU s and ~2,500 modules on top of torch, also with TL's package `__init__`
bypassed (docs/models.md, "TransformerLens' API without TransformerLens"). So the package's models carry
this copy of the part of TL's API they promise: `HookPoint` and `HookedRootModule` with TL's names, the
hook-function convention `fn(tensor, hook=hook_point) -> replacement or None`, context levels, permanent
hooks, `hook_dict`, `mod_dict`, `hooks()`, `run_with_hooks`, `run_with_cache` (a dict, as TL's
`HookedRootModule` returns), `add_hook`, `reset_hooks`, `list_hooks`. A user's TransformerLens model keeps
TL's own classes; the package finds the hooks of either kind by a non-empty `hook_dict`
(recording/capture.py), never by a TL class. tests/models/test_hooks_tl.py runs both against each other.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, Optional, Union

import numpy as np
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

NamesFilter = Optional[Union[Callable[[str], bool], Sequence[str], str]]
Direction = Literal["fwd", "bwd"]
HookName = Union[str, Callable[[str], bool]]


@dataclass
class LensHandle:
    """A torch hook handle with TL's bookkeeping: permanent hooks survive `reset_hooks`; a context level
    ties a hook to the `hooks()` block that added it."""

    hook: RemovableHandle
    is_permanent: bool = False
    context_level: Optional[int] = None
    user_hook: Optional[Callable] = None


class HookPoint(nn.Module):
    """An identity module that names an activation; hooks on it see (and may replace) that activation."""

    def __init__(self) -> None:
        super().__init__()
        self.fwd_hooks: list[LensHandle] = []
        self.bwd_hooks: list[LensHandle] = []
        self.ctx: dict = {}
        self.name: Optional[str] = None  # set by the root module's setup()

    def __repr__(self) -> str:
        bits = [f"name={self.name!r}"] if self.name is not None else []
        bits += [f"{len(self.fwd_hooks)} fwd"] if self.fwd_hooks else []
        bits += [f"{len(self.bwd_hooks)} bwd"] if self.bwd_hooks else []
        return f"HookPoint({', '.join(bits)})"

    def add_perma_hook(self, hook: Callable, dir: Direction = "fwd") -> None:
        self.add_hook(hook, dir=dir, is_permanent=True)

    def add_hook(self, hook: Callable, dir: Direction = "fwd", is_permanent: bool = False,
                 level: Optional[int] = None, prepend: bool = False) -> None:
        """Call `hook(activation, hook=self)` in the forward pass ("fwd") or on the activation's gradient
        ("bwd"); a non-None return replaces the activation (or gradient)."""
        if dir == "fwd":
            def full_hook(module, inputs, output):
                return hook(output, hook=self)

            handle = self.register_forward_hook(full_hook, prepend=prepend)
            handles = self.fwd_hooks
        elif dir == "bwd":
            def full_hook(module, grad_input, grad_output):
                result = hook(grad_output[0], hook=self)  # torch passes (grad,)
                return None if result is None else (result if isinstance(result, tuple) else (result,))

            handle = self.register_full_backward_hook(full_hook, prepend=prepend)
            handles = self.bwd_hooks
        else:
            raise ValueError(f"Invalid direction {dir}")
        # partial.__repr__ prints its arguments, which may be large tensors (as in TL)
        full_hook.__name__ = f"partial({hook.func!r},...)" if isinstance(hook, partial) else repr(hook)
        lens = LensHandle(handle, is_permanent, level, user_hook=hook)
        handles.insert(0 if prepend else len(handles), lens)

    def has_hooks(self, dir: Literal["fwd", "bwd", "both"] = "both", including_permanent: bool = True,
                  level: Optional[int] = None) -> bool:
        handles = {"fwd": self.fwd_hooks, "bwd": self.bwd_hooks, "both": self.fwd_hooks + self.bwd_hooks}[dir]
        return any((including_permanent or not h.is_permanent) and (level is None or h.context_level == level)
                   for h in handles)

    def remove_hooks(self, dir: Literal["fwd", "bwd", "both"] = "fwd", including_permanent: bool = False,
                     level: Optional[int] = None) -> None:
        """Remove the temporary hooks (of context `level` when given); with `including_permanent`, all."""
        if dir not in ("fwd", "bwd", "both"):
            raise ValueError(f"Invalid direction {dir}")

        def keep(handles: list[LensHandle]) -> list[LensHandle]:
            kept = []
            for h in handles:
                if including_permanent or (not h.is_permanent and (level is None or h.context_level == level)):
                    h.hook.remove()
                else:
                    kept.append(h)
            return kept

        if dir in ("fwd", "both"):
            self.fwd_hooks = keep(self.fwd_hooks)
        if dir in ("bwd", "both"):
            self.bwd_hooks = keep(self.bwd_hooks)

    def clear_context(self) -> None:
        self.ctx = {}

    def forward(self, x: Tensor) -> Tensor:
        return x

    def layer(self) -> int:
        """The layer index of a name 'blocks.{layer}.…'."""
        if self.name is None:
            raise ValueError("Name cannot be None")
        return int(self.name.split(".")[1])


HEAD_AXIS = ("hook_q", "hook_k", "hook_v", "hook_z", "hook_result", "hook_v_target", "hook_z_target")
"""Hooks shaped [batch, pos, head, d] (position axis -3; others -2): TL's, and the dual form's target head."""


def _names_filter(names_filter: NamesFilter) -> Callable[[str], bool]:
    if names_filter is None:
        return lambda name: True
    if isinstance(names_filter, str):
        return lambda name: name == names_filter
    if isinstance(names_filter, (list, tuple, set)):
        chosen = set(names_filter)
        return lambda name: name in chosen
    if callable(names_filter):
        return names_filter
    raise ValueError("names_filter must be a string, list of strings, or function")


def _pos_index(pos_slice) -> Union[int, slice, np.ndarray]:
    """TL's `Slice` input as an index: None (all), an int (that position; the axis stays, as in
    `run_with_cache`), a tuple (slice(*t)), a slice, or indices (list / array / tensor); a TL `Slice`
    object by its `.slice`."""
    if hasattr(pos_slice, "slice"):
        return pos_slice.slice
    if pos_slice is None:
        return slice(None)
    if isinstance(pos_slice, int):
        return np.asarray([pos_slice])
    if isinstance(pos_slice, tuple):
        return slice(*pos_slice)
    if isinstance(pos_slice, slice):
        return pos_slice
    if isinstance(pos_slice, (list, np.ndarray, Tensor)):
        return np.asarray(pos_slice.cpu() if isinstance(pos_slice, Tensor) else pos_slice)
    raise ValueError(f"Invalid input_slice {pos_slice}")


class HookedRootModule(nn.Module):
    """A module whose `HookPoint`s are named by their paths (`setup()`, called after building the layers),
    with TL's ways to add hooks for one run and take them all off again."""

    name: Optional[str]
    mod_dict: dict[str, nn.Module]
    hook_dict: dict[str, HookPoint]

    def __init__(self) -> None:
        super().__init__()
        self.is_caching = False
        self.context_level = 0

    def setup(self) -> None:
        """Name every submodule by its path (`module.name`); `mod_dict` maps paths to modules and
        `hook_dict` to the hook points."""
        self.mod_dict, self.hook_dict = {}, {}
        for name, module in self.named_modules():
            if name:
                module.name = name
                self.mod_dict[name] = module
                if isinstance(module, HookPoint):
                    self.hook_dict[name] = module

    def hook_points(self):
        return self.hook_dict.values()

    def list_hooks(self, name_filter: NamesFilter = None, dir: Literal["fwd", "bwd", "both"] = "both",
                   including_permanent: bool = True) -> dict[str, list[LensHandle]]:
        """{hook name: its attached hooks} for the hook points that have any."""
        matches, out = _names_filter(name_filter), {}
        for name, hp in self.hook_dict.items():
            handles = (hp.fwd_hooks if dir in ("fwd", "both") else []) + (hp.bwd_hooks if dir in ("bwd", "both") else [])
            handles = [h for h in handles if including_permanent or not h.is_permanent]
            if matches(name) and handles:
                out[name] = handles
        return out

    def remove_all_hook_fns(self, direction: Literal["fwd", "bwd", "both"] = "both", including_permanent: bool = False,
                            level: Optional[int] = None) -> None:
        for hp in self.hook_points():
            hp.remove_hooks(direction, including_permanent=including_permanent, level=level)

    def clear_contexts(self) -> None:
        for hp in self.hook_points():
            hp.clear_context()

    def reset_hooks(self, clear_contexts: bool = True, direction: Literal["fwd", "bwd", "both"] = "both",
                    including_permanent: bool = False, level: Optional[int] = None) -> None:
        if clear_contexts:
            self.clear_contexts()
        self.remove_all_hook_fns(direction, including_permanent, level=level)
        self.is_caching = False

    def check_hooks_to_add(self, hook_point: HookPoint, hook_point_name: str, hook: Callable, dir: Direction = "fwd",
                           is_permanent: bool = False, prepend: bool = False) -> None:
        """Override to refuse hooks (TL's extension point)."""

    def check_and_add_hook(self, hook_point: HookPoint, hook_point_name: str, hook: Callable, dir: Direction = "fwd",
                           is_permanent: bool = False, level: Optional[int] = None, prepend: bool = False) -> None:
        self.check_hooks_to_add(hook_point, hook_point_name, hook, dir=dir, is_permanent=is_permanent, prepend=prepend)
        hook_point.add_hook(hook, dir=dir, is_permanent=is_permanent, level=level, prepend=prepend)

    def add_hook(self, name: HookName, hook: Callable, dir: Direction = "fwd", is_permanent: bool = False,
                 level: Optional[int] = None, prepend: bool = False) -> None:
        """Add `hook` to the hook point `name`, or to every hook point whose name `name(...)` accepts."""
        if isinstance(name, str):
            points = [(name, self.mod_dict[name])]
            if not isinstance(points[0][1], HookPoint):
                raise TypeError(f"{name} is a {type(points[0][1]).__name__}, not a HookPoint")
        else:
            points = [(n, hp) for n, hp in self.hook_dict.items() if name(n)]
        for point_name, hp in points:
            self.check_and_add_hook(hp, point_name, hook, dir=dir, is_permanent=is_permanent, level=level, prepend=prepend)

    def add_perma_hook(self, name: HookName, hook: Callable, dir: Direction = "fwd") -> None:
        self.add_hook(name, hook, dir=dir, is_permanent=True)

    @contextmanager
    def hooks(self, fwd_hooks: Sequence[tuple[HookName, Callable]] = (), bwd_hooks: Sequence[tuple[HookName, Callable]] = (),
              reset_hooks_end: bool = True, clear_contexts: bool = False) -> Iterator["HookedRootModule"]:
        """Hooks for the block: added at a new context level, removed in `finally` (also when a hook or
        the forward pass raises) unless `reset_hooks_end` is False."""
        try:
            self.context_level += 1
            for hooks, dir in ((fwd_hooks, "fwd"), (bwd_hooks, "bwd")):
                for name, hook in hooks:
                    if isinstance(name, str):
                        point = self.mod_dict[name]
                        if not hasattr(point, "add_hook"):
                            raise TypeError(f"Expected a module with add_hook, got {type(point)}")
                        point.add_hook(hook, dir=dir, level=self.context_level)
                    else:
                        for point_name, hp in self.hook_dict.items():
                            if name(point_name):
                                hp.add_hook(hook, dir=dir, level=self.context_level)
            yield self
        finally:
            if reset_hooks_end:
                self.reset_hooks(clear_contexts, including_permanent=False, level=self.context_level)
            self.context_level -= 1

    def run_with_hooks(self, *model_args: Any, fwd_hooks: Sequence[tuple[HookName, Callable]] = (),
                       bwd_hooks: Sequence[tuple[HookName, Callable]] = (), reset_hooks_end: bool = True,
                       clear_contexts: bool = False, **model_kwargs: Any):
        """The forward pass with these hooks attached for it."""
        if len(bwd_hooks) > 0 and reset_hooks_end:
            logging.warning("WARNING: Hooks will be reset at the end of run_with_hooks. This removes the backward "
                            "hooks before a backward pass can occur.")
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts) as hooked:
            return hooked.forward(*model_args, **model_kwargs)

    def get_caching_hooks(self, names_filter: NamesFilter = None, incl_bwd: bool = False, device=None,
                          remove_batch_dim: bool = False, cache: Optional[dict] = None, pos_slice=None
                          ) -> tuple[dict, list, list]:
        """(cache, fwd_hooks, bwd_hooks): hooks that store each chosen activation, detached, in `cache`
        (gradients under 'NAME_grad'); `pos_slice` cuts the position axis (-3 for `HEAD_AXIS`, else -2)."""
        cache = {} if cache is None else cache
        chosen, index = _names_filter(names_filter), _pos_index(pos_slice)
        self.is_caching = True

        def save_hook(tensor: Tensor, hook: HookPoint, is_backward: bool = False):
            if hook.name is None:
                raise RuntimeError("Hook should have been provided a name")
            value = tensor.detach().to(device)
            if remove_batch_dim:
                value = value[0]
            pos_dim = -3 if hook.name.endswith(HEAD_AXIS) else -2
            if tensor.dim() >= -pos_dim:  # as TL: the activation's rank before remove_batch_dim
                value = value[(slice(None),) * (value.dim() + pos_dim) + (index,)]
            cache[hook.name + ("_grad" if is_backward else "")] = value

        names = [n for n in self.hook_dict if chosen(n)]
        fwd = [(n, partial(save_hook, is_backward=False)) for n in names]
        bwd = [(n, partial(save_hook, is_backward=True)) for n in names] if incl_bwd else []
        return cache, fwd, bwd

    def run_with_cache(self, *model_args: Any, names_filter: NamesFilter = None, device=None,
                       remove_batch_dim: bool = False, incl_bwd: bool = False, reset_hooks_end: bool = True,
                       clear_contexts: bool = False, pos_slice=None, **model_kwargs: Any) -> tuple[Any, dict]:
        """(model output, {hook name: activation}) for the hook points `names_filter` chooses (all by
        default): a name, a list of names, or a predicate on names."""
        cache, fwd, bwd = self.get_caching_hooks(names_filter, incl_bwd, device, remove_batch_dim=remove_batch_dim,
                                                 pos_slice=pos_slice)
        with self.hooks(fwd_hooks=fwd, bwd_hooks=bwd, reset_hooks_end=reset_hooks_end, clear_contexts=clear_contexts):
            out = self(*model_args, **model_kwargs)
            if incl_bwd:
                out.backward()
        return out, cache

