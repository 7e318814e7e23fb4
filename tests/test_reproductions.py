"""The reproduction scripts that documented numbers come from run and measure what they say
(reproductions/*.py are scripts, not package modules: loaded by path)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "reproductions" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_xie_margin_scan_sharpens_the_kernel_with_the_score_scale_and_scores_the_refit():
    xm = _script("xie_margin")
    ckpt = REPO / "data" / "checkpoints" / "softmax-td"
    rows = xm.scan(ckpt, [0.5, 1.0, 3.0], [24], [None, 8], refit_steps=2, tasks=4)
    assert [(r["layers"], r["scale"]) for r in rows] == [(6, 0.5), (6, 1.0), (6, 3.0), (8, 0.5), (8, 1.0), (8, 3.0)]
    for depth in (rows[:3], rows[3:]):
        mins = [r["diag_min"] for r in depth]
        assert mins[0] < mins[1] < mins[2] <= 1.0  # the score scale is the diagonality knob
        assert all(np.isclose(r["margin"], r["diag_min"] - 0.75) for r in depth)  # gamma = 0.5
        assert all(np.isfinite(r["objective_value"]) and r["objective_value"] > 0 for r in depth)
    # the deeper copy applies the same (tied) score: same kernel at the same scale
    assert np.isclose(rows[1]["diag_min"], rows[4]["diag_min"])
