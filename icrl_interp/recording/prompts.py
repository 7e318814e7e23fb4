"""Where a recording's prompts come from: sampled batch by batch from a task family (`PromptSource` with
a checkpoint config), or read from a user's prompt file (`load_prompt_file`, docs/formats.md "Prompt
files"). Needs no torch: the recorder turns the arrays into the model's input.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from ..core.errors import UserError
from ..families import registry
from ..models.config import CheckpointConfig
from ..tasks import layouts


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
            family = self.config.task_family_entry  # resolved once, with the config
            pb = family.sample(self.config, self.config.task, stop - start, np.random.default_rng([self.seed, index]))
            out = {"prompts/z": pb.prompt.z, "prompts/state": pb.prompt.states, "prompts/action": pb.prompt.actions,
                   "prompts/reward": pb.prompt.rewards}
            out.update({f"tasks/{k}": v for k, v in pb.tasks.items()})
            out.update({f"reference/{k}": v for k, v in pb.reference.items()})
            return out
        return {k: v[start:stop] for k, v in self.arrays.items() if k != "prompts/task_id"}

    def where(self, index: int, start: int, stop: int, batch_size: int) -> str:
        """Batch `index` (prompts start..stop-1 of this source) in messages: its place in the whole run."""
        return f"batch {index + 1} of {-(-self.n_total // batch_size)} (prompts {start}..{stop - 1})"


# ------------------------------------------------------------- prompt files
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
