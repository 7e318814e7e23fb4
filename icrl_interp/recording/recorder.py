"""Stream hooked activations of any torch model into an HDF5 recording.

`record()` runs a model over batches of prompts (sampled from a checkpoint's task
distribution, or supplied by the user), captures the hooks a probe spec names
into reusable buffers, and appends each batch to the recording together with
the prompts, per-task data and the reference algorithm's run on the same
prompts. Memory does not grow with the number of prompts.

What the prompts are (the checkpoint's task family: layout, sampler, reference algorithm) and what
model produced the activations (its family, architecture and class) are recorded separately
(`icrl_interp.recording.format`, schema 2); sampling and the reference go through the family registry.
"""
from __future__ import annotations

import copy
import datetime as _dt
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Iterator

import h5py
import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from . import budget
from ..core import devices
from ..tasks import layouts
from ..families import registry
from .._version import __version__
from .capture import capture, hook_names, parameters, readout_modules, role_points
from ..core.errors import ModelFault, UserError
from ..models.config import CheckpointConfig, ModelConfig
from .probe_spec import HookRule, ProbeSpec
from .format import BF16, RecordingWriter

_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


@dataclass
class RecordSummary:
    """What a recording run produced."""

    path: Path
    n_prompts: int
    hooks: dict[str, tuple[int, ...]]
    """Recorded hook -> per-prompt shape."""
    bytes_written: int
    seconds: float
    resumed_from: int = 0
    notes: list = field(default_factory=list)
    """Things the user should know (stochastic modules, readout mismatch, ...)."""

    def table(self) -> str:
        lines = [f"recording {self.path}", f"  prompts: {self.n_prompts}" + (f" (resumed at {self.resumed_from})" if self.resumed_from else "")]
        width = max((len(h) for h in self.hooks), default=10)
        for h, shape in self.hooks.items():
            lines.append(f"  {h:<{width}}  {tuple(shape)}")
        mb = self.bytes_written / 2**20
        rate = mb / self.seconds if self.seconds > 0 else float("inf")
        lines.append(f"  activations: {mb:.2f} MiB in {self.seconds:.2f} s ({rate:.1f} MiB/s, "
                     f"{(self.n_prompts - self.resumed_from) / max(self.seconds, 1e-9):.0f} prompts/s)")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


class _Buffers:
    """One reusable numpy buffer per hook; the hook copies into it without allocating."""

    def __init__(self, rules: dict[str, HookRule], capacity: int, device: torch.device | None = None):
        self.rules, self.capacity = rules, capacity
        self.device = torch.device("cpu") if device is None else device
        """Where the activations are: from a GPU they land in pinned host buffers, by non-blocking
        copies that overlap the rest of the forward pass (`devices.host_empty`); whoever hands the
        buffers on synchronizes first (`devices.synchronize`)."""
        self.arrays: dict[str, np.ndarray] = {}
        self.views: dict[str, torch.Tensor] = {}
        self.rows: dict[str, int] = {}
        self.source_dtype: dict[str, str] = {}

    def __call__(self, name: str, t: torch.Tensor) -> None:
        rule = self.rules[name]
        sl = rule.position_slice()
        if sl is not None:
            idx = [slice(None)] * t.ndim
            axis = rule.axis_for(name)
            if axis >= t.ndim:
                raise UserError(f"hook {name}: positions slice axis {axis}, but the activation has shape {tuple(t.shape)}")
            idx[axis] = sl
            t = t[tuple(idx)]
            if t.shape[axis] == 0:
                raise UserError(f"hook {name}: positions {rule.positions!r} select nothing of {tuple(t.shape)} "
                                f"(axis {axis})")
        t = t.detach()
        if name not in self.arrays:
            store = _TORCH_DTYPES[rule.dtype] if rule.dtype else t.dtype
            if not store.is_floating_point and t.is_floating_point():
                store = t.dtype
            host = devices.host_empty((self.capacity, *t.shape[1:]), store, self.device)
            # bfloat16 has no numpy dtype: the writer gets its bit patterns as int16
            self.arrays[name] = (host.view(torch.int16) if store == torch.bfloat16 else host).numpy()
            self.views[name] = host
            self.source_dtype[name] = str(t.dtype).removeprefix("torch.")
        if tuple(t.shape[1:]) != self.arrays[name].shape[1:]:
            raise UserError(f"hook {name}: activation shape {tuple(t.shape[1:])} changed from {self.arrays[name].shape[1:]}")
        self.views[name][: t.shape[0]].copy_(t, non_blocking=True)  # synchronous from the CPU
        self.rows[name] = t.shape[0]

    def attrs(self, name: str) -> dict:
        rule = self.rules[name]
        stored = BF16 if rule.dtype == "bfloat16" else str(self.arrays[name].dtype)
        return {"dtype": stored, "source_dtype": self.source_dtype[name], "positions": rule.positions or ":",
                "compression": rule.compression}


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    v = {"icrl_interp": __version__, "torch": torch.__version__, "h5py": h5py.__version__, "numpy": np.__version__}
    try:
        v["transformer_lens"] = md.version("transformer-lens")
    except md.PackageNotFoundError:
        v["transformer_lens"] = None
    return v


