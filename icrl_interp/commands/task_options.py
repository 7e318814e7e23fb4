"""Task flags shared by the commands that run a user's model on a family's task (`record`, `causal`):
`--task FAMILY` plus the family's construct options (`icrl-interp construct FAMILY --help`)."""
from __future__ import annotations

import argparse
import dataclasses


def add(p: argparse.ArgumentParser) -> None:
    """--model, --weights, --task and the union of every family's construct options (a flag a family
    lacks is refused once the family is known)."""
    from .. import registry
    from ..cli_fields import add_fields

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


def add_prompts(p: argparse._ActionsContainer, seed_flag: str = "--seed") -> None:
    """How a model is run on its task (`record`, `analyze --live`): probe spec, prompts, batches, baseline.
    `seed_flag` names the sampler's seed (`analyze` keeps --seed for its task split)."""
    p.add_argument("--probe", help="probe spec TOML (default: the model family's spec in probes/, or the "
                   "TransformerLens spec; your own module needs one with [roles])")
    p.add_argument("--tasks", type=int, default=512, help="number of prompts (one task each) to sample")
    p.add_argument("--batch-size", type=int, default=128, help="prompts per forward pass")
    p.add_argument(seed_flag, dest="prompt_seed", type=int, default=0, help="seed of the task sampler")
    p.add_argument("--prompts", help="run on these prompts (.npz or .h5 with z [N, pos, d_model]; may carry "
                   "task_id, gamma, tasks_* and reference_* arrays) instead of sampling")
    p.add_argument("--baseline", choices=("random-init", "none"), default="random-init",
                   help="also run the same architecture at random initialization on the same prompts, "
                   "the probes' baseline (default: random-init)")


def values(args) -> dict:
    """The task options the user gave, checked against the chosen family's."""
    from ..cli_fields import given
    from ..errors import UserError

    every = sorted({n for names in args._task_fields.values() for n in names})
    chosen = given(args, every)
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


def model_and_task(args):
    """(model, task config, source) from `CHECKPOINT` or `--model ... --task FAMILY [task options]`."""
    from .. import checkpoint
    from ..construct import task_config
    from ..errors import UserError

    options = values(args)
    if args.model is None:
        if args.checkpoint is None:
            raise UserError("give a checkpoint directory, or --model FILE.py:FUNC with --task FAMILY")
        if args.task is not None or args.weights is not None:
            raise UserError("--task and --weights go with --model; a checkpoint brings its own task and weights")
        return checkpoint.load(args.checkpoint), checkpoint.read(args.checkpoint)[0], str(args.checkpoint)
    from ..models import user

    if args.checkpoint is not None:
        raise UserError(f"give either a checkpoint ({args.checkpoint}) or --model, not both")
    if args.task is None:
        raise UserError("--model needs --task FAMILY: the task whose prompts the model reads")
    config = task_config(args.task, options)  # checks the task options before the user's code runs
    return user.load(args.model, args.weights), config, args.model
