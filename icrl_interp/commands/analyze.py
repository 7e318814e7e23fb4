"""`icrl-interp analyze INPUT...`: analysis of checkpoints, recordings and TL weights as a table and JSON."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from ..core import devices
from ..core.cli_fields import add_fields, parsed
from . import task_options


@dataclass
class AnalyzeFlags:
    """What `analyze` reads and writes, and where it runs (the analysis itself: `AnalyzeOptions`)."""

    json: str | None = field(default=None, metadata={"metavar": "OUT.json"})
    """Write the analysis here (one object, or a list for several inputs)."""
    workers: int | None = None
    """Worker processes of the local Dask cluster (None: one per input, at most the CPUs)."""
    scheduler: str | None = None
    """Where the inputs are analyzed: serial, local, local:N or tcp://HOST:PORT of a running Dask scheduler
    (None: local:WORKERS for more than one input, else serial; see docs/cluster.md)."""
    layout: str | None = field(default=None, metadata={"metavar": "LAYOUT.json"})
    """Prompt layout file: how to read a generic recording's residual stream (value error; alone) and how to
    cut TL weights into blocks (with --family)."""
    live: bool = False
    """Run each checkpoint (or --model on --task) and feed the analyzers from the forward pass: the analysis
    of the recording `record` would write, without writing it."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..analyzers import AnalyzeOptions

    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="checkpoint directory, HDF5 recording, TL .safetensors weights, or a directory of them "
                        "(with --live: checkpoint directories, or none with --model)")
    add_fields(p, AnalyzeFlags)
    p.set_defaults(_analysis=add_fields(p, AnalyzeOptions, skip=("layout", "live_tasks")))
    live = p.add_argument_group("live analysis (--live: run the model and analyze its batches; nothing is written "
                                "but the JSON)")
    add_fields(live, task_options.Prompts)
    add_fields(live, devices.Device)
    task_options.add(p)
    from .episode_options import EpisodeTargets

    add_fields(p.add_argument_group("episode recordings (`record --episodes`; docs/episodes.md): the probes' targets"),
               EpisodeTargets)


def status_of(row: dict) -> tuple[str, str]:
    from ..analyzers.analyze import status_of as status

    return status(row)


def _fmt(x, spec=".3g") -> str:
    return "-" if x is None else (x if isinstance(x, str) else format(x, spec))


def table(rows: list[dict]) -> str:
    """A readable summary: one block per input, one line per layer."""
    from ..analyzers.analyze import table_lines  # the lines analyzers of your own add

    lines = []
    for r in rows:
        lines.append(f"== {r.get('source')}")
        if "error" in r:
            lines.append(f"   ERROR: {r['error']}")
            continue
        w = r.get("weights") or {}
        bs, mf = w.get("block_sparsity") or {}, w.get("manifold") or {}
        rel = ", ".join(f"{k} {_fmt(v)}" for k, v in (mf.get("rel_err") or {}).items())
        task = r.get("task_family")
        on = f" on {task} prompts" if task and task != r.get("family") else ""
        lines.append(f"   {r.get('family')} ({r.get('kind')}){on}, layers {r.get('n_layers')}, gamma {_fmt(r.get('gamma'))}")
        if w:
            lines.append(f"   weights: in-support energy {_fmt(bs.get('in_support_energy'), '.4f')}, "
                         f"lazy drift {_fmt(bs.get('lazy_drift'))}, scale c {_fmt(mf.get('scale'), '.4g')}, "
                         f"rel err [{rel}], gauge cosine {_fmt(mf.get('gauge_cosine'), '.4f')}, "
                         f"sign pattern {_fmt(w.get('sign_pattern'))}")
        acts = r.get("activations")
        if acts:
            lines.append(f"   {'layer':>5}  {'diag mean':>9}  {'diag min':>8}  {'margin':>8}  {'probe R2':>8}  "
                         f"{'shuffled':>8}  {'value err':>9}  {'ref err':>8}")
            for L in acts["layers"]:
                kd = L.get("kernel_diagonality") or {}
                lines.append(f"   {L['layer']:>5}  {_fmt(kd.get('mean')):>9}  {_fmt(kd.get('min')):>8}  "
                             f"{_fmt(kd.get('margin')):>8}  {_fmt(L.get('td_probe_r2'), '.4f'):>8}  "
                             f"{_fmt(L.get('td_probe_r2_shuffled'), '.2g'):>8}  {_fmt(L.get('value_error')):>9}  "
                             f"{_fmt(L.get('reference_value_error')):>8}")
            wm = acts.get("wang_metrics")
            if wm:
                lines.append(f"   VD {_fmt(wm['VD'])}, SS {_fmt(wm['SS'], '.4f')}, IWS {_fmt(wm['IWS'], '.4f')} "
                             f"(batch TD at alpha {_fmt(wm.get('alpha'), '.4g')}, {wm.get('alpha_source', 'recorded')})")
            lines += _readout_lines(acts.get("readouts"))
        lines += table_lines(r)
        for k, why in (r.get("skipped") or {}).items():
            lines.append(f"   skipped {k}: {why}")
        status, why = status_of(r)
        lines.append(f"   status: {status}" + (f" ({why})" if why and status != "ok" else ""))
    return "\n".join(lines)


