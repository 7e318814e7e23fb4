"""One call from an input (checkpoint, recording, TL weights) to the analysis JSON contract.

`analyze(path)` returns a dict with schema `icrl_interp.analysis/1` (every field is documented in
docs/formats.md, "Analysis JSON"); `analyze_many(paths, workers)` runs inputs on a scheduler (in this process
or on a Dask cluster, `cluster`) and returns one row per input, a failing input giving a row with an "error" field. A recording is
read once, in chunks of prompts whose size is bounded by a memory budget, and every activation
analyzer is fed from the same chunk, so recordings larger than memory work and analysis costs about
one read.

Which analyses run is decided from the data present and the family registry, never from a family's
name. Two families can be involved:

* the **model's** family (`family` in the JSON; a checkpoint's `model.family`, a recording's
  `model.family`) and its `architecture`: theta*, the weight fits (`Hints.weight_fit`,
  `lazy_from`, `wang_summary`), the population kernel (`Hints.population_kernel`), the parameter
  names of the score and value maps, and whether attention patterns are softmax kernels;
* the **task's** family (`task_family`; whose prompts, task data and reference algorithm were
  recorded): where the algorithm's output and TD error sit in the prompt layout (`Hints.output`,
  `value_block`, `output_blocks`, `td_direction`, `primary_probe`, `query_linear`).

For the checkpoints this package writes the two are the same family; a TransformerLens or other
foreign model recorded on a family's prompts has a task family and no model family.

Each section is one registered analyzer (`registry`: weights, population kernel, value error, kernels,
probes, Wang's metrics, readouts, then any of your own; `base` is the protocol), computed
independently: the input is resolved once into a `base.Context` (its families and architecture looked
up once), every analyzer is opened in order, a recording is read once in chunks that feed every
stream, and each places its part of the JSON. One that cannot run says why in `skipped` ('not
applicable: ...' where it does not apply to this input, 'failed: ...' where it raised, else the input
it lacks), and one that fails never drops the others. `sections` sums this up per analyzer and
`status_of` turns it into the status of a report row ('ok', 'partial', 'nothing analyzed').

`analyze_model(model, task)` is the live analysis: the model runs over the prompts `icrl_interp.record`
would record and the same analyzers read the stream of batches (`icrl_interp.recording.live`); the result is the
analysis of that recording, field for field, except `source` (the model's name), `kind` ('live') and
the extra `live` object (docs/analyzers.md, "Live analysis"): bit for bit when both are read in the same
chunks, within float64 rounding with the same probe penalties in the default ones (`CHUNK_MIB`).

Fields added to `icrl_interp.analysis/1` (all optional for readers):
  task_family   the task's registered family (None: prompts of no known task, or TL weights);
  architecture  the model's architecture (`registry.Architecture.name`; None: not a known one);
  sections      {analyzer: "ok" | reason}, in the registry's order;
  activations.readouts     a foreign model's value error by depth through two lenses (readout.py);
  activations.convergence  the convergence-with-depth summary of the value error (convergence.depth_summary);
  per-task values          `value_error_per_task` per layer, `kernel_diagonality.per_task`,
                           `wang_metrics.per_task`, per lens layer (at most `per_task_max` tasks).
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..core import threads
from ..core.errors import UserError
from ..core.files import json_clean
from ..families import registry
from ..tasks.layouts import PromptLayout
from . import inputs, registry as analyzer_registry, td_probe, weights
from .base import (ANALYSIS, NOT_APPLICABLE, Analyzer, Chunk, Context, Facts, Subject, failure, guard,
                   resolve)
from .keys import (ACTIVATIONS, GENERIC, KERNEL_DIAGONALITY, LAYER, LAYERS, SECTIONS, SKIPPED, TD_PROBE_R2,
                   VALUE_ERROR, WEIGHTS, any_layer)
from .streams import TASK_KEY

SCHEMA = "icrl_interp.analysis/1"


CHUNK_MIB = {"live": 16.0}
"""The chunk budget where `--chunk-mib` is not given, by input kind: 16 MiB in a live analysis (its peak
memory then grows <= 1.2x from 1,000 to 100,000 prompts, docs/benchmarks.md), rounded up to a whole forward batch
where one fits LIVE_BATCH_MIB; DEFAULT_CHUNK_MIB otherwise (fewer, larger reads of a file). The TD
probes choose the same penalties for any chunk size (`td_probe.tied_choice`), so a live analysis and the
analysis of its recording agree within float64 rounding."""
DEFAULT_CHUNK_MIB = 128.0
SHARED_KEY = "_shared"
"""Where a chunk's prepared results travel from the reader thread to `Chunk.shared`."""
LIVE_BATCH_MIB = 64.0
"""A live analysis without `--chunk-mib` reads at least one whole forward batch per chunk where a batch's rows (as
float64, x2 as in `CHUNK_MIB`) take at most this: a chunk smaller than a batch cuts what one forward pass computed
into pieces that each pay the analyzers' per-chunk costs, while the live recording holds the batch whole anyway
(softmax-td theta*, 2048 prompts, batch 256: 120-prompt chunks 0.50 s, whole batches 0.44 s; docs/benchmarks.md,
"Live analysis"). The peak memory stays flat in the number of prompts: a batch does not grow with them."""


