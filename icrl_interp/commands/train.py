"""`icrl-interp train FAMILY --out RUN_DIR`: pretrain a model (resumes if RUN_DIR holds the same run).

One sub-command per family with a training recipe (`icrl_interp.train.recipe`); its flags are the
fields of the family's TrainConfig (help = the field docstrings, `cli_fields.add_fields`) plus the
general flags below, so a flag of another family is refused by argparse (abbreviated flags are not
accepted, so one family's flag can never be taken for a prefix of another field's). A family's flags are added
when its sub-command is used (or its --help shown): building the CLI imports no torch.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field

from ..core import devices, vocabulary
from ..core.cli_fields import add_fields, given, parsed

SKIP = ("family",)
"""Config fields that are not flags (the family is the sub-command)."""


@dataclass
class TrainRun:
    """Where a run goes and how it runs (the run itself: the family's TrainConfig)."""

    out: str = field(metadata={"metavar": "RUN_DIR"})
    """Run directory (resumed if it holds the same config)."""
    config: str | None = field(default=None, metadata={"metavar": "CONFIG.json"})
    """JSON file with config fields (flags override it)."""
    progress: bool = True
    """Show a progress bar on stderr."""
    eval: bool = True
    """The held-out evaluation at the end (--no-eval: skip it)."""
    export: str | None = field(default=None, metadata={"metavar": "DIR"})
    """After training, copy the final checkpoint + metrics + config to DIR, and the earlier checkpoints to
    DIR/snapshots/step_*/ (model + config, for metrics over training)."""
    snapshots: bool = True
    """With --export: also the earlier checkpoints (--no-snapshots: the final one only)."""
    threads: int = 1
    """Torch threads (1: fastest for these tiny matmuls)."""


class FamilyParser(argparse.ArgumentParser):
    """A family's sub-parser: its config flags are added on first use (parsing, help or usage)."""

    family: str | None = None
    """The family whose TrainConfig fields become flags (set right after the parser is made)."""
    _filled = False

    def fill(self) -> "FamilyParser":
        if not self._filled and self.family is not None:
            self._filled = True
            from ..train.recipe import recipe

            add_fields(self, recipe(self.family).config_class, skip=SKIP)
            vocabulary.refuse_renamed(self, f"train {self.family}")
        return self

    def parse_known_args(self, args=None, namespace=None):
        self.fill()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self.fill()
        return super().format_help()

    def format_usage(self) -> str:
        self.fill()
        return super().format_usage()


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..families import registry
    from ..train.recipe import training_families

    sub = p.add_subparsers(dest="family", metavar="FAMILY", required=True, parser_class=FamilyParser,
                           help="model family to train")
    for name in training_families():
        summary = registry.get(name).summary
        # no abbreviations: '--d' of one family must not silently become another family's '--dtype'
        fp = sub.add_parser(name, help=summary, description=f"Train a model of family {name}: {summary}.", allow_abbrev=False)
        fp.family = name
        add_fields(fp, TrainRun)
        add_fields(fp, devices.Device)


def config_from_args(args, config_file: str | None = None):
    """The TrainConfig of the parsed arguments: the --config file `config_file`, then the flags given."""
    from ..core.errors import UserError
    from ..train import config_for
    from ..train.recipe import recipe

    overrides = {}
    if config_file:
        try:
            with open(config_file) as f:
                overrides = json.load(f)
        except (OSError, ValueError) as e:
            raise UserError(f"cannot read config file {config_file}: {e}") from None
        except RecursionError:
            raise UserError(f"config file {config_file} is nested too deeply; it must hold one flat JSON object") from None
        if not isinstance(overrides, dict):
            raise UserError(f"config file {config_file} must hold a JSON object")
        if overrides.pop("family", args.family) != args.family:
            raise UserError(f"config file {config_file} is for another family than {args.family}")
        overrides.pop("run_id", None)
    names = [f.name for f in dataclasses.fields(recipe(args.family).config_class) if f.name not in SKIP]
    overrides.update(given(args, names))
    try:
        return config_for(args.family, **overrides)
    except OverflowError as e:  # e.g. a config file's 1e400 for an integer
        raise UserError(f"an option is out of range ({e}); give finite numbers") from None


SIZE_FIELDS = ("d", "n_states", "n_actions", "n", "n_layers", "tasks_per_step", "trajectories_per_task",
               "windows", "eval_tasks")
"""Config fields that set how much a run allocates (those a family has)."""


def check_size(cfg) -> None:
    """Refuse a config whose model, batches or evaluation do not fit in memory (before anything is made)."""
    from ..core.errors import UserError
    from ..core.outputs import check_fits
    from ..models.construct import LAYER_OVERHEAD
    from ..train.recipe import recipe_of

    sizes = {k: getattr(cfg, k) for k in SIZE_FIELDS
             if isinstance(getattr(cfg, k, None), int) and not isinstance(getattr(cfg, k), bool)}
    item = 8 if cfg.dtype == "float64" else 4
    recipe_of(cfg).model_config(cfg)  # its own errors first

    def estimate(s: dict) -> int:
        try:
            model = recipe_of(cfg).model_config(dataclasses.replace(cfg, **s))
        except UserError:  # sizes that do not make a model: the others decide
            return 2**200
        D, L, n, S, A = model.D, model.n_layers, s.get("n", 1), s.get("n_states", 1), s.get("n_actions", 1)
        tasks = s.get("tasks_per_step", 1)
        seqs = tasks * s.get("trajectories_per_task", 1) * (s.get("windows", 0) + 1)
        per_prompt = item * ((n + 1) * D * (L + 1) * 4 + (n + 1) ** 2 * L * 2)  # activations, grads, attention
        task_data = 8 * 3 * S * S * A + 8 * 3 * (n + s.get("windows", 0) + 2)
        params = 4 * item * model.parameter_count() + LAYER_OVERHEAD * L
        return params + max(seqs * per_prompt + tasks * task_data, s.get("eval_tasks", 1) * (per_prompt + task_data))

    check_fits(estimate, sizes, {k: "--" + k.replace("_", "-") for k in sizes}, "one training step")


def run_bytes(cfg) -> int:
    """Bytes a run's checkpoints (model, Adam moments; float64 at most, 8 KiB of JSON) and metrics log
    take on disk, an upper estimate."""
    from ..train.recipe import recipe_of

    params = sum(a * b for a, b in recipe_of(cfg).model_config(cfg).parameter_shapes().values())
    return (cfg.steps // cfg.checkpoint_every + 1) * (3 * 8 * params + 8 * 2**10) + (cfg.steps // cfg.log_every + 1) * 256


def check_disk(cfg, run_dir) -> None:
    """Refuse --steps whose checkpoints and metrics would not fit on the disk of the run directory."""
    from ..core.errors import UserError
    from ..core.outputs import free_bytes, human

    need, free = run_bytes(cfg), free_bytes(run_dir)
    if need > free:
        raise UserError(f"--steps {cfg.steps} writes ~{human(need)} of checkpoints and metrics (one checkpoint every "
                        f"{cfg.checkpoint_every} steps); the disk has {human(free)} free: lower --steps or raise "
                        "--checkpoint-every")


def run(args) -> int:
    from pathlib import Path

    from ..core.errors import UserError
    from ..core.outputs import check_finite, output_dir
    from ..train import train
    from ..train.trainer import is_run_dir

    o, device = parsed(args, TrainRun), parsed(args, devices.Device).device
    if not 1 <= o.threads <= 1024:
        raise UserError(f"--threads must be between 1 and 1024, got {o.threads}")
    devices.resolve(device)
    cfg = config_from_args(args, o.config)
    check_finite(cfg)
    if cfg.seed < 0:
        raise UserError(f"--seed must be a non-negative integer, got {cfg.seed}")
    check_size(cfg)
    output_dir(o.out, "--out", inputs=[o.config] if o.config else [], owned=is_run_dir,
               what="training run directory")
    if o.export is not None:
        if str(o.export).strip() and Path(o.export).resolve() == Path(o.out).resolve():
            raise UserError(f"--export {o.export} is the run directory (--out); export to another directory")
        output_dir(o.export, "--export", inputs=[o.out], replaces=True)
    check_disk(cfg, o.out)
    result = train(cfg, o.out, progress=o.progress, evaluate=o.eval, threads=o.threads, device=device)
    if result.resumed_from:
        print(f"resumed from step {result.resumed_from}")
    print(f"run directory: {result.run_dir}")
    if result.final_metrics:
        print(json.dumps(result.final_metrics, indent=1))
    if o.export:
        from ..train.trainer import export_final

        print(f"exported to {export_final(result.run_dir, o.export, snapshots=o.snapshots)}")
    return 0