def _readout_lines(ro: dict | None) -> list[str]:
    """One line per readout lens: its value error by layer beside the reference algorithm's."""
    if not isinstance(ro, dict):
        return []
    lines = [f"   readouts ({ro.get('target')}: {ro.get('target_description')})"]
    for name, lens in (ro.get("lenses") or {}).items():
        layers = lens.get("layers") or []
        errs = " ".join(_fmt(x.get("value_error")) for x in layers)
        refs = " ".join(_fmt(x.get("reference_value_error")) for x in layers)
        base = " ".join(_fmt(x.get("random_init_value_error")) for x in layers)
        conv = lens.get("convergence") or {}
        where = "all prompts" if lens.get("prompts") == "all" else lens.get("prompts")
        lines.append(f"   {name} on {where}, value error by layer: {errs} (model output "
                     f"{_fmt(lens.get('output_value_error'))}; rate {_fmt(conv.get('rate'))}/layer)")
        lines.append(f"   {'':{len(name)}} reference algorithm at the same depth: {refs}; random init: {base}")
    return lines


def run(args) -> int:
    from ..analyzers import AnalyzeOptions, analyze_many
    from ..analyzers.inputs import read_layout_file
    from ..core.cli_fields import build, given
    from ..core.errors import UserError
    from ..core.files import write_json
    from ..core.outputs import check_finite, output_file
    from ..families import registry

    a = parsed(args, AnalyzeFlags)
    values = {"progress": sys.stderr.isatty(), **given(args, args._analysis)}
    if a.workers is not None and a.workers < 1:
        raise UserError("--workers must be at least 1")
    if a.scheduler is not None:
        from ..core.cluster import parse_scheduler

        parse_scheduler(a.scheduler)  # a bad value fails before any work
    if values.get("seed", 0) < 0:
        raise UserError(f"--split-seed must be a non-negative integer, got {values['seed']}")
    head = values.get("head", 0)
    if head < 0:
        raise UserError(f"--head must be a non-negative head index, got {head}")
    if head > 0 and values.get("family") is None:
        raise UserError(f"--head {head} does not exist: the package's models have 1 attention head per layer "
                        "(head 0); --head picks a head of TransformerLens weights read with --family")
    if not values.get("chunk_mib", 1.0) > 0:
        raise UserError("--chunk-mib must be positive")
    if values.get("family") is not None:
        registry.get(values["family"])  # one line naming the known families
    if values.get("wang_alpha") is not None and not values["wang_alpha"] >= 0:
        raise UserError(f"--wang-alpha must be a non-negative TD step, got {values['wang_alpha']}")
    if values.get("probe_max_tasks", 0) < 0:
        raise UserError("--probe-max-tasks must be >= 0 (0 = all tasks)")
    values["layout"] = read_layout_file(a.layout).to_dict() if a.layout else None
    opts = build(AnalyzeOptions, values)
    check_finite(opts)
    from ..analyzers.episode_recording import is_episode_recording
    from .episode_options import target_flags

    if not a.live and any(is_episode_recording(x) for x in args.inputs):
        return _episode_run(args, a, opts)
    if flags := target_flags(args):
        raise UserError(f"{flags[0]} goes with an episode recording (written by `record --episodes`): "
                        "the candidate whose TD error, Q and V are probed")
    if a.live:
        if a.json is not None:
            output_file(a.json, "--json", inputs=[*args.inputs, *task_options.input_files(args)])
        rows = _live_rows(args, opts)
    elif args.model is not None or args.task is not None or args.weights is not None:
        raise UserError("--model, --task and --weights analyze a model live: add --live (or record it first)")
    elif unused := _live_only(args):
        one = len(unused) == 1
        raise UserError(f"{', '.join(unused)}: {'an option' if one else 'options'} of --live (how a model is run on "
                        "prompts); without --live a checkpoint is analyzed from its weights and a recording from "
                        f"what it holds: add --live, or drop {'it' if one else 'them'}")
    elif not args.inputs:
        raise UserError("give at least one INPUT (checkpoint, recording, TL weights or a directory of them), "
                        "or --live with --model FILE.py:FUNC --task FAMILY")
    else:
        rows = None
    if a.json is not None and not a.live:
        output_file(a.json, "--json", inputs=[*args.inputs, *([a.layout] if a.layout else [])])
    rows = rows if rows is not None else analyze_many(args.inputs, workers=a.workers, options=opts, scheduler=a.scheduler)
    print(table(rows))
    if a.json:
        write_json(a.json, rows[0] if len(rows) == 1 and len(args.inputs) <= 1 else rows)
    failed = [r for r in rows if "error" in r]
    for r in failed:
        where = "" if str(r["error"]).startswith(str(r["source"])) else f"{r['source']}: "  # most errors name it
        print(f"icrl-interp analyze: error: {where}{r['error']}", file=sys.stderr)
    empty = [(r, status_of(r)[1]) for r in rows if "error" not in r and status_of(r)[0] == "nothing analyzed"]
    for r, why in empty:
        print(f"icrl-interp analyze: nothing analyzed: {r['source']}: {why}", file=sys.stderr)
    return 2 if failed or empty else 0