@dataclass
class AnalyzeOptions:
    """Knobs of one analysis (defaults are what the CLI uses)."""

    chunk_mib: float | None = None
    """Memory budget for one chunk of prompts read from a recording, in MiB (none: 128, or 16 in a live
    analysis)."""
    test_fraction: float = 0.25
    """Fraction of tasks held out to score the TD probes and the tuned-lens readouts."""
    folds: int = 5
    """Cross-validation folds (over training tasks) for the ridge penalty."""
    seed: int = field(default=0, metadata={"flag": "--split-seed"})
    """Seed of the held-out split of the tasks and of its bootstrap resamples."""
    probe_max_tasks: int = 8192
    """At most about this many tasks (a hashed subset of the task ids, a fraction probe_max_tasks / N of
    them) feed the TD probes; 0 = all.
    8192 tasks of n columns are 8192 n samples for a ridge on <= 16 features: far past saturation."""
    progress: bool = False
    """Show a progress bar over chunks."""
    layout: dict | None = None
    """Prompt layout (PromptLayout.to_dict()) for TransformerLens weights (with `family`) or generic
    recordings (alone: where the values sit in the residual stream)."""
    family: str | None = field(default=None, metadata={"choices": registry.names})
    """Family whose construction TransformerLens weights (or a foreign recording's W_Q..W_O heads) are
    compared with: the weight comparison only (a generic recording's value error needs just --layout)."""
    head: int = 0
    """Attention head of TransformerLens weights."""
    kernel_matrix_max_states: int = 64
    """Include the task-averaged M_hat in the output when there are at most this many states."""
    wang_alpha: float | None = None
    """Step of the L-step batch TD that VD/SS/IWS compare a linear-td model with; None: fitted (the alpha
    minimising the mean VD over the calibration half of the tasks, as `train` does; docs/analyzers.md)."""
    live_tasks: int = 0
    """Checkpoints: also run the model on this many prompts of its own task (sampler seed 0, the
    random-init baseline beside it) and analyze its activations live, without writing them
    (docs/analyzers.md, "Live analysis"); 0 = the weights only. `report` and `sweep` default to 256."""
    per_task_max: int = 512
    """Per-task values (value error, kernel diagonality, VD/SS/IWS, readouts: one entry per task id; the
    probes' held-out sums per test task) are included when there are at most this many tasks (null
    beyond; 0 = never)."""


# ------------------------------------------------------------- who is who
def _value_hints(subject: Subject, layout) -> registry.Hints | None:
    """Where the task's output sits in the residual stream: the task family's hints; for prompts of no
    known task, those of the family the layout is of (a generic recording analyzed with --layout);
    None without a layout."""
    if layout is None:
        return None
    if subject.task_hints is not None:
        return subject.task_hints
    fam = registry.find(getattr(layout, "family", None))
    return None if fam is None else fam.hints


# ----------------------------------------------------------------- theta*
def _as_checkpoint_config(config):
    from ..models.config import CheckpointConfig

    return config if isinstance(config, CheckpointConfig) else CheckpointConfig.from_dict(config)


