"""`icrl-interp record`: stream a model's hooked activations on a task into HDF5.

Either a checkpoint of the package (`record CKPT`), or your own model on a family's task
(`record --model FILE.py:FUNC [--weights W.safetensors] --task FAMILY [task options]`; docs/byom.md).
"""
from __future__ import annotations

import argparse

from ..core import devices
from . import task_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", nargs="?", help="checkpoint directory (model.safetensors + config.json); "
                   "or use --model with --task")
    p.add_argument("--out", required=True, help="output HDF5 file (written as OUT.partial, moved into place when complete)")
    p.add_argument("--resume", action="store_true", help="continue OUT.partial from its last complete batch")
    p.add_argument("--also-analyze", action="store_true",
                   help="analyze the batches as they are recorded (one forward pass; the analysis is that of "
                   "`icrl-interp analyze OUT`); prints its table")
    p.add_argument("--json", metavar="OUT.json", help="with --also-analyze: write the analysis JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--shards", type=int, default=1, metavar="K",
                   help="write K shard files in parallel processes (OUT's name + .shard-I-of-K, each resumable) "
                   "and OUT as a master file of HDF5 virtual datasets joining them (default: 1, one file)")
    devices.add_argument(p)
    task_options.add_prompts(p)
    task_options.add(p)


def run(args) -> int:
    from ..models import checkpoint
    from ..core.errors import UserError
    from ..core.outputs import output_file

    if args.json is not None and not args.also_analyze:
        raise UserError("--json goes with --also-analyze (the analysis it writes)")
    if args.also_analyze and args.resume:
        raise UserError("--also-analyze records a new file in one pass: finish OUT.partial with --resume alone, "
                        "then run `icrl-interp analyze OUT`")
    if args.also_analyze and args.shards != 1:
        raise UserError("--also-analyze writes one file in one pass: drop --shards, or record the shards first "
                        "and run `icrl-interp analyze OUT`")
    output_file(args.out, "--out", inputs=task_options.input_files(args), suffixes=(".h5", ".hdf5"))
    if args.json is not None:
        output_file(args.json, "--json", inputs=[*task_options.input_files(args), args.out])
    task_options.check_sizes(args, args.checkpoint, args.out)  # before torch is imported: a refusal is instant
    devices.resolve(args.device)  # refused before the model is loaded
    from ..recording import recorder

    model, config, name = task_options.model_and_task(args, args.checkpoint)
    sha = checkpoint.sha256(args.checkpoint) if args.model is None else ""
    run_args = dict(probe=args.probe, tasks=args.tasks, batch_size=args.batch_size, seed=args.prompt_seed,
                    baseline=args.baseline, prompts=args.prompts, checkpoint_sha256=sha)
    if not args.also_analyze:
        summary = recorder.record_model(model, config, args.out, resume=args.resume, progress=not args.quiet,
                                        device=args.device, shards=args.shards, **run_args)
        print(summary.table())
        return 0
    from ..analyzers.analyze import analyze_model
    from ..core.files import write_json
    from .analyze import table

    result = analyze_model(model, config, out=args.out, name=name, progress=not args.quiet, device=args.device,
                           **run_args)
    print(f"recording {args.out}: {result['live']['prompts']} prompts, written as they were analyzed")
    print(table([result]))
    if args.json is not None:
        write_json(args.json, result)
    return 0
