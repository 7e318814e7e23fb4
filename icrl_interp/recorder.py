"""Stream hooked activations of any torch model into an HDF5 recording.

`record()` runs a model over batches of prompts (sampled from a checkpoint's task
distribution, or supplied by the user), captures the hooks a probe spec names
into reusable buffers, and appends each batch to the recording together with
the prompts, per-task data and the reference algorithm's run on the same
prompts. Memory does not grow with the number of prompts.

What the prompts are (the checkpoint's task family: layout, sampler, reference algorithm) and what
model produced the activations (its family, architecture and class) are recorded separately
(`icrl_interp.recording`, schema 2); sampling and the reference go through the family registry.
"""
from __future__ import annotations

import datetime as _dt
import json
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from . import layouts, registry
from ._version import __version__
from .capture import capture, hook_names
from .errors import UserError
from .models.config import CheckpointConfig, ModelConfig
from .probe_spec import HookRule, ProbeSpec
from .recording import BF16, RecordingWriter

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

    def table(self) -> str:
        lines = [f"recording {self.path}", f"  prompts: {self.n_prompts}" + (f" (resumed at {self.resumed_from})" if self.resumed_from else "")]
        width = max((len(h) for h in self.hooks), default=10)
        for h, shape in self.hooks.items():
            lines.append(f"  {h:<{width}}  {tuple(shape)}")
        mb = self.bytes_written / 2**20
        rate = mb / self.seconds if self.seconds > 0 else float("inf")
        lines.append(f"  activations: {mb:.2f} MiB in {self.seconds:.2f} s ({rate:.1f} MiB/s, "
                     f"{(self.n_prompts - self.resumed_from) / max(self.seconds, 1e-9):.0f} prompts/s)")
        return "\n".join(lines)


class _Buffers:
    """One reusable numpy buffer per hook; the hook copies into it without allocating."""

    def __init__(self, rules: dict[str, HookRule], capacity: int):
        self.rules, self.capacity = rules, capacity
        self.arrays: dict[str, np.ndarray] = {}
        self.views: dict[str, torch.Tensor] = {}
        self.rows: dict[str, int] = {}
        self.source_dtype: dict[str, str] = {}

    def __call__(self, name: str, t: torch.Tensor) -> None:
        rule = self.rules[name]
        sl = rule.position_slice()
        if sl is not None:
            idx = [slice(None)] * t.ndim
            idx[rule.axis_for(name)] = sl
            t = t[tuple(idx)]
        t = t.detach()
        if name not in self.arrays:
            store = _TORCH_DTYPES[rule.dtype] if rule.dtype else t.dtype
            if not store.is_floating_point and t.is_floating_point():
                store = t.dtype
            np_dtype = np.int16 if store == torch.bfloat16 else torch.empty(0, dtype=store).numpy().dtype
            self.arrays[name] = np.empty((self.capacity, *t.shape[1:]), dtype=np_dtype)
            view = torch.from_numpy(self.arrays[name])
            self.views[name] = view.view(torch.bfloat16) if store == torch.bfloat16 else view
            self.source_dtype[name] = str(t.dtype).removeprefix("torch.")
        if tuple(t.shape[1:]) != self.arrays[name].shape[1:]:
            raise UserError(f"hook {name}: activation shape {tuple(t.shape[1:])} changed from {self.arrays[name].shape[1:]}")
        self.views[name][: t.shape[0]].copy_(t)
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

    def __post_init__(self):
        if self.arrays is None and self.config is None:
            raise UserError("a prompt source needs a checkpoint config to sample from, or prompt arrays")

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
        return {k: v[start:stop] for k, v in self.arrays.items()}


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


def _model_input(batch: dict[str, np.ndarray], dtype: torch.dtype) -> torch.Tensor:
    if "prompts/z" in batch:
        return torch.from_numpy(np.ascontiguousarray(batch["prompts/z"])).to(dtype)
    return torch.from_numpy(np.ascontiguousarray(batch["prompts/input"]))


