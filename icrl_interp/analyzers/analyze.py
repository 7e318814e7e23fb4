"""One call from an input (checkpoint, recording, TL weights) to the analysis JSON contract.

`analyze(path)` returns a dict with schema `icrl_interp.analysis/1` (every field is
documented in the README, section Analyzers); `analyze_many(paths, workers)` runs inputs in
parallel processes and returns one row per input, a failing input giving a row
with an "error" field. A recording is read once, in chunks of prompts whose size
is bounded by a memory budget, and every activation analyzer is fed from the same
chunk, so recordings larger than memory work and analysis costs about one read.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .. import theta_star
from ..errors import UserError
from ..layouts import PromptLayout
from . import inputs, streams as S, weights

SCHEMA = "icrl_interp.analysis/1"
KNOWN_FAMILIES = ("linear-td", "softmax-td", "sarsa", "actor-critic")
POPULATION_TASKS = 256
"""Tasks drawn from a checkpoint's task distribution (seed 0) for its population kernel."""


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
    family: str | None = None
    """Family to analyze TransformerLens weights (or a generic recording's W_Q..W_O) as."""
    head: int = 0
    """Attention head of TransformerLens weights."""
    kernel_matrix_max_states: int = 64
    """Include the task-averaged M_hat in the output when there are at most this many states."""


# --------------------------------------------------------------------- json
def _clean(x):
    """JSON-safe: numpy -> python, NaN/Inf -> None."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return _clean(x.tolist())
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, (np.integer, int)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(float(x)) else None
    return x


# ----------------------------------------------------------------- theta*
def theta_for_config(config: dict, names) -> dict[str, np.ndarray]:
    """theta* of a checkpoint's family under the same parameter names (empty if there is none)."""
    return theta_star.for_config(config, names)


def _weights_section(family, params, theta, layout, reasons: dict) -> dict | None:
    if family not in KNOWN_FAMILIES:
        reasons["weights"] = f"family {family!r} has no construction to compare with"
        return None
    if layout is None:
        reasons["weights"] = "no prompt layout (pass --layout)"
        return None
    if not params:
        reasons["weights"] = "no parameters"
        return None
    if not theta:
        reasons["manifold"] = f"no theta* for family {family!r}: only block norms and lazy drift"
    return weights.analyze_weights(family, params, theta, layout)


# ------------------------------------------------------ population kernel
# ------------------------------------------------------------ checkpoints
def _analyze_checkpoint(path: Path, opts: AnalyzeOptions) -> dict:
    from .. import checkpoint  # light: safetensors.numpy + JSON, no torch

    config, tensors = checkpoint.read(path)
    family = config.get("family")
    layout = inputs.layout_from_config(config) if family in KNOWN_FAMILIES else None
    params = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()}
    reasons: dict = {}
    out = _header(path, "checkpoint", family, config, layout)
    out["weights"] = _weights_section(family, params, theta_for_config(config, params), layout, reasons)
    if out["weights"] is not None and family == "softmax-td":
        out["weights"]["population_kernel"] = _sampled_population_kernel(config, params, layout, reasons)
    out["activations"] = None
    reasons["activations"] = "a checkpoint has no recorded activations (record it with `icrl-interp record`)"
    out["skipped"] = reasons
    return out


def _sampled_population_kernel(config, params, layout, reasons) -> list[dict] | None:
    from .. import envs, sampling

    try:
        task = sampling.TaskSpec.from_dict(config.get("task"), config["family"])
        gamma = float(config["gamma"])
        mrp = envs.sample_boyan_chains(POPULATION_TASKS, task.n_states, int(config["d"]), gamma, 0,
                                       task.features, task.beta, task.rewards)
    except (UserError, KeyError, TypeError, ValueError) as e:
        reasons["population_kernel"] = f"cannot draw tasks from the checkpoint's task config: {e}"
        return None
    pk = S.PopulationKernel(params, layout, int(config.get("n_layers", 1)), gamma, mrp.n_states)
    pk.update(mrp.phi, mrp.stationary())
    return pk.result(f"sampled: {POPULATION_TASKS} tasks of the checkpoint's task distribution, seed 0")


def _header(path, kind, family, config, layout) -> dict:
    config = config or {}
    task = config.get("task") or {}
    return {
        "schema": SCHEMA, "family": family, "source": str(path), "kind": kind,
        "n_layers": config.get("n_layers"), "gamma": config.get("gamma"),
        "d_model": None if layout is None else layout.d_model,
        "context_length": task.get("n") if isinstance(task, dict) else None,
        "tied": config.get("tied"), "origin": config.get("origin"),
    }


