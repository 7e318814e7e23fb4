"""The handful of numbers per input that the summary table shows (HTML page and terminal).

Kernel diagonality is summarised by its worst layer (min over layers of min_s M(s,s), and the
margin of that layer; M̂ from a recording, else the population kernel M_π of a checkpoint); the TD probe and
value error by the last layer. The TD probe is shown as its selectivity (R² minus the largest of the input,
random-init and shuffled baselines) with its 95% interval over held-out tasks, never as raw R²: an untrained
model's raw R² is as high as a trained one's, because the TD error is mostly the reward, which is in the input.
In-context control (sarsa / actor-critic checkpoints) by the transformer's and the teacher's mean
exact return at the final closed-loop update ('error' when the evaluation failed).
Causal tests (causal JSON inputs) get their own table (`CAUSAL_COLUMNS`): the output change from erasing
the TD-error direction against random directions, and the random-init comparison when there is one.
"""
from __future__ import annotations

import textwrap

from .batch import Result
from .fields import causal_stat, control_of, control_returns, get, kernel_mins, label_of, layers_of, max_rel_err, num

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


# (column key, header, terminal header or None when the terminal leaves it out)
CAUSAL_COLUMNS = [
    ("label", "input", "input"),
    ("family", "family", "family"),
    ("task_family", "task", None),
    ("layer", "layer", "layer"),
    ("hook", "hook", None),
    ("method", "erasure", "method"),
    ("direction", "direction (probe R² held out)", None),
    ("td", "TD direction ‖Δ out‖ [95% CI]", "TD ‖Δout‖ [CI]"),
    ("random", "random directions ‖Δ out‖ [95% CI]", "random"),
    ("ratio", "ratio [95% CI]", "ratio [CI]"),
    ("cohen_d", "Cohen d [95% CI]", None),
    ("excess", "TD − random: trained / random init [95% CI]", None),
    ("exceeds", "exceeds random init", "vs random init"),
    ("status", "status", None),
    ("notes", "notes", None),
]


def stat_text(stat) -> str:
    """'0.0796 [0.0526, 0.116]' of a causal statistic ({"mean"|"value", "ci"}); '—' when absent."""
    value, ci = causal_stat(stat)
    if value is None:
        return "—"
    return f"{value:.3g}" + (f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else "")


def causal_headline(r: Result) -> dict[str, str]:
    """CAUSAL_COLUMNS of a causal input as display strings ('—' where absent)."""
    s = r.causal_section
    d = s.get("direction") if isinstance(s.get("direction"), dict) else {}
    out = get(s, "erasure", "output_change")
    base = s.get("baseline")
    comp = get(base, "comparison")
    r2 = num(d.get("r2_test"))
    row = {
        "label": label_of(r), "family": r.family if r.causal is not None else "—",
        "task_family": str(get(s, "task", "family") or "—"),
        "layer": "—" if not isinstance(s.get("layer"), int) else
        f"{s['layer']} of {s['n_layers']}" if isinstance(s.get("n_layers"), int) else str(s["layer"]),
        "hook": str(s.get("hook") or "—"), "method": str(s.get("method") or "—"),
        "direction": "—" if not d.get("source") else f"{d['source']}" + (f" (R² {r2:.3f})" if r2 is not None else ""),
        "td": stat_text(get(out, "td")), "random": stat_text(get(out, "random")),
        "ratio": stat_text(get(out, "ratio")), "cohen_d": stat_text(get(out, "cohen_d")),
        "excess": "—", "exceeds": "—", "status": r.status,
    }
    if isinstance(base, dict) and base.get("error"):
        row["exceeds"] = f"not run: {base['error']}"
    elif isinstance(comp, dict):
        ex = get(comp, "erasure", "output_change")
        row["excess"] = f"{stat_text(get(ex, 'trained'))} / {stat_text(get(ex, 'random_init'))}"
        verdict = comp.get("exceeds_random_init")
        row["exceeds"] = verdict.split(" (", 1)[0] if isinstance(verdict, str) else "—"
    elif r.causal is not None and base is None:
        row["exceeds"] = "no baseline in the JSON"
    notes = [str(n) for n in (s.get("notes") or [])]
    notes += [f"random init: {n}" for n in (get(base, "notes") or [])]
    row["notes"] = "; ".join(notes)  # a failed row's reason is listed below the tables
    return row


def causal_text(results: list[Result], width: int = 28) -> str:
    """The causal inputs as a plain-text table ('' when there are none)."""
    rows = [causal_headline(r) for r in results if r.input.kind == "causal"]
    if not rows:
        return ""
    cols = [(k, h) for k, _, h in CAUSAL_COLUMNS if h]
    for row in rows:
        row["label"] = row["label"] if len(row["label"]) <= width else "…" + row["label"][-(width - 1):]
    widths = {k: max(len(h), *(len(row[k]) for row in rows)) for k, h in cols}
    lines = ["causal tests: erasing the TD-error direction vs random directions (mean ‖Δ output‖ over held-out tasks)"]
    lines.append("  ".join(h.ljust(widths[k]) for k, h in cols).rstrip())
    lines += ["  ".join(row[k].ljust(widths[k]) for k, _ in cols).rstrip() for row in rows]
    return "\n".join(lines)


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
    causal = causal_text(results, width)
    if causal:
        lines += ["", causal]
    verdicts = [r for r in results if r.verdict is not None and r.analyzed]
    if verdicts:
        lines += ["", "algorithm verdicts (held-out behaviour R², docs/verdict.md):"]
        lines += [f"  {label_of(r)}: {r.verdict['verdict']['text']}" for r in verdicts]
    failed = [r for r in results if r.status != "ok"]
    if failed:
        lines.append("")
        lines += [f"{r.status.upper()} {r.input.path}: {r.error or r.reasons}" for r in failed]
    return "\n".join(lines)