def _live_only(args) -> list[str]:
    """The --live options the user gave (flags as typed)."""
    from ..core.cli_fields import given_flags

    return given_flags(args, task_options.Prompts) + given_flags(args, devices.Device)


def _live_rows(args, opts) -> list[dict]:
    """One live analysis per checkpoint (its own task), or of --model on --task."""
    from ..analyzers.analyze import analyze_model
    from ..analyzers.inputs import is_checkpoint
    from ..core.errors import UserError
    from ..models import checkpoint

    if args.model is not None and args.inputs:
        raise UserError(f"give either checkpoint directories ({args.inputs[0]}) or --model, not both")
    prompts, device = parsed(args, task_options.Prompts), parsed(args, devices.Device).device
    for path in args.inputs or [None]:  # every run's sizes, before torch is imported: a refusal is instant
        if path is None or is_checkpoint(path):
            task_options.check_sizes(args, prompts, path)
    devices.resolve(device)  # refused before any model is loaded
    run_args = dict(probe=prompts.probe, tasks=prompts.tasks, batch_size=prompts.batch_size, seed=prompts.prompt_seed,
                    baseline=prompts.baseline, prompts=prompts.prompts, options=opts, progress=opts.progress,
                    device=device)
    if args.model is not None:
        model, config, name = task_options.model_and_task(args, None)
        return [analyze_model(model, config, name=name, **run_args)]
    if args.task is not None or args.weights is not None:
        raise UserError("--task and --weights go with --model; a checkpoint brings its own task and weights")
    if not args.inputs:
        raise UserError("--live needs checkpoint directories, or --model FILE.py:FUNC with --task FAMILY")
    task_options.values(args)  # task options without --task are refused
    rows = []
    for path in args.inputs:
        if not is_checkpoint(path):
            raise UserError(f"{path}: --live runs checkpoint directories (model.safetensors + config.json); "
                            "analyze recordings without --live")
        model = checkpoint.load(path)  # its config rides along, resolved once
        rows.append(analyze_model(model, model.checkpoint_config, name=str(path),
                                  checkpoint_sha256=checkpoint.sha256(path), **run_args))
    return rows


