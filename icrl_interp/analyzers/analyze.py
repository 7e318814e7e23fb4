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

Each section (weights, population kernel, value error, kernels, probes, Wang's metrics, readouts) is
computed independently: one that cannot run says why in `skipped` ('not applicable: ...' where it
does not apply to this input, 'failed: ...' where it raised, else the input it lacks), and one that
fails never drops the others. `sections` sums this up per section and `status_of` turns it into the
status of a report row ('ok', 'partial', 'nothing analyzed').

`analyze_model(model, task)` is the live analysis: the model runs over the prompts `icrl_interp.record`
would record and the same analyzers read the stream of batches (`icrl_interp.recording.live`); the result is the
analysis of that recording, field for field, except `source` (the model's name), `kind` ('live') and
the extra `live` object (docs/analyzers.md, "Live analysis").

Fields added to `icrl_interp.analysis/1` (all optional for readers):
  task_family   the task's registered family (None: prompts of no known task, or TL weights);
  architecture  the model's architecture (`registry.Architecture.name`; None: not a known one);
  sections      {section: "ok" | reason} (SECTIONS);
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

from ..families import registry
from ..core.errors import ModelFault, UserError
from ..core.files import json_clean
from ..tasks.layouts import PromptLayout
from . import convergence, inputs, readout as R, streams as S, weights

SCHEMA = "icrl_interp.analysis/1"
GENERIC = "generic"
"""`family` of the analysis of a model of no registered family."""
POPULATION_TASKS = 256
"""Tasks drawn from a checkpoint's task distribution (seed 0) for its population kernel."""
DEFAULT_PRIMARY_PROBE = ("hook_resid_post",)
"""The headline TD probe of prompts of no known task (`Hints.primary_probe`'s default)."""


@dataclass
class AnalyzeOptions:
    """Knobs of one analysis (defaults are what the CLI uses)."""

    chunk_mib: float = 128.0
    """Memory budget for one chunk of prompts read from a recording, in MiB."""
    test_fraction: float = 0.25
    """Fraction of tasks held out to score the TD probes and the tuned-lens readouts."""
    folds: int = 5
    """Cross-validation folds (over training tasks) for the ridge penalty."""
    seed: int = 0
    """Seed of the task split."""
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


# --------------------------------------------------------------------- json
# ------------------------------------------------------------- who is who
@dataclass
class Subject:
    """The families and architecture an analysis is about (see the module docstring)."""

    family: str | None
    """The model's family name (registered or not; None: a model of no family)."""
    architecture: str | None
    """The model's architecture name (None: unknown)."""
    task_family: str | None
    """The registered family whose prompts were recorded (None: none / unknown)."""

    @property
    def model(self) -> registry.Family | None:
        return registry.find(self.family)

    @property
    def arch(self) -> registry.Architecture | None:
        if self.architecture is None:
            return None
        try:
            return registry.architecture(self.architecture)
        except UserError:
            return None

    @property
    def task(self) -> registry.Family | None:
        return registry.find(self.task_family)

    @property
    def task_hints(self) -> registry.Hints | None:
        task = self.task
        return None if task is None else task.hints


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


def _weights_section(family: str | None, params, theta, layout, reasons: dict, foreign: bool = False) -> dict | None:
    """The `weights` section, or None with the reason in `reasons["weights"]`. Never raises: the other
    sections do not depend on it. 'not applicable: ...' where the weights cannot be a construction's
    (a model of no family; `foreign` weights read as --family whose matrices are not d_model x d_model
    of the layout, e.g. a model that embeds its input); 'failed: ...' where they should have been."""
    known = registry.find(family)
    if known is None:
        reasons["weights"] = f"not applicable: family {family or GENERIC!r} has no construction to compare with"
        return None
    if layout is None:
        reasons["weights"] = "no prompt layout (pass --layout)"
        return None
    if not params:
        reasons["weights"] = "no parameters recorded"
        return None
    why = weights.shape_mismatch(params, layout)
    if why:
        reasons["weights"] = (f"not applicable: {why}: the model's weights are not in the prompt basis (e.g. it "
                              f"embeds its input), so there is no construction to compare them with" if foreign else
                              f"failed: {why}; the layout does not fit the matrices")
        return None
    if not theta:
        reasons["manifold"] = f"not applicable: no theta* for family {family!r}: only block norms and lazy drift"
    return _guard(reasons, "weights", weights.analyze_weights, known, params, theta, layout)


def _guard(reasons: dict, key: str, fn, *args, **kw):
    """fn(*args, **kw), or None with 'failed: why' in reasons[key]: one analyzer's failure never drops
    the others."""
    try:
        return fn(*args, **kw)
    except Exception as e:  # noqa: BLE001
        reasons[key] = _failure(e)
    return None


def _failure(e: BaseException) -> str:
    """The `skipped` reason of an analyzer that raised; a failure of the model a live analysis runs is
    raised on: it fails every analyzer, and the run."""
    if isinstance(e, ModelFault):
        raise e
    if isinstance(e, UserError):
        return f"failed: {e}"
    return f"failed (internal error, {type(e).__name__}): {e}"


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
    }


# ------------------------------------------------------------ checkpoints
def _analyze_checkpoint(path: Path, opts: AnalyzeOptions) -> dict:
    from ..models import checkpoint  # light: safetensors.numpy + JSON, no torch

    if opts.live_tasks:
        return _live_checkpoint(path, opts)
    config, tensors = checkpoint.read(path)
    subject = Subject(config.family, config.model.architecture, config.task.family)
    layout = config.model.layout
    params = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()}
    reasons: dict = {}
    out = _header(path, "checkpoint", subject, config, layout)
    theta = _guard(reasons, "theta_star", config.theta_star, list(params)) or {}
    out["weights"] = _weights_section(subject.family, params, theta, layout, reasons)
    block = subject.model.hints.population_kernel
    if out["weights"] is not None and block is not None:
        out["weights"]["population_kernel"] = _guard(reasons, "population_kernel", _sampled_population_kernel,
                                                     config, subject, params, layout, block, reasons)
    out["activations"] = None
    reasons["activations"] = "not applicable: a checkpoint has no recorded activations (record it with `icrl-interp record`)"
    return _finish(out, reasons)