@dataclass
class PromptSource:
    """Where prompts come from: sampled per batch from a config, or slices of user arrays."""

    config: CheckpointConfig | None = None
    """Checkpoint config: its task (family, distribution) is sampled, its model and constants feed the reference."""
    arrays: dict[str, np.ndarray] | None = None
    """User prompts: 'z' (or 'input' for generic models) and optional labels / task data."""
    n_total: int = 0
    """Number of prompts to record."""
    seed: int = 0
    """Seed of the sampler; batch i uses Generator([seed, i]), so a resume redraws identical batches."""
    task_note: str = "present"
    sha256: str = field(default="")
    """Hash of the user prompt file (identity for --resume)."""
    gamma: float = math.nan
    """Discount of the task (NaN: unknown); taken from the config when there is one."""

    def __post_init__(self):
        if self.arrays is None and self.config is None:
            raise UserError("a prompt source needs a checkpoint config to sample from, or prompt arrays")
        if self.config is not None and math.isnan(self.gamma):
            self.gamma = float(self.config.model.gamma)

    def task_ids(self, start: int, stop: int) -> np.ndarray:
        """Task identity of prompts start..stop-1: sampled prompts are one task each; a prompt file may say
        which prompts share a task (its `task_id` array)."""
        if self.arrays is not None and "prompts/task_id" in self.arrays:
            return np.asarray(self.arrays["prompts/task_id"][start:stop], dtype=np.int64)
        return np.arange(start, stop, dtype=np.int64)

    @property
    def task_family(self) -> str | None:
        """The registered family whose prompts these are (None: prompts of no known task)."""
        return None if self.config is None else self.config.task.family

    def batch(self, index: int, start: int, stop: int) -> dict[str, np.ndarray]:
        if self.arrays is None:
            family = registry.get(self.config.task.family)
            pb = family.sample(self.config, self.config.task, stop - start, np.random.default_rng([self.seed, index]))
            out = {"prompts/z": pb.prompt.z, "prompts/state": pb.prompt.states, "prompts/action": pb.prompt.actions,
                   "prompts/reward": pb.prompt.rewards}
            out.update({f"tasks/{k}": v for k, v in pb.tasks.items()})
            out.update({f"reference/{k}": v for k, v in pb.reference.items()})
            return out
        return {k: v[start:stop] for k, v in self.arrays.items() if k != "prompts/task_id"}


def model_info(model: nn.Module) -> dict:
    """The recording's `model` attribute: {"family", "architecture", "class"} of a model
    (family and architecture are None for a model that is not one of a registered family)."""
    config = getattr(model, "config", None)
    known = isinstance(config, ModelConfig)
    return {"family": config.family if known else None, "architecture": config.architecture if known else None,
            "class": type(model).__name__}


def prompt_layout(model: nn.Module, config: CheckpointConfig | None) -> layouts.PromptLayout | None:
    """The layout of the recorded prompts: the model's own, else that of the config's task family."""
    layout = getattr(model, "layout", None)
    if isinstance(layout, layouts.PromptLayout):
        return layout
    if config is not None:
        return registry.get(config.task.family).layout(config.model.d, config.model.m)
    return None


def _model_input(batch: dict[str, np.ndarray], dtype: torch.dtype, device: torch.device | None = None) -> torch.Tensor:
    """The model's input of a batch (prompts z in the model's dtype, or a generic model's own input),
    on `device` (None: the CPU)."""
    if "prompts/z" in batch:
        x = torch.from_numpy(np.ascontiguousarray(batch["prompts/z"])).to(dtype)
    else:
        x = torch.from_numpy(np.ascontiguousarray(batch["prompts/input"]))
    return x if device is None else x.to(device)


# ------------------------------------------------------- a model's own output
def per_prompt_output(y, batch: int, width: int | None, what: str = "the model's output") -> torch.Tensor:
    """A model's prediction as [batch, k]: [B] -> [B, 1]; [B, k]; [B, pos, k] -> the last position.
    `width` (the task's reference output width) must equal k when given. A tuple (or list, dict) is
    refused, not guessed at: which element is the prediction is the model's to say (docs/byom.md)."""
    if not isinstance(y, torch.Tensor):
        k = f" of {len(y)}" if isinstance(y, (tuple, list, dict)) else ""
        raise UserError(f"{what} is a {type(y).__name__}{k}, not a tensor: return the prediction as one tensor "
                        "[batch, k] or [batch, pos, k]")
    shape = tuple(y.shape)
    if y.ndim == 0 or y.shape[0] != batch or y.ndim > 3:
        raise UserError(f"{what} has shape {shape}; expected [batch, k] or [batch, pos, k] with batch = {batch}")
    y = y.reshape(batch, 1) if y.ndim == 1 else (y[:, -1] if y.ndim == 3 else y)
    if width is not None and y.shape[1] != width:
        raise UserError(f"{what} has shape {shape}: {y.shape[1]} value(s) per prompt, the task's output has {width} "
                        f"(return [batch, {width}] or [batch, pos, {width}])")
    return y.detach()


class _Stochastic:
    """Eval mode for the run, each module's own train/eval flag restored after (dropout would otherwise
    make two recordings of the same prompts differ)."""

    KINDS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)

    def __init__(self, *models: nn.Module):
        self.modes = [(m, m.training) for model in models for m in model.modules()]

    @staticmethod
    def note(model: nn.Module) -> str | None:
        names = [n or type(m).__name__ for n, m in model.named_modules()
                 if (isinstance(m, _Stochastic.KINDS) and m.p > 0)
                 or (isinstance(getattr(m, "dropout", None), float) and m.dropout > 0)]  # e.g. nn.MultiheadAttention
        if not names:
            return None
        return (f"the model holds stochastic modules ({', '.join(names[:3])}{' ...' if len(names) > 3 else ''}); "
                f"recorded in eval mode, its mode restored afterwards")

    def __enter__(self):
        for m, _ in self.modes:
            m.training = False
        return self

    def __exit__(self, *exc):
        for m, mode in self.modes:
            m.training = mode


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


class _Lens:
    """The model's readout applied to each layer's residual stream at the last position ('logit lens')."""

    def __init__(self, modules: list[nn.Module], layers: dict[str, int], width: int | None):
        self.modules, self.layers, self.width = modules, layers, width
        self.out: dict[int, torch.Tensor] = {}

    def __call__(self, name: str, t: torch.Tensor) -> None:
        layer = self.layers.get(name)
        if layer is None or not self.modules:
            return
        h = t[:, -1:].detach()
        for m in self.modules:
            h = m(h)
        self.out[layer] = per_prompt_output(h, t.shape[0], self.width, f"the readout of layer {layer}")


class _Probe:
    """One forward pass's hooks: recorded buffers plus the lens."""

    def __init__(self, buffers: _Buffers, lens: _Lens | None):
        self.buffers, self.lens = buffers, lens

    def __call__(self, name: str, t: torch.Tensor) -> None:
        if name in self.buffers.rules:
            self.buffers(name, t)
        if self.lens is not None:
            self.lens(name, t)


