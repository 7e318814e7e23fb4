"""Task flags shared by the commands that run a user's model on a family's task (`record`, `causal`):
`--task FAMILY` plus the family's construct options (`icrl-interp construct FAMILY --help`)."""
from __future__ import annotations

import argparse
import dataclasses


def add(p: argparse.ArgumentParser) -> None:
    """--model, --weights, --task and the union of every family's construct options (a flag a family
    lacks is refused once the family is known)."""
    from ..families import registry
    from ..core.cli_fields import add_fields

    p.add_argument("--model", metavar="FILE.py:FUNC", help="your own model: FUNC() returns a torch.nn.Module taking the "
                   "task's prompts z[batch, pos, d_model] (FILE.py:FUNC or package.module:FUNC; docs/byom.md)")
    p.add_argument("--weights", metavar="W.safetensors", help="state dict loaded strictly into --model")
    names = registry.where(lambda f: f.construct is not None)
    p.add_argument("--task", choices=names, help="the family whose task --model is recorded on")
    group = p.add_argument_group("task options (with --task; as in `icrl-interp construct FAMILY`)")
    seen: set[str] = set()
    fields: dict[str, list[str]] = {}
    for name in names:
        cls = registry.get(name).construct
        fields[name] = [f.name for f in dataclasses.fields(cls)]
        fresh = tuple(f.name for f in dataclasses.fields(cls) if f.name in seen)
        seen.update(add_fields(group, cls, skip=fresh))
    p.set_defaults(_task_fields=fields)


class Noted(argparse.Action):
    """Store the value and note the flag as given (`given_flags`): an option with a real default can still
    be told apart from one the user typed, so a command can refuse an option it would ignore."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace._noted = {**getattr(namespace, "_noted", {}), self.dest: option_string}


def given_flags(args, dests) -> list[str]:
    """The flags (as typed) of the `Noted` options among `dests` that the user gave, in `dests` order."""
    noted = getattr(args, "_noted", {})
    return [noted[d] for d in dests if d in noted]


PROMPT_OPTIONS = ("probe", "tasks", "batch_size", "prompt_seed", "prompts", "baseline")
"""Dests of `add_prompts`: how a model is run on prompts (meaningless for an input that is not run)."""


def add_prompts(p: argparse._ActionsContainer, seed_flag: str = "--seed") -> None:
    """How a model is run on its task (`record`, `analyze --live`): probe spec, prompts, batches, baseline.
    `seed_flag` names the sampler's seed (`analyze` keeps --seed for its task split)."""
    p.add_argument("--probe", action=Noted, help="probe spec TOML (default: the model family's spec in probes/, "
                   "or the TransformerLens spec; your own module needs one with [roles])")
    p.add_argument("--tasks", action=Noted, type=int, default=512, help="number of prompts (one task each) to sample")
    p.add_argument("--batch-size", action=Noted, type=int, default=128, help="prompts per forward pass")
    p.add_argument(seed_flag, dest="prompt_seed", action=Noted, type=int, default=0, help="seed of the task sampler")
    p.add_argument("--prompts", action=Noted, help="run on these prompts (.npz or .h5 with z [N, pos, d_model]; "
                   "may carry task_id, gamma, tasks_* and reference_* arrays) instead of sampling")
    p.add_argument("--baseline", action=Noted, choices=("random-init", "none"), default="random-init",
                   help="also run the same architecture at random initialization on the same prompts, "
                   "the probes' baseline (default: random-init)")


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
    from ..models import checkpoint
    from ..models.construct import task_config
    from ..core.errors import UserError

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


def check_sizes(args, ckpt: str | None, out=None, held: bool = False) -> None:
    """Memory per batch, disk (`out`: the recording written) and work of the run `add_prompts` describes,
    refused before torch is imported and before the model is loaded (`icrl_interp.recording.budget`). `held`: the
    command holds every prompt at once (`causal`): their data is one batch. Inputs that do not make a task
    are left to `model_and_task`, which names what is wrong with them."""
    from ..recording import budget
    from ..models import checkpoint
    from ..models.construct import task_config

    if args.model is not None and args.task is not None and ckpt is None:
        config, own_model = task_config(args.task, values(args)), False
    elif args.model is None and ckpt is not None and args.task is None:
        config, own_model = checkpoint.read(ckpt)[0], True
    else:
        return
    budget.check_run(config, tasks=args.tasks, batch_size=args.tasks if held else args.batch_size,
                     baseline=args.baseline != "none" and not held, own_model=own_model and not held,
                     prompts=getattr(args, "prompts", None), out=out, batch_flag="--tasks" if held else "--batch-size")