def _live_checkpoint(path: Path, opts: AnalyzeOptions) -> dict:
    """A checkpoint's analysis with its activations, from `opts.live_tasks` prompts run live: the analysis
    of the recording `icrl-interp record CKPT --tasks N` would write, with `kind` 'checkpoint'."""
    from dataclasses import replace

    from ..models import checkpoint

    if isinstance(opts.live_tasks, bool) or not isinstance(opts.live_tasks, int) or opts.live_tasks < 0:
        raise UserError(f"live_tasks must be a non-negative integer, got {opts.live_tasks!r}")
    config = checkpoint.read(path)[0]
    try:
        out = analyze_model(checkpoint.load(path), config, tasks=opts.live_tasks, options=replace(opts, live_tasks=0),
                            name=str(path), checkpoint_sha256=checkpoint.sha256(path))
    except UserError as e:  # e.g. a task config its sampler refuses: the weights are still analyzed
        out = _analyze_checkpoint(path, replace(opts, live_tasks=0))
        out["skipped"]["activations"] = f"the live run on the checkpoint's own task failed: {e}"
        out["sections"] = _sections(out, out["skipped"])
        return out
    out["kind"] = "checkpoint"
    return out


# ------------------------------------------------------------- live: from the forward pass
def analyze_model(model, task, *, task_options: dict | None = None, probe=None, tasks: int = 512,
                  batch_size: int = 128, seed: int = 0, baseline: str = "random-init", prompts=None,
                  out=None, options: AnalyzeOptions | None = None, name: str | None = None,
                  checkpoint_sha256: str = "", progress: bool = False, device=None) -> dict:
    """The analysis of `model` on `task` (a family name with `task_options`, a checkpoint directory or a
    CheckpointConfig; see `recorder.spec_and_source` for `probe`, `tasks`, `seed`, `prompts`).

    `baseline`: 'random-init' also runs the same architecture at random initialization (the probes'
    and readouts' baseline), 'none' does not. `out`: also write the recording there, in the same pass
    (`record --also-analyze`). `options`: the analysis knobs (`AnalyzeOptions`). `device`: where the
    model runs ('cpu', 'cuda', 'auto'; None: where it is); the analyzers run on the CPU."""
    from ..recording.live import open_live  # torch: only when a model is run
    from ..recording.recorder import spec_and_source

    opts = options or AnalyzeOptions()
    spec, source = spec_and_source(model, task, task_options=task_options, probe=probe, tasks=tasks, seed=seed,
                                   prompts=prompts)
    name = name or type(model).__name__
    with open_live(model, spec, source, name=name, out=out, batch_size=batch_size, baseline=baseline,
                   checkpoint_sha256=checkpoint_sha256, outputs="require", progress=progress, device=device) as rec:
        result = analyze_open(rec, opts, source=name, kind="live")
        n_batches = rec.f.run.n_batches
        result["live"] = {
            "prompts": int(source.n_total), "batch_size": int(rec.f.run.batch_size), "batches": int(n_batches),
            "forward_batches": int(rec.forward_batches) + 1,  # + batch 0, run by prepare()
            "recording": None if out is None else str(Path(out)),
        }
    return result


