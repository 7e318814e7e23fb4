"""The skeleton every hooked model shares: blocks, tied weights, stop_at_layer, readout.

A model is a `HookedRootModule` (`hooks`: TransformerLens' hook API without importing TL).
Layer l is `blocks.{l}`; its parameter matrices live in `blocks.{l}.attn` (only `blocks.0.attn`
when weights are tied, so `named_parameters()` is exactly the checkpoint's tensor names), while
every layer keeps its own hook points. Attention hooks carry a head axis of size 1, as in
TransformerLens: scores/pattern are [batch, 1, pos_q, pos_k], v/z are [batch, pos, 1, d_model].
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor, nn

from ..core.errors import UserError
from .config import ModelConfig
from .hooks import HookedRootModule, HookPoint

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def observed(hook: nn.Module) -> bool:
    """Whether anything (TL, nnsight, pyvene, plain torch) listens to this hook point."""
    own = hook._forward_hooks or hook._forward_pre_hooks or hook._backward_hooks or hook._backward_pre_hooks
    glob = torch.nn.modules.module
    shared = getattr(glob, "_global_forward_hooks", None) or getattr(glob, "_global_forward_pre_hooks", None)
    return bool(own or shared)


def weighted_values(
    pattern: Float[Tensor, "batch 1 pos_q pos_k"], v: Float[Tensor, "batch pos_k 1 d_model"]
) -> Float[Tensor, "batch pos_q 1 d_model"]:
    """sum_k pattern[q, k] v_k: each target's mix of source values (TL's hook_z)."""
    return torch.einsum("bhqk,bkhe->bqhe", pattern, v)


def apply_rows(z: Float[Tensor, "*batch rows d_in"], W: Float[Tensor, "d_out d_in"]) -> Float[Tensor, "*batch rows d_out"]:
    """W x for every row x of z, as one 2-D matmul (torch's broadcast [b, p, D] @ [D, D]
    goes through batched, intra-op-threaded kernels: up to 100x slower on a busy CPU)."""
    return (z.reshape(-1, z.shape[-1]) @ W.T).reshape(*z.shape[:-1], W.shape[0])


def project(z: Float[Tensor, "batch pos d_model"], W: Float[Tensor, "d_model d_model"]) -> Float[Tensor, "batch pos 1 d_model"]:
    """W z_i at every position, with the head axis: the TL shape of hook_v."""
    return apply_rows(z, W)[:, :, None, :]


def shift_back(y: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
    """(Y Pi)[:, k] = Y[:, k+1]: column k receives column k+1; the last column receives 0."""
    return torch.cat([y[:, 1:], torch.zeros_like(y[:, :1])], dim=1)


class AttentionParams(nn.Module):
    """`blocks.{l}.attn`: the layer's D x D parameter matrices (if it owns them) and its hook points."""

    def __init__(self, names: tuple[str, ...], D: int, dtype: torch.dtype, owns_params: bool):
        super().__init__()
        if owns_params:
            for name in names:
                self.register_parameter(name, nn.Parameter(torch.zeros(D, D, dtype=dtype)))
        self.hook_attn_scores = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_v = HookPoint()
        self.hook_z = HookPoint()


