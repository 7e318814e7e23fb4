"""The checkpoint format: a directory with `model.safetensors` and `config.json`, nothing pickled.

`read` uses only json + safetensors.numpy (no torch, no transformer_lens), so
analyzers can open checkpoints cheaply; `load` builds the torch model. Every
loader path validates the whole checkpoint and raises `UserError` naming the
problem; no byte of a foreign file is ever unpickled or executed.
See docs/formats.md, section Checkpoints, for the field-by-field contract.
"""
from __future__ import annotations

import hashlib
import json
import numbers
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .._version import __version__
from ..core.errors import UserError, one_line
from ..core.files import atomic_dir
from ..families import registry
from ..tasks.sampling import TaskSpec
from .config import FORMAT_VERSION, CheckpointConfig, ModelConfig, check_meta

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
_MAX_HEADER = 100 * 2**20
_SAFETENSORS_DTYPES = {"F32": "float32", "F64": "float64"}
_PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")


# ------------------------------------------------------------------ config
def make_config(model_config: ModelConfig, extras: Mapping | None = None, origin: dict | None = None) -> CheckpointConfig:
    """The checkpoint config of a model config plus task / origin / seed / n / training (other keys kept).

    `task` may omit `family` (the model's family is used) and `n` may be given beside it.
    """
    extras = dict(extras or {})
    fields = model_config.to_dict()
    for key in ModelConfig.field_names():
        if key in extras and extras[key] != fields[key]:
            raise UserError(f"extras say {key} = {extras[key]!r} but the model has {key} = {fields[key]!r}")
    family = registry.get(model_config.family)
    task = extras.get("task")
    if task is not None and not isinstance(task, Mapping):
        raise UserError(f"task must be an object or None, got {task!r}")
    task = dict(task or {})
    n = extras.get("n")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise UserError(f"n must be a positive integer or None, got {n!r}")
        if task.get("n", n) != n:
            raise UserError(f"extras say n = {n} but the task has n = {task['n']}")
        task["n"] = int(n)
    check_meta({"origin": extras.get("origin") or origin or {"kind": "unknown"}, "training": extras.get("training"),
                 "seed": extras.get("seed")})
    skip = set(ModelConfig.field_names()) | {"task", "n", "origin", "seed", "training", "format_version",
                                             "package_version", "model", "D", "layout", "architecture"}
    return CheckpointConfig(
        model=model_config, task=TaskSpec.from_dict(task, model_config.family, family.task_kind),
        origin=extras.get("origin") or origin or {"kind": "unknown"}, training=extras.get("training"),
        seed=extras.get("seed"), package_version=__version__,
        extra={k: v for k, v in extras.items() if k not in skip})


def validate_config(config) -> CheckpointConfig:
    """Parse and check a config.json object (format 1 or 2)."""
    return CheckpointConfig.from_dict(config)


def validate_tensors(model_config: ModelConfig, tensors: Mapping[str, np.ndarray]) -> None:
    """Names, shapes, dtype and finiteness of the weights against the config."""
    expected = model_config.parameter_shapes()
    missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing:
        raise UserError(f"checkpoint is missing tensors {', '.join(missing)} (a {model_config.family} model"
                        f"{' with tied weights' if model_config.tied else ''} has {', '.join(expected)})")
    if extra:
        raise UserError(f"checkpoint has unexpected tensors {', '.join(extra)} (a {model_config.family} model"
                        f"{' with tied weights' if model_config.tied else ''} has {', '.join(expected)})")
    for name, shape in expected.items():
        array = tensors[name]
        if tuple(array.shape) != shape:
            raise UserError(f"tensor {name} has shape {tuple(array.shape)}, but the config (D = {model_config.D}) needs {shape}")
        if str(array.dtype) != model_config.dtype:
            raise UserError(f"tensor {name} is {array.dtype}, but the config says dtype {model_config.dtype}")
        if not np.all(np.isfinite(array)):
            raise UserError(f"tensor {name} contains NaN or Inf")


# -------------------------------------------------------------------- save
def _as_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor; no torch import needed here
        value = value.detach().cpu().numpy()
    return np.ascontiguousarray(value)


def save(model_or_state, extras: Mapping | CheckpointConfig | None, out_dir, *, overwrite: bool = False) -> Path:
    """Write `out_dir/{model.safetensors, config.json}` atomically (temp dir, then rename).

    model_or_state: a model (has `.config`), or a {name: array/tensor} state whose
    model fields (family, d, n_layers, ...) come from `extras`. extras: a CheckpointConfig,
    or a dict with n, task, origin, seed, training (and any further keys, kept verbatim).
    The result is validated with the same rules as `read` before anything is written.
    """
    if hasattr(model_or_state, "config") and hasattr(model_or_state, "named_parameters"):
        model_config = model_or_state.config
        tensors = {name: _as_numpy(p) for name, p in model_or_state.named_parameters()}
        origin = getattr(model_or_state, "origin", None)
    elif isinstance(model_or_state, Mapping) and isinstance(extras, CheckpointConfig):
        model_config, origin = extras.model, None
        tensors = {str(name): _as_numpy(v) for name, v in model_or_state.items()}
    elif isinstance(model_or_state, Mapping):
        fields = {k: v for k, v in (extras or {}).items() if k in ModelConfig.field_names()}
        if "family" not in fields or "d" not in fields:
            raise UserError("saving a dict of tensors needs the model fields (family, d, n_layers, ...) in extras")
        model_config = ModelConfig.from_dict(fields)
        tensors = {str(name): _as_numpy(v) for name, v in model_or_state.items()}
        origin = None
    else:
        if hasattr(model_or_state, "named_parameters"):  # a torch module, but not one of the package's models
            raise UserError(f"cannot save a {type(model_or_state).__name__} as a checkpoint: it has no .config (it is "
                            f"not one of the package's models); save your module's weights with "
                            f"safetensors.torch.save_file(model.state_dict(), path) and record it with --model "
                            f"(docs/byom.md)")
        raise UserError(f"cannot save a {type(model_or_state).__name__}: pass one of the package's models or a dict "
                        f"of tensors")
    if isinstance(extras, CheckpointConfig):
        if extras.model != model_config:
            raise UserError("the CheckpointConfig's model differs from the model being saved")
        config = extras
    else:
        config = make_config(model_config, extras, origin)
    validate_tensors(model_config, tensors)
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise UserError(f"{out} already exists (pass --force or overwrite=True to replace it)")
    from safetensors.numpy import save_file

    with atomic_dir(out) as tmp:
        # one metadata key only: safetensors writes a map's keys in random order, and the
        # bytes must be reproducible for sha256
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": f"icrl_interp.checkpoint/{FORMAT_VERSION}"})
        (tmp / CONFIG).write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    return out


