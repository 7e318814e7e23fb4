"""The zoo's confusion matrix (docs/zoo.md): true algorithm against the verdict's label, one count per model.

Reads only the zoo JSON (`icrl_interp.zoo/1`, written by `zoo.run`); imports neither torch nor
transformer_lens. Rows: the true algorithms, decoys last ('decoy: <what it computes>'); columns: the verdict's
labels, "none fits" and reward regression last. A right answer is a diagonal cell for a non-decoy and one of
the two last columns for a decoy; the title carries the headline numbers.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from .causal import save


def figure(zoo: dict) -> Figure:
    conf = zoo["confusion"]
    counts = np.asarray(conf["counts"], dtype=float).reshape(len(conf["rows"]), len(conf["columns"]))
    fig = Figure(figsize=(2.5 + 0.75 * len(conf["columns"]), 1.6 + 0.38 * len(conf["rows"])))
    ax = fig.subplots()
    ax.imshow(np.where(counts > 0, counts, np.nan), cmap="Blues", vmin=0, vmax=max(1.0, counts.max()), aspect="auto")
    for (i, j), c in np.ndenumerate(counts):
        if c:
            ax.text(j, i, f"{int(c)}", ha="center", va="center", fontsize=9)
    ax.set_xticks(range(len(conf["columns"])), conf["columns"], rotation=35, ha="right", fontsize=8)
    ax.set_yticks(range(len(conf["rows"])), conf["rows"], fontsize=8)
    ax.set_xlabel("the verdict's label")
    ax.set_ylabel("true algorithm")
    s = zoo["summary"]

    def pct(x):
        return "n/a" if x is None else f"{100 * x:.0f}%"

    cal, ci = s.get("calibration_coverage"), s.get("calibration_coverage_ci")
    # by simulation where the run has a calibration; else the rows' own, named as what it is (mostly noise-free
    # teachers whose refits agree: not a calibration; `interval_coverage` in a zoo.json written before the rename)
    coverage = (f"interval coverage by simulation {100 * cal:.1f}% [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
                if cal is not None and ci else "noise-free interval coverage "
                + pct(s.get("interval_coverage_noise_free", s.get("interval_coverage"))))
    ax.set_title(f"zoo '{zoo['set']}' (seed {zoo['zoo_seed']}): {s['models']} models; non-decoys right "
                 f"{pct(s['accuracy_non_decoys'])}, decoys refused {s['decoys_refused']}/{s['decoys']}, "
                 f"clear wrong {s['clear_wrong']},\n{coverage}", fontsize=8)
    fig.tight_layout()
    return fig


def write_figure(zoo: dict, path) -> Path:
    """The confusion matrix as a PNG, written atomically (marked as the package's)."""
    return save(figure(zoo), path)
