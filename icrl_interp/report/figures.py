"""Report figures (matplotlib, Agg; no pyplot global state).

Every figure carries the reference a reader needs to judge it: the (1+gamma)/2 threshold of
Assumption 5.1, the theta* construction, the shuffled-label control. A figure is drawn only
when the inputs hold the fields it needs; each builder returns None otherwise, and a builder
that fails on odd input is reported in the page instead of stopping the report.
"""
from __future__ import annotations

import json
import math
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from jaxtyping import Float
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..analyzers.keys import (ACTIVATIONS, LAYER, TD_PROBE_R2, TD_PROBE_SELECTIVITY, VALUE_ERROR, WANG_METRICS,
                              WEIGHTS)
from ..core.faults import kill_point
from ..families import registry
from .batch import Result
from .causal import save
from .fields import (control_of, get, is_theta_star, kernel_head, kernel_mins, kernel_of, label_of, last_layer, layer_values,
                     layers_of, max_rel_err, num, readout_curves, representatives)

Array = np.ndarray
PATTERN_HOOK = re.compile(r"^blocks\.(\d+)\.attn\.hook_pattern$")
THETA_STAR_COLOR = "black"
CONTROL_COLOR = "tab:gray"
MAX_LINES = 10
MAX_LAYERS = 8


@dataclass
class FigureInfo:
    """One figure as the page shows it."""

    family: str
    """Family section the figure belongs to."""
    key: str
    """File stem (unique within the report)."""
    title: str
    """Heading above the image."""
    caption: str
    """How to read it, and what good looks like."""
    files: list[str] = field(default_factory=list)
    """Paths relative to the report directory (PNG first, then SVG if asked)."""
    error: str = ""
    """Why the figure could not be drawn ('' when it was)."""
    section: str = "family"
    """Where the page shows it: 'family' (the section of `family`), 'causal' (the causal tests) or 'verdict'."""


# ------------------------------------------------------------------ small helpers
def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def _save(fig: Figure, out_dir: Path, key: str, svg: bool) -> list[str]:
    """PNG (and SVG) written atomically, marked as the package's (`causal.save`); returns paths relative
    to the report directory."""
    files = []
    for ext in ("png", "svg") if svg else ("png",):
        files.append(f"{out_dir.name}/{save(fig, out_dir / f'{key}.{ext}').name}")
    return files


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


# ------------------------------------------------------------------ per-recording figure
def attention_figure(r: Result) -> Figure | None:
    """Attention heatmap of prompt 0 per layer (read from the recording) above the analysis' M̂.

    Both panels show the same head: the one the analysis reports (`kernel_diagonality.head`, the most
    diagonal); a layer without an analysed kernel shows the mean over heads, and its title says so."""
    if r.input.kind != "recording":
        return None
    from ..recording.format import Recording

    kernels = {l[LAYER]: kernel_of(l) for l in layers_of(r)}
    heads = {l[LAYER]: kernel_head(l) for l in layers_of(r)}
    with Recording(r.input.path) as rec:
        hooks = sorted((int(m.group(1)), h) for h in rec.hooks() if (m := PATTERN_HOOK.match(h)))[:MAX_LAYERS]
        if not hooks or rec.n_prompts == 0:
            return None
        with_kernel = any(kernels.get(l, (None, None))[0] is not None for l, _ in hooks)
        rows = 2 if with_kernel else 1
        fig = Figure(figsize=(max(7.5, 3.8 * len(hooks)), 3.4 * rows + 0.6), layout="constrained")
        axes = fig.subplots(rows, len(hooks), squeeze=False)
        for col, (layer, hook) in enumerate(hooks):
            ax = axes[0, col]
            pattern = rec.read(hook, 0, 1)[0].astype(np.float64)  # [heads, q, k]
            head = (heads.get(layer) or (None,))[0]
            if head is not None and 0 <= head < pattern.shape[0]:
                heat, which = pattern[head], f"head {head}" + (f" of {pattern.shape[0]} (most diagonal)" if pattern.shape[0] > 1 else "")
            else:
                heat = pattern.mean(axis=0)
                which = f"mean over {pattern.shape[0]} heads" if pattern.shape[0] > 1 else "head 0"
            im = ax.imshow(heat, cmap="viridis", vmin=0.0, aspect="auto", interpolation="nearest")
            fig.colorbar(im, ax=ax, label="attention weight")
            ax.set_title(f"layer {layer}: attention (prompt 0), {which}", fontsize=9)
            ax.set_xlabel("source position k")
            ax.set_ylabel("target position j")
            if with_kernel:
                _kernel_panel(fig, axes[1, col], layer, *kernels.get(layer, (None, None)), heads.get(layer))
    note = ("\nbottom: M̂ averaged over tasks; red boxes mark diagonal entries at or below (1+γ)/2"
            if with_kernel else "")
    fig.suptitle(f"{label_of(r)}: attention and state-aggregated kernel{note}")
    return fig


