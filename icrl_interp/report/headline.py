"""The handful of numbers per input that the summary table shows (HTML page and terminal).

Kernel diagonality is summarised by its worst layer (min over layers of min_s M(s,s), and the
margin of that layer; M̂ from a recording, else the population kernel M_π of a checkpoint); the TD probe and
value error by the last layer. The TD probe is shown as its selectivity (R² minus the largest of the input,
random-init and shuffled baselines) with its 95% interval over held-out tasks, never as raw R²: an untrained
model's raw R² is as high as a trained one's, because the TD error is mostly the reward, which is in the input.
In-context control (sarsa / actor-critic checkpoints) by the transformer's and the teacher's mean
exact return at the final closed-loop update ('error' when the evaluation failed).
"""
from __future__ import annotations

import textwrap

from .batch import Result
from .fields import control_of, control_returns, get, kernel_mins, label_of, layers_of, max_rel_err, num

# (column key, header, format)
COLUMNS = [
    ("label", "input", "{}"),
    ("family", "family", "{}"),
    ("source", "source", "{}"),
    ("status", "status", "{}"),
    ("in_support_energy", "in-support energy", "{:.3f}"),
    ("manifold_rel_err", "manifold rel. err (max)", "{:.3g}"),
    ("gauge_cosine", "gauge cosine", "{:.3f}"),
    ("sign_pattern", "sign pattern", "{}"),
    ("lazy_drift", "lazy drift", "{:.3g}"),
    ("kernel_min", "min kernel diag", "{:.3f}"),
    ("kernel_margin", "margin vs (1+γ)/2", "{:+.3f}"),
    ("td_probe_selectivity", "TD-probe selectivity [95% CI] (last layer)", "{}"),
    ("value_error", "value error (last layer)", "{:.3g}"),
    ("control_return", "control return (tf/teacher)", "{}"),
]


def headline(r: Result) -> dict:
    """Raw values for COLUMNS (None where the analysis lacks them)."""
    a = r.analysis or {}
    out = {
        "label": label_of(r),
        "family": r.family,
        "source": r.source,
        "status": r.status,
        "in_support_energy": num(get(a, "weights", "block_sparsity", "in_support_energy")),
        "manifold_rel_err": max_rel_err(r),
        "gauge_cosine": num(get(a, "weights", "manifold", "gauge_cosine")),
        "sign_pattern": get(a, "weights", "sign_pattern") if isinstance(get(a, "weights", "sign_pattern"), str) else None,
        "lazy_drift": num(get(a, "weights", "block_sparsity", "lazy_drift")),
        "kernel_min": None,
        "kernel_margin": None,
        "td_probe_r2": None,
        "td_probe_selectivity": None,
        "value_error": None,
        "control_return": None,
    }
    layers = layers_of(r)
    kernels = kernel_mins(r)
    if kernels:
        mn, threshold = min(kernels.values(), key=lambda v: v[0])
        out["kernel_min"], out["kernel_margin"] = mn, None if threshold is None else mn - threshold
    for key in ("td_probe_r2", "value_error"):
        vals = [num(layer.get(key)) for layer in layers if num(layer.get(key)) is not None]
        out[key] = vals[-1] if vals else None
    sel = [x for x in layers if num(x.get("td_probe_selectivity")) is not None]
    if sel:
        out["td_probe_selectivity"] = selectivity_text(sel[-1].get("td_probe_selectivity"),
                                                       sel[-1].get("td_probe_selectivity_ci"))
    tf, teacher = control_returns(r)
    if tf is not None and teacher is not None:
        diverged = num(get(control_of(r), "diverged_mdps"))
        out["control_return"] = f"{tf:.3f}/{teacher:.3f}" + (" (NaN)" if diverged else "")
    elif control_of(r) and control_of(r).get("error"):
        out["control_return"] = "error"
    return out


def selectivity_text(value, ci) -> str:
    """'+0.131 [+0.101, +0.173]' (the interval left out when the analysis has none)."""
    lo, hi = (ci if isinstance(ci, list) and len(ci) == 2 else [None, None])
    text = f"{num(value):+.3f}"
    return text + (f" [{num(lo):+.3f}, {num(hi):+.3f}]" if num(lo) is not None and num(hi) is not None else "")


def formatted(r: Result) -> dict[str, str]:
    """COLUMNS as display strings ('—' where absent)."""
    raw = headline(r)
    return {key: "—" if raw[key] in (None, "") else fmt.format(raw[key]) for key, _, fmt in COLUMNS}


# Terminal headers: short enough that the table fits one screen; LEGEND spells them out.
SHORT = {"in_support_energy": "energy", "manifold_rel_err": "rel.err", "gauge_cosine": "gauge",
         "sign_pattern": "signs", "lazy_drift": "lazy", "kernel_min": "diag", "kernel_margin": "margin",
         "td_probe_selectivity": "probe sel. [CI]", "value_error": "v.err", "control_return": "control"}
LEGEND = ("energy: in-support energy · rel.err: manifold relative error (max block) · gauge: gauge cosine · "
          "signs: value-row sign pattern · lazy: lazy-block drift · diag / margin: min kernel diagonal and its "
          "margin over (1+γ)/2 (worst layer) · probe sel.: TD-probe R² minus the largest of its input, random-init and "
          "shuffled baselines, with its 95% interval over held-out tasks (last layer; ≈ 0: nothing beyond the input) · "
          "v.err: value error (last layer) · "
          "control: closed-loop return, transformer/teacher")


def text_table(results: list[Result], width: int = 28) -> str:
    """A plain-text table for the terminal, failed inputs listed with their reasons below it."""
    rows = [formatted(r) for r in results]
    cols = [(k, SHORT.get(k, h)) for k, h, _ in COLUMNS if k != "status"]
    for row in rows:
        row["label"] = row["label"] if len(row["label"]) <= width else "…" + row["label"][-(width - 1):]
    widths = {k: max(len(h), *(len(row[k]) for row in rows)) if rows else len(h) for k, h in cols}
    lines = ["  ".join(h.ljust(widths[k]) for k, h in cols)]
    lines += ["  ".join(row[k].ljust(widths[k]) for k, _ in cols) for row in rows]
    lines += ["", *textwrap.wrap(LEGEND, 110)]
    failed = [r for r in results if r.status != "ok"]
    if failed:
        lines.append("")
        lines += [f"{r.status.upper()} {r.input.path}: {r.error or r.reasons}" for r in failed]
    return "\n".join(lines)
