"""`icrl-interp record`: stream a checkpoint's hooked activations into HDF5."""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="checkpoint directory (model.safetensors + config.json)")
    p.add_argument("--out", required=True, help="output HDF5 file (written as OUT.partial, moved into place when complete)")
    p.add_argument("--probe", help="probe spec TOML (default: the model family's spec in probes/)")
    p.add_argument("--tasks", type=int, default=512, help="number of prompts (one task each) to record")
    p.add_argument("--batch-size", type=int, default=128, help="prompts per forward pass")
    p.add_argument("--seed", type=int, default=0, help="seed of the task sampler")
    p.add_argument("--resume", action="store_true", help="continue OUT.partial from its last complete batch")
    p.add_argument("--prompts", help="record on these prompts (.npz or .h5 with z [N, pos, d_model]) instead of sampling")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    from .. import checkpoint, probe_spec, recorder

    config, _ = checkpoint.read(args.checkpoint)
    model = checkpoint.load(args.checkpoint)
    spec = probe_spec.load_spec(args.probe) if args.probe else probe_spec.shipped_spec(config.family)
    if args.prompts:
        source = recorder.load_prompt_file(args.prompts, config, model.layout)
    else:
        source = recorder.PromptSource(config=config, n_total=args.tasks, seed=args.seed)
    summary = recorder.record(model, args.out, spec, source, batch_size=args.batch_size, resume=args.resume,
                              checkpoint_sha256=checkpoint.sha256(args.checkpoint), progress=not args.quiet)
    print(summary.table())
    return 0