def theta_for_config(config, names) -> dict[str, np.ndarray]:
    """theta* of a checkpoint's model under the given parameter names (empty if its family has no
    construction); `config` is a `CheckpointConfig` or a config.json dict (format 1 or 2)."""
    return _as_checkpoint_config(config).theta_star(list(names))


def theta_for_layout(family: str, layout: PromptLayout, params: dict, gamma: float = 0.9, alpha: float = 1.0) -> dict:
    """theta* of a family at the dimensions of `layout` for every layer of `params` (TL weights: no
    checkpoint config; the family's constants at their defaults)."""
    from ..models.config import CheckpointConfig, ModelConfig
    from ..tasks.sampling import TaskSpec

    fam = registry.get(family)
    d, m = inputs.family_dims(family, layout)
    n_layers = max(weights.layers_of(params), default=0) + 1
    model = ModelConfig(family=family, d=d, n_layers=n_layers, gamma=gamma, alpha=alpha, tied=n_layers == 1, m=m)
    config = CheckpointConfig(model=model, task=TaskSpec.from_dict(None, family, fam.task_kind))
    return config.theta_star(list(params))


def _header(path, kind, subject: Subject, config, layout) -> dict:
    """The fields every analysis starts with; `config` is a CheckpointConfig or None."""
    model = None if config is None else config.model
    return {
        "schema": SCHEMA, "family": subject.family or GENERIC, "task_family": subject.task_family,
        "architecture": subject.architecture, "source": str(path), "kind": kind,
        "n_layers": None if model is None else model.n_layers, "gamma": None if model is None else model.gamma,
        "d_model": None if layout is None else layout.d_model,
        "context_length": None if config is None else config.task.n,
        "tied": None if model is None else model.tied, "origin": None if config is None else config.origin,
        WEIGHTS: None, ACTIVATIONS: None,
    }


# ------------------------------------------------------------ running the registered analyzers
def _run(ctx: Context) -> None:
    """Every registered analyzer on one input: opened in order (a stream that reads no chunk is placed at
    once), then the recording read once in chunks feeding every other stream, then theirs placed in
    order."""
    streams = {}
    for a in analyzer_registry.analyzers():
        if not _applies(ctx, a):
            continue
        s = ctx.guard(a.key, a.open, ctx)
        if s is None:
            continue
        if s.paths:
            streams[a] = s
        else:
            _place(ctx, a, s)
    if streams:
        try:
            _stream(ctx, streams)
        except Exception as e:  # noqa: BLE001 - e.g. a dataset that cannot be read: no activations, the rest stays
            ctx.reasons[ACTIVATIONS], ctx.analysis[ACTIVATIONS] = failure(e), None
            streams = {}
    for a, s in streams.items():
        _place(ctx, a, s)


def _applies(ctx: Context, a: Analyzer) -> bool:
    """Whether there is something for the analyzer to add to: a weights section (place 'weights'), the
    activations of a recording (place 'activations': checked on the first such analyzer)."""
    if a.place == WEIGHTS:
        return isinstance(ctx.analysis.get(WEIGHTS), dict)
    if a.place == ACTIVATIONS:
        return ctx.facts is not None
    return True


