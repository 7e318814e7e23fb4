"""`ModelConfig` and the parameter names it implies (light: no torch, no transformer_lens).

The checkpoint reader validates files against `parameter_shapes`, so this module must
stay importable without torch.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field, fields

from ..core.errors import UserError
from ..families import registry
from ..tasks import layouts
from ..tasks.sampling import PromptBatch, TaskSpec

DTYPES = ("float32", "float64")


@dataclass
class ModelConfig:
    """Everything needed to build a model of a registered family (see `icrl_interp.families.registry`)."""

    family: str
    """Registered family whose layout and architecture the model has ('linear-td', 'softmax-td', ...)."""
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
    """Architectures with forms only (softmax: 'tsm', the default, or 'dual')."""
    m: int | None = None
    """Policy-parameter dimension (families whose layout needs it: actor-critic)."""
    activation: str | None = None
    """Architectures with activations only (linear attention): elementwise activation on the kernel Z^T Q Z."""
    dtype: str = "float32"
    """'float32' or 'float64' (parameters and computation)."""

    def __post_init__(self):
        # resolved once: everything below reads these entries, not the registry (`family_entry`)
        self._family = family = registry.get(self.family)
        self._arch = arch = registry.architecture(family.architecture)
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
        if arch.forms:
            self.form = arch.forms[0] if self.form is None else self.form
            if self.form not in arch.forms:
                raise UserError(f"unknown {arch.name} form {self.form!r} (use {' or '.join(map(repr, arch.forms))})")
        else:
            self.form = None  # only architectures with variants have a form
        if family.needs_m:
            self.m = _positive_int("m", self.m)
        elif self.m is not None:
            users = ", ".join(registry.where(lambda f: f.needs_m))
            raise UserError(f"m (policy dimension) is not used by {self.family} (only by: {users})")
        if self.activation is not None:
            if not arch.activations:
                raise UserError(f"an activation is not supported by {self.family} ({arch.name} attention)")
            if self.activation not in arch.activations:
                raise UserError(f"unknown activation {self.activation!r} (known: {', '.join(arch.activations)})")
        if self.dtype not in DTYPES:
            raise UserError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")

    @property
    def family_entry(self) -> registry.Family:
        """The registered family (looked up once, when the config is made; again only if `family` changed)."""
        if self._family.name != self.family:
            self._family = registry.get(self.family)
        return self._family

    @property
    def architecture_entry(self) -> registry.Architecture:
        """The registered architecture of the family (looked up once, as `family_entry`)."""
        if self._arch.name != self.family_entry.architecture:
            self._arch = registry.architecture(self.family_entry.architecture)
        return self._arch

    @property
    def architecture(self) -> str:
        """The model architecture (registry.ARCHITECTURES key) of the family."""
        return self.family_entry.architecture

    @property
    def layout(self) -> layouts.PromptLayout:
        """The family's prompt layout (row blocks of d_model)."""
        return self.family_entry.layout(self.d, self.m)

    @property
    def D(self) -> int:
        """Residual-stream width d_model."""
        return self.layout.d_model

    def parameter_names(self) -> tuple[str, ...]:
        """Per-layer parameter names (without the blocks.{l}.attn. prefix)."""
        return self.architecture_entry.parameter_names(self.form)

    def stored_layers(self) -> range:
        """Layers that own parameters: only layer 0 when tied."""
        return range(1 if self.tied else self.n_layers)

    def parameter_shapes(self) -> dict[str, tuple[int, int]]:
        """Checkpoint / named_parameters() names -> shapes (every matrix is D x D)."""
        D = self.D
        return {f"blocks.{l}.attn.{p}": (D, D) for l in self.stored_layers() for p in self.parameter_names()}

    def parameter_count(self) -> int:
        """Numbers in all the parameters: `parameter_shapes` summed without listing them (size estimates
        of 10^8 untied layers must not build a dict of 10^8 entries first)."""
        return len(self.stored_layers()) * len(self.parameter_names()) * self.D * self.D

    def to_dict(self) -> dict:
        """The model fields of config.json (plus the derived D and layout)."""
        out = asdict(self)
        out["architecture"] = self.architecture
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
        if data.get("architecture") is not None and data["architecture"] != config.architecture:
            raise UserError(f"config says architecture {data['architecture']!r}, but family {config.family} "
                            f"is built on {config.architecture!r}")
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