def _sampled_population_kernel(config, subject: Subject, params, layout, block: str, reasons) -> list[dict] | None:
    """M_pi on POPULATION_TASKS tasks drawn (seed 0) by the task family's sampler."""
    try:
        pb = subject.task.sample(config, config.task, POPULATION_TASKS, np.random.default_rng(0))
    except (UserError, KeyError, TypeError, ValueError) as e:
        reasons["population_kernel"] = f"cannot draw tasks from the checkpoint's task config: {e}"
        return None
    if "phi" not in pb.tasks or "stationary" not in pb.tasks:
        reasons["population_kernel"] = "not applicable: the task family's tasks have no state features (tasks/phi)"
        return None
    phi, mu = pb.tasks["phi"], pb.tasks["stationary"]
    pk = S.PopulationKernel(params, layout, config.model.n_layers, config.model.gamma, phi.shape[1],
                            score=subject.arch.score, block=block)
    pk.update(phi, mu)
    return pk.result(f"sampled: {POPULATION_TASKS} tasks of the checkpoint's task distribution, seed 0")


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
    subject = Subject(family.name, family.architecture, None)
    out = _header(path, "tl-weights", subject, None, layout)
    out["n_layers"] = len(weights.layers_of(params))
    reasons: dict = {}
    theta = _guard(reasons, "theta_star", theta_for_layout, family.name, layout, params) if _fits(params, layout) else {}
    out["weights"] = _weights_section(family.name, params, theta or {}, layout, reasons, foreign=True)
    out["activations"] = None
    reasons["activations"] = "not applicable: weights alone have no activations"
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
    subject = Subject(info["family"], info["architecture"], rec.task_family)
    raw_layout = rec.attr("layout")
    layout = inputs.layout_from_dict(raw_layout) if raw_layout is not None else None
    if layout is None and opts.layout is not None:
        layout = inputs.layout_from_dict(opts.layout)
    _refuse_damage(rec, subject, layout, own_layout=raw_layout is not None)
    params = {k: np.asarray(v, dtype=np.float64) for k, v in rec.group("params").items()}
    theta = {k: np.asarray(v, dtype=np.float64) for k, v in rec.group("theta_star").items()}
    family_w = subject.family
    if subject.model is None and opts.family and any(".attn.W_" in k for k in params):
        # a foreign model's TransformerLens heads, read as the score / value maps of --family
        family_w = registry.get(opts.family).name
        params = _guard(reasons, "weights", weights.tl_to_family, params, family_w, opts.head) or {}
        theta = (_guard(reasons, "theta_star", theta_for_layout, family_w, layout, params) or {}
                 if params and _fits(params, layout) else {})
    elif not theta and config is not None and subject.model is not None:
        # recorded without /theta_star: rebuild it
        theta = _guard(reasons, "theta_star", config.theta_star, list(params)) or {}
    out = _header(path, kind, subject, config, layout)
    n_layers = int(rec.attr("n_layers", 0) or 0) or _layers_from_hooks(rec.hooks())
    gamma = float(rec.attr("gamma", math.nan))
    out["n_layers"], out["gamma"] = n_layers, None if math.isnan(gamma) else gamma
    out["weights"] = None
    if "weights" not in reasons:  # (a failed conversion of TL heads has said why)
        out["weights"] = _weights_section(family_w, params, theta, layout, reasons, foreign=subject.model is None)
    out["activations"] = _guard(reasons, "activations", _activations, rec, subject, layout, params, config,
                                n_layers, gamma, opts, reasons, out)
    return _finish(out, reasons)