def _kernel_panel(fig: Figure, ax, layer: int, matrix, threshold, head: tuple[int, int] | None = None) -> None:
    if matrix is None:
        ax.axis("off")
        ax.text(0.5, 0.5, f"layer {layer}: no M̂ in the analysis", ha="center", va="center")
        return
    kernel = np.array([[np.nan if v is None else v for v in row] for row in matrix], dtype=np.float64)
    im = ax.imshow(kernel, cmap="magma", vmin=0.0, vmax=1.0, interpolation="nearest")
    fig.colorbar(im, ax=ax, label="M̂(s, s') (probability)")
    diag = np.diag(kernel)
    seen = np.isfinite(diag)
    title = f"layer {layer}: M̂ (task average)"
    if head is not None:
        title += f", head {head[0]}" + (f" of {head[1]} (most diagonal)" if head[1] > 1 else "")
    if threshold is not None:
        title += f"\nthreshold (1+γ)/2 = {threshold:.3f}"
        for s in np.nonzero(seen & (diag <= threshold))[0]:
            ax.add_patch(Rectangle((s - 0.5, s - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))
    ax.set_title(title)
    ax.set_xlabel("source state s'")
    ax.set_ylabel("target state s")


# ------------------------------------------------------------------ block norms
def block_matrix(entry) -> tuple[list[str], list[str], Float[Array, "r c"]] | None:
    """Accepts {'rows','cols','norms'}, {row: {col: x}} or [[x]]; None when it is none of these."""
    if isinstance(entry, dict):
        values = next((entry[k] for k in ("norms", "values", "matrix") if k in entry), None)
        if values is not None and isinstance(entry.get("rows"), list) and isinstance(entry.get("cols"), list):
            mat = np.asarray(values, dtype=np.float64)
            if mat.shape == (len(entry["rows"]), len(entry["cols"])):
                return [str(x) for x in entry["rows"]], [str(x) for x in entry["cols"]], mat
            return None
        if entry and all(isinstance(v, dict) for v in entry.values()):
            rows = list(entry)
            cols = list(dict.fromkeys(c for v in entry.values() for c in v))
            mat = np.array([[num(entry[r].get(c)) if num(entry[r].get(c)) is not None else np.nan for c in cols]
                            for r in rows])
            return rows, cols, mat
        return None
    if isinstance(entry, list) and entry and all(isinstance(x, list) for x in entry):
        try:
            mat = np.asarray(entry, dtype=np.float64)
        except (TypeError, ValueError):
            return None
        if mat.ndim == 2:
            return [str(i) for i in range(mat.shape[0])], [str(j) for j in range(mat.shape[1])], mat
    return None


def _block_norms(r: Result) -> dict:
    bn = get(r.analysis, WEIGHTS, "block_sparsity", "block_norms")
    if not isinstance(bn, dict):
        return {}
    out = {name: m for name, entry in bn.items() if (m := block_matrix(entry)) is not None}
    return out


def _theta_block_norms(r: Result, theta_inputs: list[Result]) -> dict:
    """θ*'s block norms for the parameters of `r`: a θ* input of the batch, else θ* rebuilt from the
    input itself (a recording's /theta_star, or theta_star for a checkpoint's config)."""
    for t in theta_inputs:
        norms = _block_norms(t)
        if norms:
            return norms
    try:
        theta, layout = _theta_and_layout(r, list(_block_norms(r)))
    except Exception:  # noqa: BLE001 - no reference panel is better than no figure
        return {}
    from ..analyzers import weights

    return {name: block_matrix(weights.block_norms(m, layout)) for name, m in theta.items()}


def _theta_and_layout(r: Result, names: list[str]):
    if r.input.kind == "recording":
        from ..recording.format import Recording

        with Recording(r.input.path) as rec:
            return {k: v for k, v in rec.group("theta_star").items() if k in names}, rec.layout
    from ..analyzers import analyze, inputs

    config = json.loads((r.input.path / "config.json").read_text())
    return analyze.theta_for_config(config, names), inputs.layout_from_config(config)


def _heat(fig: Figure, ax, rows, cols, mat, title: str) -> None:
    finite = mat[np.isfinite(mat)]
    vmax = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    im = ax.imshow(mat, cmap="Blues", vmin=0.0, vmax=vmax, interpolation="nearest")
    fig.colorbar(im, ax=ax, label="‖block‖_F")
    ax.set_xticks(range(len(cols)), cols, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_xlabel("column block")
    ax.set_ylabel("row block")
    ax.set_title(title, fontsize=9)
    if mat.size <= 64:
        for (i, j), v in np.ndenumerate(mat):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2g}", ha="center", va="center", fontsize=6,
                        color="white" if v > 0.6 * vmax else "black")