# ------------------------------------------------------------ TL weights
def _analyze_tl(path: Path, opts: AnalyzeOptions) -> dict:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    if opts.layout is None or opts.family is None:
        raise UserError(f"{path}: TransformerLens weights need --layout FILE.json and --family to compare against")
    layout = inputs.layout_from_dict(opts.layout)
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable safetensors file ({e})") from None
    params = weights.tl_to_family(tensors, opts.family, opts.head)
    d = _family_d(opts.family, layout)
    config = {"family": opts.family, "d": d, "gamma": 0.9, "n_layers": len(weights.layers_of(params))}
    out = _header(path, "tl-weights", opts.family, config, layout)
    reasons: dict = {}
    out["weights"] = _weights_section(opts.family, params, theta_for_config(config, params), layout, reasons)
    out["activations"] = None
    out["skipped"] = reasons
    return out


def _family_d(family: str, layout: PromptLayout) -> int:
    return layout.size("x") if family == "softmax-td" else layout.size("phi")


# ------------------------------------------------------------- recordings
def _analyze_recording(path: Path, opts: AnalyzeOptions) -> dict:
    from ..recording import Recording

    with Recording(path) as rec:
        family = rec.family or "generic"
        config = rec.attr("checkpoint_config") or {}
        raw_layout = rec.attr("layout")
        layout = inputs.layout_from_dict(raw_layout) if raw_layout is not None else None
        if layout is None and opts.layout is not None:
            layout = inputs.layout_from_dict(opts.layout)
        params = {k: np.asarray(v, dtype=np.float64) for k, v in rec.group("params").items()}
        theta = {k: np.asarray(v, dtype=np.float64) for k, v in rec.group("theta_star").items()}
        reasons: dict = {}
        if family not in KNOWN_FAMILIES and opts.family and any(".attn.W_" in k for k in params):
            family_w = opts.family
            params = weights.tl_to_family(params, family_w, opts.head)
            theta = theta_for_config({"family": family_w, "d": _family_d(family_w, layout), "gamma": 0.9}, params)
        else:
            family_w = family
            if not theta and config:  # recorded without /theta_star: build it from the checkpoint config
                theta = theta_for_config(config, params)
        out = _header(path, "recording", family, config, layout)
        n_layers = int(rec.attr("n_layers", 0) or 0) or _layers_from_hooks(rec.hooks())
        gamma = float(rec.attr("gamma", math.nan))
        out["n_layers"], out["gamma"] = n_layers, None if math.isnan(gamma) else gamma
        out["weights"] = _weights_section(family_w, params, theta, layout, reasons)
        out["activations"] = _activations(rec, family, layout, params, config, n_layers, gamma, opts, reasons, out)
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


def _facts(rec, family, layout, n_layers, reasons) -> _Facts | None:
    """Check the recording against the layout; None when there is nothing to analyze."""
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
    if family in KNOWN_FAMILIES and layout is not None:
        if f["prompts/z"].shape[2] != layout.d_model:
            raise UserError(f"{rec.path}: prompts have d_model {f['prompts/z'].shape[2]} but the layout has "
                            f"{layout.d_model}: the layout does not fit")
        for l in range(n_layers):
            h = f"blocks.{l}.hook_resid_post"
            if h not in hooks:
                raise UserError(f"{rec.path}: recording lacks hook {h}, which the activation analyzers need "
                                f"(value error, TD probes); add blocks.*.hook_resid_post to the probe spec")
            if f[f"acts/{h}"].shape[-1] != layout.d_model:
                raise UserError(f"{rec.path}: hook {h} has width {f[f'acts/{h}'].shape[-1]} but the layout has "
                                f"d_model {layout.d_model}: the layout does not fit")
    task_note = str(rec.attr("task_data", "present"))
    has_tasks = task_note == "present" and all(f"tasks/{k}" in f for k in ("values", "stationary"))
    if not has_tasks:
        reasons["value_error"] = f"no task data ({task_note})"
    has_ref = "reference/td_errors" in f
    if not has_ref:
        reasons["td_probe"] = "no /reference/td_errors in the recording"
    labelled = "prompts/state" in f and bool(np.any(f["prompts/state"][: min(N, 64)] >= 0))
    n = int(f["reference/td_errors"].shape[-1]) if has_ref else pos - 1
    return _Facts(N, pos, n, hooks, has_tasks, has_ref, labelled, _n_states(rec, has_tasks, labelled))