def _refuse_damage(rec, subject: Subject, layout, own_layout: bool) -> None:
    """A UserError for an input that is damaged or read with a layout that does not fit it, before any
    analyzer runs. A section that does not apply to a sound input (no task data, a foreign model's basis)
    is 'not applicable' in `skipped`; what is checked here would make every section wrong instead: every
    recording holds its prompts /prompts/z [N, pos, d_model] at its layout's width, and the families it
    names are registered (a family of your own: ICRL_INTERP_FAMILIES, docs/adding-a-family.md)."""
    for what, name in (("task family", subject.task_family), ("model family", subject.family)):
        if name is not None and registry.find(name) is None:
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


def _dtype_attr(ds) -> str:
    v = ds.attrs.get("dtype", "")
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass
class _Facts:
    """What a recording offers the activation analyzers."""

    N: int
    pos: int
    n: int
    hooks: set
    has_tasks: bool
    has_ref: bool
    labelled: bool
    n_states: int
    readable: set
    """Layers whose hook_resid_post is recorded at the layout's width (the readouts need it)."""


def _facts(rec, subject: Subject, layout, n_layers, reasons) -> _Facts | None:
    """Check the recording against the layout; None when there is nothing to analyze.

    The value error reads hook_resid_post of the layers recorded at the layout's width; every other
    layer gets its reason (a model of a known family that lacks the hook or has another width: the
    recording or the layout is wrong; a foreign model: its residual stream has its own basis, and the
    readouts serve instead). A recording without prompts is a UserError (without /prompts/z: `_refuse_damage`)."""
    f, N = rec.f, rec.n_prompts
    if N == 0:
        raise UserError(f"{rec.path}: the recording holds no prompts")
    hooks = set(rec.hooks())
    if not hooks and "outputs/model" not in f and "lens" not in f:
        reasons["activations"] = "no recorded hooks"
        return None
    pos = int(f["prompts/z"].shape[1])  # present, at the layout's width: `_refuse_damage`
    readable = set()
    if layout is not None:
        foreign = subject.model is None
        for l in range(n_layers):
            h = f"blocks.{l}.hook_resid_post"
            width = f[f"acts/{h}"].shape[-1] if h in hooks else None
            if h not in hooks:
                reasons[f"value_error.layer{l}"] = (f"no {h} recorded" if foreign else
                                                    f"the recording lacks hook {h}, which the value error needs; add "
                                                    f"blocks.*.hook_resid_post to the probe spec")
            elif width != layout.d_model:
                reasons[f"value_error.layer{l}"] = (
                    f"not applicable: {h} has width {width}, not the layout's d_model {layout.d_model}: the model's "
                    f"residual stream is not in the prompt layout (see readouts)" if foreign else
                    f"failed: hook {h} has width {width} but the layout has d_model {layout.d_model}: the layout "
                    f"does not fit")
            else:
                readable.add(l)
    else:
        reasons["value_error"] = "no prompt layout (pass --layout): the values cannot be read from the residual stream"
    task_note = str(rec.attr("task_data", "present"))
    has_tasks = task_note == "present" and all(f"tasks/{k}" in f for k in ("values", "stationary"))
    if not has_tasks:
        reasons["value_error"] = f"no task data ({task_note})"
    has_ref = "reference/td_errors" in f
    if not has_ref:
        reasons["td_probe"] = "no /reference/td_errors in the recording"
    labelled = "prompts/state" in f and bool(np.any(f["prompts/state"][: min(N, 64)] >= 0))
    n = int(f["reference/td_errors"].shape[-1]) if has_ref else pos - 1
    return _Facts(N, pos, n, hooks, has_tasks, has_ref, labelled, _n_states(rec, has_tasks, labelled), readable)


