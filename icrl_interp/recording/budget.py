"""What a run of a model over prompts costs, estimated before torch is imported.

`record` and `analyze --live` (and the Python calls behind them) run a model batch by batch over
sampled or given prompts. Before any of it starts, and before torch is imported so that a refusal is
instant, three costs are estimated, each refused in one line with the estimate and the limit
(docs/integrity.md, "Sizes are checked before any work"):

- memory per batch (`outputs.check_fits`, against this machine's memory): the batch's prompts, task
  data and reference run and, for the package's own models, their recorded activations and one
  layer's working set (an attention pattern is positions x positions, per layer and prompt). A user's
  model's activations are not known until it runs;
- disk (`outputs.check_disk`, when a recording is written): every prompt's data and activations,
  against the free space of the output's filesystem. After the first batch the recorder checks again
  with the exact bytes of that batch (`recorder.check_disk`), which covers a user's model too;
- work (`check_work`, sampled prompts): sampling the prompts alone, timed on one batch here, must take
  less than MAX_WORK_DAYS; the forward passes only add to it.
"""
from __future__ import annotations

import math
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import UserError
from ..core.outputs import check_disk, check_fits
from .background import BUFFER_SETS

MAX_WORK_DAYS = 7
"""The longest run (in days of sampling alone) started without a refusal."""
SAMPLED = 256
"""Prompts sampled to time the sampler and weigh a prompt (a batch of them, when batches are smaller)."""


@dataclass(frozen=True)
class PerPrompt:
    """Bytes one prompt costs."""

    data: int
    """Its prompt, task data and reference run (what the sampler makes, and the recording keeps)."""
    recorded: int
    """The activations recorded of one model (0: not known before the model runs)."""
    working: int
    """What one layer of the forward pass holds besides (attention scores and pattern, its streams)."""


def per_prompt(config, pos: int, d_model: int, own_model: bool) -> PerPrompt:
    """An upper estimate for prompts of `pos` positions of width `d_model` of the task of `config` (a
    CheckpointConfig; None: prompts of no task), run through the package's model of `config` when
    `own_model` (its float32/64 streams of width D, one attention head per layer)."""
    data = 8 * pos * d_model * 2  # the prompt, and its copy in the model's dtype
    if config is not None:
        task = config.task
        states = task.n_states * max(task.n_actions, 1)
        data += 8 * (states * states + states * config.model.d + states)  # P, phi, r / values
    if config is None or not own_model:
        return PerPrompt(data, 0, 0)
    model = config.model
    item = 8 if model.dtype == "float64" else 4
    rows = _pattern_rows(model.family_entry, pos)
    recorded = item * model.n_layers * (rows * pos + 2 * pos * model.D)  # pattern rows, residual stream, values
    working = item * (2 * pos * pos + 4 * pos * model.D)  # scores and pattern, streams in and out
    return PerPrompt(data, recorded, working)


def _pattern_rows(family, pos: int) -> int:
    """Query rows of the attention pattern that the family's shipped spec records of its own models (all pos
    of them for a family that names no spec). `family`: the registry entry the config already resolved (not
    looked up again)."""
    if family.probe_spec is None:
        return pos
    if family.name not in _SHIPPED:
        from .probe_spec import shipped_spec

        _SHIPPED[family.name] = shipped_spec(family)
    return _SHIPPED[family.name].pattern_rows(pos)


_SHIPPED: dict = {}
"""Family name -> its shipped probe spec, read once per process."""


def batch_bytes(cost: PerPrompt, batch: int, models: int, batches: int) -> int:
    """Memory one batch holds: its data, the recorded activations of each model (the model, its random-init
    copy) in the recorder's buffer sets (`background.BUFFER_SETS`; at most one per batch), and one layer's
    working set."""
    return batch * (cost.data + models * min(BUFFER_SETS, batches) * cost.recorded + cost.working)


