"""Stream hooked activations of any torch model into an HDF5 recording.

`record()` runs a model over batches of prompts (sampled from a checkpoint's task
distribution, or supplied by the user), captures the hooks a probe spec names
into reusable buffers, and appends each batch to the recording together with
the prompts, per-task data and the reference algorithm's run on the same
prompts. Memory does not grow with the number of prompts.

What the prompts are (the checkpoint's task family: layout, sampler, reference algorithm) and what
model produced the activations (its family, architecture and class) are recorded separately
(`icrl_interp.recording.format`, schema 2); sampling and the reference go through the family registry.

The recorder drives; what it uses lives in its own modules: the prompts (`prompts`), the probe spec
(`probe_spec.spec_for`), the task (`models.construct.task_of`), the random-init copy
(`models.random_init`), the file writer (`format`) and, for `shards > 1`, the shard files
(`shards.plan`, `run`, `write_master`). The calls go one way, from here down.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Iterator

import h5py
import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from .._version import __version__
from ..core import devices, threads
from ..core.errors import ModelFault, UserError
from ..families import registry
from ..models.config import CheckpointConfig, ModelConfig
from ..models.construct import task_of
from ..models.modes import eval_mode, stochastic_modules
from ..models.random_init import random_init_copy
from ..models.user import per_prompt_output
from ..tasks import layouts
from . import budget
from .background import BUFFER_SETS, DEPTH, BackgroundWriter
from . import shards as sharding
from .capture import capture, hook_names, parameters, readout_modules, role_points
from .format import BF16, RecordingWriter
from .probe_spec import HookRule, ProbeSpec, spec_for
from .prompts import PromptSource, load_prompt_file

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
    """Each hook's activations of one batch, for the writer: the model's own tensor where that is safe
    (no copy), else a copy in a reusable numpy buffer per hook (no allocation per batch).

    Without a copy (`direct`): a CPU tensor already in the stored dtype that is contiguous and owns its
    whole storage (not a view of a parameter, of the prompts or of a larger tensor) is handed on as it is.
    That is safe only while nothing writes into it afterwards, which torch's version counter tells: every
    in-place write bumps it. Every tensor handed on is watched, from the first batch on: if the forward
    pass wrote into it after the hook (`settle`), the batch is run again with that hook copied, and it
    stays copied; the writer checks again (`rewritten`), so a model writing into an earlier batch's
    activation is refused, never written. (The first batch used to be copied as a precaution; that
    copy's fresh pages cost every run more than the rare rerun it spared: docs/benchmarks.md.)"""

    def __init__(self, rules: dict[str, HookRule], capacity: int, device: torch.device | None = None,
                 direct_ok: dict[str, bool] | None = None):
        self.rules, self.capacity = rules, capacity
        self.device = torch.device("cpu") if device is None else device
        """Where the activations are: from a GPU they land in pinned host buffers, by non-blocking
        copies that overlap the rest of the forward pass (`devices.host_empty`); whoever hands the
        buffers on synchronizes first (`devices.synchronize`)."""
        self.arrays: dict[str, np.ndarray] = {}
        self.views: dict[str, torch.Tensor] = {}
        self.rows: dict[str, int] = {}
        self.source_dtype: dict[str, str] = {}
        self.store: dict[str, torch.dtype] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.direct_ok = {} if direct_ok is None else direct_ok
        """Hook -> False once the model wrote into its tensor after the hook (it is copied from then on);
        absent: handed on without a copy where `_whole` allows. Shared by the buffer sets of one model."""
        self.direct: dict[str, np.ndarray] = {}
        """This batch's activations handed on without a copy (numpy views of the model's tensors)."""
        self.watched: dict[str, tuple[torch.Tensor, int]] = {}
        """Hook -> (its tensor, version when the hook saw it), for every tensor whose version is checked."""

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
        if name not in self.shapes:
            store = _TORCH_DTYPES[rule.dtype] if rule.dtype else t.dtype
            if not store.is_floating_point and t.is_floating_point():
                store = t.dtype
            self.store[name], self.shapes[name] = store, tuple(t.shape[1:])
            self.source_dtype[name] = str(t.dtype).removeprefix("torch.")
        if tuple(t.shape[1:]) != self.shapes[name]:
            raise UserError(f"hook {name}: activation shape {tuple(t.shape[1:])} changed from {self.shapes[name]}")
        self.rows[name] = t.shape[0]
        whole = self._whole(name, t)
        if whole and self.direct_ok.get(name, True):
            self.direct[name] = t.numpy()
            self.watched[name] = (t, t._version)
            # a copy buffer of an earlier batch of this set (a tensor that was not whole then) is free now (the
            # set's last batch is written): each set holds one batch of activations, copied or not, as `budget` counts
            self.arrays.pop(name, None)
            self.views.pop(name, None)
            return
        self.direct.pop(name, None)
        self.watched.pop(name, None)
        if name not in self.arrays:
            host = devices.host_empty((self.capacity, *self.shapes[name]), self.store[name], self.device)
            # bfloat16 has no numpy dtype: the writer gets its bit patterns as int16
            self.arrays[name] = (host.view(torch.int16) if self.store[name] == torch.bfloat16 else host).numpy()
            self.views[name] = host
        self.views[name][: t.shape[0]].copy_(t, non_blocking=True)  # synchronous from the CPU

    def _whole(self, name: str, t: torch.Tensor) -> bool:
        """Whether `t` can be handed on as it is: a contiguous CPU tensor in the stored dtype (not bfloat16,
        which numpy lacks) that owns its whole storage and has a version counter (an inference-mode tensor has
        none, so a later write into it could not be seen)."""
        return (t.device.type == "cpu" and t.layout == torch.strided and t.dtype == self.store[name]
                and not t.is_inference()
                and t.dtype != torch.bfloat16 and t.is_contiguous() and t.storage_offset() == 0
                and t.untyped_storage().nbytes() == t.numel() * t.element_size())

    def batch(self, name: str, n: int) -> np.ndarray:
        """The `n` rows of this batch's activations of hook `name`."""
        return self.direct[name] if name in self.direct else self.arrays[name][:n]

    def settle(self) -> bool:
        """After the forward pass: False when a tensor handed on without a copy was written after its hook
        (then that hook is copied from now on, and this batch must be run again)."""
        bad = self.rewritten()
        for name in bad:
            self.direct_ok[name] = False
            del self.direct[name], self.watched[name]
        return not bad

    def rewritten(self) -> list[str]:
        """Hooks whose activations handed on without a copy have been written into since their hook ran."""
        return [name for name, (t, version) in self.watched.items() if name in self.direct and t._version != version]

    def attrs(self, name: str) -> dict:
        rule = self.rules[name]
        store = torch.int16 if self.store[name] == torch.bfloat16 else self.store[name]  # as `arrays` holds it
        stored = BF16 if rule.dtype == "bfloat16" else str(store).removeprefix("torch.")
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


def _all_finite(x: torch.Tensor) -> bool:
    """Whether a floating-point tensor holds no NaN and no ±Inf: its least and largest values (one pass,
    `aminmax`; a NaN makes both NaN) are finite. `isfinite(x).all()` built a boolean tensor of x's size and
    took ~20x as long, a few percent of a small model's forward pass."""
    if not x.numel():
        return True
    lo, hi = torch.aminmax(x)
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


def _stochastic_note(model: nn.Module) -> str | None:
    """The note of a recording of a model with stochastic modules (it runs in `modes.eval_mode`)."""
    names = stochastic_modules(model)
    if not names:
        return None
    return (f"the model holds stochastic modules ({', '.join(names[:3])}{' ...' if len(names) > 3 else ''}); "
            f"recorded in eval mode, its mode restored afterwards")


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

    while True:  # run again when the model wrote into an activation handed on uncopied (that hook is copied
        # from then on, so this ends)
        with torch.no_grad(), capture(model, points, probe):
            y = user_model.forward(model, x) if user else model(x)
        if probe.buffers.settle():
            break
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


def _refuse_rewritten(probes: tuple, index: int) -> None:
    """Refuse batch `index` when the model wrote into activations of it that were handed to the writer
    without a copy (`_Buffers`), after their hook ran: what would be written is not what the hook saw."""
    for probe in probes:
        bad = probe.buffers.rewritten() if probe is not None else []
        if bad:
            raise ModelFault(f"the model wrote into its activations of batch {index} after returning them "
                             f"(hooks {', '.join(bad)}, written in place by a later forward pass)")


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
    run_batch: Callable[..., dict]
    """run_batch(index, probes, check=True) -> {dataset path: rows} of batch `index` (activations are views
    of `probes`' reusable buffers: copy them to keep them past the next batch on the same probes); with
    check=False the caller runs `check` on it before the rows are used."""
    probe_sets: list
    """`background.BUFFER_SETS` sets of (model probe, baseline probe): the recorder fills set
    i % BUFFER_SETS with batch i (live analysis uses sets 0 and 1)."""
    first: dict | None
    """Batch 0, run before anything was created (None when resuming)."""
    notes: list

    @property
    def n_batches(self) -> int:
        return -(-self.source.n_total // self.batch_size)

    def batch_rows(self, index: int) -> tuple[int, int]:
        """Prompts [lo, hi) of batch `index`."""
        return index * self.batch_size, min((index + 1) * self.batch_size, self.source.n_total)

    def check(self, index: int, data: dict) -> None:
        """Refuse batch `index` (`run_batch(..., check=False)`) when its activations or outputs are not finite."""
        lo, hi = self.batch_rows(index)
        _check_finite(data, self.source.where(index, lo, hi, self.batch_size))

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


def _check_positive(*named) -> None:
    """Refuse the first (flag, value) whose value is not a positive integer."""
    for name, value in named:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise UserError(f"{name} must be a positive integer, got {value!r}")


@contextmanager
def _prepare(model, spec, source, batch_size, resume, checkpoint_sha256, baseline, baseline_seed, outputs,
             device: torch.device) -> Iterator[RecordRun]:
    _check_positive(("--tasks", source.n_total), ("--batch-size", batch_size))
    if isinstance(source.seed, bool) or not isinstance(source.seed, (int, np.integer)) or source.seed < 0:
        raise UserError(f"--prompt-seed must be a non-negative integer, got {source.seed!r}")
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
    n_layers = 0 if foreign else own.n_layers  # 0: the analyzers count the recorded layers
    width = _reference_width(source)
    resid_layers = {n: int(n.split(".")[1]) for n in rules if n.startswith("blocks.") and n.endswith(".hook_resid_post")}
    readout = readout_modules(model, spec.roles) if foreign else []
    notes = [n for n in (_stochastic_note(model),) if n]
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

    def run_batch(index: int, probes: tuple[_Probe, _Probe | None], check: bool = True) -> dict:
        lo, hi = index * batch_size, min((index + 1) * batch_size, source.n_total)
        data = source.batch(index, lo, hi)
        x = _model_input(data, dtype)
        if x.is_floating_point() and not _all_finite(x):
            raise UserError(f"prompts {lo}..{hi - 1} contain NaN or Inf")
        x = x.to(device)
        result = {f"acts/{n}": None for n in rules}
        result.update(_forward(model, points, probes[0], x, hi - lo, width, keep_output, foreign))
        if base_model is not None:
            extra = _forward(base_model, points, probes[1], x, hi - lo, width, keep_output, foreign)
            result.update({f"baseline/{k}": v for k, v in extra.items()})
        for n in rules:
            result[f"acts/{n}"] = probes[0].buffers.batch(n, hi - lo)
            if base_model is not None:
                result[f"baseline/acts/{n}"] = probes[1].buffers.batch(n, hi - lo)
        devices.synchronize(device)  # the non-blocking copies into the buffers have landed
        if check:
            _check_finite(result, source.where(index, lo, hi, batch_size))  # a shard's: its place in the whole run
        return {**result, **data, "prompts/task_id": source.task_ids(lo, hi)}

    direct_ok: tuple[dict, dict] = ({}, {})  # per model, shared by its buffer sets (`_Buffers.direct_ok`)
    probe_sets = [(_Probe(_Buffers(rules, batch_size, device, direct_ok[0]), lens),
                   _Probe(_Buffers(rules, batch_size, device, direct_ok[1]), base_lens) if base_model is not None else None)
                  for _ in range(BUFFER_SETS)]  # host buffers are allocated when a set first copies
    with eval_mode(*models):
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
            **_identity(model, spec, source, batch_size, checkpoint_sha256),
            "layout": layout.to_dict() if layout is not None else None,
            "checkpoint_config": config.to_dict() if config else None, "n_layers": int(n_layers),
            "gamma": source.gamma,
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

    if not isinstance(shards, (int, np.integer)) or isinstance(shards, bool) or shards < 1:
        raise UserError(f"--shards must be a positive integer, got {shards!r}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked(sharding.lock_path(out), f"the recording {out}"):
        for stale in sharding.leftovers(out):  # of killed runs; no other run of `out` is alive now
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


_IDENTITY_KEYS = ("task_family", "model", "probe_spec", "checkpoint_sha256", "seed", "batch_size", "source_sha256",
                  "n_total")


def _identity(model, spec: ProbeSpec, source: PromptSource, batch_size: int, checkpoint_sha256: str) -> dict:
    """The identity attributes (`RecordingWriter.IDENTITY`) a run of `model` over `source` writes, as `_prepare`
    builds them: what a shard found complete on --resume must carry."""
    return {"task_family": source.task_family or "", "model": model_info(model), "probe_spec": spec.to_json(),
            "checkpoint_sha256": checkpoint_sha256, "seed": int(source.seed),
            "batch_size": int(min(batch_size, source.n_total)), "source_sha256": source.sha256,
            "n_total": int(source.n_total)}


def _record_sharded(model, out, spec, source, batch_size, resume, checkpoint_sha256, progress, baseline, baseline_seed,
                    outputs, device, count: int, workers) -> RecordSummary:
    """`record(shards=count)`: the shards (`shards.plan`) recorded in parallel, each by `_record_file`, then
    joined by the master file (`shards.write_master`)."""
    _check_positive(("--batch-size", batch_size), ("--tasks", source.n_total))
    batch_size = int(min(batch_size, source.n_total))
    parts = sharding.plan(out, source, batch_size, count, resume)
    target = devices.of(model) if device is None else devices.resolve(device)  # refused once, before any fork

    def one(i: int) -> dict:
        part = parts[i]
        if part.state == "done":  # a complete shard of another run (other weights, spec, prompts) is refused
            return sharding.check_done(part.path, part.meta, _identity(model, spec, part.source, batch_size,
                                                                       checkpoint_sha256), tuple(_IDENTITY_KEYS))
        s = _record_file(model, part.path, spec, part.source, batch_size, part.state == "resume", checkpoint_sha256,
                         False, baseline, baseline_seed, outputs, target, shard=part.meta)
        return {"n_prompts": s.n_prompts, "bytes": s.bytes_written, "resumed_from": s.resumed_from, "notes": s.notes,
                "hooks": {k: list(v) for k, v in s.hooks.items()}}

    # forked workers share one CPU model; CUDA cannot be used in a forked child, so a GPU records the
    # shards one after another (it is the bottleneck either way)
    workers = workers if target.type == "cpu" else 0
    paths = [part.path for part in parts]
    bar = tqdm(total=source.n_total, unit="prompt", desc=f"record {count} shards", disable=not progress)
    t0 = time.perf_counter()
    try:
        results = sharding.run(one, count, workers, [f"shard {i} ({p})" for i, p in enumerate(paths)],
                               progress=lambda r: bar.update(r["n_prompts"]))
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    sharding.write_master(out, paths)
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
    with eval_mode(model), torch.no_grad():
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

    def job(index: int, data: dict, attrs: dict, probes: tuple) -> Callable[[], None]:
        def write() -> None:
            run.check(index, data)  # a NaN refuses the batch before any of it is written
            _refuse_rewritten(probes, index)  # by the forward passes of later batches, while it waited
            writer.write_batch(data, attrs)
            _refuse_rewritten(probes, index)  # while it was written
            bar.update(next(iter(data.values())).shape[0])
        return write

    # The writer thread writes batch i (and checks it) while the forward passes of the next batches fill
    # the other buffer sets: BUFFER_SETS = DEPTH + 1, so a set is handed back before it is filled again.
    try:
        with threads.beside(1), BackgroundWriter(min(DEPTH, len(run.probe_sets) - 1)) as background:
            for index in batches:
                probes = run.probe_sets[index % len(run.probe_sets)]
                if index == 0 and run.first is not None:
                    # the writer's now: let go of it here, so its memory serves later batches
                    data, run.first = run.first, None
                else:
                    data = run.run_batch(index, probes, False)
                acts = [k for k in data if k.startswith(("acts/", "baseline/acts/"))]
                bytes_written += sum(data[k].nbytes for k in acts)
                background.put(job(index, data, {k: run.dataset_attrs(k) for k in acts}, probes))
    finally:
        bar.close()
    shapes = {n: shape for probes in reversed(run.probe_sets) for n, shape in probes[0].buffers.shapes.items()}
    return start_at, shapes, bytes_written, time.perf_counter() - t0


# ------------------------------------------------------------- one call
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


def summary_json(summary: RecordSummary) -> str:
    return json.dumps({"path": str(summary.path), "n_prompts": summary.n_prompts,
                       "hooks": {k: list(v) for k, v in summary.hooks.items()},
                       "bytes": summary.bytes_written, "seconds": summary.seconds})