def _td_preconditioner(config):
    """The checkpoint's TD preconditioner C (the `C` constant of its family), None (identity) without one."""
    try:
        return None if config is None else (config.constants or {}).get("C")
    except UserError:  # a family this process does not know: no constants to read
        return None


def _wang_stream(rec, subject: Subject, layout, params, config, n_layers, facts: _Facts, reasons, per_task_max: int = 0,
                 alpha: float | None = None):
    """The VD/SS/IWS accumulator when the recording allows it (else the reason is noted)."""
    f, arch = rec.f, subject.arch
    activation = None if config is None else config.model.activation
    if activation:
        reasons["wang_metrics"] = f"not applicable: the model uses activation {activation!r}; VD/SS/IWS need linear attention"
    elif arch is None:
        reasons["wang_metrics"] = "not applicable: needs a model of a known architecture (its value and score parameters)"
    elif not facts.has_tasks or not all(p in f for p in ("tasks/phi", "tasks/stationary")):
        reasons["wang_metrics"] = "needs task data (features, stationary distribution)"
    elif any(S.layer_param(params, l, k) is None for l in range(n_layers) for k in (arch.value, arch.score)):
        reasons["wang_metrics"] = f"needs the recorded parameters {arch.value} and {arch.score} of every layer"
    elif not {"phi", "gamma_phi_next", "reward"} <= set(layout.names):
        reasons["wang_metrics"] = (f"not applicable: VD/SS/IWS read each prompt's transitions from the layout's blocks "
                                   f"phi, gamma_phi_next and reward; this layout has {', '.join(layout.names)}")
    elif any(l not in facts.readable for l in range(n_layers)):
        reasons["wang_metrics"] = "needs hook_resid_post of every layer"
    elif any(f[f"acts/blocks.{l}.hook_resid_post"].shape[1] != facts.pos for l in range(n_layers)):
        reasons["wang_metrics"] = "needs hook_resid_post at every position"
    else:
        C = _td_preconditioner(config)
        return S.WangStream(params, layout, n_layers, facts.pos, value=arch.value, score=arch.score,
                            per_task_max=per_task_max, alpha=alpha, C=None if C is None else np.asarray(C, float))
    return None


