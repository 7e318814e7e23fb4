"""Test inputs for the report: contract-shaped analysis dicts, checkpoints / recordings carrying
them, and a stand-in analyzer (`report_fake:analyze`) that reads them back.

The stand-in lets the batch machinery (hashing, cache, parallel processes, failures) be tested
exactly, independently of the real analyzers. It logs every call to $REPORT_FAKE_LOG so tests can
count how many inputs were really analyzed (the log works across spawned processes).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np

from icrl_interp.tasks import layouts
from icrl_interp.core.errors import UserError
from icrl_interp.recording.format import RecordingWriter
from icrl_interp.families import softmax_td

SCHEMA = "icrl_interp.analysis/1"
LOG_ENV = "REPORT_FAKE_LOG"


def make_analysis(family: str, source: str, quality: float, n_layers: int = 3, gamma: float = 0.9,
                  with_acts: bool = True) -> dict:
    """An analysis in exactly the contract's shape; `quality` in [0, 1] moves every metric towards θ*'s."""
    q = float(quality)
    threshold = (1 + gamma) / 2
    layers = []
    for l in range(n_layers):
        mn = 0.5 + 0.49 * q - 0.01 * l
        hook = f"blocks.{l}.hook_resid_post"
        layers.append({
            "layer": l,
            "kernel_diagonality": {"mean": mn + 0.005, "min": mn, "margin": mn - threshold, "threshold": threshold,
                                   "M_hat": [[mn, 1 - mn], [1 - mn - 0.01, mn + 0.01]]},
            "td_probe_r2": 0.2 + 0.79 * q,
            "td_probe": {hook: {"r2": 0.2 + 0.79 * q, "r2_shuffled": 0.01 * (l - 1)}},
            "td_probe_hook": hook,
            "value_error": 0.9 * (1.05 - q) * 0.6 ** l,
            "reference_value_error": 0.9 * 0.6 ** l,
        })
    norms_p = {"transition": {"transition": 0.1 * (1 - q), "parameter": 2.0},
               "parameter": {"transition": 0.05 * (1 - q), "parameter": 0.3 * (1 - q)}}
    return {
        "schema": SCHEMA,
        "family": family,
        "source": "/the/input/path",
        "origin": {"kind": source},
        "weights": {
            "block_sparsity": {
                "in_support_energy": 0.4 + 0.6 * q,
                "lazy_drift": 0.0 if family == "sarsa" else None,
                "block_norms": {"P": norms_p},
            },
            "manifold": {"scale": -2.5 + q, "rel_err": {"P12": 1.0 - q, "V21": 0.5 * (1.0 - q)},
                         "gauge_cosine": 0.3 + 0.7 * q},
            "sign_pattern": "+,+,-" if q > 0.5 else "+,-,-",
        },
        "activations": {"layers": layers} if with_acts else None,
    }


def write_checkpoint(path: Path, analysis: dict | None, config: dict, weights: bytes = b"weights") -> Path:
    """A checkpoint-shaped directory; `analysis` is what the stand-in analyzer will return."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(weights)
    if analysis is not None:
        (path / "analysis.json").write_text(json.dumps(analysis))
    return path


def write_run(run_dir: Path, family: str, seed: int, steps: list[int], run_id: str | None = None) -> Path:
    """A training run directory with one checkpoint per step, quality rising with the step."""
    run_id = run_id or run_dir.name
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps({"family": family, "seed": seed, "lr": 1e-3}))
    (run_dir / "metrics.jsonl").write_text("")
    for step in steps:
        q = min(1.0, step / max(steps)) * (0.9 + 0.02 * seed)
        config = {"family": family, "seed": seed, "lr": 1e-3, "gamma": 0.9,
                  "origin": {"kind": "trained", "run_id": run_id, "step": step}}
        write_checkpoint(run_dir / "checkpoints" / f"step_{step:06d}", make_analysis(family, "trained", q), config,
                         weights=f"w{seed}-{step}".encode())
    return run_dir


def write_recording(path: Path, analysis: dict | None, family: str = "softmax-td", n_prompts: int = 6,
                    n_states: int = 4, n: int = 12, n_layers: int = 2, gamma: float = 0.9, seed: int = 0,
                    checkpoint_config: dict | None = None, complete: bool = True) -> Path:
    """A small real-format recording (RecordingWriter) with softmax patterns whose kernel is known:
    layer l attends to same-state sources with weight mass sharpening as l grows."""
    rng = np.random.default_rng(seed)
    d = n_states
    lay = softmax_td.layout(d)
    meta = {"family": family, "layout": lay.to_dict(), "probe_spec": {"name": "test"}, "checkpoint_config": checkpoint_config,
            "checkpoint_sha256": "0" * 64, "n_layers": n_layers, "gamma": gamma, "seed": seed,
            "versions": {}, "created": "2026-01-01T00:00:00Z", "task_data": "present"}
    if analysis is not None:
        meta["test_analysis"] = analysis
    w = RecordingWriter(path, meta)
    star = softmax_td.theta_star(d, gamma=gamma)
    w.write_static("theta_star", {"blocks.0.attn.A": star["A"], "blocks.0.attn.V": star["V"]})
    states = rng.integers(0, n_states, size=(n_prompts, n + 1))
    batch = {"prompts/state": states, "prompts/z": rng.standard_normal((n_prompts, n + 1, lay.d_model))}
    same = (states[:, :, None] == states[:, None, :]).astype(float)
    same[:, :, -1] = 0.0  # the query column is never a source
    for l in range(n_layers):
        logits = np.where(same > 0, 2.0 * (l + 1), 0.0)
        logits[:, :, -1] = -np.inf
        pat = np.exp(logits - logits.max(-1, keepdims=True))
        pat /= pat.sum(-1, keepdims=True)
        batch[f"acts/blocks.{l}.attn.hook_pattern"] = pat[:, None].astype(np.float32)
    batch["tasks/P"] = np.tile(np.eye(n_states), (n_prompts, 1, 1))
    w.write_batch(batch)
    if complete:
        w.finish()
        return path
    w.close()
    return w.partial


def analyze(path: str) -> dict:
    """Stand-in analyzer: return the analysis stored in the input, failing like the real one would."""
    log = os.environ.get(LOG_ENV)
    if log:
        with open(log, "a") as f:
            f.write(f"{path}\n")
    p = Path(path)
    if p.is_dir():
        if not (p / "model.safetensors").is_file():
            raise UserError(f"{p}: incomplete checkpoint (no model.safetensors)")
        if not (p / "analysis.json").is_file():
            raise RuntimeError("fake analyzer crashed")
        return json.loads((p / "analysis.json").read_text())
    try:
        f = h5py.File(p, "r")
    except OSError:
        raise UserError(f"{p}: not an HDF5 file (or a corrupt one)") from None
    with f:
        if not bool(f.attrs.get("complete", False)):
            raise UserError(f"{p}: recording is incomplete (complete=false)")
        raw = f.attrs.get("test_analysis")
        if raw is None:
            raise UserError(f"{p}: no analysis")
        return json.loads(raw)
