"""The algorithm verdict's figure and report table (matplotlib, Agg; no pyplot global state).

Reads only the verdict JSON (`icrl_interp.verdict/2`, docs/formats.md "Verdict JSON"); imports neither
torch nor transformer_lens. Left panel: held-out behaviour R² per layer for every candidate, with the
input baseline; right panel: the best candidate's fitted step k per layer (does k grow with depth?).
"""
from __future__ import annotations

import html
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from .causal import save

from ..analyzers.inputs import EPISODE_VERDICT_SCHEMAS as EPISODE_SCHEMAS  # noqa: E402
from ..analyzers.inputs import VERDICT_SCHEMA as SCHEMA  # noqa: E402


def _rows(v: dict) -> list[dict]:
    return list(v["layers"]) + [v["output"]]


PARAM_NAMES = {"alpha": "α", "beta": "β", "scale": "scale", "gamma": "γ′", "lambda": "λ", "step": "k"}


def params_text(params: dict) -> str:
    """The fitted parameters with their intervals, e.g. "α 1 [0.985, 1.01], γ′ 0.5 [0.5, 0.5], k 3 [3, 3]"."""
    out = []
    for k, p in params.items():
        ci = p.get("ci")
        fixed = " (the task's)" if p.get("fixed") else ""
        out.append(f"{PARAM_NAMES.get(k, k)} {p['value']:.3g}" + (f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else "") + fixed)
    return ", ".join(out)


def summary_lines(v: dict) -> list[str]:
    """The model's verdict in a few lines: label and clear, fitted parameters, the OOD checks, more tasks."""
    top = v["verdict"]
    lines = [f"model: {top['text']}"]
    if top.get("params"):
        lines.append(f"  fitted: {params_text(top['params'])}; clear: {'yes' if top.get('clear') else 'no'}")
    ood = top.get("ood")
    if ood and ood.get("checks"):
        cells = [f"{k} {c['r2']:.3g} {'pass' if c['passes'] else 'FAIL'}"
                 if c.get("available") and c.get("r2") is not None else f"{k} n/a" for k, c in ood["checks"].items()]
        lines.append("  out of distribution (R²): " + "; ".join(cells))
    more = top.get("more_tasks")
    if more:
        lines.append(f"  to resolve it: about {more['held_out_tasks_needed']} held-out tasks "
                     f"(record about {more.get('tasks_to_record', '?')} in all)")
    return lines


def figure(v: dict, title: str = "") -> Figure:
    """Behaviour R² by layer and candidate (intervals as bars), and the fitted step k of the top candidates."""
    rows = _rows(v)
    labels = [str(r["layer"]) for r in rows]
    names = [c for c, e in v["candidates"].items() if e["applicable"]]
    fig = Figure(figsize=(11, 4.2))
    ax, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    x = np.arange(len(rows))
    for i, c in enumerate(names):
        r2 = np.array([np.nan if r["behaviour"][c]["r2"] is None else r["behaviour"][c]["r2"] for r in rows])
        lo = np.array([np.nan if not r["behaviour"][c]["ci"] else r["behaviour"][c]["ci"][0] for r in rows])
        hi = np.array([np.nan if not r["behaviour"][c]["ci"] else r["behaviour"][c]["ci"][1] for r in rows])
        shift = (i - (len(names) - 1) / 2) * 0.6 / max(len(names), 1)
        ax.errorbar(x + shift, np.clip(r2, -0.5, 1.0), yerr=[np.clip(r2 - lo, 0, None), np.clip(hi - r2, 0, None)],
                    fmt="o-", ms=3, lw=1, capsize=2, label=c)
    base = [np.nan if r["baselines"]["input_ridge"]["r2"] is None else r["baselines"]["input_ridge"]["r2"] for r in rows]
    ax.plot(x, np.clip(base, -0.5, 1.0), "k--", lw=1, label="input ridge (baseline)")
    ax.axhline(v["settings"]["min_r2"], color="grey", lw=0.6, ls=":")
    ax.set_xticks(x, labels)
    ax.set_xlabel("layer (output: the model's own output)")
    ax.set_ylabel("held-out R² of the update (clipped at −0.5)")
    ax.set_ylim(-0.55, 1.05)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    ax.set_title(f"behaviour: {v['verdict']['text']}"[:110], fontsize=9)
    layers = [r for r in v["layers"]]
    top = [c for c in names if any(r["verdict"]["best"] == c for r in rows)][:4]
    for c in top:
        steps = [r["behaviour"][c]["step"] for r in layers]
        ax2.plot([r["layer"] for r in layers], [np.nan if s is None else s for s in steps], "o-", label=c)
    ax2.set_xlabel("layer")
    ax2.set_ylabel("fitted step k")
    ax2.set_title("best step k per layer", fontsize=9)
    if top:
        ax2.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def write_figure(v: dict, path, title: str = "") -> Path:
    """The figure as a PNG (or SVG by suffix), written atomically without date metadata."""
    return save(figure(v, title or str(v.get("source", ""))), path)