def block_norm_figure(family: str, results: list[Result]) -> Figure | None:
    """Learned block norms beside θ*'s, one row per parameter matrix."""
    ok = [r for r in results if r.analyzed]
    theta = [r for r in ok if is_theta_star(r) and _block_norms(r)]
    learned = [r for r in representatives(ok) if not is_theta_star(r) and _block_norms(r)][:3]
    if not learned and not theta:
        return None
    shown = learned or theta[:1]
    reference = _theta_block_norms(shown[0], theta)
    names = list(dict.fromkeys(n for r in shown for n in _block_norms(r)))[:6]
    panels = 1 + len(shown) if learned else 1
    fig = Figure(figsize=(max(7.5, 3.8 * panels), 3.4 * len(names) + 0.8), layout="constrained")
    axes = fig.subplots(len(names), panels, squeeze=False)
    for i, name in enumerate(names):
        col = 0
        if learned:
            ax = axes[i, 0]
            if name in reference:
                _heat(fig, ax, *reference[name], f"{name}: θ* (construction)")
            else:
                ax.axis("off")
                ax.text(0.5, 0.5, f"θ* block norms of {name}\nnot available", ha="center", va="center")
            col = 1
        for r in shown:
            ax = axes[i, col]
            norms = _block_norms(r)
            if name in norms:
                energy = num(get(r.analysis, WEIGHTS, "block_sparsity", "in_support_energy"))
                extra = f"\nin-support energy {energy:.3f}" if energy is not None else ""
                _heat(fig, ax, *norms[name], f"{name}: {label_of(r)}{extra}")
            else:
                ax.axis("off")
            col += 1
    fig.suptitle(f"{family}: block norms of the parameters, learned vs θ*\n"
                 "good: the learned mass sits in the blocks θ* uses (in-support energy → 1)")
    return fig


# ------------------------------------------------------------------ value error
def _reference_key(layer_rows: list[dict]) -> str | None:
    """Name of a per-layer reference-algorithm value error, if the analyzer gives one."""
    for row in layer_rows:
        for k in row:
            if k != VALUE_ERROR and VALUE_ERROR in k and ("reference" in k or "ref" in k.split("_")):
                return k
    return None


def _positive(xs, ys):
    keep = [(x, y) for x, y in zip(xs, ys) if y is not None and y > 0]
    return [x for x, _ in keep], [y for _, y in keep]


VALUE_ERROR_AXIS = {
    "query": "mean over prompts of |v̂_l(s_q) − v_π(s_q)| (reward units)",
    "positions": "mean over tasks of ‖v_l − v_π‖_∞ over the context's states (reward units)",
}
"""Axis label of `value_error` by the task family's `Hints.output`: the per-layer numbers are means
(over prompts, or over tasks of a max-norm), and the axis says so."""


def _task_family(r: Result) -> str | None:
    return get(r.analysis, "task_family") or r.family


def value_error_label(family: str, results: list[Result] | None = None) -> str:
    """What `value_error` measures, from the task family of the inputs (`results`, else `family`):
    `VALUE_ERROR_AXIS` by `Hints.output`; for 'parameters' outputs the family's `value_error_label`,
    as a mean over prompts."""
    names = {_task_family(r) for r in results or []} or {family}
    if len(names) > 1:
        return "value error (mean over prompts; its definition depends on the task family)"
    found = registry.find(names.pop())
    hints = found.hints if found is not None else registry.Hints(output="query")
    if hints.output in VALUE_ERROR_AXIS:
        return VALUE_ERROR_AXIS[hints.output]
    return f"mean over prompts of the {hints.value_error_label}₂"


LENS_STYLE = {"model-readout": ("s", "-."), "tuned-linear": ("^", "--")}
"""(marker, line style) of each readout lens in the depth figure."""


