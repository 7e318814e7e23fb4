"""The causal test's figure (matplotlib, Agg; no pyplot global state): the output change from erasing the
TD-error direction against the distribution over random directions, and the steering curve.

Reads only the `causal` JSON section (docs/formats.md#causal-json); imports neither torch nor
transformer_lens.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..files import atomic_path

TD_COLOR = "tab:red"
RANDOM_COLOR = "tab:gray"


def _ci_span(ax, stat: dict | None, color: str) -> None:
    if stat and stat.get("ci"):
        ax.axvspan(stat["ci"][0], stat["ci"][1], color=color, alpha=0.15, lw=0)


def figure(section: dict, title: str = "") -> Figure:
    """Two panels: erasure (histogram of the random draws' mean |Δ output|, the TD direction's with its
    interval) and steering (mean |Δ output| against the scale s, random band 5–95% of the draws)."""
    fig = Figure(figsize=(10, 4))
    steering = section.get("steering") or []
    axes = fig.subplots(1, 2 if steering else 1, squeeze=False)[0]
    out = section["erasure"]["output_change"]
    ax = axes[0]
    draws = np.asarray(out["random"]["draws"], dtype=np.float64)
    top = max(float(draws.max(initial=0.0)), out["td"]["mean"] or 0.0)
    bins = np.linspace(0.0, top * 1.05 if top > 0 else 1.0, 21)
    ax.hist(draws, bins=bins, color=RANDOM_COLOR, alpha=0.7, label=f"random directions ({draws.size} draws)")
    ax.axvline(out["td"]["mean"], color=TD_COLOR, lw=2, label="TD-error direction")
    _ci_span(ax, out["td"], TD_COLOR)
    ratio, d = out.get("ratio", {}).get("value"), out["cohen_d"]["value"]
    ax.set_title(f"erase ({section['method']}): ratio {'—' if ratio is None else f'{ratio:.3g}'}, "
                 f"Cohen d {'—' if d is None else f'{d:.3g}'}", fontsize=10)
    ax.set_xlabel("mean ‖Δ output‖ over held-out tasks")
    ax.set_ylabel("random draws")
    ax.legend(fontsize=8)
    if steering:
        ax = axes[1]
        s = np.array([p["scale"] for p in steering])
        order = np.argsort(s)
        s = s[order]
        td = np.array([steering[i]["td"]["change"] for i in order])
        lo = np.array([(steering[i]["td"]["ci"] or [np.nan, np.nan])[0] for i in order])
        hi = np.array([(steering[i]["td"]["ci"] or [np.nan, np.nan])[1] for i in order])
        rnd = np.array([steering[i]["random"]["change"] for i in order])
        band = np.array([steering[i]["random"]["band"] for i in order])
        if 0.0 not in s:  # no shift, no change
            at = int(np.searchsorted(s, 0.0))
            s, td, lo, hi, rnd = (np.insert(a, at, 0.0) for a in (s, td, lo, hi, rnd))
            band = np.insert(band, at, [0.0, 0.0], axis=0)
        ax.fill_between(s, band[:, 0], band[:, 1], color=RANDOM_COLOR, alpha=0.25, lw=0, label="random: 5–95% of draws")
        ax.plot(s, rnd, "o--", color=RANDOM_COLOR, label="random: mean")
        ax.fill_between(s, lo, hi, color=TD_COLOR, alpha=0.15, lw=0)
        ax.plot(s, td, "o-", color=TD_COLOR, label="TD-error direction")
        ax.axhline(0.0, color="black", lw=0.5)
        ax.set_xlabel("steering scale s (shift = s · std of the projection)")
        ax.set_ylabel("mean ‖Δ output‖")
        ax.set_title("steer", fontsize=10)
        ax.legend(fontsize=8)
    d = section["direction"]
    r2 = d.get("r2_test")
    fig.suptitle(f"{title + ': ' if title else ''}{section['hook']}, direction {d['source']}"
                 + (f" (probe R² {r2:.3f} held out)" if r2 is not None else ""), fontsize=10)
    fig.tight_layout()
    return fig


def write_figure(section: dict, path, title: str = "") -> Path:
    """The figure as a PNG (or SVG by suffix), written atomically without date metadata."""
    path = Path(path)
    fmt = "svg" if path.suffix.lower() == ".svg" else "png"
    fig = figure(section, title)
    FigureCanvasAgg(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, suffix=f".{fmt}") as tmp:
        meta = {"Software": None} if fmt == "png" else {"Date": None, "Creator": None}
        fig.savefig(tmp, format=fmt, dpi=100, metadata=meta)
    return path
