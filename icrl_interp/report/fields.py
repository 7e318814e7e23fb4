"""Tolerant access to analysis dicts (contract icrl_interp.analysis/1): a missing or malformed
field reads as None / empty, so reports draw what is there and skip the rest. The keys, and the readers
an analyzer's report columns share with the report, are the analyzers' (`icrl_interp.analyzers.keys`)."""
from __future__ import annotations

from ..analyzers import kernel, weights
from ..analyzers.keys import (ACTIVATIONS, CONTROL, KERNEL_DIAGONALITY, LAYER, LAYERS, RANDOM_INIT_VALUE_ERROR,
                              READOUTS, REFERENCE_VALUE_ERROR, VALUE_ERROR, get, layers, num)
from .batch import Result

__all__ = ["get", "num"]  # re-exported: the report's modules read analyses through this module


def layers_of(r: Result) -> list[dict]:
    """The per-layer activation metrics of an analysis, sorted by layer ([] when absent)."""
    return layers(r.analysis)


def layer_values(r: Result, key: str) -> tuple[list[int], list[float]]:
    """(layers, values) of one per-layer metric, skipping layers where it is absent."""
    xs, ys = [], []
    for layer in layers_of(r):
        v = num(layer.get(key))
        if v is not None:
            xs.append(layer[LAYER])
            ys.append(v)
    return xs, ys


def is_theta_star(r: Result) -> bool:
    """Whether the input is a construction θ* (by the analysis' or the config's `source`)."""
    return r.source.lower().replace("θ", "theta").replace("_", "").replace("-", "") in ("theta*", "thetastar", "construction")


def label_of(r: Result) -> str:
    """Short human name: θ*, 'run @ step N', or the file / directory name; '[rec]' marks recordings,
    '[causal]' causal JSON files, '[verdict]' verdict JSON files."""
    meta = r.input.meta
    if r.input.kind in ("causal", "verdict"):
        return f"{r.input.path.stem} [{r.input.kind}]"
    name = r.input.path.stem if r.input.kind == "recording" else r.input.path.name
    tag = " [rec]" if r.input.kind == "recording" else ""
    if is_theta_star(r):
        return f"θ* ({name}){tag}"
    if meta.get("run_id") is not None and meta.get("step") is not None:
        return f"{meta['run_id']} @ step {meta['step']}{tag}"
    return name + tag


def max_rel_err(r: Result) -> float | None:
    """Largest per-block relative error to θ* at the best scale."""
    return weights.max_rel_err(r.analysis)


def last_layer(r: Result, key: str) -> float | None:
    return (layer_values(r, key)[1] or [None])[-1]


def representatives(results: list[Result]) -> list[Result]:
    """θ* inputs, then the last step of each training run, then everything else."""
    theta = [r for r in results if is_theta_star(r)]
    last: dict[str, Result] = {}
    others = []
    for r in results:
        if is_theta_star(r):
            continue
        run, step = r.input.meta.get("run_id"), r.input.meta.get("step")
        if run is not None and isinstance(step, int):
            key = f"{run}|{r.input.kind}"
            if key not in last or step > last[key].input.meta["step"]:
                last[key] = r
        else:
            others.append(r)
    return theta + list(last.values()) + others


def kernel_of(layer: dict) -> tuple[list | None, float | None]:
    """(task-averaged M̂ as nested lists or None, contraction threshold (1+γ)/2 or None) of a layer."""
    kd = layer.get(KERNEL_DIAGONALITY)
    if not isinstance(kd, dict):
        return None, None
    matrix = kd.get("M_hat")
    return (matrix if isinstance(matrix, list) and matrix else None), kernel.threshold_of(kd)


def kernel_head(layer: dict) -> tuple[int, int] | None:
    """(head, number of heads) of the kernel the analysis reports for a layer (the most diagonal head),
    None when it does not say (older analyses: a single head)."""
    kd = layer.get(KERNEL_DIAGONALITY)
    head = kd.get("head") if isinstance(kd, dict) else None
    if not isinstance(head, int) or isinstance(head, bool):
        return None
    n = kd.get("n_heads")
    per_head = kd.get("per_head")
    n = n if isinstance(n, int) else len(per_head) if isinstance(per_head, list) else head + 1
    return head, n


def readout_curves(r: Result) -> dict[str, dict]:
    """{lens: {"layers", "value_error", "reference", "random_init"}} of the readouts of a foreign model
    (`activations.readouts.lenses`; lists aligned with "layers", None where absent); {} when none."""
    lenses = get(r.analysis, ACTIVATIONS, READOUTS, "lenses")
    out = {}
    for name, lens in (lenses.items() if isinstance(lenses, dict) else []):
        rows = [x for x in (lens.get(LAYERS) if isinstance(lens, dict) else None) or []
                if isinstance(x, dict) and isinstance(x.get(LAYER), int)]
        if rows:
            rows.sort(key=lambda x: x[LAYER])
            out[str(name)] = {"layers": [x[LAYER] for x in rows],
                              "value_error": [num(x.get(VALUE_ERROR)) for x in rows],
                              "reference": [num(x.get(REFERENCE_VALUE_ERROR)) for x in rows],
                              "random_init": [num(x.get(RANDOM_INIT_VALUE_ERROR)) for x in rows]}
    return out


def kernel_mins(r: Result) -> dict[int, tuple[float, float | None]]:
    """layer -> (min_s diagonal, threshold): the empirical M̂ of a recording, else the population
    kernel M_π the analyzer computes from a checkpoint's score matrix."""
    return kernel.kernel_mins(r.analysis)


def control_of(r: Result) -> dict | None:
    """The in-context control section of an analysis (report.control_eval), None when absent."""
    c = get(r.analysis, CONTROL)
    return c if isinstance(c, dict) else None


def control_returns(r: Result) -> tuple[float | None, float | None]:
    """(transformer, teacher) mean exact return at the final closed-loop update, None where absent."""
    c = control_of(r)
    return (num(get(c, "returns", "transformer", "mean")), num(get(c, "returns", "teacher", "mean")))


def causal_stat(stat) -> tuple[float | None, list | None]:
    """(mean, [low, high] or None) of a causal statistic ({"mean", "ci"} or {"value", "ci"})."""
    if not isinstance(stat, dict):
        return None, None
    value = num(stat.get("mean")) if "mean" in stat else num(stat.get("value"))
    ci = stat.get("ci")
    ok = isinstance(ci, list) and len(ci) == 2 and all(num(c) is not None for c in ci)
    return value, ([num(ci[0]), num(ci[1])] if ok else None)