def check_memory(cost_of: Callable[[int], PerPrompt], pos: int, tasks: int, batch_size: int, models: int,
                 pos_flag: str | None = None, batch_flag: str = "--batch-size") -> None:
    """Refuse a batch that does not fit in memory (`outputs.check_fits`); `cost_of(pos)` is the cost of a
    prompt of `pos` positions, `pos_flag` names where a prompt's length comes from (a prompt file) and
    `batch_flag` the size of a batch (--tasks, for a command that holds all its prompts at once)."""
    batch = min(batch_size, tasks)

    def estimate(s: dict) -> int:
        b = s["batch_size"]
        return batch_bytes(cost_of(s.get("pos", pos)), b, models, -(-tasks // b))

    sizes, flags = {"batch_size": batch}, {"batch_size": batch_flag}
    if pos_flag is not None:
        sizes["pos"], flags["pos"] = pos, pos_flag
    what = "one batch" + (" of the model and its random-init copy" if models == 2 else "")
    check_fits(estimate, sizes, flags, f"{what} (prompts, task data, activations, attention patterns)")


def check_work(tasks: int, rate: float, flag: str) -> None:
    """Refuse `tasks` prompts whose sampling alone, at `rate` prompts per second, takes over MAX_WORK_DAYS."""
    days = tasks / rate / 86400
    if days > MAX_WORK_DAYS:
        raise UserError(f"{flag} {tasks} would take ~{days:.3g} days to sample alone (~{rate:.3g} prompts/s "
                        f"here); the limit is {MAX_WORK_DAYS} days of work: at most {flag} "
                        f"{int(rate * 86400 * MAX_WORK_DAYS)}")


def prompt_file_shape(path) -> tuple[int, ...] | None:
    """The shape of a prompt file's `z` (or `input`), read from its header without loading it; None when
    it cannot be read (loading the file says what is wrong)."""
    path = Path(path)
    try:
        if path.suffix == ".npz":
            with zipfile.ZipFile(path) as zf:
                names = [n for n in ("z.npy", "input.npy") if n in zf.namelist()]
                if not names:
                    return None
                with zf.open(names[0]) as f:
                    version = np.lib.format.read_magic(f)
                    header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                              else np.lib.format.read_array_header_2_0)
                    return tuple(int(n) for n in header(f)[0])
        if path.suffix in (".h5", ".hdf5"):
            import h5py

            with h5py.File(path, "r") as f:
                key = "z" if "z" in f else "input" if "input" in f else None
                return None if key is None else tuple(int(n) for n in f[key].shape)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None
    return None


def check_run(config, *, tasks: int, batch_size: int, baseline: bool, own_model: bool, prompts=None, out=None,
              batch_flag: str = "--batch-size") -> None:
    """Memory per batch, disk (when `out` is written) and work of running a model over `tasks` prompts
    sampled from the task of `config` (a CheckpointConfig), or over the prompt file `prompts`; the
    package's model of `config` when `own_model`, else a user's. Sizes that are not positive integers are
    left to the run's own checks."""
    models = 2 if baseline else 1
    if prompts is not None:
        shape = prompt_file_shape(prompts)
        if shape is None or len(shape) != 3 or min(shape) < 1:
            return  # loading the file refuses it, naming the problem
        tasks, pos, d_model = shape
        what = f"--prompts {prompts} ({tasks} prompts)"
    else:
        pos, d_model = config.task.n + 1, config.model.D
        what = f"--tasks {tasks}"
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in (tasks, batch_size)):
        return
    cost_of = lambda p: per_prompt(config, p, d_model, own_model)  # noqa: E731
    check_memory(cost_of, pos, tasks, batch_size, models, "a prompt length (--prompts) of" if prompts else None,
                 batch_flag)
    cost, rate = cost_of(pos), None
    if prompts is None:  # one batch sampled (256 prompts at most): its exact bytes, and how fast the sampler runs
        batch = min(batch_size, tasks, SAMPLED)
        t0 = time.perf_counter()
        sample = config.sample(batch, np.random.default_rng(0))
        rate = batch / max(time.perf_counter() - t0, 1e-9)
        arrays = [sample.prompt.z, sample.prompt.states, sample.prompt.actions, sample.prompt.rewards,
                  *sample.tasks.values(), *sample.reference.values()]
        cost = PerPrompt(math.ceil(sum(np.asarray(a).nbytes for a in arrays) / batch), cost.recorded, cost.working)
    if out is not None:
        check_disk(tasks * (cost.data + models * cost.recorded), out, f"{what} would write")
    if rate is not None:
        check_work(tasks, rate, "--tasks")
