"""Flags of the commands that run a model on prompts (`record`, `analyze --live`, `causal`, `verdict`): your
own model and the task it runs on (`UserModel`, plus `--task FAMILY`'s construct options:
`icrl-interp construct FAMILY --help`), and how it is run (`Prompts`)."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

from ..core.cli_fields import add_fields


def _task_families() -> list[str]:
    from ..families import registry

    return registry.where(lambda f: f.construct is not None)


@dataclass
class UserModel:
    """Your own model and the family whose task it runs on (docs/byom.md)."""

    model: str | None = field(default=None, metadata={"metavar": "FILE.py:FUNC"})
    """Your own model: FUNC() returns a torch.nn.Module taking the task's prompts z[batch, pos, d_model]
    (FILE.py:FUNC or package.module:FUNC; docs/byom.md)."""
    weights: str | None = field(default=None, metadata={"metavar": "W.safetensors"})
    """State dict loaded strictly into --model."""
    task: str | None = field(default=None, metadata={"choices": _task_families})
    """The family whose task --model runs on (its task options below, as in `icrl-interp construct FAMILY`)."""


@dataclass
class Prompts:
    """How a model is run on its task: probe spec, prompts, batches, baseline."""

    probe: str | None = field(default=None, metadata={"metavar": "SPEC.toml"})
    """Probe spec TOML (default: the model family's spec in probes/, or the TransformerLens spec; your own
    module needs one with [roles])."""
    tasks: int = 512
    """Number of tasks sampled, one prompt each."""
    batch_size: int = 128
    """Prompts per forward pass."""
    prompt_seed: int = 0
    """Seed of the task sampler: which tasks are drawn and the trajectories of their prompts."""
    prompts: str | None = field(default=None, metadata={"metavar": "FILE"})
    """Run on these prompts (.npz or .h5 with z [N, pos, d_model]; may carry task_id, gamma, tasks_* and
    reference_* arrays) instead of sampling."""
    baseline: str = field(default="random-init", metadata={"choices": ("random-init", "none")})
    """Also run the same architecture at random initialization on the same prompts, the probes' baseline
    (random-init), or not (none)."""


def add(p: argparse.ArgumentParser) -> None:
    """`UserModel`'s flags and the union of every family's construct options (a flag a family lacks is
    refused once the family is known)."""
    from ..families import registry

    add_fields(p.add_argument_group("your own model (docs/byom.md)"), UserModel)
    group = p.add_argument_group("task options (with --task; as in `icrl-interp construct FAMILY`)")
    seen: set[str] = set()
    fields: dict[str, list[str]] = {}
    for name in _task_families():
        cls = registry.get(name).construct
        fields[name] = [f.name for f in dataclasses.fields(cls)]
        fresh = tuple(f.name for f in dataclasses.fields(cls) if f.name in seen)
        seen.update(add_fields(group, cls, skip=fresh))
    p.set_defaults(_task_fields=fields)


def _given_options(args) -> dict:
    """The task options the user gave, of any family."""
    from ..core.cli_fields import given

    return given(args, sorted({n for names in args._task_fields.values() for n in names}))


def task_flags(args) -> list[str]:
    """--task and the task options the user gave (flags, for a message)."""
    return ["--task"] * (args.task is not None) + [f"--{k.replace('_', '-')}" for k in _given_options(args)]


def values(args) -> dict:
    """The task options the user gave, checked against the chosen family's."""
    from ..core.errors import UserError

    chosen = _given_options(args)
    if args.task is None:
        if chosen:
            raise UserError(f"--{next(iter(chosen)).replace('_', '-')} is a task option: give --task FAMILY with it")
        return {}
    own = set(args._task_fields[args.task])
    foreign = sorted(set(chosen) - own)
    if foreign:
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in foreign)
        raise UserError(f"{flags}: not an option of the {args.task} task (its options: "
                        f"{', '.join('--' + k.replace('_', '-') for k in sorted(own))})")
    return chosen


def input_files(args) -> list[str]:
    """Every file or directory the command reads (an output may be none of them)."""
    model_file = None
    if args.model and ":" in args.model:
        target = args.model.rpartition(":")[0]
        model_file = target if target.endswith(".py") else None
    names = ("checkpoint", "probe", "prompts", "weights")
    return [v for v in [*(getattr(args, n, None) for n in names), model_file] if v]


def model_and_task(args, ckpt: str | None):
    """(model, task config, source) from the checkpoint directory `ckpt` or `--model ... --task FAMILY [task
    options]`. The checkpoint is an argument, not read from `args`: each command names its own (a positional
    of record and causal, verdict's SOURCE when it is a directory, none for analyze --live --model)."""
    from ..core.errors import UserError
    from ..models import checkpoint
    from ..models.construct import task_config

    options = values(args)
    if args.model is None:
        if ckpt is None:
            raise UserError("give a checkpoint directory, or --model FILE.py:FUNC with --task FAMILY")
        if args.task is not None or args.weights is not None:
            raise UserError("--task and --weights go with --model; a checkpoint brings its own task and weights")
        return checkpoint.load(ckpt), checkpoint.read(ckpt)[0], str(ckpt)
    from ..models import user

    if ckpt is not None:
        raise UserError(f"give either a checkpoint ({ckpt}) or --model, not both")
    if args.task is None:
        raise UserError("--model needs --task FAMILY: the task whose prompts the model reads")
    config = task_config(args.task, options)  # checks the task options before the user's code runs
    return user.load(args.model, args.weights), config, args.model


def check_sizes(args, run: Prompts, ckpt: str | None, out=None, held: bool = False) -> None:
    """Memory per batch, disk (`out`: the recording written) and work of the run `run` describes, refused
    before torch is imported and before the model is loaded (`icrl_interp.recording.budget`). `held`: the
    command holds every prompt at once (`causal`): their data is one batch. Inputs that do not make a task
    are left to `model_and_task`, which names what is wrong with them."""
    from ..models import checkpoint
    from ..models.construct import task_config
    from ..recording import budget

    if args.model is not None and args.task is not None and ckpt is None:
        config, own_model = task_config(args.task, values(args)), False
    elif args.model is None and ckpt is not None and args.task is None:
        config, own_model = checkpoint.read(ckpt)[0], True
    else:
        return
    budget.check_run(config, tasks=run.tasks, batch_size=run.tasks if held else run.batch_size,
                     baseline=run.baseline != "none" and not held, own_model=own_model and not held,
                     prompts=run.prompts, out=out, batch_flag="--tasks" if held else "--batch-size")
