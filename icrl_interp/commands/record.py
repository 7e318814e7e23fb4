"""`icrl-interp record`: stream a model's hooked activations on a task into HDF5.

Either a checkpoint of the package (`record CKPT`), or your own model on a family's task
(`record --model FILE.py:FUNC [--weights W.safetensors] --task FAMILY [task options]`; docs/byom.md).
"""
from __future__ import annotations

import argparse

from . import task_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", nargs="?", help="checkpoint directory (model.safetensors + config.json); "
                   "or use --model with --task")
    p.add_argument("--out", required=True, help="output HDF5 file (written as OUT.partial, moved into place when complete)")
    p.add_argument("--probe", help="probe spec TOML (default: the model family's spec in probes/, or the "
                   "TransformerLens spec; your own module needs one with [roles])")
    p.add_argument("--tasks", type=int, default=512, help="number of prompts (one task each) to record")
    p.add_argument("--batch-size", type=int, default=128, help="prompts per forward pass")
    p.add_argument("--seed", type=int, default=0, help="seed of the task sampler")
    p.add_argument("--resume", action="store_true", help="continue OUT.partial from its last complete batch")
    p.add_argument("--prompts", help="record on these prompts (.npz or .h5 with z [N, pos, d_model]; may carry "
                   "task_id, gamma, tasks_* and reference_* arrays) instead of sampling")
    p.add_argument("--baseline", choices=("random-init", "none"), default="random-init",
                   help="also record the same architecture at random initialization on the same prompts, "
                   "the probes' baseline (default: random-init)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    task_options.add(p)


def run(args) -> int:
    from .. import checkpoint, probe_spec, recorder
    from ..outputs import output_file

    output_file(args.out, "--out", inputs=task_options.input_files(args), suffixes=(".h5", ".hdf5"))
    model, config, _ = task_options.model_and_task(args)
    if args.model is None:
        spec = probe_spec.load_spec(args.probe) if args.probe else probe_spec.shipped_spec(config.family)
        if args.prompts:
            source = recorder.load_prompt_file(args.prompts, config, model.layout)
        else:
            source = recorder.PromptSource(config=config, n_total=args.tasks, seed=args.seed)
        summary = recorder.record(model, args.out, spec, source, batch_size=args.batch_size, resume=args.resume,
                                  checkpoint_sha256=checkpoint.sha256(args.checkpoint), progress=not args.quiet,
                                  baseline=args.baseline)
    else:
        summary = recorder.record_model(model, config, args.out, probe=args.probe, tasks=args.tasks,
                                        batch_size=args.batch_size, seed=args.seed, baseline=args.baseline,
                                        prompts=args.prompts, resume=args.resume, progress=not args.quiet)
    print(summary.table())
    return 0