def _stream(ctx: Context, streams: dict) -> None:
    """Pass 1: every stream fed the same chunks (one that raises is dropped with its reason, the others
    go on); then each stream's pass 2 (`finish`), where it has one."""
    rec, f, opts = ctx.rec, ctx.f, ctx.opts
    paths = set().union(*(s.paths for s in streams.values())) | {"prompts/task_id"}  # the per-task values
    paths = sorted(p for p in paths if p in f)
    row_bytes = sum(int(np.prod(f[p].shape[1:])) * 8 for p in paths)  # as float64 in memory
    budget = opts.chunk_mib if opts.chunk_mib is not None else CHUNK_MIB.get(ctx.kind, DEFAULT_CHUNK_MIB)
    rows = inputs.chunk_rows(row_bytes * 2, int(budget * 2**20), ctx.facts.N)  # x2: copies, temporaries
    batch = getattr(rec, "batch_rows", None)  # a live recording's forward batch
    if opts.chunk_mib is None and batch and rows < batch and batch * row_bytes * 2 <= LIVE_BATCH_MIB * 2**20:
        rows = min(batch, ctx.facts.N)  # whole forward batches (LIVE_BATCH_MIB)
    preparers = [s.prepare for s in streams.values() if hasattr(s, "prepare")]

    def prepare(data: dict, hurry) -> None:  # in the reader thread, ahead of the analysis (`Stream.prepare`)
        shared = {}
        for fn in preparers:
            if hurry():  # the analysis waits for this chunk: its streams compute the rest (`base.prepared`)
                break
            fn(data, shared, hurry)
        data[SHARED_KEY] = shared

    for start, stop, data in inputs.iter_chunks(rec, paths, rows, opts.progress, prepare if preparers else None):
        data[TASK_KEY] = data["prompts/task_id"] if "prompts/task_id" in data else np.arange(start, stop)
        chunk = Chunk(start, stop, data, data.pop(SHARED_KEY, {}))
        for a, s in list(streams.items()):
            try:
                s.update(chunk)
            except Exception as e:  # noqa: BLE001 - a bug in one analyzer must not lose the others
                ctx.reasons[a.key] = failure(e)
                del streams[a]
    for a, s in list(streams.items()):
        try:
            getattr(s, "finish", lambda rec, rows: None)(rec, rows)
        except Exception as e:  # noqa: BLE001
            ctx.reasons[a.key] = failure(e)
            del streams[a]


def _place(ctx: Context, a: Analyzer, stream) -> None:
    """The stream's `finalize` keys into the dict its analyzer's `place` names ('layers' of the
    activations merged into each layer's entry)."""
    res = ctx.guard(a.key, stream.finalize)
    where = ctx.analysis if a.place == ANALYSIS else ctx.analysis.get(a.place)
    if not isinstance(res, dict) or not isinstance(where, dict):
        return
    for key, value in res.items():
        if key == LAYERS and a.place == ACTIVATIONS:
            entries = {x[LAYER]: x for x in where[LAYERS]}
            for layer, fields in value.items():
                if layer in entries:
                    entries[layer].update(fields)
        else:
            where[key] = value


# ------------------------------------------------------------ checkpoints
def _analyze_checkpoint(path: Path, opts: AnalyzeOptions) -> dict:
    from ..models import checkpoint  # light: safetensors.numpy + JSON, no torch

    if opts.live_tasks:
        return _live_checkpoint(path, opts)
    config, tensors = checkpoint.read(path)
    subject = resolve(config.family, config.model.architecture_entry.name, config.task.family, config)
    layout = config.model.layout
    params = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()}
    reasons: dict = {}
    out = _header(path, "checkpoint", subject, config, layout)
    theta = guard(reasons, "theta_star", config.theta_star, list(params)) or {}
    ctx = Context("checkpoint", subject, layout, config, opts, reasons, out, params, theta, subject.model)
    _run(ctx)
    reasons[ACTIVATIONS] = "not applicable: a checkpoint has no recorded activations (record it with `icrl-interp record`)"
    return _finish(out, reasons)


def _live_checkpoint(path: Path, opts: AnalyzeOptions) -> dict:
    """A checkpoint's analysis with its activations, from `opts.live_tasks` prompts run live: the analysis
    of the recording `icrl-interp record CKPT --tasks N` would write, with `kind` 'checkpoint'."""
    from dataclasses import replace

    from ..models import checkpoint

    if isinstance(opts.live_tasks, bool) or not isinstance(opts.live_tasks, int) or opts.live_tasks < 0:
        raise UserError(f"live_tasks must be a non-negative integer, got {opts.live_tasks!r}")
    model = checkpoint.load(path)  # read once: its config rides along (`checkpoint_config`)
    try:
        out = analyze_model(model, model.checkpoint_config, tasks=opts.live_tasks, options=replace(opts, live_tasks=0),
                            name=str(path), checkpoint_sha256=checkpoint.sha256(path))
    except UserError as e:  # e.g. a task config its sampler refuses: the weights are still analyzed
        out = _analyze_checkpoint(path, replace(opts, live_tasks=0))
        out[SKIPPED][ACTIVATIONS] = f"the live run on the checkpoint's own task failed: {e}"
        out[SECTIONS] = _sections(out, out[SKIPPED])
        return out
    out["kind"] = "checkpoint"
    return out