def _activations(rec, subject: Subject, layout, params, config, n_layers, gamma, opts, reasons, out) -> dict | None:
    facts = _facts(rec, subject, layout, n_layers, reasons)
    if facts is None:
        return None
    f = rec.f
    hints = _value_hints(subject, layout)  # where the task's output sits (needs the layout)
    model_hints = subject.model.hints if subject.model is not None and layout is not None else None
    arch = subject.arch
    out["context_length"] = facts.n
    gamma_k = gamma if math.isfinite(gamma) else 0.0

    values, kernels = {}, {}
    probes = S.ProbeSet(f, facts.N, facts.pos, facts.n, opts) if facts.has_ref else None
    if probes is not None and probes.targets.note:
        reasons["td_probe.values"] = probes.targets.note
    direction = S.td_direction(hints, layout)
    for l in range(n_layers):
        if hints is not None and l in facts.readable:
            try:
                values[l] = S.ValueStream(hints, l, layout, f[f"acts/blocks.{l}.hook_resid_post"], facts.pos,
                                          facts.has_tasks, "reference/values" in f, opts.per_task_max)
            except (ValueError, UserError) as e:
                reasons[f"value_error.layer{l}"] = str(e)
        ph = f"blocks.{l}.attn.hook_pattern"
        if ph in facts.hooks and (arch is None or arch.softmax):
            # a softmax pattern (or one of a foreign model: KernelStream checks the rows sum to 1) is a kernel
            ds = f[f"acts/{ph}"]
            use_labels = facts.labelled and facts.n_states > 0 and math.isfinite(gamma)
            no_labels = ("no state labels (prompts/state is -1)" if not (facts.labelled and facts.n_states > 0) else
                         "no discount γ recorded (the contraction threshold (1+γ)/2 needs it)")
            k = _guard(reasons, "kernel_diagonality", S.KernelStream, l, ds, facts.pos, gamma_k, facts.n_states, layout,
                       opts.kernel_matrix_max_states, use_labels, _dtype_attr(ds) == "bfloat16", opts.per_task_max,
                       no_labels)
            if k is not None:
                kernels[l] = k
        elif ph in facts.hooks:
            reasons.setdefault("kernel_diagonality",
                               f"not applicable: the {subject.family} attention pattern is not a softmax kernel")
        for h in sorted(x for x in facts.hooks if x.startswith(f"blocks.{l}.")) if facts.has_ref else ():
            it = S.probe_iteration(h, l)
            if it >= f["reference/td_errors"].shape[1]:
                reasons[f"td_probe.{h}"] = f"no reference TD error for iteration {it}"
                continue
            try:
                base = f.get(f"baseline/acts/{h}")  # the same hook at random initialization, when recorded
                p = probes.add(l, h, f[f"acts/{h}"], direction if h.endswith("hook_resid_post") else None, base)
                if p.base_note and "baseline" in f:
                    reasons[f"td_probe.{h}.random_init"] = p.base_note
            except ValueError as e:
                reasons[f"td_probe.{h}"] = str(e)
    wang = None
    if hints is not None and hints.query_linear:
        wang = _guard(reasons, "wang_metrics", _wang_stream, rec, subject, layout, params, config, n_layers, facts,
                      reasons, opts.per_task_max, opts.wang_alpha)
    population = None
    block = None if model_hints is None else model_hints.population_kernel
    if block is not None and arch is not None and facts.has_tasks and "tasks/phi" in f and params \
            and out.get("weights") is not None:
        population = _guard(reasons, "population_kernel", S.PopulationKernel, params, layout, n_layers, gamma,
                            facts.n_states, score=arch.score, block=block)
    readouts = None
    if "outputs/model" in f or "lens" in f:  # a foreign model's own output / readout (see readout.py)
        readouts = _guard(reasons, "readouts", R.Readouts, f, hints, layout, facts.pos, opts.seed, opts.test_fraction,
                          opts.per_task_max, reasons)
    elif subject.model is not None or facts.readable:
        reasons["readouts"] = "not applicable: the residual stream is in the prompt layout (value_error reads it)"
    else:
        reasons["readouts"] = ("no outputs/model or lens/{l} recorded (record the model with this version's "
                               "`icrl-interp record --model`)")

    paths = set()
    for v in values.values():
        paths.update((v.path, "prompts/state", "tasks/values", "tasks/stationary", "reference/values", "reference/output"))
    for k in kernels.values():
        paths.update((k.path, "prompts/state", "prompts/z"))
    if probes is not None and probes.probes:
        paths.update(probes.paths)
    if wang is not None:
        paths.update(wang.paths())
    if population is not None:
        paths.update(("tasks/phi", "tasks/stationary"))
    if readouts is not None:
        paths.update(readouts.paths)
    if paths:
        paths.add("prompts/task_id")  # the per-task values (when recorded; else the prompt index)
    paths = sorted(p for p in paths if p in f)
    row_bytes = sum(int(np.prod(f[p].shape[1:])) * 8 for p in paths)  # as float64 in memory
    rows = inputs.chunk_rows(row_bytes * 2, int(opts.chunk_mib * 2**20), facts.N)  # x2: copies, temporaries

    # every stream is fed the same chunk; one that fails is dropped with its reason, the others go on
    streams: dict = {f"value_error.layer{l}": (lambda a, b, d, v=v: v.update(d)) for l, v in values.items()}
    streams.update({f"kernel_diagonality.layer{l}": (lambda a, b, d, k=k: k.update(d, d["_shared"]))
                    for l, k in kernels.items()})
    if probes is not None and probes.probes:
        streams["td_probe"] = probes.update
    if wang is not None:
        streams["wang_metrics"] = lambda a, b, d: wang.update(d)
    if population is not None:
        streams["population_kernel"] = lambda a, b, d: population.update(d["tasks/phi"], d["tasks/stationary"])
    if readouts is not None:
        streams["readouts"] = readouts.update
    dead: set = set()
    for start, stop, data in inputs.iter_chunks(rec, paths, rows, opts.progress) if streams else ():
        data[S.TASK_KEY] = data["prompts/task_id"] if "prompts/task_id" in data else np.arange(start, stop)
        data["_shared"] = {}  # per-chunk columns the kernel streams of all layers share
        for key, update in streams.items():
            if key in dead:
                continue
            try:
                update(start, stop, data)
            except Exception as e:  # noqa: BLE001 - a bug in one analyzer must not lose the others
                reasons[key] = _failure(e)
                dead.add(key)
    values = {l: v for l, v in values.items() if f"value_error.layer{l}" not in dead}
    kernels = {l: k for l, k in kernels.items() if f"kernel_diagonality.layer{l}" not in dead}
    wang = None if "wang_metrics" in dead else wang
    population = None if "population_kernel" in dead else population
    readouts = None if "readouts" in dead else readouts
    if "td_probe" in dead:
        probes = None

    if probes is not None and probes.probes:
        try:  # pass 2: the held-out prompts only, for the per-task intervals
            probes.finish(rec, rows)
        except Exception as e:  # noqa: BLE001
            reasons["td_probe"], probes = _failure(e), None
    if readouts is not None:
        try:  # pass 2: the tuned lens on held-out tasks (a failure there keeps the logit lens)
            readouts.finish(rec, rows)
        except Exception as e:  # noqa: BLE001
            reasons["readouts.tuned-linear"] = _failure(e)
            readouts.solved = {}
    primary = hints.primary_probe if hints is not None else DEFAULT_PRIMARY_PROBE
    layers = [_layer_entry(primary, l, values, kernels, probes, reasons) for l in range(n_layers)]
    result = {"n_prompts": facts.N, "layers": layers}
    result["convergence"] = _guard(reasons, "convergence", convergence.depth_summary, [x["layer"] for x in layers],
                                   [x.get("value_error") for x in layers], [x.get("reference_value_error") for x in layers])
    if wang is not None:
        tol = 1e-8 if _dtype_attr(f["acts/blocks.0.hook_resid_post"]) == "float64" else 1e-3
        res = _guard(reasons, "wang_metrics", wang.result, tol)
        if res is not None:
            result["wang_metrics"], why = res
            if why:
                reasons["wang_metrics"] = why
    if readouts is not None:
        result["readouts"] = _guard(reasons, "readouts", readouts.result)
    if population is not None and out.get("weights") is not None:
        out["weights"]["population_kernel"] = _guard(reasons, "population_kernel", population.result, "recorded tasks")
    return result