def _episode_run(args, a: AnalyzeFlags, opts) -> int:
    """`analyze REC.h5` of an episode recording: the probes of every recorded layer to a candidate's targets."""
    from ..core.errors import UserError
    from ..core.files import write_json
    from ..core.outputs import output_file
    from ..verdicts.episode_targets import probe_recording
    from .episode_options import candidate_of, other_task_flags

    if len(args.inputs) != 1:
        raise UserError("an episode recording is analyzed alone: give it as the only INPUT")
    family = [flag for flag, on in (("--workers", a.workers is not None), ("--scheduler", a.scheduler is not None),
                                    ("--layout", a.layout is not None), ("--family", opts.family is not None),
                                    ("--model", args.model is not None), ("--weights", args.weights is not None))
              if on] + other_task_flags(args) + _live_only(args)
    if family:
        raise UserError(f"{family[0]} does not go with an episode recording (its histories and layers are the input)")
    path = args.inputs[0]
    if a.json is not None:
        output_file(a.json, "--json", inputs=[path])
    result = probe_recording(path, split_seed=opts.seed, test_fraction=opts.test_fraction, folds=opts.folds,
                             **candidate_of(args))
    print(episode_table(result))
    if a.json:
        write_json(a.json, result)
    return 0


EPISODE_TARGETS = ("delta", "delta_selective", "q", "v")
"""The targets of the terminal table (the JSON has them all: the input-explained part and Q per action too)."""


def episode_table(result: dict) -> str:
    """The probes of an episode recording: one block per layer, one line per target."""
    c = result["candidate"]
    params = ", ".join(f"{k} {v:.3g}" for k, v in c["params"].items())
    why = (f"the behavioural fit's best rule (fitted to the model's action probabilities; "
           f"label: {c['label']})" if c["source"] == "behavioural fit" else "given")
    sp = result["split"]
    lines = [f"== {result['source']}",
             f"   targets: {c['candidate']} ({params}): {why}",
             f"   held-out histories {sp['test_histories']} (train {sp['train_histories']}); the TD error at step t is "
             f"step t-{result['delta_lag']}'s",
             f"   {'layer':>5}  {'target':<16}{'R2':>8}{'input':>8}{'random':>8}{'shuffled':>9}  selectivity [95% CI]"]
    for layer, per in result["layers"].items():
        for name in EPISODE_TARGETS:
            p = per.get(name)
            if p is None:
                continue
            b, sel = p["baselines"], p["selectivity"]
            ci = sel.get("ci")
            lines.append(f"   {layer:>5}  {name:<16}{_fmt(p['r2'], '.3f'):>8}{_fmt(b['input'], '.3f'):>8}"
                         f"{_fmt(b['random_init'], '.3f'):>8}{_fmt(b['shuffled'], '.3f'):>9}  "
                         f"{_fmt(sel['mean'], '+.3f')}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")
                         + ("  selective" if p["selective"] else ""))
    return "\n".join(lines)
