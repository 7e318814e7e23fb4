"""One call from an input (checkpoint, recording, TL weights) to the analysis JSON contract.

`analyze(path)` returns a dict with schema `icrl_interp.analysis/1` (every field is documented in
docs/formats.md, "Analysis JSON"); `analyze_many(paths, workers)` runs inputs in parallel processes
and returns one row per input, a failing input giving a row with an "error" field. A recording is
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

Fields added to `icrl_interp.analysis/1` (all optional for readers):
  task_family   the task's registered family (None: prompts of no known task, or TL weights);
  architecture  the model's architecture (`registry.Architecture.name`; None: not a known one).
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .. import registry
from ..errors import UserError
from ..files import json_clean
from ..layouts import PromptLayout
from . import inputs, streams as S, weights

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
    """Fraction of tasks held out to score the TD probes."""
    folds: int = 5
    """Cross-validation folds (over training tasks) for the ridge penalty."""
    seed: int = 0
    """Seed of the task split."""
    probe_max_tasks: int = 8192
    """At most about this many tasks (a hashed subset of whole pairs) feed the TD probes; 0 = all.
    8192 tasks of n columns are 8192 n samples for a ridge on <= 16 features: far past saturation."""
    progress: bool = False
    """Show a progress bar over chunks."""
    layout: dict | None = None
    """Prompt layout (PromptLayout.to_dict()) for TransformerLens weights or generic recordings."""
    family: str | None = field(default=None, metadata={"choices": registry.names})
    """Family to analyze TransformerLens weights (or a generic recording's W_Q..W_O) as."""
    head: int = 0
    """Attention head of TransformerLens weights."""
    kernel_matrix_max_states: int = 64
    """Include the task-averaged M_hat in the output when there are at most this many states."""


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
    from ..sampling import TaskSpec

    fam = registry.get(family)
    d, m = inputs.family_dims(family, layout)
    n_layers = max(weights.layers_of(params), default=0) + 1
    model = ModelConfig(family=family, d=d, n_layers=n_layers, gamma=gamma, alpha=alpha, tied=n_layers == 1, m=m)
    config = CheckpointConfig(model=model, task=TaskSpec.from_dict(None, family, fam.task_kind))
    return config.theta_star(list(params))


def _weights_section(family: str | None, params, theta, layout, reasons: dict) -> dict | None:
    known = registry.find(family)
    if known is None:
        reasons["weights"] = f"family {family or GENERIC!r} has no construction to compare with"
        return None
    if layout is None:
        reasons["weights"] = "no prompt layout (pass --layout)"
        return None
    if not params:
        reasons["weights"] = "no parameters"
        return None
    if not theta:
        reasons["manifold"] = f"no theta* for family {family!r}: only block norms and lazy drift"
    return weights.analyze_weights(known, params, theta, layout)


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
    from .. import checkpoint  # light: safetensors.numpy + JSON, no torch

    config, tensors = checkpoint.read(path)
    subject = Subject(config.family, config.model.architecture, config.task.family)
    layout = config.model.layout
    params = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()}
    reasons: dict = {}
    out = _header(path, "checkpoint", subject, config, layout)
    out["weights"] = _weights_section(subject.family, params, config.theta_star(list(params)), layout, reasons)
    block = subject.model.hints.population_kernel
    if out["weights"] is not None and block is not None:
        out["weights"]["population_kernel"] = _sampled_population_kernel(config, subject, params, layout, block, reasons)
    out["activations"] = None
    reasons["activations"] = "a checkpoint has no recorded activations (record it with `icrl-interp record`)"
    out["skipped"] = reasons
    return out