def _layer_entry(primary: tuple[str, ...], l, values, kernels, probes, reasons) -> dict:
    entry = {"layer": l, "kernel_diagonality": None, "td_probe_r2": None, "value_error": None}
    if l in values:
        entry.update(_guard(reasons, f"value_error.layer{l}", values[l].result) or {})
    res = _guard(reasons, f"kernel_diagonality.layer{l}", kernels[l].result) if l in kernels else None
    if res is not None:
        kd, free, why = res
        entry["kernel_diagonality"], entry["label_free_diagonal"] = kd, free
        if why:
            reasons.setdefault("kernel_diagonality", why)
    layer_probes = {} if probes is None else _guard(
        reasons, f"td_probe.layer{l}", lambda: {h: probes.result(l, h) for (ll, h) in probes.probes if ll == l}) or {}
    if layer_probes:
        hook = primary_probe(primary, l, layer_probes)
        head = {} if hook is None else layer_probes[hook]
        entry["td_probe"] = layer_probes
        entry["td_probe_hook"] = hook
        entry["td_probe_r2"] = head.get("r2")
        entry["td_probe_r2_shuffled"] = head.get("r2_shuffled")
        # the headline: R^2 minus the largest baseline (input, random init, shuffled), with its interval
        entry["td_probe_selectivity"] = head.get("selectivity")
        entry["td_probe_selectivity_ci"] = head.get("selectivity_ci")
        entry["td_probe_baseline"] = head.get("max_baseline")
    return entry