# ------------------------------------------------------------- live: from the forward pass
# BLAS / torch threads at most the cores this process may use, BLAS one short beside the reader thread (core/threads.py)
@threads.limited(busy=1)
def analyze_model(model, task, *, task_options: dict | None = None, probe=None, tasks: int = 512,
                  batch_size: int = 128, seed: int = 0, baseline: str = "random-init", prompts=None,
                  out=None, options: AnalyzeOptions | None = None, name: str | None = None,
                  checkpoint_sha256: str = "", progress: bool = False, device=None) -> dict:
    """The analysis of `model` on `task` (a family name with `task_options`, a checkpoint directory or a
    CheckpointConfig; see `recorder.spec_and_source` for `probe`, `tasks`, `seed`, `prompts`).

    `baseline`: 'random-init' also runs the same architecture at random initialization (the probes'
    and readouts' baseline), 'none' does not. `out`: also write the recording there, in the same pass
    (`record --also-analyze`). `options`: the analysis knobs (`AnalyzeOptions`). `device`: where the
    model runs ('cpu', 'cuda', 'auto'; None: where it is); the analyzers run on the CPU, except the TD
    probes' GEMMs, which run on the model's device when that is not the CPU (`td_probe.on_device`)."""
    from ..recording.live import open_live  # torch: only when a model is run
    from ..recording.recorder import spec_and_source

    opts = options or AnalyzeOptions()
    spec, source = spec_and_source(model, task, task_options=task_options, probe=probe, tasks=tasks, seed=seed,
                                   prompts=prompts)
    name = name or type(model).__name__
    with open_live(model, spec, source, name=name, out=out, batch_size=batch_size, baseline=baseline,
                   checkpoint_sha256=checkpoint_sha256, outputs="require", progress=progress, device=device) as rec, \
            td_probe.on_device(next((p.device for p in model.parameters()), None)), \
            threads.beside(1):  # probes' GEMMs on a GPU model's device; torch one core short: the reader thread's
        # forward passes run beside the analysis (its BLAS pools stay those of `analyze`: the same rounding as a file's)
        result = analyze_open(rec, opts, source=name, kind="live")
        n_batches = rec.f.run.n_batches
        result["live"] = {
            "prompts": int(source.n_total), "batch_size": int(rec.f.run.batch_size), "batches": int(n_batches),
            "forward_batches": int(rec.forward_batches) + 1,  # + batch 0, run by prepare()
            "recording": None if out is None else str(Path(out)),
        }
    return result


# ------------------------------------------------------------ TL weights
def _analyze_tl(path: Path, opts: AnalyzeOptions) -> dict:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    if opts.layout is None or opts.family is None:
        raise UserError(f"{path}: TransformerLens weights need --layout FILE.json (how to cut the matrices into "
                        f"blocks) and --family (which construction to compare them with)")
    family = registry.get(opts.family)
    layout = inputs.layout_from_dict(opts.layout)
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable safetensors file ({e})") from None
    params = weights.tl_to_family(tensors, family.name, opts.head)
    subject = Subject(family.name, family.architecture, None, model=family)
    out = _header(path, "tl-weights", subject, None, layout)
    out["n_layers"] = len(weights.layers_of(params))
    reasons: dict = {}
    theta = guard(reasons, "theta_star", theta_for_layout, family.name, layout, params) if _fits(params, layout) else {}
    _run(Context("tl-weights", subject, layout, None, opts, reasons, out, params, theta or {}, family, foreign=True))
    reasons[ACTIVATIONS] = "not applicable: weights alone have no activations"
    return _finish(out, reasons)


def _fits(params: dict, layout) -> bool:
    """Every parameter is d_model x d_model of the layout (so theta* at the layout's dimensions applies)."""
    return layout is not None and weights.shape_mismatch(params, layout) is None


# ------------------------------------------------------------- recordings
def _analyze_recording(path: Path, opts: AnalyzeOptions) -> dict:
    from ..recording.format import Recording

    with Recording(path) as rec:
        return analyze_open(rec, opts)