def html_table(v: dict) -> str:
    """The report's table: per layer the verdict, the best candidate's R² and interval, the margin, and whether
    the probes and the causal test point at the same candidate (an episode verdict: `episode_table`)."""
    if v.get("schema") in EPISODE_SCHEMAS:
        return episode_table(v)

    def fmt(x, ci=None):
        if x is None:
            return "—"
        return f"{x:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")

    out = ["<table class='verdict'><tr><th>layer</th><th>verdict</th><th>best R²</th><th>runner-up</th>"
           "<th>margin</th><th>probes' top</th><th>causal top</th></tr>"]
    for r in _rows(v):
        d = r["verdict"]
        out.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            r["layer"], d.get("label", d["best"]) if d["fits"] else "none fits", fmt(d["best_r2"], d["best_r2_ci"]),
            d["runner_up"] or "—",
            fmt(d["margin"], d["margin_ci"]), d.get("representation_top") or "—",
            d.get("causation_top") or ("—" if r["layer"] == "output" else r.get("causation", {}).get("reason", "—")[:40])))
            + "</tr>")
    out.append("</table>")
    out += [f"<p class='verdict-summary'>{html.escape(line.strip())}</p>" for line in summary_lines(v)[1:]]
    return "\n".join(out)


def episode_table(v: dict) -> str:
    """An episode verdict (`icrl_interp.episode_verdict/1` or `/2`, docs/episodes.md "The behavioural verdict"): per rule
    and baseline the held-out mean log-likelihood per step with its interval and the fitted parameters with
    theirs, then the verdict's text."""
    def fmt(x, ci=None):
        return "—" if x is None else f"{x:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")

    out = ["<table class='verdict'><tr><th>rule</th><th>held-out log-lik per step</th><th>fitted parameters</th></tr>"]
    for name, c in v["candidates"].items():
        # the rules' own parameter names (gamma is the discount here, not a family's gamma')
        params = ", ".join(f"{k} {fmt(p['value'], p.get('ci'))}" for k, p in (c.get("params") or {}).items())
        out.append(f"<tr><td>{html.escape(name)}</td><td>{fmt(c.get('held_out_loglik'), c.get('held_out_loglik_ci'))}"
                   f"</td><td>{html.escape(params or '—')}</td></tr>")
    for name, b in (v.get("baselines") or {}).items():
        out.append(f"<tr><td>{html.escape(name)} (baseline)</td><td>{fmt(b.get('held_out_loglik'), b.get('held_out_loglik_ci'))}"
                   "</td><td>—</td></tr>")
    out.append("</table>")
    out.append(f"<p class='verdict-summary'>{html.escape(str(v['verdict'].get('text', '')))}</p>")
    return "\n".join(out)
