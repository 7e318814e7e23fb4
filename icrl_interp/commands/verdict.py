"""`icrl-interp verdict`: which candidate RL algorithm a model's forward pass runs, layer by layer.

On a recording (`verdict REC.h5`: behaviour and representation evidence), on a checkpoint of the package
(`verdict CKPT`: recorded on its task first, then with causal evidence), or on your own model
(`verdict --model FILE.py:FUNC [--weights W] --task FAMILY [task options] [--probe SPEC.toml]`), or your
model with the recording made of it (`verdict REC.h5 --model FILE.py:FUNC [--weights W]`: the recording
brings the task and the probe spec's [roles], the model is edited for the causal evidence). An option the
chosen form would ignore (e.g. --tasks on a recording) is refused. docs/verdict.md says how to read it.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from . import task_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", nargs="?", help="a recording (.h5) or a checkpoint directory; or use --model with --task")
    p.add_argument("--candidates", help="comma-separated candidate names (default: every one that applies; "
                   "docs/verdict.md lists them)")
    p.add_argument("--steps", type=int, help="largest candidate step k tried per layer (default: 2 x layers + 2)")
    p.add_argument("--test-fraction", type=float, default=0.3, help="share of the tasks held out for the scores "
                   "(default: 0.3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the task split, bootstrap and random directions "
                   "(default: 0)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of the held-out tasks "
                   "(default: 1000)")
    p.add_argument("--min-r2", type=float, default=0.5, help="held-out behaviour R² a candidate needs to fit "
                   "(default: 0.5)")
    p.add_argument("--max-prompts", type=int, default=1024, help="prompts of the recording read (default: 1024)")
    p.add_argument("--causal-draws", action=task_options.Noted, type=int, default=16,
                   help="random directions of the causal control (default: 16)")
    p.add_argument("--causal-tasks", action=task_options.Noted, type=int, default=64,
                   help="held-out tasks edited (default: 64)")
    p.add_argument("--no-causal", action="store_true", help="skip the causal evidence even with a model")
    p.add_argument("--json", metavar="OUT.json", help="write the verdict here (icrl_interp.verdict/1)")
    p.add_argument("--figure", metavar="OUT.png", help="draw behaviour R² per layer and candidate")
    task_options.add(p)
    task_options.add_prompts(p, seed_flag="--record-seed")


def table(v: dict) -> str:
    """The terminal summary: per layer, each candidate's held-out R² (step) and the verdict."""
    names = [c for c, e in v["candidates"].items() if e["applicable"]]
    width = max(12, *(len(c) + 2 for c in names))
    head = f"{'layer':8}" + "".join(f"{c:>{width}}" for c in names) + f"{'input':>10}  verdict"
    lines = [f"verdict on {v['source']} (readout: {v['readout']['kind']}; held-out R² of the update; step k)", head]
    for s in v["layers"] + [v["output"]]:
        cells = []
        for c in names:
            b = s["behaviour"][c]
            r2 = "—" if b["r2"] is None else f"{b['r2']:.3f}"
            k = "" if b["step"] is None else f" k{b['step']}"
            cells.append(f"{r2 + k:>{width}}")
        base = s["baselines"]["input_ridge"]["r2"]
        lines.append(f"{str(s['layer']):8}" + "".join(cells) + f"{'—' if base is None else format(base, '.3f'):>10}"
                     f"  {s['verdict']['text']}")
    lines.append(f"model: {v['verdict']['text']}")
    skipped = {c: e["reason"] for c, e in v["candidates"].items() if not e["applicable"]}
    if skipped:
        lines.append("not applicable: " + "; ".join(f"{c} ({r})" for c, r in skipped.items()))
    return "\n".join(lines)