def record(
    model: nn.Module,
    out,
    spec: ProbeSpec,
    source: PromptSource,
    batch_size: int = 128,
    resume: bool = False,
    checkpoint_sha256: str = "",
    progress: bool = True,
) -> RecordSummary:
    """Record `source.n_total` prompts through `model` into the HDF5 file `out`."""
    if batch_size < 1 or source.n_total < 1:
        raise UserError("--tasks and --batch-size must be positive")
    config = source.config
    params = dict(model.named_parameters())
    rules, param_names = spec.resolve(hook_names(model), params)
    layout = prompt_layout(model, config)
    info = model_info(model)
    own = getattr(model, "config", None)
    n_layers = own.n_layers if isinstance(own, ModelConfig) else 0  # 0: the analyzers count the recorded layers
    meta = {
        "task_family": source.task_family or "", "model": info,
        "layout": layout.to_dict() if layout is not None else None,
        "probe_spec": spec.to_json(), "checkpoint_config": config.to_dict() if config else None,
        "checkpoint_sha256": checkpoint_sha256, "n_layers": int(n_layers),
        "gamma": float(config.model.gamma) if config else float("nan"),
        "seed": int(source.seed), "batch_size": int(batch_size), "source_sha256": source.sha256,
        "versions": _versions(), "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "task_data": source.task_note,
    }
    writer = RecordingWriter(out, meta, resume=resume)
    try:
        start_at = writer.n_done
        if start_at % batch_size and start_at != source.n_total:
            raise UserError(f"cannot resume: {start_at} prompts done is not a whole number of batches of {batch_size}")
        writer.write_static("params", {n: params[n].detach().cpu().double().numpy() for n in param_names})
        # theta* of the checkpoint's model for the recorded parameter names (none match a foreign model's)
        writer.write_static("theta_star", config.theta_star(param_names) if config is not None else {})
        # Two buffer sets: the forward pass of batch i+1 fills one while a writer
        # thread streams batch i from the other (torch releases the GIL while it
        # computes, so the write hides behind the forward on a second core).
        buffer_sets = [_Buffers(rules, batch_size), _Buffers(rules, batch_size)]
        dtype = next(iter(params.values())).dtype if params else torch.float32
        bytes_written, t0 = 0, time.perf_counter()
        batches = range(start_at // batch_size, -(-source.n_total // batch_size))
        bar = tqdm(total=source.n_total, initial=start_at, unit="prompt", desc="record", disable=not progress)
        pending = None
        with ThreadPoolExecutor(max_workers=1) as pool:
            try:
                for index in batches:
                    buffers = buffer_sets[index % 2]
                    lo, hi = index * batch_size, min((index + 1) * batch_size, source.n_total)
                    data = source.batch(index, lo, hi)
                    x = _model_input(data, dtype)
                    if x.is_floating_point() and not torch.isfinite(x).all():
                        raise UserError(f"prompts {lo}..{hi - 1} contain NaN or Inf")
                    with torch.no_grad(), capture(model, list(rules), buffers):
                        model(x)
                    missing = [n for n in rules if buffers.rows.get(n) != hi - lo]
                    if missing:
                        raise UserError(f"hooks did not fire during the forward pass: {', '.join(missing)}")
                    buffers.rows.clear()
                    acts = {f"acts/{n}": buffers.arrays[n][: hi - lo] for n in rules}
                    bytes_written += sum(a.nbytes for a in acts.values())
                    if pending is not None:
                        pending.result()  # one write in flight at most; re-raises its error
                        bar.update(pending_rows)
                    pending = pool.submit(writer.write_batch, {**acts, **data}, {f"acts/{n}": buffers.attrs(n) for n in rules})
                    pending_rows = hi - lo
                if pending is not None:
                    pending.result()
                    bar.update(pending_rows)
            finally:
                if pending is not None:
                    wait([pending])  # never close the file under a running write
                bar.close()
        buffers = buffer_sets[0]
        seconds = time.perf_counter() - t0
        shapes = {n: buffers.arrays[n].shape[1:] for n in buffers.arrays} if buffers.arrays else {}
        path = writer.finish()
    except BaseException:
        writer.close()  # the .partial stays for --resume; the final path is never touched
        raise
    return RecordSummary(path, source.n_total, shapes, bytes_written, seconds, start_at)


# ------------------------------------------------------------- user prompts
_PROMPT_KEYS = {"z", "input", "state", "action", "reward"}
_TASK_KEYS = {"P", "r", "phi", "stationary", "values"}


def load_prompt_file(path, config: CheckpointConfig | None, layout: layouts.PromptLayout | None) -> PromptSource:
    """Read user prompts from .npz or .h5 (docs/formats.md: arrays z, state, action, reward, tasks_*).

    With a checkpoint config the prompts are taken to be its task family's, and that family's
    reference algorithm (any registered family that has one) is run on them."""
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
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read prompt file {path}: {e}") from None
    unknown = set(arrays) - _PROMPT_KEYS - {f"tasks_{k}" for k in _TASK_KEYS}
    if unknown:
        raise UserError(f"prompt file {path}: unknown arrays {', '.join(sorted(unknown))}")
    key = "z" if "z" in arrays else "input" if "input" in arrays else None
    if key is None:
        raise UserError(f"prompt file {path} has no 'z' array (prompts [N, pos, d_model])")
    main = arrays[key]
    N = main.shape[0]
    if key == "z":
        if main.ndim != 3:
            raise UserError(f"prompt file {path}: z has shape {main.shape}, expected [N, pos, d_model]")
        if layout is not None and main.shape[2] != layout.d_model:
            raise UserError(f"prompt file {path}: z has d_model {main.shape[2]}, the checkpoint's layout has {layout.d_model}")
        if not np.all(np.isfinite(main)):
            raise UserError(f"prompt file {path}: z contains NaN or Inf")
    for k, v in arrays.items():
        if v.shape[:1] != (N,):
            raise UserError(f"prompt file {path}: {k} has {v.shape[0] if v.ndim else 0} rows, z has {N}")
        if k in ("state", "action", "reward") and key == "z" and v.shape != main.shape[:2]:
            raise UserError(f"prompt file {path}: {k} has shape {v.shape}, expected {main.shape[:2]}")
    out = {f"prompts/{key}": main.astype(np.float64) if key == "z" else main}
    pos = main.shape[1] if main.ndim > 1 else 0
    for label, fill in (("state", -1), ("action", -1), ("reward", 0.0)):
        if key == "z":
            out[f"prompts/{label}"] = arrays.get(label, np.full((N, pos), fill, dtype=np.int64 if fill == -1 else np.float64))
    present = [k for k in _TASK_KEYS if f"tasks_{k}" in arrays]
    out.update({f"tasks/{k}": arrays[f"tasks_{k}"] for k in present})
    note = "present" if len(present) == len(_TASK_KEYS) else (
        "absent: the prompt file has no task arrays" if not present else f"partial: only {', '.join(sorted(present))}")
    family = registry.get(config.task.family) if config is not None else None
    if family is not None and family.reference is not None and key == "z":
        # the prompts are the task family's: its reference algorithm reads everything it needs off them
        task_layout = family.layout(config.model.d, config.model.m)
        if main.shape[2] != task_layout.d_model:
            raise UserError(f"prompt file {path}: z has d_model {main.shape[2]}, prompts of the {family.name} task "
                            f"have {task_layout.d_model}")
        ref = family.reference(out["prompts/z"], config.model, config.constants)
        out.update({f"reference/{k}": np.asarray(v) for k, v in ref.items()})
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return PromptSource(config=config, arrays=out, n_total=N, seed=0, task_note=note, sha256=digest)


def summary_json(summary: RecordSummary) -> str:
    return json.dumps({"path": str(summary.path), "n_prompts": summary.n_prompts,
                       "hooks": {k: list(v) for k, v in summary.hooks.items()},
                       "bytes": summary.bytes_written, "seconds": summary.seconds})
