"""The calibration figure (docs/zoo.md, "Calibration"): per teacher and noise level, each parameter's coverage by
its 95 % interval with the Wilson interval over replicates, against the nominal 95 % and the 90-99 % target band.

Reads only the calibration JSON (`icrl_interp.zoo_calibration/1`, written by `zoo.calibration`); imports neither
torch nor transformer_lens.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from .causal import save


def _teacher(t: dict) -> str:
    return f"{t['algorithm']} a={t['alpha']:g} g'={t['gamma']:g} k={t['steps']}"


def figure(cal: dict) -> Figure:
    cells = cal["cells"]
    names = sorted({k for c in cells for k in c["parameters"]})
    fig = Figure(figsize=(1.8 + 1.3 * len(cells), 3.6))
    ax = fig.subplots()
    lo, hi = cal["target"]
    ax.axhspan(lo, hi, color="0.9", label=f"target {lo:.0%}-{hi:.0%}")
    ax.axhline(0.95, color="0.4", lw=0.8, ls="--", label="nominal 95%")
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        xs, ys, err = [], [], [[], []]
        for i, c in enumerate(cells):
            p = c["parameters"].get(name)
            if p is None:
                continue
            xs.append(i + (j - (len(names) - 1) / 2) * width)
            ys.append(p["coverage"])
            err[0].append(p["coverage"] - p["coverage_ci"][0])
            err[1].append(p["coverage_ci"][1] - p["coverage"])
        ax.errorbar(xs, ys, yerr=np.array(err), fmt="o", ms=4, capsize=2, label=name)
    ax.set_xticks(range(len(cells)), [f"{_teacher(c['teacher'])}\nnoise {c['noise']:g}" for c in cells], fontsize=7)
    ax.set_ylim(min(0.7, *(c["parameters"][k]["coverage_ci"][0] for c in cells for k in c["parameters"])) - 0.02, 1.01)
    ax.set_ylabel("coverage of the truth")
    s = cal["summary"]["overall"]
    ax.set_title(f"interval calibration: {cal['settings']['replicates']} replicates per cell; pooled coverage "
                 f"{s['coverage']:.1%} [{s['coverage_ci'][0]:.1%}, {s['coverage_ci'][1]:.1%}]", fontsize=8)
    ax.legend(fontsize=7, ncol=3, loc="lower left")
    fig.tight_layout()
    return fig


def coverage_text(pooled: dict) -> str:
    """'C/N intervals cover the truth (x%, Wilson 95% [lo%, hi%])' of a pooled coverage (`summary.overall`)."""
    lo, hi = pooled["coverage_ci"]
    return (f"{pooled['covered']}/{pooled['checked']} intervals cover the truth ({pooled['coverage']:.1%}, Wilson 95% "
            f"[{lo:.1%}, {hi:.1%}])")


def write_figure(cal: dict, path) -> Path:
    """The calibration figure as a PNG, written atomically (marked as the package's)."""
    return save(figure(cal), path)