def _forward(model, points, probe: _Probe, x, n: int, width: int | None, keep_output: bool, user: bool = False):
    """Run one batch with hooks; returns {dataset suffix: array} of outputs and lens (activations stay
    in the probe's buffers). `user`: a user's model, whose exceptions and sys.exit are one-line errors
    (`models.user.forward`)."""
    from ..models import user as user_model

    with torch.no_grad(), capture(model, points, probe):
        y = user_model.forward(model, x) if user else model(x)
    missing = [name for name in probe.buffers.rules if probe.buffers.rows.get(name) != n]
    if missing:
        raise UserError(f"hooks did not fire during the forward pass: {', '.join(missing)}")
    probe.buffers.rows.clear()
    out = {}
    if keep_output:
        out["outputs/model"] = per_prompt_output(y, n, width).cpu().numpy()
    if probe.lens is not None:
        for layer, v in sorted(probe.lens.out.items()):
            out[f"lens/{layer}"] = v.cpu().numpy()
        probe.lens.out.clear()
    return out


def _check_finite(data: dict[str, np.ndarray], where: str) -> None:
    """Refuse a batch whose outputs (the model's, the lens's) hold NaN or Inf, or whose activations hold
    NaN (an Inf there can be meant: masked attention scores are -inf), before it is written anywhere.
    One pass over each array and no temporary: NaN propagates through min()."""
    from ..models import user

    for path, a in data.items():
        kind = path.split("/")[1] if path.startswith("baseline/") else path.split("/")[0]
        if kind not in ("acts", "outputs", "lens") or a.dtype.kind != "f" or not a.size:
            continue
        whose = "the random-init copy's" if path.startswith("baseline/") else "the model's"
        if kind == "acts":
            if np.isnan(a.min()):
                hook = path.split("acts/", 1)[1]
                raise ModelFault(f"non-finite activations: {whose} hook {hook} holds NaN in {where}")
            continue
        what = "output" if kind == "outputs" else f"readout of layer {path.rsplit('/', 1)[1]}"
        user.check_output(a, f"{whose} {what}", where)


def _check_sizes(source: "PromptSource", batch_size: int, own_model: bool, models: int) -> None:
    """Refuse a batch that does not fit in memory before anything is created (`budget`: the commands
    check it before torch is imported; this is the same check for the Python calls)."""
    main = None if source.arrays is None else source.arrays.get("prompts/z", source.arrays.get("prompts/input"))
    if main is not None:
        pos, d_model = (main.shape[1], main.shape[2]) if main.ndim == 3 else (1, int(np.prod(main.shape[1:])))
    elif source.config is not None:
        pos, d_model = source.config.task.n + 1, source.config.model.D
    else:
        return
    budget.check_memory(lambda p: budget.per_prompt(source.config, p, d_model, own_model), pos, source.n_total,
                        batch_size, models, "a prompt length (--prompts) of" if main is not None else None)


def check_disk(run: "RecordRun", out) -> None:
    """Refuse a recording that would not fit on the disk of `out`, from the exact bytes of its first batch
    (every batch writes as many per prompt; a compressed hook takes less), before the file is created."""
    from ..core.outputs import check_disk as refuse_past_free_space

    lo, hi = run.batch_rows(0)
    per_prompt = sum(np.asarray(a).nbytes for a in run.first.values()) / (hi - lo)
    statics = sum(np.asarray(a).nbytes for arrays in run.statics.values() for a in arrays.values())
    n = run.source.n_total
    refuse_past_free_space(math.ceil(per_prompt * n) + statics, out, f"recording {n} prompts would write")


BASELINES = ("random-init", "none")
"""`record(baseline=...)`: also record the same architecture at random initialization, or not."""


