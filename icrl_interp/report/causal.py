"""The causal test's figure (matplotlib, Agg; no pyplot global state): the output change from erasing the
TD-error direction against the distribution over random directions, the steering curve, and (with a
`baseline` section) the trained model against its random-init copy.

Reads only the `causal` JSON section (docs/formats.md#causal-json); imports neither torch nor
transformer_lens.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..core.files import atomic_path
from ..core.outputs import FIGURE_METADATA

TD_COLOR = "tab:red"
RANDOM_COLOR = "tab:gray"
BASE_COLOR = "tab:blue"
"""The random-init copy's curves."""


def _ci_span(ax, stat: dict | None, color: str) -> None:
    if stat and stat.get("ci"):
        ax.axvspan(stat["ci"][0], stat["ci"][1], color=color, alpha=0.15, lw=0)


def _comparison(section: dict) -> dict | None:
    return (section.get("baseline") or {}).get("comparison")


def figure(section: dict, title: str = "") -> Figure:
    """Up to three panels: erasure (histogram of the random draws' mean |Δ output|, the TD direction's
    with its interval), steering (mean |Δ output| against the scale s, random band 5–95% of the draws;
    the random-init copy's curves in blue) and, with a baseline, the excess output change (TD − random)
    of the trained model, its random-init copy and their paired difference, with intervals."""
    steering = section.get("steering") or []
    comparison = _comparison(section)
    n_panels = 1 + bool(steering) + bool(comparison)
    fig = Figure(figsize=(5 * n_panels, 4))
    axes = fig.subplots(1, n_panels, squeeze=False)[0]
    out = section["erasure"]["output_change"]
    ax = axes[0]
    draws = np.asarray(out["random"]["draws"], dtype=np.float64)
    top = max(float(draws.max(initial=0.0)), out["td"]["mean"] or 0.0)
    bins = np.linspace(0.0, top * 1.05 if top > 0 else 1.0, 21)
    ax.hist(draws, bins=bins, color=RANDOM_COLOR, alpha=0.7, label=f"random directions ({draws.size} draws)")
    ax.axvline(out["td"]["mean"], color=TD_COLOR, lw=2, label="TD-error direction")
    _ci_span(ax, out["td"], TD_COLOR)
    ratio, d = out.get("ratio", {}).get("value"), out["cohen_d"]["value"]
    who = "trained, " if comparison else ""
    ax.set_title(f"{who}erase ({section['method']}): ratio {'—' if ratio is None else f'{ratio:.3g}'}, "
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
        base_steer = (section.get("baseline") or {}).get("steering") or []
        if base_steer and comparison:
            bs = np.array([p["scale"] for p in base_steer])
            bo = np.argsort(bs)
            bs = bs[bo]
            btd = np.array([base_steer[i]["td"]["change"] for i in bo])
            brnd = np.array([base_steer[i]["random"]["change"] for i in bo])
            if 0.0 not in bs:
                at = int(np.searchsorted(bs, 0.0))
                bs, btd, brnd = (np.insert(a, at, 0.0) for a in (bs, btd, brnd))
            ax.plot(bs, btd, "s-", color=BASE_COLOR, label="random init: TD-error direction")
            ax.plot(bs, brnd, "s--", color=BASE_COLOR, alpha=0.5, label="random init: random mean")
        ax.axhline(0.0, color="black", lw=0.5)
        ax.set_xlabel("steering scale s (shift = s · std of the projection)")
        ax.set_ylabel("mean ‖Δ output‖")
        ax.set_title("steer", fontsize=10)
        ax.legend(fontsize=8)
    if comparison:
        _comparison_panel(axes[-1], comparison, f"erase: {section['method']}")
    d = section["direction"]
    r2 = d.get("r2_test")
    answer = section.get("conclusion")  # schema 2: the selective test's answer (docs/causal.md)
    fig.suptitle(f"{title + ': ' if title else ''}{section['hook']}, direction {d['source']}"
                 + (f" (probe R² {r2:.3f} held out)" if r2 is not None else "")
                 + (f"; uses the selective TD part: {answer}" if answer else ""), fontsize=10)
    fig.tight_layout()
    return fig


def _comparison_panel(ax, comparison: dict, method: str) -> None:
    """Excess output change (TD − random directions) of each model and their paired difference."""
    rows = [("erase", comparison["erasure"]["output_change"])]
    if comparison.get("steering"):
        point = max(comparison["steering"], key=lambda p: abs(p["scale"]))
        rows.append((f"steer s={point['scale']:g}", point))
    labels, y = [], 0.0
    for name, v in rows:
        for key, label, color in (("trained", "trained", TD_COLOR), ("random_init", "random init", BASE_COLOR),
                                  ("difference", "difference", "black")):
            st = v[key]
            if st.get("mean") is not None:
                ci = st.get("ci")
                err = None if not ci else [[max(st["mean"] - ci[0], 0.0)], [max(ci[1] - st["mean"], 0.0)]]
                ax.errorbar([st["mean"]], [y], xerr=err, fmt="o", color=color, capsize=3)
            labels.append((y, f"{name}: {label}"))
            y -= 1.0
        y -= 0.5
    ax.set_yticks([p for p, _ in labels], [t for _, t in labels], fontsize=8)
    ax.axvline(0.0, color="black", lw=0.5)
    ax.set_xlabel("excess ‖Δ output‖ (TD − random directions)")
    ax.set_title(f"trained vs random init ({method})\nerasure exceeds: "
                 f"{_short(comparison.get('exceeds_random_init', ''))}", fontsize=10)


def _short(verdict: str) -> str:
    """The verdict's answer and, for a no, its reason in a few words."""
    for start, short in (("yes", "yes"), ("no: the paired difference's interval includes 0", "no (difference includes 0)"),
                         ("no: the random-init", "no (random init larger)"),
                         ("no: the paired difference lies above 0, but", "no (trained reaches 0)"),
                         ("no: no interval", "no (no interval)")):
        if verdict.startswith(start):
            return short
    return verdict.split(":", 1)[0]


def write_figure(section: dict, path, title: str = "") -> Path:
    """The figure as a PNG (or SVG by suffix), written atomically without date metadata."""
    return save(figure(section, title), path)


def save(fig: Figure, path) -> Path:
    """Write a figure as a PNG (or SVG by suffix), atomically, without date metadata."""
    path = Path(path)
    fmt = "svg" if path.suffix.lower() == ".svg" else "png"
    FigureCanvasAgg(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, suffix=f".{fmt}") as tmp:
        # the metadata marks the figure as ours, so a later run may replace it (outputs.is_ours)
        fig.savefig(tmp, format=fmt, dpi=100, metadata=FIGURE_METADATA[fmt])
    return path
