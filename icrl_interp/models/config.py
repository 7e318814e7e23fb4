"""`ModelConfig` and the parameter names it implies (light: no torch, no transformer_lens).

The checkpoint reader validates files against `parameter_shapes`, so this module must
stay importable without torch.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields

from .. import layouts
from ..errors import UserError

DTYPES = ("float32", "float64")
SOFTMAX_FORMS = ("dual", "tsm")
# Elementwise activations of Wang et al.'s nonlinear variant, applied to the kernel Z^T Q Z
# (their `experiment/activation.py`; softmax is left out because it is not elementwise).
ACTIVATIONS = ("relu", "tanh", "leaky_relu", "elu", "selu")
LSA_FAMILIES = ("sarsa", "actor-critic")

# Per-layer parameter names of each family, in paper notation (matrices act on d_model).
_BASE_NAMES = {"linear-td": ("P", "Q"), "softmax-td": ("A", "V"), "sarsa": ("P", "V"), "actor-critic": ("P", "V")}


@dataclass
class ModelConfig:
    """Everything needed to build a model of one of the three constructions."""

    family: str
    """'linear-td' (Wang), 'softmax-td' (Xie), 'sarsa' or 'actor-critic' (Liang-Lai LSA)."""
    d: int
    """Feature dimension (state features for the TD families, state-action features for LSA)."""
    n_layers: int = 1
    """Number of attention layers L."""
    gamma: float | int = 0.9
    """Discount (ints accepted, stored as float). Used by the forward map only in the softmax TSM form (W = gamma e_target e_current^T)."""
    alpha: float | int = 1.0
    """Step size of theta* (recorded; with per-layer steps, the first layer's, see origin.alphas)."""
    tied: bool = True
    """One set of weights reused by every layer (only blocks.0.* parameters exist)."""
    form: str | None = None
    """Softmax only: 'tsm' (single head + temporal shift module, default) or 'dual' (two heads)."""
    m: int | None = None
    """Policy-parameter dimension (actor-critic only)."""
    activation: str | None = None
    """Linear-td only: elementwise activation on the kernel Z^T Q Z (None = linear attention)."""
    dtype: str = "float32"
    """'float32' or 'float64' (parameters and computation)."""

    def __post_init__(self):
        if self.family not in layouts.FAMILIES:
            raise UserError(f"unknown family {self.family!r} (known: {', '.join(layouts.FAMILIES)})")
        self.d = _positive_int("d", self.d)
        self.n_layers = _positive_int("n_layers", self.n_layers)
        self.gamma = float(self.gamma)
        if not (0.0 <= self.gamma < 1.0):
            raise UserError(f"gamma must lie in [0, 1), got {self.gamma}")
        self.alpha = float(self.alpha)
        if not math.isfinite(self.alpha):
            raise UserError(f"alpha must be finite, got {self.alpha}")
        if not isinstance(self.tied, bool):
            raise UserError(f"tied must be true or false, got {self.tied!r}")
        if self.family == "softmax-td":
            self.form = "tsm" if self.form is None else self.form
            if self.form not in SOFTMAX_FORMS:
                raise UserError(f"unknown softmax form {self.form!r} (use 'tsm' or 'dual')")
        else:
            self.form = None  # the form only distinguishes softmax models
        if self.family == "actor-critic":
            self.m = _positive_int("m", self.m)
        elif self.m is not None:
            raise UserError(f"m (policy dimension) is only used by actor-critic, not {self.family}")
        if self.activation is not None:
            if self.family != "linear-td":
                raise UserError(f"an activation is only supported for linear-td, not {self.family}")
            if self.activation not in ACTIVATIONS:
                raise UserError(f"unknown activation {self.activation!r} (known: {', '.join(ACTIVATIONS)})")
        if self.dtype not in DTYPES:
            raise UserError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")

    @property
    def layout(self) -> layouts.PromptLayout:
        """The family's prompt layout (row blocks of d_model)."""
        return layouts.layout_for(self.family, self.d, self.m)

    @property
    def D(self) -> int:
        """Residual-stream width d_model."""
        return self.layout.d_model

    def parameter_names(self) -> tuple[str, ...]:
        """Per-layer parameter names (without the blocks.{l}.attn. prefix)."""
        extra = ("V_target",) if self.form == "dual" else ()
        return _BASE_NAMES[self.family] + extra

    def stored_layers(self) -> range:
        """Layers that own parameters: only layer 0 when tied."""
        return range(1 if self.tied else self.n_layers)

    def parameter_shapes(self) -> dict[str, tuple[int, int]]:
        """Checkpoint / named_parameters() names -> shapes (every matrix is D x D)."""
        D = self.D
        return {f"blocks.{l}.attn.{p}": (D, D) for l in self.stored_layers() for p in self.parameter_names()}

    def to_dict(self) -> dict:
        """The model fields of config.json (plus the derived D and layout)."""
        out = asdict(self)
        out["D"] = self.D
        out["layout"] = self.layout.to_dict()
        return out

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        """Build from a config.json dict (extra keys ignored; D and layout are checked)."""
        if "family" not in data or "d" not in data:
            missing = [k for k in ("family", "d") if k not in data]
            raise UserError(f"config is missing {', '.join(missing)}")
        kw = {k: data[k] for k in cls.field_names() if k in data}
        # JSON types first, so a foreign file gets a UserError rather than a type-checker error
        for key in ("d", "n_layers") + (("m",) if kw.get("m") is not None else ()):
            if key in kw:
                kw[key] = _positive_int(key, kw[key])
        for key in ("family", "form", "activation", "dtype"):
            if kw.get(key) is not None and not isinstance(kw[key], str):
                raise UserError(f"config field {key!r} must be a string, got {kw[key]!r}")
        if "tied" in kw and not isinstance(kw["tied"], bool):
            raise UserError(f"config field 'tied' must be true or false, got {kw['tied']!r}")
        for key in ("gamma", "alpha"):
            if key in kw:
                if isinstance(kw[key], bool) or not isinstance(kw[key], (int, float)):
                    raise UserError(f"config field {key!r} must be a number, got {kw[key]!r}")
                kw[key] = float(kw[key])
        config = cls(**kw)
        if "D" in data and data["D"] != config.D:
            raise UserError(f"config says D = {data['D']!r}, but family {config.family} with d = {config.d} has D = {config.D}")
        if "layout" in data and data["layout"] != config.layout.to_dict():
            raise UserError(f"config layout {data['layout']!r} does not match family {config.family} with d = {config.d} "
                            f"(expected {config.layout.to_dict()!r})")
        return config


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise UserError(f"{name} must be a positive integer, got {value!r}")
    return int(value)
