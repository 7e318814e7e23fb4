"""The handful of numbers per input that the summary table shows (HTML page and terminal).

The columns are the input's label, family, source and status, then the summary fields of every
registered analyzer in order (`icrl_interp.analyzers.registry.columns()`: an analyzer of your own adds
its own), then in-context control. The built-in ones: kernel diagonality by its worst layer (min over
layers of min_s M(s,s), and the margin of that layer; M̂ from a recording, else the population kernel
M_π of a checkpoint); the TD probe and value error by the last layer. The TD probe is shown as its
selectivity (R² minus the largest of the input, random-init and shuffled baselines) with its 95% interval
over held-out tasks, never as raw R²: an untrained model's raw R² is as high as a trained one's, because
the TD error is mostly the reward, which is in the input.
In-context control (sarsa / actor-critic checkpoints) by the transformer's and the teacher's mean
exact return at the final closed-loop update ('error' when the evaluation failed).
Causal tests (causal JSON inputs) get their own table (`CAUSAL_COLUMNS`): the output change from erasing
the TD-error direction against random directions, and the random-init comparison when there is one.
"""
from __future__ import annotations

import textwrap

from ..analyzers import registry
from ..analyzers.keys import TD_PROBE_R2, last_layer
from .batch import Result
from .fields import causal_stat, control_of, control_returns, get, label_of, num

META_COLUMNS = [("label", "input", "{}"), ("family", "family", "{}"), ("source", "source", "{}"), ("status", "status", "{}")]
"""(column key, header, format) of the columns before the analyzers' (never formatted as numbers)."""
CONTROL_COLUMN = ("control_return", "control return (tf/teacher)", "{}")
CONTROL_LEGEND = "control: closed-loop return, transformer/teacher"


def columns() -> list[tuple[str, str, str]]:
    """(column key, header, format) of every column, in order."""
    return [*META_COLUMNS, *((c.key, c.header, c.fmt) for c in registry.columns()), CONTROL_COLUMN]


def headline(r: Result) -> dict:
    """Raw values of `columns()` (None where the analysis lacks them), and the last layer's raw TD-probe R²."""
    a = r.analysis or {}
    out = {"label": label_of(r), "family": r.family, "source": r.source, "status": r.status}
    for c in registry.columns():
        try:
            out[c.key] = c.value(a)
        except Exception:  # noqa: BLE001 - an analyzer's reader that fails on odd input leaves its cell empty
            out[c.key] = None
    out[TD_PROBE_R2] = last_layer(a, TD_PROBE_R2)
    out["control_return"] = None
    tf, teacher = control_returns(r)
    if tf is not None and teacher is not None:
        diverged = num(get(control_of(r), "diverged_mdps"))
        out["control_return"] = f"{tf:.3f}/{teacher:.3f}" + (" (NaN)" if diverged else "")
    elif control_of(r) and control_of(r).get("error"):
        out["control_return"] = "error"
    return out


def formatted(r: Result) -> dict[str, str]:
    """`columns()` as display strings ('—' where absent)."""
    raw = headline(r)
    return {key: _shown(raw[key], fmt) for key, _, fmt in columns()}


def _shown(value, fmt: str) -> str:
    """A cell: '—' where absent, `fmt` where the value fits it, else the value as text."""
    if value in (None, ""):
        return "—"
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def short_headers() -> dict[str, str]:
    """Terminal headers: short enough that the table fits one screen; `legend()` spells them out."""
    return {**{c.key: c.short or c.header for c in registry.columns()}, "control_return": "control"}


def legend() -> str:
    """What the terminal headers mean."""
    return " · ".join([*(c.legend for c in registry.columns() if c.legend), CONTROL_LEGEND])


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


def text_table(results: list[Result], width: int = 28, zoos=()) -> str:
    """A plain-text table for the terminal, failed inputs listed with their reasons below it. It opens with what
    each model runs (`answers.text`: the verdict and causal inputs) and the zoos' known-answer totals, when the
    batch has them: the answer before the metrics."""
    from . import answers, known_answers

    lead = [x for x in (answers.text(results), known_answers.text(list(zoos))) if x]
    rows = [formatted(r) for r in results]
    short = short_headers()
    cols = [(k, short.get(k, h)) for k, h, _ in columns() if k != "status"]
    for row in rows:
        row["label"] = row["label"] if len(row["label"]) <= width else "…" + row["label"][-(width - 1):]
    widths = {k: max(len(h), *(len(row[k]) for row in rows)) if rows else len(h) for k, h in cols}
    lines = [x for part in lead for x in (part, "")]
    lines += ["  ".join(h.ljust(widths[k]) for k, h in cols)]
    lines += ["  ".join(row[k].ljust(widths[k]) for k, _ in cols) for row in rows]
    lines += ["", *textwrap.wrap(legend(), 110)]
    causal = causal_text(results, width)
    if causal:
        lines += ["", causal]
    failed = [r for r in results if r.status != "ok"]
    if failed:
        lines.append("")
        lines += [f"{r.status.upper()} {r.input.path}: {r.error or r.reasons}" for r in failed]
    return "\n".join(lines)