def analyze_open(rec, opts: AnalyzeOptions | None = None, source=None, kind: str = "recording") -> dict:
    """The analysis of an open recording: a `recording.Recording`, or a `live.LiveRecording` fed by the
    forward pass (then `source` names the model and `kind` is 'live'; every other field is what the
    analysis of the recording of the same prompts holds)."""
    opts = opts or AnalyzeOptions()
    path = rec.path if source is None else source
    reasons: dict = {}
    config = rec.checkpoint_config  # a config that does not parse: the file is damaged (UserError)
    info = rec.model_info
    subject = resolve(info["family"], info["architecture"], rec.task_family, config)
    raw_layout = rec.attr("layout")
    layout = inputs.layout_from_dict(raw_layout) if raw_layout is not None else None
    if layout is None and opts.layout is not None:
        layout = inputs.layout_from_dict(opts.layout)
    _refuse_damage(rec, subject, layout, own_layout=raw_layout is not None)
    params = {k: np.asarray(v, dtype=np.float64) for k, v in rec.group("params").items()}
    theta = {k: np.asarray(v, dtype=np.float64) for k, v in rec.group("theta_star").items()}
    family_w = subject.model
    if subject.model is None and opts.family and any(".attn.W_" in k for k in params):
        # a foreign model's TransformerLens heads, read as the score / value maps of --family
        family_w = registry.get(opts.family)
        params = guard(reasons, WEIGHTS, weights.tl_to_family, params, family_w.name, opts.head) or {}
        theta = (guard(reasons, "theta_star", theta_for_layout, family_w.name, layout, params) or {}
                 if params and _fits(params, layout) else {})
    elif not theta and config is not None and subject.model is not None:
        # recorded without /theta_star: rebuild it
        theta = guard(reasons, "theta_star", config.theta_star, list(params)) or {}
    out = _header(path, kind, subject, config, layout)
    n_layers = int(rec.attr("n_layers", 0) or 0) or _layers_from_hooks(rec.hooks())
    gamma = float(rec.attr("gamma", math.nan))
    out["n_layers"], out["gamma"] = n_layers, None if math.isnan(gamma) else gamma
    ctx = Context(kind, subject, layout, config, opts, reasons, out, params, theta, family_w,
                  foreign=subject.model is None, n_layers=n_layers, gamma=gamma, rec=rec,
                  check=_check_recording)  # run on the first analyzer that reads activations (after the weights)
    _run(ctx)
    return _finish(out, reasons)


def _refuse_damage(rec, subject: Subject, layout, own_layout: bool) -> None:
    """A UserError for an input that is damaged or read with a layout that does not fit it, before any
    analyzer runs. A section that does not apply to a sound input (no task data, a foreign model's basis)
    is 'not applicable' in `skipped`; what is checked here would make every section wrong instead: every
    recording holds its prompts /prompts/z [N, pos, d_model] at its layout's width, and the families it
    names are registered (a family of your own: ICRL_INTERP_FAMILIES, docs/adding-a-family.md)."""
    for what, name, entry in (("task family", subject.task_family, subject.task),
                              ("model family", subject.family, subject.model)):
        if name is not None and entry is None:
            raise UserError(f"{rec.path}: the recording's {what} {name!r} is not a registered family (known: "
                            f"{', '.join(registry.names())}); register it (docs/adding-a-family.md) or check the file")
    if "prompts/z" not in rec.f:
        raise UserError(f"{rec.path}: damaged recording: no /prompts/z (every recording holds its prompts)")
    shape = tuple(rec.f["prompts/z"].shape)
    if len(shape) != 3:
        raise UserError(f"{rec.path}: damaged recording: /prompts/z has shape {shape}, expected [N, pos, d_model]")
    if layout is not None and shape[2] != layout.d_model:
        raise UserError(f"{rec.path}: damaged recording: its prompts have width {shape[2]} but its layout has d_model "
                        f"{layout.d_model}" if own_layout else f"--layout has d_model {layout.d_model} but the "
                        f"prompts of {rec.path} have width {shape[2]}: the layout does not fit this recording")


def _layers_from_hooks(hooks: list[str]) -> int:
    layers = [int(h.split(".")[1]) for h in hooks if h.startswith("blocks.") and h.split(".")[1].isdigit()]
    return max(layers) + 1 if layers else 0