# --------------------------------------------------------- checkpoint config
FORMAT_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)
_V1_META = ("n", "task", "origin", "seed", "package_version", "format_version")
_V2_KEYS = ("format_version", "model", "task", "origin", "training", "seed", "package_version")


@dataclass
class CheckpointConfig:
    """A checkpoint's config.json, parsed and validated once (format 2; format 1 is read too).

    The model (architecture, layout, dimensions) and the task its prompts come from are separate:
    `task.family` names the family whose prompts, labels and reference algorithm the checkpoint is
    recorded and judged on; for the checkpoints this package writes it equals `model.family`.
    """

    model: ModelConfig
    """The model: family, architecture, dimensions, dtype (and the derived layout)."""
    task: TaskSpec
    """The task distribution prompts are drawn from (its family's layout and reference)."""
    origin: dict = field(default_factory=lambda: {"kind": "unknown"})
    """How the weights were made: {"kind": "theta_star" | "random_init" | "trained" | ..., constants...}."""
    training: dict | None = None
    """The training config of a trained checkpoint (None otherwise)."""
    seed: int | None = None
    """Seed recorded for task sampling downstream."""
    package_version: str | None = None
    """icrl_interp version that wrote the file."""
    extra: dict = field(default_factory=dict)
    """Any other top-level keys, kept verbatim."""

    def __post_init__(self):
        if not isinstance(self.origin, dict) or not isinstance(self.origin.get("kind"), str):
            raise UserError(f"config.json origin must be an object with a string 'kind', got {self.origin!r}")
        if self.training is not None and not isinstance(self.training, dict):
            raise UserError(f"config.json training must be an object or null, got {self.training!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral)):
            raise UserError(f"config.json seed must be an integer or null, got {self.seed!r}")
        # the task's family must be known too (the model's entry when it is the model's family)
        self._task_family = self.model.family_entry if self.task.family == self.model.family else \
            registry.get(self.task.family)

    @property
    def task_family_entry(self) -> registry.Family:
        """The registered family of the task (looked up once, as `ModelConfig.family_entry`)."""
        if self._task_family.name != self.task.family:
            self._task_family = registry.get(self.task.family)
        return self._task_family

    @property
    def family(self) -> str:
        """The model's family (its construction, layout and architecture)."""
        return self.model.family

    @property
    def constants(self) -> dict:
        """The family's theta* / reference constants (e.g. score_scale, the critic step beta)."""
        return self.model.family_entry.constants_of(self)

    @property
    def n(self) -> int:
        """Context length of the task."""
        return self.task.n

    def sample(self, batch: int, rng) -> "PromptBatch":
        """`batch` tasks of the task distribution: prompts of the task's family, task data, and its
        reference algorithm at this checkpoint's constants (the family's `sample`)."""
        import numpy as np

        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        return self.task_family_entry.sample(self, self.task, int(batch), rng)

    def reference(self, z) -> dict:
        """The task family's reference algorithm on prompts `z` (e.g. a user's prompt file)."""
        return self.task_family_entry.reference(z, self.model, self.constants)

    def theta_star(self, names=None) -> dict:
        """theta* of the model's family for every stored layer, at the checkpoint's constants and steps
        (per-layer steps from origin.alphas) with gauge constants at their defaults; restricted to
        `names` when given. Empty when the family has no construction."""
        family = self.model.family_entry
        if family.theta_star is None:
            return {}
        k = {**self.constants, **{g: family.constants[g] for g in family.gauge}}
        layers = self.model.stored_layers()
        alphas = self.origin.get("alphas")
        if not (isinstance(alphas, list) and len(alphas) == len(layers)):
            alphas = [self.model.alpha] * len(layers)
        out = {}
        for layer in layers:
            for name, matrix in family.theta_star(self.model, float(alphas[layer]), k).items():
                out[f"blocks.{layer}.attn.{name}"] = matrix
        return out if names is None else {n: out[n] for n in names if n in out}

    def to_dict(self) -> dict:
        """The format-2 config.json object."""
        out = {"format_version": FORMAT_VERSION, "model": self.model.to_dict(), "task": self.task.to_dict(),
               "origin": self.origin, "training": self.training, "seed": self.seed,
               "package_version": self.package_version}
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    @classmethod
    def from_dict(cls, data) -> "CheckpointConfig":
        """Parse a config.json object of format 1 (flat) or 2 (model / task / origin / training)."""
        if not isinstance(data, dict):
            raise UserError(f"config.json must hold a JSON object, got {type(data).__name__}")
        version = data.get("format_version")
        if version is None:
            raise UserError("config.json has no format_version (is this an icrl_interp checkpoint?)")
        if isinstance(version, bool) or not isinstance(version, int) or version not in SUPPORTED_VERSIONS:
            from .._version import __version__

            raise UserError(f"unsupported checkpoint format_version {version!r} (this icrl_interp {__version__} reads "
                            f"{', '.join(map(str, SUPPORTED_VERSIONS))})")
        if version == 1:
            data = _upgrade_v1(data)
        missing = [k for k in ("model", "task", "origin") if k not in data]
        if missing:
            raise UserError(f"config.json is missing {', '.join(missing)}")
        if not isinstance(data["model"], dict):
            raise UserError(f"config.json model must be an object, got {data['model']!r}")
        model_missing = [k for k in ("family", "d", "n_layers", "gamma", "alpha", "tied", "dtype") if k not in data["model"]]
        if model_missing:
            raise UserError(f"config.json model is missing {', '.join(model_missing)}")
        model = ModelConfig.from_dict(data["model"])
        family = model.family_entry
        data = family.current_config(data)  # keys the family renamed since the file was written
        if version == 2:
            _check_full_task(data["task"])
        task = TaskSpec.from_dict(data["task"], model.family, family.task_kind)
        check_meta(data)
        return cls(model=model, task=task, origin=data["origin"], training=data.get("training"),
                   seed=data.get("seed"), package_version=data.get("package_version"),
                   extra={k: v for k, v in data.items() if k not in _V2_KEYS})


REQUIRED_TASK_KEYS = {"boyan": ("kind", "n", "n_states", "features", "rewards"),
                      "mdp": ("kind", "n", "n_states", "n_actions")}
"""Task keys a format-2 config must name (a missing family is the model's; keys added to TaskSpec later
default to the old behaviour)."""


def _check_full_task(task) -> None:
    """A format-2 config names its task: a null or partial one would silently record another task
    distribution (the sampler's defaults) than the one the model was made for."""
    if not isinstance(task, dict):
        raise UserError(f"config.json task must be an object naming the task's family, kind, n, ..., got {task!r}")
    required = REQUIRED_TASK_KEYS.get(task.get("kind"), REQUIRED_TASK_KEYS["boyan"] if "kind" in task else ("kind",))
    missing = [k for k in required if k not in task]
    if missing:
        raise UserError(f"config.json task is missing {', '.join(missing)}: the checkpoint does not say which task "
                        f"it was made for (write the full task, as `icrl-interp construct` does)")


def check_meta(data: dict) -> None:
    """origin / training / seed of a config.json object, checked before they reach a typed field."""
    origin, training, seed = data.get("origin"), data.get("training"), data.get("seed")
    if not isinstance(origin, dict) or not isinstance(origin.get("kind"), str):
        raise UserError(f"config.json origin must be an object with a string 'kind', got {origin!r}")
    if training is not None and not isinstance(training, dict):
        raise UserError(f"config.json training must be an object or null, got {training!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise UserError(f"config.json seed must be an integer or null, got {seed!r}")
    version = data.get("package_version")
    if version is not None and not isinstance(version, str):
        raise UserError(f"config.json package_version must be a string or null, got {version!r}")


def _upgrade_v1(data: dict) -> dict:
    """A format-1 (flat) config.json as a format-2 object: model fields, task (with the top-level n), rest."""
    missing = [k for k in ("family", "d", "n_layers", "D", "gamma", "alpha", "tied", "dtype", "layout", "origin")
               if k not in data]
    if missing:
        raise UserError(f"config.json is missing {', '.join(missing)}")
    model_keys = set(ModelConfig.field_names()) | {"D", "layout"}
    task = data.get("task")
    if task is not None and not isinstance(task, dict):
        raise UserError(f"config.json task must be an object or null, got {task!r}")
    n = data.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1):
        raise UserError(f"config.json n must be a positive integer or null, got {n!r}")
    task = dict(task or {})
    if n is not None:
        task.setdefault("n", int(n))
    out = {"format_version": FORMAT_VERSION, "model": {k: data[k] for k in model_keys if k in data}, "task": task,
           "origin": data["origin"], "training": data.get("training"), "seed": data.get("seed"),
           "package_version": data.get("package_version")}
    out.update({k: v for k, v in data.items() if k not in model_keys and k not in _V1_META and k != "training"})
    return out