@dataclass
class RecordRun:
    """One run of a model over a prompt source, checked on its first batch (`prepare`): what both sinks
    of the batch stream need. The HDF5 writer (`record`) appends every batch to a file; live analysis
    (`icrl_interp.recording.live`) hands batches to the analyzers without writing them."""

    source: PromptSource
    batch_size: int
    meta: dict
    """The recording's root attributes (docs/formats.md, "Recordings")."""
    statics: dict[str, dict[str, np.ndarray]]
    """Groups written once: 'params' (the recorded parameters, float64) and 'theta_star'."""
    run_batch: Callable[[int, tuple], dict]
    """run_batch(index, probes) -> {dataset path: rows} of batch `index` (activations are views of
    `probes`' reusable buffers: copy them to keep them past the next batch on the same probes)."""
    probe_sets: list
    """Two sets of (model probe, baseline probe): batch i fills set i % 2."""
    first: dict | None
    """Batch 0, run before anything was created (None when resuming)."""
    notes: list

    @property
    def n_batches(self) -> int:
        return -(-self.source.n_total // self.batch_size)

    def batch_rows(self, index: int) -> tuple[int, int]:
        """Prompts [lo, hi) of batch `index`."""
        return index * self.batch_size, min((index + 1) * self.batch_size, self.source.n_total)

    def dataset_attrs(self, path: str) -> dict:
        """Attributes of a recorded dataset (activations: stored dtype, source dtype, positions, compression)."""
        if "acts/" not in path:
            return {}
        name = path.split("acts/", 1)[1]
        # the set a hook has filled (a run resumed at an odd batch has filled only set 1 so far)
        filled = [probes[0].buffers for probes in self.probe_sets if name in probes[0].buffers.source_dtype]
        return filled[0].attrs(name)


@contextmanager
def prepare(
    model: nn.Module,
    spec: ProbeSpec,
    source: PromptSource,
    batch_size: int = 128,
    resume: bool = False,
    checkpoint_sha256: str = "",
    baseline: str = "none",
    baseline_seed: int = 0,
    outputs: str = "auto",
    device=None,
) -> Iterator[RecordRun]:
    """Check a run of `model` over `source` and run its first batch; inside the block the model (and its
    random-init copy) are in eval mode, each module's mode restored on leaving. Arguments as `record`."""
    target = devices.of(model) if device is None else devices.resolve(device)
    with _on_device(model, target), _prepare(model, spec, source, batch_size, resume, checkpoint_sha256, baseline,
                                             baseline_seed, outputs, target) as run:
        yield run


@contextmanager
def _on_device(model: nn.Module, device: torch.device) -> Iterator[nn.Module]:
    """The model on `device` inside the block, moved back where it was on leaving."""
    home = devices.of(model)
    if home != device:
        model.to(device)
    try:
        yield model
    finally:
        if home != device:
            model.to(home)


@contextmanager
def _prepare(model, spec, source, batch_size, resume, checkpoint_sha256, baseline, baseline_seed, outputs,
             device: torch.device) -> Iterator[RecordRun]:
    for name, value in (("--tasks", source.n_total), ("--batch-size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise UserError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(source.seed, bool) or not isinstance(source.seed, (int, np.integer)) or source.seed < 0:
        raise UserError(f"--seed must be a non-negative integer, got {source.seed!r}")
    if baseline not in BASELINES:
        raise UserError(f"baseline must be one of {', '.join(BASELINES)}, got {baseline!r}")
    if outputs not in ("auto", "require", "none"):
        raise UserError(f"outputs must be 'auto', 'require' or 'none', got {outputs!r}")
    batch_size = int(min(batch_size, source.n_total))  # a batch never holds more than the run
    own = getattr(model, "config", None)
    foreign = not isinstance(own, ModelConfig)
    _check_sizes(source, batch_size, not foreign, 2 if baseline == "random-init" else 1)
    config = source.config
    params = parameters(model)
    points = role_points(model, spec.roles)
    rules, param_names = spec.resolve(hook_names(model), params, role_names=list(points))
    points = {name: points.get(name, name) for name in rules}
    layout = prompt_layout(model, config)
    info = model_info(model)
    n_layers = 0 if foreign else own.n_layers  # 0: the analyzers count the recorded layers
    width = _reference_width(source)
    resid_layers = {n: int(n.split(".")[1]) for n in rules if n.startswith("blocks.") and n.endswith(".hook_resid_post")}
    readout = readout_modules(model, spec.roles) if foreign else []
    notes = [n for n in (_Stochastic.note(model),) if n]
    if foreign and resid_layers and not readout:
        notes.append("no readout: give the model's output modules as role 'readout' for the logit lens")

    keep_output = foreign and outputs != "none"
    if keep_output and outputs == "auto":
        keep_output = _output_fits(model, source, width, dtype=_dtype_of(params), device=device)
        if not keep_output:
            notes.append("the model's output does not fit the task's output: not recorded (no outputs/model, no lens)")
            readout = []
    base_model, base_info = (random_init_copy(model, baseline_seed) if baseline == "random-init" else (None, None))
    models = [m for m in (model, base_model) if m is not None]
    dtype = _dtype_of(params)
    lens = _Lens(readout, resid_layers, width) if readout else None
    base_lens = _Lens(readout_modules(base_model, spec.roles), resid_layers, width) if readout and base_model is not None else None

    def run_batch(index: int, probes: tuple[_Probe, _Probe | None]) -> dict:
        lo, hi = index * batch_size, min((index + 1) * batch_size, source.n_total)
        data = source.batch(index, lo, hi)
        x = _model_input(data, dtype)
        if x.is_floating_point() and not torch.isfinite(x).all():
            raise UserError(f"prompts {lo}..{hi - 1} contain NaN or Inf")
        x = x.to(device)
        result = {f"acts/{n}": None for n in rules}
        result.update(_forward(model, points, probes[0], x, hi - lo, width, keep_output, foreign))
        if base_model is not None:
            extra = _forward(base_model, points, probes[1], x, hi - lo, width, keep_output, foreign)
            result.update({f"baseline/{k}": v for k, v in extra.items()})
        for n in rules:
            result[f"acts/{n}"] = probes[0].buffers.arrays[n][: hi - lo]
            if base_model is not None:
                result[f"baseline/acts/{n}"] = probes[1].buffers.arrays[n][: hi - lo]
        devices.synchronize(device)  # the non-blocking copies into the buffers have landed
        # where in the whole run (a shard's batches are numbered from its first)
        shard = isinstance(source, ShardSource)
        first, total = (source.first_batch, source.whole.n_total) if shard else (0, source.n_total)
        at = first * batch_size
        _check_finite(result, f"batch {first + index + 1} of {-(-total // batch_size)} "
                              f"(prompts {at + lo}..{at + hi - 1})")
        return {**result, **data, "prompts/task_id": source.task_ids(lo, hi)}

    probe_sets = [(_Probe(_Buffers(rules, batch_size, device), lens),
                   _Probe(_Buffers(rules, batch_size, device), base_lens) if base_model is not None else None)
                  for _ in range(2)]
    with _Stochastic(*models):
        first, readout_info = None, None
        if not resume:
            first = run_batch(0, probe_sets[0])  # every check runs before the file exists
            if lens is not None:
                diff = float(np.max(np.abs(first[f"lens/{max(lens.layers.values())}"] - first["outputs/model"])))
                readout_info = {"modules": _paths_of(model, readout), "max_abs_diff_last_layer": diff}
                if diff > 1e-4 * max(1.0, float(np.max(np.abs(first["outputs/model"])))):
                    notes.append(f"the readout applied to the last layer differs from the model's output by {diff:.3g}: "
                                 f"the logit lens is not the model's own readout")
        meta = {
            "task_family": source.task_family or "", "model": info,
            "layout": layout.to_dict() if layout is not None else None,
            "probe_spec": spec.to_json(), "checkpoint_config": config.to_dict() if config else None,
            "checkpoint_sha256": checkpoint_sha256, "n_layers": int(n_layers),
            "gamma": source.gamma, "seed": int(source.seed), "batch_size": int(batch_size),
            "source_sha256": source.sha256, "n_total": int(source.n_total),
            "versions": _versions(), "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "task_data": source.task_note, "roles": {n: p for n, p in points.items() if n != p},
        }
        if readout_info is not None:
            meta["readout"] = readout_info
        if base_info is not None:
            meta["baseline"] = base_info
        statics = {"params": {n: params[n].detach().cpu().double().numpy() for n in param_names},
                   # theta* of the checkpoint's model for the recorded parameter names (none match a foreign model's)
                   "theta_star": config.theta_star(param_names) if config is not None else {}}
        yield RecordRun(source, batch_size, meta, statics, run_batch, probe_sets, first, notes)


def record(
    model: nn.Module,
    out,
    spec: ProbeSpec,
    source: PromptSource,
    batch_size: int = 128,
    resume: bool = False,
    checkpoint_sha256: str = "",
    progress: bool = True,
    baseline: str = "none",
    baseline_seed: int = 0,
    outputs: str = "auto",
    device=None,
    shards: int = 1,
    workers: int | None = None,
) -> RecordSummary:
    """Record `source.n_total` prompts through `model` into the HDF5 file `out`.

    The model runs in eval mode (each module's mode is restored afterwards). With `baseline='random-init'`
    the same architecture at random initialization (`random_init_copy`) is recorded on the same prompts
    under `baseline/`. A model of no registered family also gets its own output (`outputs/model`) and,
    when it has a readout (role `readout`, or a TransformerLens model's own), the readout of every
    layer's residual stream (`lens/{l}`). `outputs`: 'require' refuses a model whose output does not fit
    the task's (`per_prompt_output`), 'auto' records it only when it fits (a note says when not), 'none'
    never. Everything is checked on the first batch before any file is
    created, so a refused run leaves nothing behind.

    `device`: where the model runs ('cpu', 'cuda', 'auto' or a torch.device; None: where it is); it is
    moved back afterwards. `shards` > 1 writes that many shard files in parallel processes (`workers`
    at a time, default: one per shard up to the CPU count) and a master file of virtual datasets at
    `out` (`icrl_interp.recording.shards`, docs/formats.md "Sharded recordings").

    The run holds the lock `out` + '.lock' (`shards.lock_path`; removed at the end): a second run on
    the same `out` while this one (or a shard writer of it) lives is a one-line UserError.
    """
    from ..core.files import locked
    from .shards import leftovers, lock_path

    if not isinstance(shards, (int, np.integer)) or isinstance(shards, bool) or shards < 1:
        raise UserError(f"--shards must be a positive integer, got {shards!r}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked(lock_path(out), f"the recording {out}"):
        for stale in leftovers(out):  # of killed runs; no other run of `out` is alive now
            stale.unlink()
        if shards > 1:
            return _record_sharded(model, out, spec, source, batch_size, resume, checkpoint_sha256, progress,
                                   baseline, baseline_seed, outputs, device, int(shards), workers)
        return _record_file(model, out, spec, source, batch_size, resume, checkpoint_sha256, progress, baseline,
                            baseline_seed, outputs, device)


def _record_file(model, out, spec, source, batch_size, resume, checkpoint_sha256, progress, baseline, baseline_seed,
                 outputs, device, shard: dict | None = None) -> RecordSummary:
    """`record` into one file; `shard` (the root attribute of a shard, `shards.shard_meta`) makes it a shard."""
    with prepare(model, spec, source, batch_size, resume, checkpoint_sha256, baseline, baseline_seed, outputs,
                 device) as run:
        meta = run.meta if shard is None else {**run.meta, "shard": shard}
        if not resume:
            check_disk(run, out)
        writer = RecordingWriter(out, meta, resume=resume)
        try:
            summary = _stream(writer, run, progress)
            path = writer.finish()
        except UserError:
            # a batch refused (a NaN, the model raised or exited): resuming would refuse it again, so a
            # new file goes; a resumed one keeps the batches it had, all checked
            if resume:
                writer.close()
            else:
                writer.discard()
            raise
        except BaseException:
            writer.close()  # interrupted, disk full: the .partial stays for --resume; the final path is never touched
            raise
    start_at, shapes, bytes_written, seconds = summary
    return RecordSummary(path, source.n_total, shapes, bytes_written, seconds, start_at, run.notes)


@dataclass
class ShardSource(PromptSource):
    """Batches [first_batch, first_batch + n_batches) of another source as a source of their own: batch i
    of the shard is batch first_batch + i of the whole (same tasks, same task ids), so a shard holds
    exactly the rows the single-file recording holds there."""

    whole: PromptSource | None = None
    """The source of the whole run."""
    first_batch: int = 0
    """The whole run's index of the shard's first batch."""
    whole_batch_size: int = 1
    """Prompts per batch of the whole run."""

    @classmethod
    def of(cls, whole: PromptSource, first_batch: int, stop_batch: int, batch_size: int) -> "ShardSource":
        lo, hi = first_batch * batch_size, min(stop_batch * batch_size, whole.n_total)
        return cls(config=whole.config, arrays=whole.arrays, n_total=hi - lo, seed=whole.seed,
                   task_note=whole.task_note, sha256=whole.sha256, gamma=whole.gamma, whole=whole,
                   first_batch=first_batch, whole_batch_size=batch_size)

    @property
    def first_prompt(self) -> int:
        return self.first_batch * self.whole_batch_size

    def task_ids(self, start: int, stop: int) -> np.ndarray:
        return self.whole.task_ids(start + self.first_prompt, stop + self.first_prompt)

    def batch(self, index: int, start: int, stop: int) -> dict[str, np.ndarray]:
        return self.whole.batch(index + self.first_batch, start + self.first_prompt, stop + self.first_prompt)


def _record_sharded(model, out, spec, source, batch_size, resume, checkpoint_sha256, progress, baseline, baseline_seed,
                    outputs, device, count: int, workers) -> RecordSummary:
    """`record(shards=count)`: the shards in parallel, then the master (`icrl_interp.recording.shards`)."""
    from . import shards

    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise UserError(f"--batch-size must be a positive integer, got {batch_size!r}")
    if isinstance(source.n_total, bool) or not isinstance(source.n_total, (int, np.integer)) or source.n_total < 1:
        raise UserError(f"--tasks must be a positive integer, got {source.n_total!r}")
    batch_size = int(min(batch_size, source.n_total))
    ranges = shards.batch_ranges(-(-source.n_total // batch_size), count)
    out = Path(out)
    paths = shards.shard_paths(out, count)
    states = shards.check_outputs(out, paths, resume)
    target = devices.of(model) if device is None else devices.resolve(device)  # refused once, before any fork
    metas = [shards.shard_meta(i, count, b0, b0 * batch_size, source.n_total, batch_size)
             for i, (b0, _) in enumerate(ranges)]

    def one(i: int) -> dict:
        if states[i] == "done":
            return shards.check_done(paths[i], metas[i])
        sub = ShardSource.of(source, *ranges[i], batch_size)
        s = _record_file(model, paths[i], spec, sub, batch_size, states[i] == "resume", checkpoint_sha256, False,
                         baseline, baseline_seed, outputs, target, shard=metas[i])
        return {"n_prompts": s.n_prompts, "bytes": s.bytes_written, "resumed_from": s.resumed_from, "notes": s.notes,
                "hooks": {k: list(v) for k, v in s.hooks.items()}}

    # forked workers share one CPU model; CUDA cannot be used in a forked child, so a GPU records the
    # shards one after another (it is the bottleneck either way)
    workers = workers if target.type == "cpu" else 0
    bar = tqdm(total=source.n_total, unit="prompt", desc=f"record {count} shards", disable=not progress)
    t0 = time.perf_counter()
    try:
        results = shards.run(one, count, workers, [f"shard {i} ({p})" for i, p in enumerate(paths)],
                             progress=lambda r: bar.update(r["n_prompts"]))
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    shards.write_master(out, paths)
    notes = list(dict.fromkeys(n for r in results for n in r["notes"]))
    notes.append(f"{count} shards ({paths[0].name} ...), joined by virtual datasets in {out.name}")
    return RecordSummary(out, source.n_total, {k: tuple(v) for k, v in results[0]["hooks"].items()},
                         sum(r["bytes"] for r in results), seconds, sum(r["resumed_from"] for r in results), notes)


def _dtype_of(params: dict) -> torch.dtype:
    return next(iter(params.values())).dtype if params else torch.float32


def _output_fits(model: nn.Module, source: "PromptSource", width: int | None, dtype: torch.dtype,
                 device: torch.device | None = None) -> bool:
    """Whether the model's output on two prompts has the task's per-prompt shape (only a user's model is
    asked: its errors are one line, `models.user.forward`)."""
    from ..models import user

    data = source.batch(0, 0, min(2, source.n_total))
    with _Stochastic(model), torch.no_grad():
        y = user.forward(model, _model_input(data, dtype, device))
    try:
        per_prompt_output(y, next(iter(data.values())).shape[0], width)
    except UserError:
        return False
    return True


def _paths_of(model: nn.Module, modules: list[nn.Module]) -> list[str]:
    names = {id(m): n for n, m in model.named_modules()}
    return [names.get(id(m), type(m).__name__) for m in modules]


def _reference_width(source: "PromptSource") -> int | None:
    """Values per prompt of the task's output (reference/output), None when the task has none."""
    if source.arrays is not None:
        ref = source.arrays.get("reference/output")
        return None if ref is None else int(np.prod(ref.shape[1:]))
    if source.config is None:
        return None
    pb = source.config.sample(1, np.random.default_rng([source.seed, 2**31]))
    ref = pb.reference.get("output")
    return None if ref is None else int(np.prod(np.shape(ref)[1:]))


def _stream(writer, run: RecordRun, progress: bool):
    """Write every batch from the writer's progress on; returns (start, shapes, bytes, seconds)."""
    source, batch_size = run.source, run.batch_size
    start_at = writer.n_done
    if start_at % batch_size and start_at != source.n_total:
        raise UserError(f"cannot resume: {start_at} prompts done is not a whole number of batches of {batch_size}")
    for group, arrays in run.statics.items():
        writer.write_static(group, arrays)
    bytes_written, t0 = 0, time.perf_counter()
    batches = range(start_at // batch_size, -(-source.n_total // batch_size))
    bar = tqdm(total=source.n_total, initial=start_at, unit="prompt", desc="record", disable=not progress)
    pending, pending_rows = None, 0
    # Two buffer sets: the forward pass of batch i+1 fills one while a writer thread streams batch i
    # from the other (torch releases the GIL while it computes, so the write hides behind the forward).
    with ThreadPoolExecutor(max_workers=1) as pool:
        try:
            for index in batches:
                probes = run.probe_sets[index % 2]
                data = run.first if (index == 0 and run.first is not None) else run.run_batch(index, probes)
                acts = [k for k in data if k.startswith(("acts/", "baseline/acts/"))]
                bytes_written += sum(data[k].nbytes for k in acts)
                attrs = {k: run.dataset_attrs(k) for k in acts}
                if pending is not None:
                    pending.result()  # one write in flight at most; re-raises its error
                    bar.update(pending_rows)
                pending = pool.submit(writer.write_batch, data, attrs)
                pending_rows = next(iter(data.values())).shape[0]
            if pending is not None:
                pending.result()
                bar.update(pending_rows)
        finally:
            if pending is not None:
                wait([pending])  # never close the file under a running write
            bar.close()
    shapes = {n: a.shape[1:] for probes in reversed(run.probe_sets) for n, a in probes[0].buffers.arrays.items()}
    return start_at, shapes, bytes_written, time.perf_counter() - t0


# ------------------------------------------------------------- one call
def task_of(task, options: dict | None = None) -> CheckpointConfig:
    """A task given as a family name (+ its construct options), a checkpoint directory or a config."""
    from ..models import checkpoint, construct

    if isinstance(task, CheckpointConfig):
        if options:
            raise UserError("task options go with a family name, not with a checkpoint config")
        return task
    if isinstance(task, str) and registry.find(task) is not None:
        return construct.task_config(task, options)
    if isinstance(task, (str, Path)) and Path(task).is_dir():
        if options:
            raise UserError("task options go with a family name, not with a checkpoint directory")
        return checkpoint.read(task)[0]
    raise UserError(f"task {task!r} is neither a registered family ({', '.join(registry.names())}) nor a checkpoint "
                    f"directory")


def spec_for(model: nn.Module, probe=None) -> ProbeSpec:
    """The probe spec to record `model` with: the one given (a path, a ProbeSpec, or a {role: path} dict),
    else the model family's shipped spec, else the TransformerLens spec for a TransformerLens model."""
    from . import probe_spec

    if isinstance(probe, ProbeSpec):
        return probe
    if isinstance(probe, dict):
        return probe_spec.parse_spec("[roles]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in probe.items()),
                                     "<roles>")
    if probe is not None:
        return probe_spec.load_spec(probe)
    own = getattr(model, "config", None)
    if isinstance(own, ModelConfig):
        return probe_spec.shipped_spec(own.family)
    if any(getattr(m, "hook_dict", None) for m in model.modules()):
        return probe_spec.shipped_spec(probe_spec.GENERIC)
    raise UserError(f"{type(model).__name__} is not a TransformerLens model: pass a probe spec whose [roles] map the "
                    f"residual stream, attention pattern and readout to its modules (docs/byom.md)")


def record_model(model: nn.Module, task, out, *, task_options: dict | None = None, probe=None, tasks: int = 512,
                 batch_size: int = 128, seed: int = 0, baseline: str = "random-init", prompts=None,
                 resume: bool = False, progress: bool = True, checkpoint_sha256: str = "", device=None,
                 shards: int = 1, workers: int | None = None) -> RecordSummary:
    """Record any model on a task: `icrl_interp.record` (docs/byom.md).

    `task` is a registered family name (with `task_options`: the family's construct options), a
    checkpoint directory or a CheckpointConfig; `prompts` an optional prompt file (.npz / .h5) to record
    on instead of sampling. The model must take the task's prompts z[batch, pos, d_model] and, unless it
    is one of the package's models, return the task's output ([batch, k] or [batch, pos, k]).
    `device`, `shards`, `workers`: as `record` (where the model runs; shard files in parallel).
    """
    spec, source = spec_and_source(model, task, task_options=task_options, probe=probe, tasks=tasks, seed=seed,
                                   prompts=prompts)
    return record(model, out, spec, source, batch_size=batch_size, resume=resume, progress=progress,
                  baseline=baseline, outputs="require", checkpoint_sha256=checkpoint_sha256, device=device,
                  shards=shards, workers=workers)


def spec_and_source(model: nn.Module, task, *, task_options: dict | None = None, probe=None, tasks: int = 512,
                    seed: int = 0, prompts=None) -> tuple[ProbeSpec, PromptSource]:
    """What `record_model` records `model` with: its probe spec (`spec_for`) and the prompts (`prompts`,
    a prompt file, else `tasks` prompts sampled from `task` under `seed`)."""
    if not isinstance(model, nn.Module):
        raise UserError(f"record needs a torch.nn.Module, got {type(model).__name__}")
    config = task_of(task, task_options)
    spec = spec_for(model, probe)
    if prompts is not None:
        return spec, load_prompt_file(prompts, config, prompt_layout(model, config))
    return spec, PromptSource(config=config, n_total=tasks, seed=seed)


# ------------------------------------------------------------- user prompts
_PROMPT_KEYS = {"z", "input", "state", "action", "reward", "task_id", "gamma"}
_TASK_KEYS = {"P", "r", "phi", "stationary", "values"}
_REFERENCE_KEYS = {"td_errors", "values", "output", "w", "lam"}


def _real(name: str, path: Path, v: np.ndarray, integer: bool = False) -> np.ndarray:
    """A numeric array of a prompt file, refused when it is complex, non-numeric or (for floats) not finite."""
    if v.dtype.kind == "c":
        raise UserError(f"prompt file {path}: {name} is complex; prompts and labels must be real numbers")
    if v.dtype.kind not in "biuf":
        raise UserError(f"prompt file {path}: {name} has dtype {v.dtype}, not numbers")
    if integer:
        if v.dtype.kind not in "biu":
            raise UserError(f"prompt file {path}: {name} must hold integers, it has dtype {v.dtype}")
        return v.astype(np.int64)
    if not np.all(np.isfinite(v)):
        raise UserError(f"prompt file {path}: {name} contains NaN or Inf")
    return v.astype(np.float64)


_TASK_AXES = {"P": ("S", "S"), "r": ("S",), "phi": ("S", "d"), "stationary": ("S",), "values": ("S",)}
"""Per-prompt axes of the task arrays of a prompt file (S: states, d: features)."""


def _check_task_shapes(path: Path, tasks: dict[str, np.ndarray]) -> None:
    """tasks_* arrays agree on the number of states S (and features d)."""
    sizes: dict[str, tuple[int, str]] = {}
    for k, v in tasks.items():
        axes = _TASK_AXES[k]
        if v.ndim != 1 + len(axes):
            raise UserError(f"prompt file {path}: tasks_{k} has shape {v.shape}, expected [N, {', '.join(axes)}]")
        for axis, size in zip(axes, v.shape[1:]):
            seen = sizes.setdefault(axis, (size, k))
            if seen[0] != size:
                raise UserError(f"prompt file {path}: tasks_{k} has {axis} = {size} but tasks_{seen[1]} has {seen[0]}")


def load_prompt_file(path, config: CheckpointConfig | None, layout: layouts.PromptLayout | None) -> PromptSource:
    """Read user prompts from .npz or .h5 (docs/formats.md, "Prompt files").

    Arrays: z [N, pos, d_model]; optional state / action / reward [N, pos]; task_id [N] (prompts with one
    id share a task: splits and shuffled controls go by it); gamma (scalar); tasks_* (task data);
    reference_* (the reference algorithm's run: td_errors [N, steps, n], output [N, k], ...). With a task
    config the prompts are taken to be its task family's: reference arrays the file lacks are computed by
    that family's reference algorithm, and a gamma in the file must agree with the task's."""
    import hashlib

    path = Path(path)
    if not path.exists():
        raise UserError(f"prompt file {path} does not exist")
    arrays: dict[str, np.ndarray] = {}
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as f:
                arrays = {k: f[k] for k in f.files}
        elif path.suffix in (".h5", ".hdf5"):
            with h5py.File(path, "r") as f:
                f.visititems(lambda k, o: arrays.__setitem__(k.replace("/", "_"), o[()]) if isinstance(o, h5py.Dataset) else None)
        else:
            raise UserError(f"prompt file {path} must be .npz or .h5")
    except (OSError, ValueError, EOFError) as e:
        raise UserError(f"cannot read prompt file {path}: {e}") from None
    unknown = set(arrays) - _PROMPT_KEYS - {f"tasks_{k}" for k in _TASK_KEYS} - {f"reference_{k}" for k in _REFERENCE_KEYS}
    if unknown:
        raise UserError(f"prompt file {path}: unknown arrays {', '.join(sorted(unknown))}")
    key = "z" if "z" in arrays else "input" if "input" in arrays else None
    if key is None:
        raise UserError(f"prompt file {path} has no 'z' array (prompts [N, pos, d_model])")
    gamma = math.nan
    if "gamma" in arrays:
        g = _real("gamma", path, np.asarray(arrays.pop("gamma")))
        if g.size != 1 or not 0.0 <= float(g.reshape(-1)[0]) <= 1.0:
            raise UserError(f"prompt file {path}: gamma must be one number in [0, 1], got {g.reshape(-1)[:3]}")
        gamma = float(g.reshape(-1)[0])
        if config is not None and not math.isclose(gamma, config.model.gamma, rel_tol=0, abs_tol=1e-12):
            raise UserError(f"prompt file {path}: gamma {gamma} disagrees with the task's gamma {config.model.gamma} "
                            f"(pass --gamma {gamma})")
    main = arrays[key]
    if main.ndim == 0 or main.shape[0] == 0:
        raise UserError(f"prompt file {path}: {key} holds no prompts")
    N = main.shape[0]
    if key == "z":
        main = _real("z", path, main)
        if main.ndim != 3:
            raise UserError(f"prompt file {path}: z has shape {main.shape}, expected [N, pos, d_model]")
        if main.shape[1] < 2:
            raise UserError(f"prompt file {path}: z has {main.shape[1]} position(s); a prompt needs context columns and a query")
        if layout is not None and main.shape[2] != layout.d_model:
            raise UserError(f"prompt file {path}: z has d_model {main.shape[2]}, the task's layout has {layout.d_model}")
    for k, v in arrays.items():
        if v.ndim == 0 or v.shape[:1] != (N,):
            raise UserError(f"prompt file {path}: {k} has {v.shape[0] if v.ndim else 0} rows, {key} has {N}")
        if k in ("state", "action", "reward") and key == "z" and v.shape != main.shape[:2]:
            raise UserError(f"prompt file {path}: {k} has shape {v.shape}, expected {main.shape[:2]}")
    out = {f"prompts/{key}": main}
    pos = main.shape[1] if main.ndim > 1 else 0
    for label, fill in (("state", -1), ("action", -1), ("reward", 0.0)):
        if key == "z":
            given = arrays.get(label)
            out[f"prompts/{label}"] = (_real(label, path, given, integer=fill == -1) if given is not None else
                                       np.full((N, pos), fill, dtype=np.int64 if fill == -1 else np.float64))
    if "task_id" in arrays:
        ids = _real("task_id", path, arrays["task_id"], integer=True)
        if ids.shape != (N,) or ids.min() < 0:
            raise UserError(f"prompt file {path}: task_id must be N non-negative integers, one per prompt")
        out["prompts/task_id"] = ids
    present = [k for k in sorted(_TASK_KEYS) if f"tasks_{k}" in arrays]
    out.update({f"tasks/{k}": _real(f"tasks_{k}", path, arrays[f"tasks_{k}"]) for k in present})
    _check_task_shapes(path, {k: out[f"tasks/{k}"] for k in present})
    note = "present" if len(present) == len(_TASK_KEYS) else (
        "absent: the prompt file has no task arrays" if not present else f"partial: only {', '.join(present)}")
    given_ref = {k: _real(f"reference_{k}", path, arrays[f"reference_{k}"]) for k in sorted(_REFERENCE_KEYS)
                 if f"reference_{k}" in arrays}
    family = registry.get(config.task.family) if config is not None else None
    if family is not None and family.reference is not None and key == "z":
        # the prompts are the task family's: its reference algorithm reads everything it needs off them
        task_layout = family.layout(config.model.d, config.model.m)
        if main.shape[2] != task_layout.d_model:
            raise UserError(f"prompt file {path}: z has d_model {main.shape[2]}, prompts of the {family.name} task "
                            f"have {task_layout.d_model}")
        ref = family.reference(out["prompts/z"], config.model, config.constants)
        out.update({f"reference/{k}": np.asarray(v) for k, v in ref.items()})
    for k, v in given_ref.items():
        computed = out.get(f"reference/{k}")
        if computed is not None and computed.shape != v.shape:
            raise UserError(f"prompt file {path}: reference_{k} has shape {v.shape}, the task's reference gives "
                            f"{computed.shape}")
        out[f"reference/{k}"] = v  # the file's own reference run wins
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return PromptSource(config=config, arrays=out, n_total=N, seed=0, task_note=note, sha256=digest, gamma=gamma)


def summary_json(summary: RecordSummary) -> str:
    return json.dumps({"path": str(summary.path), "n_prompts": summary.n_prompts,
                       "hooks": {k: list(v) for k, v in summary.hooks.items()},
                       "bytes": summary.bytes_written, "seconds": summary.seconds})