def _check_recording(ctx: Context) -> Facts | None:
    """What the recording offers the activation analyzers, and the `activations` section they fill (one
    entry per layer); None (the reason in `skipped`) when there is nothing to analyze."""
    facts = _facts(ctx)
    if facts is None:
        return None
    ctx.hints = _value_hints(ctx.subject, ctx.layout)  # where the task's output sits (needs the layout)
    ctx.analysis["context_length"] = facts.n
    keys = sorted({k for a in analyzer_registry.analyzers() for k in a.layer_keys})  # one order, whoever registers
    ctx.analysis[ACTIVATIONS] = {"n_prompts": facts.N,
                                 LAYERS: [{LAYER: l, **dict.fromkeys(keys)} for l in range(ctx.n_layers)]}
    return facts


def _facts(ctx: Context) -> Facts | None:
    """Check the recording against the layout; None when there is nothing to analyze.

    `Facts.readable`: the layers whose hook_resid_post is recorded at the layout's width (the value error
    reads them; `value_error` says why the others are not). A recording without prompts is a UserError
    (without /prompts/z: `_refuse_damage`)."""
    rec, layout = ctx.rec, ctx.layout
    f, N = rec.f, rec.n_prompts
    if N == 0:
        raise UserError(f"{rec.path}: the recording holds no prompts")
    hooks = set(rec.hooks())
    if not hooks and "outputs/model" not in f and "lens" not in f:
        ctx.reasons[ACTIVATIONS] = "no recorded hooks"
        return None
    pos = int(f["prompts/z"].shape[1])  # present, at the layout's width: `_refuse_damage`
    readable = set()
    for l in range(ctx.n_layers) if layout is not None else ():
        h = f"blocks.{l}.hook_resid_post"
        if h in hooks and f[f"acts/{h}"].shape[-1] == layout.d_model:
            readable.add(l)
    task_note = str(rec.attr("task_data", "present"))
    has_tasks = task_note == "present" and all(f"tasks/{k}" in f for k in ("values", "stationary"))
    has_ref = "reference/td_errors" in f
    labelled = "prompts/state" in f and bool(np.any(f["prompts/state"][: min(N, 64)] >= 0))
    n = int(f["reference/td_errors"].shape[-1]) if has_ref else pos - 1
    return Facts(N, pos, n, hooks, has_tasks, has_ref, labelled, _n_states(rec, has_tasks, labelled), readable)


def _n_states(rec, has_tasks: bool, labelled: bool) -> int:
    f = rec.f
    for p in ("tasks/values", "tasks/stationary"):
        if has_tasks and p in f:
            return int(f[p].shape[-1])
    if not labelled:
        return 0
    top = -1
    ds = f["prompts/state"]
    for start in range(0, ds.shape[0], 65536):
        top = max(top, int(ds[start : start + 65536].max()))
    return top + 1


# ------------------------------------------------------------------ sections and status
def _reason(reasons: dict, *keys: str) -> str | None:
    """The first reason under one of `keys` (the key itself, else a `key.<detail>` entry)."""
    for key in keys:
        if key in reasons:
            return str(reasons[key])
        for k, v in reasons.items():
            if k.startswith(key + "."):
                return str(v)
    return None


def _sections(out: dict, reasons: dict) -> dict:
    """{analyzer: "ok" | "not applicable: why" | why it is missing | "failed: why"}, in registry order:
    'ok' where its part is there; else, for an analyzer of the activations where there are none, why
    not; else the first reason under its key, else its `missing`."""
    acts = out.get(ACTIVATIONS)
    sections = {}
    for a in analyzer_registry.analyzers():
        if a.is_computed(out):
            sections[a.name] = "ok"
        elif a.place == ACTIVATIONS and acts is None and reasons.get(ACTIVATIONS):
            sections[a.name] = str(reasons[ACTIVATIONS])
        else:
            sections[a.name] = _reason(reasons, a.key) or a.missing
    return sections


def _finish(out: dict, reasons: dict) -> dict:
    out[SKIPPED] = reasons
    out[SECTIONS] = _sections(out, reasons)
    return out