def _sampled_population_kernel(config, subject: Subject, params, layout, block: str, reasons) -> list[dict] | None:
    """M_pi on POPULATION_TASKS tasks drawn (seed 0) by the task family's sampler."""
    try:
        pb = subject.task.sample(config, config.task, POPULATION_TASKS, np.random.default_rng(0))
    except (UserError, KeyError, TypeError, ValueError) as e:
        reasons["population_kernel"] = f"cannot draw tasks from the checkpoint's task config: {e}"
        return None
    if "phi" not in pb.tasks or "stationary" not in pb.tasks:
        reasons["population_kernel"] = "the task family's tasks have no state features (tasks/phi)"
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
        raise UserError(f"{path}: TransformerLens weights need --layout FILE.json and --family to compare against")
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
    out["weights"] = _weights_section(family.name, params, theta_for_layout(family.name, layout, params), layout, reasons)
    out["activations"] = None
    out["skipped"] = reasons
    return out


# ------------------------------------------------------------- recordings
def _analyze_recording(path: Path, opts: AnalyzeOptions) -> dict:
    from ..recording import Recording

    with Recording(path) as rec:
        reasons: dict = {}
        try:
            config = rec.checkpoint_config
        except UserError as e:
            config = None
            reasons["checkpoint_config"] = str(e)
        info = rec.model_info
        subject = Subject(info["family"], info["architecture"], rec.task_family)
        raw_layout = rec.attr("layout")
        layout = inputs.layout_from_dict(raw_layout) if raw_layout is not None else None
        if layout is None and opts.layout is not None:
            layout = inputs.layout_from_dict(opts.layout)
        params = {k: np.asarray(v, dtype=np.float64) for k, v in rec.group("params").items()}
        theta = {k: np.asarray(v, dtype=np.float64) for k, v in rec.group("theta_star").items()}
        family_w = subject.family
        if subject.model is None and opts.family and any(".attn.W_" in k for k in params):
            # a foreign model's TransformerLens heads, read as the score / value maps of --family
            family_w = registry.get(opts.family).name
            params = weights.tl_to_family(params, family_w, opts.head)
            theta = theta_for_layout(family_w, layout, params) if layout is not None else {}
        elif not theta and config is not None and subject.model is not None:
            theta = config.theta_star(list(params))  # recorded without /theta_star: rebuild it
        out = _header(path, "recording", subject, config, layout)
        n_layers = int(rec.attr("n_layers", 0) or 0) or _layers_from_hooks(rec.hooks())
        gamma = float(rec.attr("gamma", math.nan))
        out["n_layers"], out["gamma"] = n_layers, None if math.isnan(gamma) else gamma
        out["weights"] = _weights_section(family_w, params, theta, layout, reasons)
        out["activations"] = _activations(rec, subject, layout, params, config, n_layers, gamma, opts, reasons, out)
        out["skipped"] = reasons
    return out


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

    With prompts of a known task in a known layout, every layer's hook_resid_post must be there for a
    model of a known family (an error otherwise); for a foreign model, layers without it are skipped."""
    f, N = rec.f, rec.n_prompts
    if N == 0:
        raise UserError(f"{rec.path}: the recording holds no prompts")
    hooks = set(rec.hooks())
    if not hooks:
        reasons["activations"] = "no recorded hooks"
        return None
    if "prompts/z" not in f:
        raise UserError(f"{rec.path}: recording has no /prompts/z")
    pos = int(f["prompts/z"].shape[1])
    readable = set()
    if subject.task is not None and layout is not None:
        strict = subject.model is not None
        if f["prompts/z"].shape[2] != layout.d_model:
            raise UserError(f"{rec.path}: prompts have d_model {f['prompts/z'].shape[2]} but the layout has "
                            f"{layout.d_model}: the layout does not fit")
        for l in range(n_layers):
            h = f"blocks.{l}.hook_resid_post"
            if h not in hooks:
                if strict:
                    raise UserError(f"{rec.path}: recording lacks hook {h}, which the activation analyzers need "
                                    f"(value error, TD probes); add blocks.*.hook_resid_post to the probe spec")
                reasons[f"value_error.layer{l}"] = f"no {h} recorded"
            elif f[f"acts/{h}"].shape[-1] != layout.d_model:
                if strict:
                    raise UserError(f"{rec.path}: hook {h} has width {f[f'acts/{h}'].shape[-1]} but the layout has "
                                    f"d_model {layout.d_model}: the layout does not fit")
                reasons[f"value_error.layer{l}"] = f"{h} is not in the prompt layout (width {f[f'acts/{h}'].shape[-1]})"
            else:
                readable.add(l)
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


def _wang_stream(rec, subject: Subject, layout, params, config, n_layers, facts: _Facts, reasons):
    """The VD/SS/IWS accumulator when the recording allows it (else the reason is noted)."""
    f, arch = rec.f, subject.arch
    activation = None if config is None else config.model.activation
    if activation:
        reasons["wang_metrics"] = f"the model uses activation {activation!r}; VD/SS/IWS need linear attention"
    elif arch is None:
        reasons["wang_metrics"] = "needs a model of a known architecture (its value and score parameters)"
    elif not facts.has_tasks or not all(p in f for p in ("reference/w", "tasks/phi", "tasks/stationary")):
        reasons["wang_metrics"] = "needs /reference/w and task data (features, stationary distribution)"
    elif any(S.layer_param(params, l, k) is None for l in range(n_layers) for k in (arch.value, arch.score)):
        reasons["wang_metrics"] = f"needs the recorded parameters {arch.value} and {arch.score} of every layer"
    elif any(l not in facts.readable for l in range(n_layers)):
        reasons["wang_metrics"] = "needs hook_resid_post of every layer"
    elif any(f[f"acts/blocks.{l}.hook_resid_post"].shape[1] != facts.pos for l in range(n_layers)):
        reasons["wang_metrics"] = "needs hook_resid_post at every position"
    else:
        return S.WangStream(params, layout, n_layers, facts.pos, value=arch.value, score=arch.score)
    return None


def _activations(rec, subject: Subject, layout, params, config, n_layers, gamma, opts, reasons, out) -> dict | None:
    facts = _facts(rec, subject, layout, n_layers, reasons)
    if facts is None:
        return None
    f = rec.f
    hints = subject.task_hints if layout is not None else None  # readouts need the task and its layout
    model_hints = subject.model.hints if subject.model is not None and layout is not None else None
    arch = subject.arch
    out["context_length"] = facts.n
    gamma_k = gamma if math.isfinite(gamma) else 0.0

    values, kernels, probes = {}, {}, {}
    direction = S.td_direction(hints, layout)
    for l in range(n_layers):
        if hints is not None and l in facts.readable:
            try:
                values[l] = S.ValueStream(hints, l, layout, f[f"acts/blocks.{l}.hook_resid_post"], facts.pos,
                                          facts.has_tasks, "reference/values" in f)
            except ValueError as e:
                reasons[f"value_error.layer{l}"] = str(e)
        ph = f"blocks.{l}.attn.hook_pattern"
        if ph in facts.hooks and (arch is None or arch.softmax):
            # a softmax pattern (or one of a foreign model: KernelStream checks the rows sum to 1) is a kernel
            ds = f[f"acts/{ph}"]
            use_labels = facts.labelled and facts.n_states > 0 and math.isfinite(gamma)
            kernels[l] = S.KernelStream(l, ds, facts.pos, gamma_k, facts.n_states, layout,
                                        opts.kernel_matrix_max_states, use_labels, _dtype_attr(ds) == "bfloat16")
        elif ph in facts.hooks:
            reasons.setdefault("kernel_diagonality", f"the {subject.family} attention pattern is not a softmax kernel")
        for h in sorted(x for x in facts.hooks if x.startswith(f"blocks.{l}.")) if facts.has_ref else ():
            it = S.probe_iteration(h, l)
            if it >= f["reference/td_errors"].shape[1]:
                reasons[f"td_probe.{h}"] = f"no reference TD error for iteration {it}"
                continue
            try:
                probes[(l, h)] = S.ProbeStream(h, l, f[f"acts/{h}"], facts.pos, facts.n, opts.folds,
                                               direction if h.endswith("hook_resid_post") else None)
            except ValueError as e:
                reasons[f"td_probe.{h}"] = str(e)
    wang = None
    if hints is not None and hints.query_linear:
        wang = _wang_stream(rec, subject, layout, params, config, n_layers, facts, reasons)
    population = None
    block = None if model_hints is None else model_hints.population_kernel
    if block is not None and arch is not None and facts.has_tasks and "tasks/phi" in f and params:
        population = S.PopulationKernel(params, layout, n_layers, gamma, facts.n_states, score=arch.score, block=block)

    paths = set()
    for v in values.values():
        paths.update((v.path, "prompts/state", "tasks/values", "tasks/stationary", "reference/values", "reference/output"))
    for k in kernels.values():
        paths.update((k.path, "prompts/state", "prompts/z"))
    for p in probes.values():
        paths.update((p.path, "reference/td_errors"))
    if wang is not None:
        paths.update(wang.paths())
    if population is not None:
        paths.update(("tasks/phi", "tasks/stationary"))
    paths = sorted(p for p in paths if p in f)
    row_bytes = sum(int(np.prod(f[p].shape[1:])) * 8 for p in paths)  # as float64 in memory
    rows = inputs.chunk_rows(row_bytes * 2, int(opts.chunk_mib * 2**20), facts.N)  # x2: copies, temporaries

    probe_fraction = opts.probe_max_tasks / facts.N if opts.probe_max_tasks > 0 else 1.0
    for start, stop, data in inputs.iter_chunks(rec, paths, rows, opts.progress):
        for v in values.values():
            v.update(data)
        shared: dict = {}  # per-chunk columns the kernel streams of all layers share
        for k in kernels.values():
            k.update(data, shared)
        if probes:
            split = S.ChunkSplit(start, stop, facts.N, opts.seed, opts.test_fraction, opts.folds, probe_fraction)
            for p in probes.values():
                p.update(data, split)
        if wang is not None:
            wang.update(data)
        if population is not None:
            population.update(data["tasks/phi"], data["tasks/stationary"])

    primary = hints.primary_probe if hints is not None else DEFAULT_PRIMARY_PROBE
    layers = [_layer_entry(primary, l, values, kernels, probes, reasons) for l in range(n_layers)]
    result = {"n_prompts": facts.N, "layers": layers}
    if wang is not None:
        tol = 1e-8 if _dtype_attr(f["acts/blocks.0.hook_resid_post"]) == "float64" else 1e-3
        result["wang_metrics"], why = wang.result(tol)
        if why:
            reasons["wang_metrics"] = why
    if population is not None and out.get("weights") is not None:
        out["weights"]["population_kernel"] = population.result("recorded tasks")
    return result


def _layer_entry(primary: tuple[str, ...], l, values, kernels, probes, reasons) -> dict:
    entry = {"layer": l, "kernel_diagonality": None, "td_probe_r2": None, "value_error": None}
    if l in values:
        entry.update(values[l].result())
    if l in kernels:
        kd, free, why = kernels[l].result()
        entry["kernel_diagonality"], entry["label_free_diagonal"] = kd, free
        if why:
            reasons.setdefault("kernel_diagonality", why)
    layer_probes = {h: p.result() for (ll, h), p in probes.items() if ll == l}
    if layer_probes:
        hook = primary_probe(primary, l, layer_probes)
        entry["td_probe"] = layer_probes
        entry["td_probe_hook"] = hook
        entry["td_probe_r2"] = None if hook is None else layer_probes[hook]["r2"]
        entry["td_probe_r2_shuffled"] = None if hook is None else layer_probes[hook]["r2_shuffled"]
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


def analyze_many(paths, workers: int | None = None, options: AnalyzeOptions | None = None) -> list[dict]:
    """Analyze several inputs (directories expand to the checkpoints / recordings below them) in
    parallel processes; one row per input, in input order."""
    items = inputs.expand_inputs([str(p) for p in paths])
    opts = asdict(options or AnalyzeOptions())
    workers = min(len(items), workers or os.cpu_count() or 1)
    if workers <= 1:
        return [_row(p, opts) for p in items]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    opts["progress"] = False  # bars from several processes would interleave
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        return list(pool.map(_row, items, [opts] * len(items)))