def _refuse_unused(args, recording: str) -> None:
    """Options a verdict on a recording would ignore are refused, naming what would use them: the recording
    brings its prompts and task; the model given with it (--model) is only edited for the causal evidence."""
    from ..core.errors import UserError

    recorded = task_options.given_flags(args, ("tasks", "prompt_seed", "baseline"))
    if recorded:
        raise UserError(f"{', '.join(recorded)}: not used on a recording ({recording} holds its prompts); they set "
                        "how `verdict CKPT` or `verdict --model ... --task` records a model first: drop them")
    if args.model is not None and task_options.task_flags(args):
        raise UserError(f"{', '.join(task_options.task_flags(args))}: {recording} brings its own task (the model "
                        "given with it is edited on the recorded prompts): drop them")
    causal = task_options.given_flags(args, ("probe", "batch_size", "causal_draws", "causal_tasks"))
    if args.model is None and causal:
        raise UserError(f"{', '.join(causal)}: not used without the model; they set the causal evidence, which edits "
                        "the model: add --model FILE.py:FUNC (the recorded model), or drop them")


def run(args) -> int:
    from ..verdicts.causal_evidence import verdict
    from ..core.errors import UserError
    from ..core.files import write_json
    from ..core.outputs import output_file

    ckpt = recording = None
    if args.source is not None:
        if Path(args.source).is_dir():
            ckpt = args.source
        else:
            recording = args.source
    if recording is not None:
        _refuse_unused(args, recording)
    files = task_options.input_files(args) + ([args.source] if args.source else [])
    if args.json:
        output_file(args.json, "--json", inputs=files, suffixes=(".json",))
    if args.figure:
        output_file(args.figure, "--figure", inputs=files, suffixes=(".png", ".svg"))
    cands = None if args.candidates is None else [c.strip() for c in args.candidates.split(",") if c.strip()]
    for name, value, low in (("--bootstrap", args.bootstrap, 10), ("--max-prompts", args.max_prompts, 10),
                             ("--causal-draws", args.causal_draws, 1), ("--causal-tasks", args.causal_tasks, 2),
                             ("--tasks", args.tasks, 10), ("--batch-size", args.batch_size, 1)):
        if value < low:
            raise UserError(f"{name} must be at least {low}, got {value}")
    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be at least 1, got {args.steps}")
    if not -1e9 < args.min_r2 <= 1.0:
        raise UserError(f"--min-r2 must be a number at most 1, got {args.min_r2}")
    if not 0.0 < args.test_fraction < 1.0:
        raise UserError(f"--test-fraction must lie in (0, 1), got {args.test_fraction}")
    if cands is not None:
        from ..verdicts.candidates import CANDIDATES

        unknown = [c for c in cands if c not in CANDIDATES]
        if unknown or not cands:
            raise UserError(f"--candidates: unknown {', '.join(unknown) or '(none given)'} "
                            f"(known: {', '.join(CANDIDATES)})")
    if args.prompts is not None:
        raise UserError("--prompts: record the model on your prompts first (icrl-interp record --prompts), then "
                        "run the verdict on that recording")
    model = config = label = None
    if args.model is not None and recording is not None:
        from ..models import user  # the recording brings the task: the model is only edited (causation)

        model = user.load(args.model, args.weights)
    elif ckpt is not None or args.model is not None:
        from tempfile import gettempdir

        task_options.check_sizes(args, ckpt, out=gettempdir())  # it records the model there first
        model, config, label = task_options.model_and_task(args, ckpt)
    elif args.task is not None or args.weights is not None:
        raise UserError("--task and --weights go with --model")
    if recording is None and model is None:
        raise UserError("give a recording (.h5), a checkpoint directory, or --model FILE.py:FUNC with --task FAMILY")
    v = verdict(recording, model=model, task=config, probe=args.probe,
                tasks=args.tasks, record_seed=args.prompt_seed, candidates=cands, steps=args.steps,
                test_fraction=args.test_fraction, seed=args.seed, bootstrap=args.bootstrap, min_r2=args.min_r2,
                max_prompts=args.max_prompts, causal_draws=args.causal_draws, causal_tasks=args.causal_tasks,
                causal=not args.no_causal, label=recording or label, baseline=args.baseline,
                batch_size=args.batch_size)
    print(table(v))
    if args.json:
        write_json(args.json, v)
        print(f"wrote {args.json}")
    if args.figure:
        from ..report.verdict import write_figure

        write_figure(v, args.figure)
        print(f"wrote {args.figure}")
    return 0