# -------------------------------------------------------------------- read
def _magic(path: Path) -> str:
    """What a non-checkpoint file looks like, for the error message ('' if nothing known)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return ""
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "a Python pickle"
    if head.startswith(b"PK\x03\x04"):
        return "a zip archive (torch.save format, which holds pickles)"
    return ""


def _refuse_foreign(path: Path, what: str) -> None:
    kind = _magic(path)
    if kind:
        raise UserError(f"{path} is {kind}, not {what}; pickled weights are never loaded (unpickling can run code), "
                        "convert them to safetensors")


def _check_safetensors(path: Path) -> None:
    """Validate the safetensors framing (header length, JSON header, data size) before parsing."""
    _refuse_foreign(path, "a safetensors file")
    size = path.stat().st_size
    if size < 8:
        raise UserError(f"{path} is truncated ({size} bytes; a safetensors file starts with an 8-byte header length)")
    with open(path, "rb") as f:
        n_header = int.from_bytes(f.read(8), "little")
        if n_header > min(size - 8, _MAX_HEADER):
            raise UserError(f"{path} is truncated or not a safetensors file (header length {n_header}, file size {size})")
        try:
            header = json.loads(f.read(n_header))
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deeply
            raise UserError(f"{path} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise UserError(f"{path} is not a safetensors file (its header is not a JSON object)")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, offsets = info["dtype"], info["data_offsets"]
            end = max(end, int(offsets[1]))
        except (TypeError, KeyError, IndexError, ValueError):
            raise UserError(f"{path}: malformed safetensors entry for {name!r}") from None
        if not isinstance(dtype, str) or dtype not in _SAFETENSORS_DTYPES:
            raise UserError(f"{path}: tensor {name} has dtype {dtype}; checkpoints hold float32 or float64 only")
    if 8 + n_header + end != size:
        raise UserError(f"{path} is truncated or padded: its header promises {end} data bytes, "
                        f"the file holds {size - 8 - n_header}")


def read(path) -> tuple[CheckpointConfig, dict[str, np.ndarray]]:
    """(config, {name: numpy array}) of a checkpoint directory, fully validated; never imports torch."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"checkpoint {path} does not exist")
    if not path.is_dir():
        _refuse_foreign(path, "a checkpoint directory")
        raise UserError(f"{path} is a file, not a checkpoint directory (expected a directory with {WEIGHTS} and {CONFIG})")
    weights, config_path = path / WEIGHTS, path / CONFIG
    if not weights.is_file():
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in _PICKLE_SUFFIXES)
        hint = f" (found {', '.join(pickles)}: pickled weights are never loaded, convert them to safetensors)" if pickles else ""
        raise UserError(f"{path} is not a checkpoint: no {WEIGHTS}{hint}")
    if not config_path.is_file():
        raise UserError(f"{path} is not a checkpoint: no {CONFIG}")
    try:
        config = json.loads(config_path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{config_path} is not valid JSON ({e})") from None
    except RecursionError:
        raise UserError(f"{config_path} is not a checkpoint config (JSON nested too deeply)") from None
    except OSError as e:
        raise UserError(f"{config_path} cannot be read ({e.strerror or e})") from None
    config = validate_config(config)
    model_config = config.model
    _check_safetensors(weights)
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(weights))
    except Exception as e:  # the framing was checked; anything left is a corrupt file
        raise UserError(f"{weights} could not be read as safetensors: {one_line(e)}") from None
    validate_tensors(model_config, tensors)
    return config, tensors


def load(path):
    """The model stored in a checkpoint directory (its `origin` and `checkpoint_config` attached)."""
    config, tensors = read(path)
    from .build import empty_model

    model = empty_model(config.model)
    model.load_arrays(tensors)
    model.origin = dict(config.origin)
    model.checkpoint_config = config
    return model


def sha256(path) -> str:
    """SHA-256 over (name, size, bytes) of config.json then model.safetensors.

    Same scheme as the report's content hash, so the two agree on a directory that
    holds just these two files.
    """
    path = Path(path)
    h = hashlib.sha256()
    for name in sorted((CONFIG, WEIGHTS)):
        file = path / name
        if not file.is_file():
            raise UserError(f"{path} is not a checkpoint: no {name}")
        h.update(f"{name}\0{file.stat().st_size}\0".encode())
        with open(file, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    return h.hexdigest()