def value_error_depth_figure(family: str, results: list[Result]) -> Figure | None:
    """Mean value error against layer, log scale: per-layer `value_error` (θ* dashed black), and for
    models read through readouts each lens's curve with the same lens on the random-init model (thin
    dotted); the reference algorithm at the same depth dotted grey."""
    shown = [r for r in representatives([r for r in results if r.analyzed])
             if layer_values(r, VALUE_ERROR)[0] or readout_curves(r)]
    if not shown:
        return None
    shown = shown[:MAX_LINES]
    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.subplots()
    ref_drawn = base_drawn = False
    for r, color in zip(shown, _colors(len(shown))):
        theta = is_theta_star(r)
        xs, ys = _positive(*layer_values(r, VALUE_ERROR))
        if xs:
            ax.plot(xs, ys, marker="o", color=THETA_STAR_COLOR if theta else color,
                    linestyle="--" if theta else "-", label=label_of(r))
        ref = _reference_key(layers_of(r))
        if ref and not ref_drawn:
            rx, ry = _positive(*layer_values(r, ref))
            if rx:
                ax.plot(rx, ry, color=CONTROL_COLOR, linestyle=":", marker="x", label="reference algorithm (same prompts)")
                ref_drawn = True
        for lens, c in readout_curves(r).items():
            marker, style = LENS_STYLE.get(lens, ("d", "-."))
            lx, ly = _positive(c["layers"], c["value_error"])
            ax.plot(lx, ly, marker=marker, color=color, linestyle=style, label=f"{label_of(r)}: {lens} lens")
            bx, by = _positive(c["layers"], c["random_init"])
            if bx:
                ax.plot(bx, by, marker=marker, color=color, linestyle=":", linewidth=0.8, alpha=0.7,
                        label="same lens, random-init model" if not base_drawn else None)
                base_drawn = True
            rx, ry = _positive(c["layers"], c["reference"])
            if rx and not ref_drawn:
                ax.plot(rx, ry, color=CONTROL_COLOR, linestyle=":", marker="x",
                        label="reference algorithm at step l + 1 (same prompts)")
                ref_drawn = True
    ax.set_yscale("log")
    ax.set_xlabel("layer l (depth)")
    if not ax.get_legend_handles_labels()[0]:
        return None  # nothing positive to draw on a log scale
    ax.set_ylabel(value_error_label(family, shown) + " (log)", fontsize=8)
    ax.set_title(f"{family}: value error against depth\ngood: falls geometrically with depth, like θ*")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def value_error_context_figure(family: str, results: list[Result]) -> Figure | None:
    """Last-layer value error against context length n (needs ≥ 2 lengths)."""
    points = defaultdict(lambda: defaultdict(list))
    for r in results:
        n, v = r.input.meta.get("context_length"), last_layer(r, VALUE_ERROR) if r.analyzed else None
        if isinstance(n, int) and v is not None and v > 0:
            points["θ* (construction)" if is_theta_star(r) else (r.source or "model")][n].append(v)
    lengths = {n for series in points.values() for n in series}
    if len(lengths) < 2:
        return None
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    for (name, series), color in zip(sorted(points.items()), _colors(len(points))):
        theta = name.startswith("θ*")
        ns = sorted(series)
        means = [float(np.mean(series[n])) for n in ns]
        color = THETA_STAR_COLOR if theta else color
        for n in ns:
            ax.scatter([n] * len(series[n]), series[n], color=color, alpha=0.35, s=12)
        ax.plot(ns, means, marker="o", color=color, linestyle="--" if theta else "-", label=f"{name} (mean)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("context length n (transitions, log)")
    ax.set_ylabel(f"last layer: {value_error_label(family, [r for r in results if r.analyzed])} (log)", fontsize=8)
    ax.set_title(f"{family}: value error against context length\ngood: the floor shrinks as n grows (≈ 1/√n)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return fig


# ------------------------------------------------------------------ TD probe
def td_probe_figure(family: str, results: list[Result]) -> Figure | None:
    """The TD-error probe's selectivity per layer (R² minus the largest of the input, random-init and
    shuffled baselines) with its interval over held-out tasks. Analyses without baselines (older ones)
    show their raw R², marked as such: a raw R² near 1 is no evidence of TD (an untrained model scores
    about as high, because δ is mostly the reward, which is in the input)."""
    from .td_probes import selectivity_values

    ok = representatives([r for r in results if r.analyzed])
    shown = [r for r in ok if selectivity_values(r)[0] or layer_values(r, TD_PROBE_R2)[0]][:MAX_LINES]
    if not shown:
        return None
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    lows, highs = [0.0], [0.0]
    for r, color in zip(shown, _colors(len(shown))):
        theta = is_theta_star(r)
        color = THETA_STAR_COLOR if theta else color
        xs, ys, lo, hi = selectivity_values(r)
        if xs:
            ax.plot(xs, ys, marker="o", color=color, linestyle="--" if theta else "-", label=label_of(r))
            band = [(x, a, b) for x, a, b in zip(xs, lo, hi) if a is not None and b is not None]
            if band:
                bx, blo, bhi = map(list, zip(*band))
                ax.fill_between(bx, blo, bhi, color=color, alpha=0.15, linewidth=0)
                lows.extend(blo)
                highs.extend(bhi)
        else:
            xs, ys = layer_values(r, TD_PROBE_R2)
            ax.plot(xs, ys, marker="x", color=color, linestyle=":", label=f"{label_of(r)}: raw R², no baselines")
        lows.extend(ys)
        highs.extend(ys)
    ax.axhline(0.0, color=CONTROL_COLOR, linewidth=1.0, label="0: nothing beyond the best baseline")
    ax.set_ylim(max(-1.0, min(lows) - 0.05), min(1.05, max(highs) + 0.05))
    ax.set_xlabel("layer l")
    ax.set_ylabel("selectivity: R² − max baseline R²")
    ax.set_title(f"{family}: TD-error probe selectivity per layer, 95% interval shaded\n"
                 "above 0 with its interval: δ beyond the input; ≈ 0: the input does as well")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return fig


# ------------------------------------------------------------------ in-context control
TEACHER_COLOR = "tab:blue"
ORACLE_COLOR = "tab:green"
# transformer lines avoid the colours of the teacher, the oracle and the random level
_TF_COLORS = ("tab:orange", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")


def control_curves(r: Result) -> dict | None:
    """(iteration, teacher mean, transformer mean, random, oracle) of an input's control run, as arrays
    of equal length and floats; None when it has no usable curves (disabled, failed, malformed)."""
    c = get(control_of(r), "curves")
    try:
        it = np.asarray(c["iteration"], dtype=np.float64)
        teacher = np.asarray(c["teacher"]["mean"], dtype=np.float64)
        tf = np.asarray(c["transformer"]["mean"], dtype=np.float64)
        random, oracle = num(c["random"]), num(c["oracle"])
    except (TypeError, KeyError, ValueError):
        return None
    if it.ndim != 1 or it.size < 2 or teacher.shape != it.shape or tf.shape != it.shape:
        return None
    return {"iteration": it, "teacher": teacher, "transformer": tf, "random": random, "oracle": oracle}


def control_figure(family: str, results: list[Result]) -> Figure | None:
    """Exact return vs closed-loop update: teacher, each checkpoint's transformer, random and oracle levels."""
    shown = [(r, cv) for r in representatives([r for r in results if r.analyzed])
             if (cv := control_curves(r)) is not None][:MAX_LINES]
    if not shown:
        return None
    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.subplots()
    # teacher / random / oracle depend only on the MDPs and the update rule: draw each distinct one once
    teachers = {tuple(np.round(cv["teacher"], 12)) for _, cv in shown}
    drawn_teachers: set = set()
    levels: dict[str, set] = {"random": set(), "oracle": set()}
    distinct = {name: {round(cv[name], 12) for _, cv in shown if cv[name] is not None} for name in levels}
    for i, (r, cv) in enumerate(shown):
        key = tuple(np.round(cv["teacher"], 12))
        if key not in drawn_teachers:
            drawn_teachers.add(key)
            who = f" (for {label_of(r)})" if len(teachers) > 1 else ""
            ax.plot(cv["iteration"], cv["teacher"], color=TEACHER_COLOR, linewidth=4, alpha=0.45,
                    label=f"analytic teacher{who}")
        theta = is_theta_star(r)
        ax.plot(cv["iteration"], cv["transformer"], color=THETA_STAR_COLOR if theta else _TF_COLORS[i % len(_TF_COLORS)],
                linestyle="--", linewidth=1.4, label=f"transformer: {label_of(r)}")
        for name, color, what in (("oracle", ORACLE_COLOR, "oracle (value iteration)"),
                                  ("random", CONTROL_COLOR, "random policy")):
            value = cv[name]
            if value is not None and round(value, 12) not in levels[name]:
                levels[name].add(round(value, 12))
                ax.axhline(value, color=color, linestyle=":", linewidth=1.5,
                           label=what if len(distinct[name]) == 1 else f"{what} (for {label_of(r)})")
    settings = get(control_of(shown[0][0]), "settings") or {}
    mdps = settings.get("mdps")
    ax.set_xlabel("closed-loop update (iteration of Algorithm 1)")
    ax.set_ylabel("exact discounted return (mean over MDPs)")
    ax.set_title(f"{family}: in-context control on {mdps} held-out MDPs\n"
                 "good: transformer on top of the teacher; oracle is the ceiling, random the floor")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return fig


# ------------------------------------------------------------------ training trends
TREND_METRICS = [
    # (title, y label, extractor, reference value for θ*, log scale)
    ("in-support energy", "fraction of squared norm", lambda r: num(get(r.analysis, WEIGHTS, "block_sparsity", "in_support_energy")), 1.0, False),
    ("manifold gauge cosine", "cosine (1 = θ* up to scale)", lambda r: num(get(r.analysis, WEIGHTS, "manifold", "gauge_cosine")), 1.0, False),
    ("manifold relative error (max over blocks)", "relative error (log; θ* = 0)", max_rel_err, None, True),
    ("lazy-block drift ‖P22‖, ‖V̄22‖", "norm (θ* = 0)", lambda r: num(get(r.analysis, WEIGHTS, "block_sparsity", "lazy_drift")), 0.0, False),
    ("TD-probe selectivity (last layer)", "R² − max baseline R²", lambda r: last_layer(r, TD_PROBE_SELECTIVITY), None, False),
    ("value error (last layer)", "mean value error (log; the depth figure's axis says which)",
     lambda r: last_layer(r, VALUE_ERROR), None, True),
    ("Wang et al.'s SS vs batch TD at the fitted step", "sensitivity similarity (θ* = 1)",
     lambda r: num(get(r.analysis, ACTIVATIONS, WANG_METRICS, "SS")), 1.0, False),
    ("Wang et al.'s VD vs batch TD at the fitted step", "value difference (log; θ* = 0)",
     lambda r: num(get(r.analysis, ACTIVATIONS, WANG_METRICS, "VD")), None, True),
]


def _series(results: list[Result]) -> dict[str, dict[str, dict[int, Result]]]:
    """series label -> run -> step -> result, for inputs that know their training run and step."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    trained = [r for r in results if r.analyzed and not is_theta_star(r)
               and r.input.meta.get("run_id") is not None and isinstance(r.input.meta.get("step"), int)]
    configs = {r.input.meta.get("series") for r in trained}
    for r in trained:
        label = f"{r.input.kind}s" + (f", config {r.input.meta.get('series')}" if len(configs) > 1 else "")
        out[label][str(r.input.meta["run_id"])][r.input.meta["step"]] = r
    return out


def _band(ax, runs: dict[str, dict[int, Result]], value, color, label: str, log: bool, band_label: bool = True) -> bool:
    """Mean ± std across runs (seeds) at each step, individual runs as thin lines."""
    per_step = defaultdict(list)
    for steps in runs.values():
        xs, ys = [], []
        for s in sorted(steps):
            v = value(steps[s])
            if v is not None and (v > 0 or not log):
                xs.append(s)
                ys.append(v)
                per_step[s].append(v)
        if xs and len(runs) > 1:
            ax.plot(xs, ys, color=color, alpha=0.25, linewidth=0.8)
    if not per_step:
        return False
    steps = sorted(per_step)
    mean = np.array([np.mean(per_step[s]) for s in steps])
    std = np.array([np.std(per_step[s]) for s in steps])
    ax.plot(steps, mean, color=color, marker="o", markersize=3, label=f"{label} (mean of {len(runs)} seed{'s' * (len(runs) > 1)})")
    if len(runs) > 1:
        lo = np.maximum(mean - std, mean * 0.1) if log else mean - std
        ax.fill_between(steps, lo, mean + std, color=color, alpha=0.2, label="± 1 std across seeds" if band_label else None)
    return True


def training_figure(family: str, results: list[Result]) -> Figure | None:
    """Metrics over training steps (mean ± std across seeds), each with θ*'s value as reference."""
    series = _series(results)
    if not series:
        return None
    panels = []
    layers = sorted({l for s in series.values() for run in s.values() for r in run.values() for l in kernel_mins(r)})
    if layers:
        panels.append(("kernel",))
    for spec in TREND_METRICS:
        if any(spec[2](r) is not None for s in series.values() for run in s.values() for r in run.values()):
            panels.append(spec)
    if not panels:
        return None
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(5.2 * cols, 3.8 * rows + 0.8), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[len(panels):]:
        ax.axis("off")
    colors = _colors(max(len(series), len(layers), 1))
    for ax, spec in zip(axes, panels):
        if spec[0] == "kernel":
            thresholds = []
            for i, (layer, color) in enumerate(zip(layers[:MAX_LAYERS], colors)):
                def value(r, layer=layer):
                    mn, threshold = kernel_mins(r).get(layer, (None, None))
                    if threshold is not None:
                        thresholds.append(threshold)
                    return mn
                for label, runs in series.items():
                    _band(ax, runs, value, color, f"layer {layer}" + (f" {label}" if len(series) > 1 else ""), False,
                          band_label=i == 0)
            if thresholds:
                ax.axhline(float(np.median(thresholds)), color="red", linestyle="--",
                           label=f"(1+γ)/2 = {np.median(thresholds):.3f} (contraction threshold)")
            ax.set_title("kernel diagonality: min_s M(s, s) per layer\n(M̂ from recordings, else M_π from weights); good: above the red line")
            ax.set_ylabel("min diagonal of the kernel (probability)")
        else:
            title, ylabel, value, ref, log = spec
            for (label, runs), color in zip(series.items(), colors):
                _band(ax, runs, value, color, label, log)
            if ref is not None:
                ax.axhline(ref, color=THETA_STAR_COLOR, linestyle="--", linewidth=1, label=f"θ* = {ref:g}")
            if log:
                ax.set_yscale("log")
            ax.set_title(title)
            ax.set_ylabel(ylabel)
        ax.set_xlabel("training step (optimizer steps)")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    fig.suptitle(f"{family}: metrics over training (mean ± std across seeds; θ* reference dashed)")
    return fig


# ------------------------------------------------------------------ driver
FAMILY_FIGURES = [
    ("training", "Metrics over training steps", training_figure,
     "Each panel: one metric of the checkpoints (or recordings) of training runs, mean ± one standard "
     "deviation across seeds at each step; the dashed line is the value θ* attains; in the kernel panel the "
     "red dashed line is the contraction threshold (1+γ)/2 of Assumption 5.1."),
    ("block-norms", "Block norms: learned parameters vs θ*", block_norm_figure,
     "Frobenius norm of each (row block, column block) of every parameter matrix, cut by the prompt layout. "
     "Left: θ*. A model that learned the construction puts its mass in the same blocks (up to the scale gauge)."),
    ("value-error-depth", "Value error against depth", value_error_depth_figure,
     "Policy-evaluation error after each layer (log scale). θ* dashed black; the reference algorithm dotted grey "
     "when the analysis provides it."),
    ("value-error-context", "Value error against context length", value_error_context_figure,
     "Last-layer value error against the number of context transitions: points are inputs, lines their means."),
    ("td-probe", "TD-error probe selectivity per layer", td_probe_figure,
     "A ridge probe from the activations at each context column to the reference TD error δ of the layer's "
     "step, scored on held-out tasks (split by task id), minus the best of three baselines scored the same way: "
     "the prompt column alone, the same hook of the model at random initialization (when recorded) and the "
     "probe on shuffled labels (partners of other tasks). Shaded: 95% bootstrap interval over held-out tasks. "
     "Raw R² is not shown as evidence: δ is mostly the reward, which is in the input, so an untrained model "
     "scores a raw R² about as high as a trained one. Per-target and per-task numbers: td_probes.csv, "
     "td_probe_tasks.csv."),
    ("control", "In-context control: return vs closed-loop update", control_figure,
     "Paper (b)'s Algorithm 1 on held-out random MDPs (fixed seed): each update samples n steps with the current "
     "parameters, builds the prompt and sets the parameters to the output. y: the exact discounted return of the "
     "acting policy from the start distribution (solved from P, R and the policy, not sampled), mean over MDPs. "
     "Thick blue: the analytic teacher (the reference update iterated); dashed: each checkpoint's transformer fed "
     "its own output (θ* black); dotted: the oracle (value iteration, the ceiling) and the uniform random policy. "
     "Good: the transformer's curve lies on the teacher's (θ* exactly) and both rise towards the oracle."),
]


def make_figures(results: list[Result], report_dir: Path, svg: bool = False, max_recordings: int = 12,
                 log=None) -> list[FigureInfo]:
    """Draw everything the inputs support into `<report_dir>/figures/`; never raises on odd input."""
    fig_dir = Path(report_dir) / "figures"
    if fig_dir.is_dir():  # stale figures of an earlier report must not survive
        for old in fig_dir.glob("*"):
            if old.suffix in (".png", ".svg") and old.is_file():
                old.unlink()
    by_family: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        if r.analyzed and r.causal is None and r.verdict is None:  # causal / verdict inputs: their own figures
            by_family[r.family].append(r)
    infos: list[FigureInfo] = []

    def draw(info: FigureInfo, build, *args) -> None:
        try:
            fig = build(*args)
            if fig is None:
                return
            info.files = _save(fig, fig_dir, info.key, svg)
            kill_point("report.figure")
        except Exception as e:  # noqa: BLE001 - a figure that cannot be drawn is reported, not fatal
            info.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if log:
                log(f"figure {info.key}: {info.error}")
        infos.append(info)

    for family in sorted(by_family):
        rs = by_family[family]
        for key, title, build, caption in FAMILY_FIGURES:
            draw(FigureInfo(family, f"{_slug(family)}-{key}", title, caption), build, family, rs)
        recs = [r for r in representatives(rs) if r.input.kind == "recording"]
        for i, r in enumerate(recs[:max_recordings]):
            draw(FigureInfo(family, f"{_slug(family)}-attention-{i:03d}-{r.sha256[:8]}",
                            f"Attention and kernel M̂: {label_of(r)}",
                            "Top: softmax attention of the first prompt; bottom: the state-aggregated kernel M̂(s, s') "
                            "averaged over all prompts, both of the head the analysis reports (the most diagonal; the "
                            "titles name it; a layer without M̂ shows the mean over heads). Under Assumption 5.1 every "
                            "diagonal entry exceeds (1+γ)/2 (boxed in red where it does not)."),
                 attention_figure, r)
        if len(recs) > max_recordings:
            infos.append(FigureInfo(family, f"{_slug(family)}-attention-more", "More recordings",
                                    f"{len(recs) - max_recordings} further recordings not drawn (raise --max-recordings)."))
    own = [(r, FigureInfo(r.family, causal_key(i, r), f"Causal test: {label_of(r)}", CAUSAL_CAPTION, section="causal"))
           for i, r in enumerate(r for r in results if r.causal is not None and r.analyzed)]
    own += [(r, FigureInfo(r.family, f"verdict-{i:03d}-{_slug(r.family)}-{r.sha256[:8]}", f"Algorithm verdict: {label_of(r)}",
                           VERDICT_CAPTION, section="verdict"))
            for i, r in enumerate(r for r in results if r.verdict is not None and r.analyzed
                                  and "layers" in r.verdict)]  # an episode verdict has no layers to draw: its table
    for r, info in own:
        try:
            info.files = (causal_figure if info.section == "causal" else verdict_figure)(r, fig_dir, info.key, svg)
        except Exception as e:  # noqa: BLE001 - as above
            info.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if log:
                log(f"figure {info.key}: {info.error}")
        infos.append(info)
    return infos


# ------------------------------------------------------------------ causal tests
CAUSAL_CAPTION = (
    "From the causal JSON (icrl-interp causal): at the layer and hook named above, the TD-error direction is "
    "erased from the context columns (or steered along), and the model's output change is measured on held-out "
    "tasks against the same edit along random directions. Erasure panel: the TD direction's mean ‖Δ output‖ (red, "
    "95% interval shaded) against the histogram of the random draws' means; steering panel: ‖Δ output‖ against "
    "the scale, random band 5–95% of the draws; with a random-init baseline, the same architecture at random "
    "initialization (blue) and the excess (TD − random) of both models with their paired difference. Good (a "
    "model that uses the direction): the red line right of the histogram (ratio above 1 with its interval), the "
    "steering curve above the band, and the trained model's excess above the random-init copy's.")


def causal_key(i: int, r: Result) -> str:
    """File stem of the i-th causal input's figure: `causal-NNN-<family>-l<layer>-<method>-<hash>`."""
    s = r.causal_section
    layer = s.get("layer") if isinstance(s.get("layer"), int) else "x"
    return f"causal-{i:03d}-{_slug(r.family)}-l{layer}-{_slug(str(s.get('method') or 'x'))}-{r.sha256[:8]}"


VERDICT_CAPTION = (
    "From the verdict JSON (icrl-interp verdict): left, the held-out R² of the model's update at each layer (and of "
    "its output) by each candidate algorithm at its fitted step size and step, with 95% bootstrap intervals over "
    "held-out tasks and the input baseline (dashed); right, the fitted step k per layer of the candidates that win "
    "somewhere. Good evidence for an algorithm: its R² near 1 at every layer with an interval clear of the "
    "runner-up's, and k growing one step per layer (docs/verdict.md).")


def verdict_figure(r: Result, fig_dir: Path, key: str, svg: bool) -> list[str]:
    """The verdict's figure (`report.verdict.write_figure`) as `<key>.png` (and `.svg`)."""
    from .verdict import write_figure

    return _document_figure(write_figure, r.verdict, r, fig_dir, key, svg)


def causal_figure(r: Result, fig_dir: Path, key: str, svg: bool) -> list[str]:
    """The causal section's figure (`report.causal.write_figure`) as `<key>.png` (and `.svg`); paths relative
    to the report directory."""
    from .causal import write_figure

    return _document_figure(write_figure, r.causal_section, r, fig_dir, key, svg)


def _document_figure(write_figure, doc: dict, r: Result, fig_dir: Path, key: str, svg: bool) -> list[str]:
    """write_figure(doc, target, title) as `<key>.png` (and `.svg`); paths relative to the report directory."""
    files = []
    for ext in ("png", "svg") if svg else ("png",):
        target = fig_dir / f"{key}.{ext}"
        write_figure(doc, target, title=f"{r.input.path.stem} ({r.family})")
        files.append(f"{fig_dir.name}/{target.name}")
    return files