class ICRLModel(HookedRootModule):
    """Base of the three constructions: a stack of `n_layers` blocks on the family's prompt layout."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.layout = config.layout
        self.n_layers = config.n_layers
        # how the weights were made; checkpoint.save writes it as config.json's origin
        self.origin: dict = {"kind": "untrained"}
        owners = set(config.stored_layers())
        dtype = TORCH_DTYPES[config.dtype]
        self.blocks = nn.ModuleList([self.make_block(l in owners, dtype) for l in range(config.n_layers)])
        self.setup()

    def make_block(self, owns_params: bool, dtype: torch.dtype) -> nn.Module:
        raise NotImplementedError

    # ------------------------------------------------------------- parameters
    @property
    def dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.config.dtype]

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def layer_params(self, layer: int) -> dict[str, Tensor]:
        """The matrices layer `layer` uses (layer 0's when tied)."""
        owner = self.blocks[0 if self.config.tied else layer].attn
        return {name: getattr(owner, name) for name in self.config.parameter_names()}

    def load_arrays(self, arrays: Mapping[str, object]) -> "ICRLModel":
        """Copy numpy arrays / tensors into the parameters; names and shapes must match exactly."""
        expected = self.config.parameter_shapes()
        missing, extra = sorted(set(expected) - set(arrays)), sorted(set(arrays) - set(expected))
        if missing or extra:
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unexpected {', '.join(extra)}"] if extra else [])
            raise UserError(f"parameters do not match a {self.config.family} model: {'; '.join(parts)}")
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name, shape in expected.items():
                value = torch.as_tensor(np.asarray(arrays[name]) if not isinstance(arrays[name], Tensor) else arrays[name])
                if tuple(value.shape) != shape:
                    raise UserError(f"parameter {name} has shape {tuple(value.shape)}, expected {shape}")
                params[name].copy_(value.to(params[name].dtype))
        return self

    def arrays(self) -> dict[str, np.ndarray]:
        """Parameters as numpy arrays, by checkpoint name."""
        return {name: p.detach().cpu().numpy().copy() for name, p in self.named_parameters()}

    # ---------------------------------------------------------------- forward
    def as_input(self, z) -> Float[Tensor, "batch pos d_model"]:
        """A prompt batch (numpy or torch) as a tensor of the model's dtype and device."""
        return torch.as_tensor(np.asarray(z) if not isinstance(z, Tensor) else z).to(self.device, self.dtype)

    def _check_input(self, z: Tensor) -> Tensor:
        if z.ndim != 3:
            raise UserError(f"prompts must be [batch, pos, d_model], got shape {tuple(z.shape)}")
        if z.shape[-1] != self.config.D:
            raise UserError(f"prompts have d_model {z.shape[-1]}, a {self.config.family} model with d = {self.config.d} "
                            f"expects {self.config.D}")
        if z.shape[1] < 2:
            raise UserError(f"prompts need at least one context column plus the query column, got pos = {z.shape[1]}")
        return z.to(self.device, self.dtype)

    def _stop(self, stop_at_layer: int | None) -> int:
        if stop_at_layer is None:
            return self.n_layers
        L = self.n_layers
        if not -L <= stop_at_layer <= L:
            raise UserError(f"stop_at_layer must lie in [-{L}, {L}] for a {L}-layer model, got {stop_at_layer}")
        return stop_at_layer % L if stop_at_layer < 0 else stop_at_layer

    def forward(
        self, z: Float[Tensor, "batch pos d_model"], stop_at_layer: int | None = None
    ) -> Float[Tensor, "batch pos d_model"]:
        """Residual stream after the last layer run (layers 0 .. stop_at_layer-1, TL semantics)."""
        z = self._check_input(z)
        for layer in range(self._stop(stop_at_layer)):
            z = self.blocks[layer](z, self.layer_params(layer))
        return z

    def readout(self, z_out: Float[Tensor, "*batch pos d_model"]) -> Float[Tensor, "*batch out"]:
        """The model's output: readout_sign * z_out[..., -1, readout block] (see layouts)."""
        return self.layout.readout(z_out)

    def hook_shapes(self, batch: int, pos: int) -> dict[str, tuple[int, ...]]:
        """Every hook point's activation shape for a [batch, pos, D] input (the documented contract)."""
        out: dict[str, tuple[int, ...]] = {}
        for layer, block in enumerate(self.blocks):
            for name, shape in block.hook_shapes(batch, pos, self.config.D).items():
                out[f"blocks.{layer}.{name}"] = shape
        return out


def attention_hook_shapes(batch: int, pos: int, D: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the hooks every block has (relative to blocks.{l})."""
    return {
        "hook_resid_pre": (batch, pos, D),
        "attn.hook_attn_scores": (batch, 1, pos, pos),
        "attn.hook_pattern": (batch, 1, pos, pos),
        "attn.hook_v": (batch, pos, 1, D),
        "attn.hook_z": (batch, pos, 1, D),
        "hook_attn_out": (batch, pos, D),
        "hook_resid_post": (batch, pos, D),
    }