def _wang_stream(rec, family, layout, params, config, n_layers, facts: _Facts, reasons):
    """The VD/SS/IWS accumulator when the recording allows it (else the reason is noted)."""
    f = rec.f
    if config.get("activation"):
        reasons["wang_metrics"] = f"the model uses activation {config['activation']!r}; VD/SS/IWS need linear attention"
    elif not facts.has_tasks or not all(p in f for p in ("reference/w", "tasks/phi", "tasks/stationary")):
        reasons["wang_metrics"] = "needs /reference/w and task data (features, stationary distribution)"
    elif any(S.layer_param(params, l, k) is None for l in range(n_layers) for k in ("P", "Q")):
        reasons["wang_metrics"] = "needs the recorded parameters P and Q of every layer"
    elif any(f[f"acts/blocks.{l}.hook_resid_post"].shape[1] != facts.pos for l in range(n_layers)):
        reasons["wang_metrics"] = "needs hook_resid_post at every position"
    else:
        return S.WangStream(params, layout, n_layers, facts.pos)
    return None


def _activations(rec, family, layout, params, config, n_layers, gamma, opts, reasons, out) -> dict | None:
    facts = _facts(rec, family, layout, n_layers, reasons)
    if facts is None:
        return None
    f, known = rec.f, family in KNOWN_FAMILIES and layout is not None
    out["context_length"] = facts.n
    gamma_k = gamma if math.isfinite(gamma) else 0.0

    values, kernels, probes = {}, {}, {}
    direction = S.td_direction(family, layout)
    for l in range(n_layers):
        if known:
            try:
                values[l] = S.ValueStream(family, l, layout, f[f"acts/blocks.{l}.hook_resid_post"], facts.pos,
                                          facts.has_tasks, "reference/values" in f)
            except ValueError as e:
                reasons[f"value_error.layer{l}"] = str(e)
        ph = f"blocks.{l}.attn.hook_pattern"
        if ph in facts.hooks and (family == "softmax-td" or family not in KNOWN_FAMILIES):
            ds = f[f"acts/{ph}"]
            use_labels = facts.labelled and facts.n_states > 0 and math.isfinite(gamma)
            kernels[l] = S.KernelStream(l, ds, facts.pos, gamma_k, facts.n_states, layout,
                                        opts.kernel_matrix_max_states, use_labels, _dtype_attr(ds) == "bfloat16")
        elif ph in facts.hooks:
            reasons.setdefault("kernel_diagonality", f"the {family} attention pattern is not a softmax kernel")
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
    wang = _wang_stream(rec, family, layout, params, config, n_layers, facts, reasons) if family == "linear-td" and known else None
    population = None
    if family == "softmax-td" and known and facts.has_tasks and "tasks/phi" in f and params:
        population = S.PopulationKernel(params, layout, n_layers, gamma, facts.n_states)

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

    layers = [_layer_entry(family, l, values, kernels, probes, reasons) for l in range(n_layers)]
    result = {"n_prompts": facts.N, "layers": layers}
    if wang is not None:
        tol = 1e-8 if _dtype_attr(f["acts/blocks.0.hook_resid_post"]) == "float64" else 1e-3
        result["wang_metrics"], why = wang.result(tol)
        if why:
            reasons["wang_metrics"] = why
    if population is not None and out.get("weights") is not None:
        out["weights"]["population_kernel"] = population.result("recorded tasks")
    return result


def _layer_entry(family, l, values, kernels, probes, reasons) -> dict:
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
        primary = _primary_probe(family, l, layer_probes)
        entry["td_probe"] = layer_probes
        entry["td_probe_hook"] = primary
        entry["td_probe_r2"] = None if primary is None else layer_probes[primary]["r2"]
        entry["td_probe_r2_shuffled"] = None if primary is None else layer_probes[primary]["r2_shuffled"]
    return entry


def _primary_probe(family: str, layer: int, probes: dict) -> str | None:
    """The hook whose R^2 is the contract's td_probe_r2: where the construction puts delta."""
    order = [f"blocks.{layer}.hook_resid_post"]
    if family in ("sarsa", "actor-critic"):
        order.insert(0, f"blocks.{layer}.attn.hook_attn_scores")
    for h in order:
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
    return _clean(out)


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
