"""`icrl-interp record`: stream a model's hooked activations on a task into HDF5.

Either a checkpoint of the package (`record CKPT`), or your own model on a family's task
(`record --model FILE.py:FUNC [--weights W.safetensors] --task FAMILY [task options]`; docs/byom.md).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..core import devices
from ..core.cli_fields import add_fields, parsed
from . import task_options


@dataclass
class RecordOptions:
    """What `record` writes and how."""

    out: str = field(metadata={"metavar": "OUT.h5"})
    """Output HDF5 file (written as OUT.partial, moved into place when complete)."""
    resume: bool = False
    """Continue OUT.partial from its last complete batch."""
    also_analyze: bool = False
    """Analyze the batches as they are recorded (one forward pass; the analysis is that of `icrl-interp
    analyze OUT`); prints its table."""
    json: str | None = field(default=None, metadata={"metavar": "OUT.json"})
    """With --also-analyze: write the analysis JSON here."""
    progress: bool = True
    """Show a progress bar on stderr."""
    shards: int = field(default=1, metadata={"metavar": "K"})
    """Write K shard files in parallel processes (OUT's name + .shard-I-of-K, each resumable) and OUT as a
    master file of HDF5 virtual datasets joining them (1: one file)."""
    full_patterns: bool = False
    """Record the attention patterns and scores at every query position, [heads, pos, pos] per layer: O(n²)
    per prompt. The linear-attention families' specs record O(n) per prompt without it (docs/formats.md)."""


@dataclass
class EpisodeOptions:
    """Recording a model over learning histories instead of a family's prompts (docs/episodes.md)."""

    episodes: str | None = field(default=None, metadata={"metavar": "EPS.h5"})
    """An episodes file: record the model (an AD model directory, or --model) over its histories, rows aligned
    to steps [histories, steps, ...]."""
    token_format: str | None = field(default=None, metadata={"choices": ("ad-step", "ad-element", "dpt")})
    """With --episodes and a model without a token_format attribute: the token format it reads."""
    context: int | None = field(default=None, metadata={"metavar": "K"})
    """With --token-format: steps per window (AD formats) or transitions of context (dpt)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", nargs="?", help="checkpoint directory (model.safetensors + config.json); "
                   "or use --model with --task; with --episodes, an AD model directory")
    add_fields(p, RecordOptions)
    add_fields(p.add_argument_group("episodes (docs/episodes.md)"), EpisodeOptions)
    add_fields(p, devices.Device)
    add_fields(p.add_argument_group("prompts"), task_options.Prompts)
    task_options.add(p)


def run(args) -> int:
    from ..core.errors import UserError
    from ..core.outputs import output_file
    from ..models import checkpoint

    o, prompts = parsed(args, RecordOptions), parsed(args, task_options.Prompts)
    device = parsed(args, devices.Device).device
    episodes = parsed(args, EpisodeOptions)
    if episodes.episodes is not None:
        return _record_episodes(args, o, prompts, episodes, device)
    if episodes.token_format is not None or episodes.context is not None:
        raise UserError("--token-format and --context go with --episodes")
    if o.json is not None and not o.also_analyze:
        raise UserError("--json goes with --also-analyze (the analysis it writes)")
    if o.also_analyze and o.resume:
        raise UserError("--also-analyze records a new file in one pass: finish OUT.partial with --resume alone, "
                        "then run `icrl-interp analyze OUT`")
    if o.also_analyze and o.shards != 1:
        raise UserError("--also-analyze writes one file in one pass: drop --shards, or record the shards first "
                        "and run `icrl-interp analyze OUT`")
    output_file(o.out, "--out", inputs=task_options.input_files(args), suffixes=(".h5", ".hdf5"))
    if o.json is not None:
        output_file(o.json, "--json", inputs=[*task_options.input_files(args), o.out])
    task_options.check_sizes(args, prompts, args.checkpoint, o.out)  # before torch is imported: a refusal is instant
    devices.resolve(device)  # refused before the model is loaded
    from ..recording import recorder

    model, config, name = task_options.model_and_task(args, args.checkpoint)
    sha = checkpoint.sha256(args.checkpoint) if args.model is None else ""
    run_args = dict(probe=prompts.probe, tasks=prompts.tasks, batch_size=prompts.batch_size, seed=prompts.prompt_seed,
                    baseline=prompts.baseline, prompts=prompts.prompts, checkpoint_sha256=sha)
    if o.full_patterns:
        from ..recording.probe_spec import spec_for

        run_args["probe"] = spec_for(model, prompts.probe, full_patterns=True)
    if not o.also_analyze:
        summary = recorder.record_model(model, config, o.out, resume=o.resume, progress=o.progress,
                                        device=device, shards=o.shards, **run_args)
        print(summary.table())
        return 0
    from ..analyzers.analyze import analyze_model
    from ..core.files import write_json
    from .analyze import table

    result = analyze_model(model, config, out=o.out, name=name, progress=o.progress, device=device, **run_args)
    print(f"recording {o.out}: {result['live']['prompts']} prompts, written as they were analyzed")
    print(table([result]))
    if o.json is not None:
        write_json(o.json, result)
    return 0


def _record_episodes(args, o: RecordOptions, prompts, ep: EpisodeOptions, device) -> int:
    """`record --episodes EPS.h5 (AD_MODEL_DIR | --model FILE.py:FUNC) --out OUT.h5`."""
    from ..core.errors import UserError
    from ..core.outputs import output_file

    given = [flag for flag, on in (("--task", args.task is not None), ("--prompts", prompts.prompts is not None),
                                   ("--also-analyze", o.also_analyze), ("--json", o.json)) if on]
    if given:
        raise UserError(f"{given[0]} does not go with --episodes (the histories are the input; analyze the "
                        "recording with `icrl-interp analyze OUT`)")
    if (args.model is None) == (args.checkpoint is None):
        raise UserError("--episodes needs the model: an AD model directory, or --model FILE.py:FUNC (not both)")
    output_file(o.out, "--out", inputs=[ep.episodes, *task_options.input_files(args)], suffixes=(".h5", ".hdf5"))
    target = devices.resolve(device)
    from ..recording.episodes import load_episode_model, record_episodes
    from ..recording.probe_spec import load_spec

    spec = args.checkpoint if args.checkpoint is not None else args.model
    model = load_episode_model(spec, args.weights)
    model.to(target)
    roles = load_spec(prompts.probe).roles if prompts.probe is not None else None
    summary = record_episodes(model, ep.episodes, o.out, token_format=ep.token_format, context=ep.context,
                              roles=roles or None, patterns=o.full_patterns, baseline=prompts.baseline,
                              batch_size=prompts.batch_size, progress=o.progress, model_spec=str(spec),
                              resume=o.resume, shards=o.shards)
    print(summary.table())
    return 0