def primary_probe(order: tuple[str, ...], layer: int, probes: dict) -> str | None:
    """The hook whose R^2 is the contract's td_probe_r2: the first of `Hints.primary_probe` (hooks
    relative to blocks.{layer}, where the construction puts delta) that was probed."""
    for rel in order:
        h = f"blocks.{layer}.{rel}"
        if h in probes:
            return h
    return None


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
SECTIONS = ("weights", "population_kernel", "value_error", "kernels", "probes", "wang_metrics", "readouts")
"""The analyses whose outcome `sections` reports, each computed independently of the others."""
NOT_APPLICABLE = "not applicable"


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
    """{section: "ok" | "not applicable: why" | why it is missing | "failed: why"} (see SECTIONS)."""
    w, acts = out.get("weights"), out.get("activations")
    layers = [x for x in ((acts or {}).get("layers") or []) if isinstance(x, dict)]

    def any_layer(*keys) -> bool:
        return any(x.get(k) is not None for x in layers for k in keys)

    def pick(ok: bool, keys: tuple[str, ...], default: str) -> str:
        if ok:
            return "ok"
        if acts is None and reasons.get("activations"):
            return str(reasons["activations"])
        return _reason(reasons, *keys) or default

    return {
        "weights": "ok" if w else _reason(reasons, "weights") or f"{NOT_APPLICABLE}: no weights",
        "population_kernel": "ok" if (w or {}).get("population_kernel") else (
            _reason(reasons, "population_kernel") or f"{NOT_APPLICABLE}: no population kernel for this model "
                                                     f"(Hints.population_kernel, its weights and the tasks' features)"),
        "value_error": pick(any_layer("value_error"), ("value_error",),
                            f"{NOT_APPLICABLE}: no residual stream in the prompt layout"),
        "kernels": pick(any_layer("kernel_diagonality", "label_free_diagonal"), ("kernel_diagonality",),
                        f"{NOT_APPLICABLE}: no attention pattern recorded"),
        "probes": pick(any_layer("td_probe_r2", "td_probe"), ("td_probe",), f"{NOT_APPLICABLE}: no hook to probe"),
        "wang_metrics": pick(bool((acts or {}).get("wang_metrics")), ("wang_metrics",),
                             f"{NOT_APPLICABLE}: the task's output is not linear in the query (Hints.query_linear)"),
        "readouts": pick(bool((acts or {}).get("readouts")), ("readouts",),
                         f"{NOT_APPLICABLE}: no model output or lens recorded"),
    }


def _finish(out: dict, reasons: dict) -> dict:
    out["skipped"] = reasons
    out["sections"] = _sections(out, reasons)
    return out


def status_of(analysis: dict) -> tuple[str, str]:
    """('ok' | 'partial' | 'nothing analyzed', one-line reasons) of an analysis dict.

    'ok': something was analyzed and every section that applies was computed; 'partial': something
    was, but a section that applies lacks an input or failed (the reasons name them); 'nothing
    analyzed': no section was computed. Analyses of other analyzers (no `sections`) are 'ok' when
    they hold weights or a per-layer metric."""
    sections = analysis.get("sections") if isinstance(analysis, dict) else None
    if not isinstance(sections, dict) or not sections:
        acts = (analysis or {}).get("activations") if isinstance(analysis, dict) else None
        layers = acts.get("layers") if isinstance(acts, dict) else None
        metric = any(isinstance(x, dict) and any(x.get(k) is not None for k in
                                                 ("value_error", "kernel_diagonality", "td_probe_r2"))
                     for x in (layers if isinstance(layers, list) else []))
        if (isinstance(analysis, dict) and analysis.get("weights")) or metric:
            return "ok", ""
        skipped = (analysis or {}).get("skipped") if isinstance(analysis, dict) else None
        why = "; ".join(f"{k}: {v}" for k, v in skipped.items()) if isinstance(skipped, dict) else ""
        return "nothing analyzed", why or "the analysis holds neither weights nor activations"
    missing = {k: str(v) for k, v in sections.items() if v != "ok" and not str(v).startswith(NOT_APPLICABLE)}
    if not any(v == "ok" for v in sections.values()):
        return "nothing analyzed", "; ".join(f"{k}: {v}" for k, v in sections.items())
    if missing:
        return "partial", "; ".join(f"{k}: {v}" for k, v in missing.items())
    return "ok", ""


# ------------------------------------------------------------------ public
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