def status_of(analysis: dict) -> tuple[str, str]:
    """('ok' | 'partial' | 'nothing analyzed', one-line reasons) of an analysis dict.

    'ok': something was analyzed and every section that applies was computed; 'partial': something
    was, but a section that applies lacks an input or failed (the reasons name them); 'nothing
    analyzed': no section was computed. Analyses of other analyzers (no `sections`) are 'ok' when
    they hold weights or a per-layer metric."""
    sections = analysis.get(SECTIONS) if isinstance(analysis, dict) else None
    if not isinstance(sections, dict) or not sections:
        metric = any_layer(analysis, VALUE_ERROR, KERNEL_DIAGONALITY, TD_PROBE_R2)
        if (isinstance(analysis, dict) and analysis.get(WEIGHTS)) or metric:
            return "ok", ""
        skipped = (analysis or {}).get(SKIPPED) if isinstance(analysis, dict) else None
        why = "; ".join(f"{k}: {v}" for k, v in skipped.items()) if isinstance(skipped, dict) else ""
        return "nothing analyzed", why or "the analysis holds neither weights nor activations"
    missing = {k: str(v) for k, v in sections.items() if v != "ok" and not str(v).startswith(NOT_APPLICABLE)}
    if not any(v == "ok" for v in sections.values()):
        return "nothing analyzed", "; ".join(f"{k}: {v}" for k, v in sections.items())
    if missing:
        return "partial", "; ".join(f"{k}: {v}" for k, v in missing.items())
    return "ok", ""


def table_lines(analysis: dict) -> list[str]:
    """The lines of `icrl-interp analyze`'s table that the registered analyzers with a `line` add."""
    lines = []
    for a in analyzer_registry.analyzers():
        text = guard({}, a.name, a.line, analysis) if a.line is not None else None
        if text:
            lines.append(f"   {a.name}: {text}")
    return lines


# ------------------------------------------------------------------ public
# BLAS / torch threads at most the cores this process may use, BLAS one short beside the reader thread (core/threads.py)
@threads.limited(busy=1)
def analyze(path, options: AnalyzeOptions | None = None, **overrides) -> dict:
    """Analyze one checkpoint directory, recording or TL-weights file; returns the contract dict."""
    opts = options or AnalyzeOptions()
    if overrides:
        opts = AnalyzeOptions(**{**asdict(opts), **overrides})
    path = Path(path)
    kind = inputs.input_kind(path)
    if kind == "checkpoint":
        out = _analyze_checkpoint(path if path.is_dir() else path.parent, opts)
    elif kind == "recording":
        out = _analyze_recording(path, opts)
    else:
        out = _analyze_tl(path, opts)
    return json_clean(out)


def _row(path: str, options: dict) -> dict:
    """One input's row; errors become {"error": ...} so a batch never dies of one input."""
    try:
        return analyze(path, AnalyzeOptions(**options))
    except UserError as e:
        return {"schema": SCHEMA, "source": str(path), "error": str(e)}
    except Exception as e:  # a bug, but the rest of the batch still deserves its results
        return {"schema": SCHEMA, "source": str(path), "error": f"internal error ({type(e).__name__}): {e}"}


def analyze_many(paths, workers: int | None = None, options: AnalyzeOptions | None = None,
                 scheduler: str | None = None) -> list[dict]:
    """Analyze several inputs (directories expand to the checkpoints / recordings below them); one row
    per input, in input order. They run on `scheduler` (`cluster.parse_scheduler`: serial, local[:N],
    tcp://HOST:PORT); None = a local Dask cluster of `workers` processes (None: one per input, at most
    the CPUs) when there is more than one input, else in this process (docs/cluster.md)."""
    from ..core.cluster import choose_scheduler, open_engine

    items = inputs.expand_inputs([str(p) for p in paths])
    opts = asdict(options or AnalyzeOptions())
    chosen = choose_scheduler(scheduler, len(items), min(len(items), workers or os.cpu_count() or 1))
    if chosen.kind == "serial":
        return [_row(p, opts) for p in items]
    # one bar over the inputs in this process: bars from several workers would interleave
    progress, opts["progress"] = opts.get("progress", False), False
    with open_engine(chosen) as engine:
        rows = engine.map(_row, [(p, opts) for p in items], desc="analyzing", progress=progress,
                          lost=lambda why: f"analysis process died: {why}")
    return [{"schema": SCHEMA, "source": str(p), "error": r} if isinstance(r, str) else r for p, r in zip(items, rows)]
