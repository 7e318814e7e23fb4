"""`icrl-interp verdict`: which candidate RL algorithm a model's forward pass runs, layer by layer.

On a recording (`verdict REC.h5`: behaviour and representation evidence), on a checkpoint of the package
(`verdict CKPT`: recorded on its task first, then with causal evidence), or on your own model
(`verdict --model FILE.py:FUNC [--weights W] --task FAMILY [task options] [--probe SPEC.toml]`), or your
model with the recording made of it (`verdict REC.h5 --model FILE.py:FUNC [--weights W]`: the recording
brings the task and the probe spec's [roles], the model is edited for the causal evidence). On an episodes
file (`verdict --episodes EPS.h5`): which tabular learning rule chose its actions (`verdicts.behaviour_fit`,
docs/episodes.md); on an episode recording (`verdict REC.h5` of `record --episodes`): that fit to the model's
action probabilities, with the representation evidence of every rule beside it (`verdicts.episode_evidence`).
An option the chosen form would ignore (e.g. --tasks on a recording) is refused.
docs/verdict.md says how to read it.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from ..core.cli_fields import add_fields, given_flags, parsed
from . import task_options


@dataclass
class VerdictOptions:
    """Which candidates, how they are scored, the causal evidence, and what is written."""

    episodes: str | None = field(default=None, metadata={"metavar": "EPS.h5"})
    """An episodes file: which tabular learning rule chose its actions (the behavioural fit, docs/episodes.md)."""
    candidates: str | None = None
    """Comma-separated candidate names (None: every one that applies; docs/verdict.md lists them)."""
    max_step: int | None = None
    """Largest candidate step k tried per layer (None: 2 x layers + 2, doubled while a layer's best needs all)."""
    test_fraction: float = 0.3
    """Share of the tasks held out for the scores."""
    split_seed: int = 0
    """Seed of the held-out split of the tasks and of its bootstrap resamples."""
    bootstrap: int = 1000
    """Bootstrap resamples of the held-out tasks."""
    min_r2: float = 0.5
    """Held-out behaviour R² a candidate needs to fit."""
    max_prompts: int = 1024
    """Prompts of the recording read."""
    random_draws: int = 16
    """Random directions of the causal evidence's control."""
    direction_seed: int = 0
    """Seed of those random directions."""
    causal_tasks: int = 64
    """Held-out tasks edited for the causal evidence."""
    causal: bool = True
    """The causal evidence with a model (--no-causal: skip it)."""
    json: str | None = field(default=None, metadata={"metavar": "OUT.json"})
    """Write the verdict here (icrl_interp.verdict/2)."""
    figure: str | None = field(default=None, metadata={"metavar": "OUT.png"})
    """Draw behaviour R² per layer and candidate."""


CAUSAL_ONLY = ("random_draws", "direction_seed", "causal_tasks")
"""Options of the causal evidence, which edits the model (not used without one)."""
EPISODES = ("episodes", "candidates", "test_fraction", "split_seed", "bootstrap", "json")
"""The options of the verdict on an episodes file (`--episodes`); it refuses the others."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", nargs="?", help="a recording (.h5) or a checkpoint directory; or use --model with --task")
    add_fields(p, VerdictOptions)
    task_options.add(p)
    add_fields(p.add_argument_group("prompts (a model is recorded first)"), task_options.Prompts)


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
    from ..report.verdict import summary_lines

    lines += summary_lines(v)
    skipped = {c: e["reason"] for c, e in v["candidates"].items() if not e["applicable"]}
    if skipped:
        lines.append("not applicable: " + "; ".join(f"{c} ({r})" for c, r in skipped.items()))
    return "\n".join(lines)


def _refuse_unused(args, recording: str) -> None:
    """Options a verdict on a recording would ignore are refused, naming what would use them: the recording
    brings its prompts and task; the model given with it (--model) is only edited for the causal evidence."""
    from ..core.errors import UserError

    recorded = given_flags(args, task_options.Prompts, ("tasks", "prompt_seed", "baseline"))
    if recorded:
        raise UserError(f"{', '.join(recorded)}: not used on a recording ({recording} holds its prompts); they set "
                        "how `verdict CKPT` or `verdict --model ... --task` records a model first: drop them")
    if args.model is not None and task_options.task_flags(args):
        raise UserError(f"{', '.join(task_options.task_flags(args))}: {recording} brings its own task (the model "
                        "given with it is edited on the recorded prompts): drop them")
    causal = given_flags(args, task_options.Prompts, ("probe", "batch_size")) + \
        given_flags(args, VerdictOptions, CAUSAL_ONLY)
    if args.model is None and causal:
        raise UserError(f"{', '.join(causal)}: not used without the model; they set the causal evidence, which edits "
                        "the model: add --model FILE.py:FUNC (the recorded model), or drop them")


def episodes_table(v: dict) -> str:
    """The terminal summary of an episode verdict: each candidate's held-out log-likelihood and parameters."""
    lines = [f"episode verdict on {v['source']} (held-out mean log-likelihood per step over "
             f"{v['histories']['held_out']} histories; parameters fitted on {v['histories']['train']})"]
    for name, e in v["candidates"].items():
        params = ", ".join(f"{k} {p['value']:.3g}" + ("" if p["ci"] is None else
                                                      f" [{p['ci'][0]:.3g}, {p['ci'][1]:.3g}]")
                           for k, p in e["params"].items())
        lines.append(f"  {name:16} {e['held_out_loglik']:9.4f}  {params}")
    for name, e in v["baselines"].items():
        lines.append(f"  {name:16} {e['held_out_loglik']:9.4f}  (baseline)")
    lines.append(f"verdict: {v['verdict']['text']}")
    return "\n".join(lines)


def representation_lines(v: dict) -> list[str]:
    """The representation evidence of a verdict on an episode recording: per candidate and layer the held-out R²
    of its delta probe [95 % interval], of delta's selective part and of Q and V, then the agreement."""
    rep = v["representation"]
    lines = [f"representation (held-out R² of probes of each rule's targets, with its fitted parameters; "
             f"{rep['split']['test_histories']} held-out histories; * selective: beats every baseline)",
             f"  {'rule':16} {'layer':>5}  {'delta [95% CI]':>22}  {'delta sel.':>10}  {'Q':>7}  {'V':>7}"]
    fmt = lambda p: "—" if p["r2"] is None else f"{p['r2']:.3f}" + ("*" if p["selective"] else "")  # noqa: E731
    for name, c in rep["candidates"].items():
        for layer, t in c["layers"].items():
            ci = t["delta"]["r2_ci"]
            delta = fmt(t["delta"]) + ("" if ci is None else f" [{ci[0]:.3f}, {ci[1]:.3f}]")
            lines.append(f"  {name:16} {layer:>5}  {delta:>22}  {fmt(t['delta_selective']):>10}  {fmt(t['q']):>7}  "
                         f"{fmt(t['v']):>7}")
    lines.append(rep["agreement"]["text"])
    return lines


def _episode_options(args, o: VerdictOptions, where: str, inputs: list, extra=()) -> list[str] | None:
    """The checks of a verdict on episodes (an episodes file or an episode recording): the options it does not
    use (and `extra`) refused, --json's path, the numbers; returns the candidates asked for (None: every one)."""
    from ..core.errors import UserError
    from ..core.outputs import output_file
    from ..tasks.learners import NAMES

    unused = [f for f in given_flags(args, VerdictOptions) if f not in given_flags(args, VerdictOptions, EPISODES)]
    unused += given_flags(args, task_options.Prompts) + given_flags(args, task_options.UserModel, ("model", "weights"))
    unused += task_options.task_flags(args) + list(extra)
    if unused:
        raise UserError(f"{', '.join(unused)}: not used {where}; drop them")
    if o.json:
        output_file(o.json, "--json", inputs=inputs, suffixes=(".json",))
    if o.bootstrap < 10:
        raise UserError(f"--bootstrap must be at least 10, got {o.bootstrap}")
    if not 0.0 < o.test_fraction < 1.0:
        raise UserError(f"--test-fraction must lie in (0, 1), got {o.test_fraction}")
    cands = None if o.candidates is None else [c.strip() for c in o.candidates.split(",") if c.strip()]
    if cands is not None and (not cands or any(c not in NAMES for c in cands)):
        raise UserError(f"--candidates: unknown {', '.join(c for c in cands if c not in NAMES) or '(none given)'} "
                        f"(known with --episodes: {', '.join(NAMES)})")
    return cands


def _episodes(args, o: VerdictOptions) -> int:
    """`verdict --episodes EPS.h5`: the behavioural fit of the learning rules to the episodes' actions."""
    from ..core.files import write_json
    from ..tasks.episodes import read_episodes
    from ..verdicts.behaviour_fit import fit_behaviour

    cands = _episode_options(args, o, "with --episodes (the fit reads the episodes' own actions)", [o.episodes],
                             [args.source] if args.source is not None else [])
    v = fit_behaviour(read_episodes(o.episodes), split_seed=o.split_seed, test_fraction=o.test_fraction,
                      bootstrap=o.bootstrap, candidates=cands, source=str(o.episodes))
    print(episodes_table(v))
    if o.json:
        write_json(o.json, v)
        print(f"wrote {o.json}")
    return 0


def _episode_recording(args, o: VerdictOptions) -> int:
    """`verdict REC.h5` of an episode recording: the behavioural fit to the model's action probabilities and the
    representation evidence beside it (`verdicts.episode_evidence`)."""
    from ..analyzers.episode_recording import open_episode_recording
    from ..core.files import write_json
    from ..verdicts.episode_evidence import verdict_on_recording

    cands = _episode_options(args, o, f"on an episode recording ({args.source} holds the histories, the model's "
                             "action probabilities and its layers)", [args.source])
    with open_episode_recording(args.source) as rec:
        v = verdict_on_recording(rec, split_seed=o.split_seed, test_fraction=o.test_fraction, bootstrap=o.bootstrap,
                                 candidates=cands, source=str(args.source))
    print("\n".join([episodes_table(v), *representation_lines(v)]))
    if o.json:
        write_json(o.json, v)
        print(f"wrote {o.json}")
    return 0


def run(args) -> int:
    from ..core.errors import UserError
    from ..core.files import write_json
    from ..core.outputs import output_file
    from ..verdicts.causal_evidence import verdict

    o, prompts = parsed(args, VerdictOptions), parsed(args, task_options.Prompts)
    if o.episodes is not None:
        return _episodes(args, o)
    if args.source is not None:
        from ..analyzers.episode_recording import is_episode_recording

        if is_episode_recording(args.source):
            return _episode_recording(args, o)
    ckpt = recording = None
    if args.source is not None:
        if Path(args.source).is_dir():
            ckpt = args.source
        else:
            recording = args.source
    if recording is not None:
        _refuse_unused(args, recording)
    files = task_options.input_files(args) + ([args.source] if args.source else [])
    if o.json:
        output_file(o.json, "--json", inputs=files, suffixes=(".json",))
    if o.figure:
        output_file(o.figure, "--figure", inputs=files, suffixes=(".png", ".svg"))
    cands = None if o.candidates is None else [c.strip() for c in o.candidates.split(",") if c.strip()]
    for name, value, low in (("--bootstrap", o.bootstrap, 10), ("--max-prompts", o.max_prompts, 10),
                             ("--random-draws", o.random_draws, 1), ("--causal-tasks", o.causal_tasks, 2),
                             ("--tasks", prompts.tasks, 10), ("--batch-size", prompts.batch_size, 1)):
        if value < low:
            raise UserError(f"{name} must be at least {low}, got {value}")
    if o.max_step is not None and o.max_step < 1:
        raise UserError(f"--max-step must be at least 1, got {o.max_step}")
    if not -1e9 < o.min_r2 <= 1.0:
        raise UserError(f"--min-r2 must be a number at most 1, got {o.min_r2}")
    if not 0.0 < o.test_fraction < 1.0:
        raise UserError(f"--test-fraction must lie in (0, 1), got {o.test_fraction}")
    if cands is not None:
        from ..verdicts.candidates import CANDIDATES

        unknown = [c for c in cands if c not in CANDIDATES]
        if unknown or not cands:
            raise UserError(f"--candidates: unknown {', '.join(unknown) or '(none given)'} "
                            f"(known: {', '.join(CANDIDATES)})")
    if prompts.prompts is not None:
        raise UserError("--prompts: record the model on your prompts first (icrl-interp record --prompts), then "
                        "run the verdict on that recording")
    model = config = label = None
    if args.model is not None and recording is not None:
        from ..models import user  # the recording brings the task: the model is only edited (causation)

        model = user.load(args.model, args.weights)
    elif ckpt is not None or args.model is not None:
        from tempfile import gettempdir

        task_options.check_sizes(args, prompts, ckpt, out=gettempdir())  # it records the model there first
        model, config, label = task_options.model_and_task(args, ckpt)
    elif args.task is not None or args.weights is not None:
        raise UserError("--task and --weights go with --model")
    if recording is None and model is None:
        raise UserError("give a recording (.h5), a checkpoint directory, or --model FILE.py:FUNC with --task FAMILY")
    v = verdict(recording, model=model, task=config, probe=prompts.probe, tasks=prompts.tasks,
                prompt_seed=prompts.prompt_seed, candidates=cands, steps=o.max_step, test_fraction=o.test_fraction,
                split_seed=o.split_seed, direction_seed=o.direction_seed, bootstrap=o.bootstrap, min_r2=o.min_r2,
                max_prompts=o.max_prompts, causal_draws=o.random_draws, causal_tasks=o.causal_tasks,
                causal=o.causal, label=recording or label, baseline=prompts.baseline, batch_size=prompts.batch_size)
    print(table(v))
    if o.json:
        write_json(o.json, v)
        print(f"wrote {o.json}")
    if o.figure:
        from ..report.verdict import write_figure

        write_figure(v, o.figure)
        print(f"wrote {o.figure}")
    return 0
