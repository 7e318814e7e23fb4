"""Read an episode recording (`recording/episodes.py`, `record --episodes`): its histories back as `Episodes`, the
step-aligned residual stream of every recorded layer (and of the random-init copy under `baseline/`), and the
model's action probabilities. What `analyze REC.h5` probes (`episode_probes.probe_episodes`).

An episode recording is a schema-2 recording whose rows are histories (root attribute `rows` = "histories").
The activations stay h5py datasets: the probes read them a block of histories at a time.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from ..core.errors import UserError
from ..recording.format import Recording
from ..tasks.episodes import ARRAYS, Episodes

ROWS = "histories"
RESID = re.compile(r"^blocks\.(\d+)\.hook_resid_post$")
"""The recorded residual stream of layer l (the package's name; a user model's roles map to it)."""


def is_episode_recording(path) -> bool:
    """Whether `path` is an HDF5 file written by `record --episodes` (a cheap look at one root attribute)."""
    p = Path(path)
    if not p.is_file() or p.suffix.lower() not in (".h5", ".hdf5"):
        return False
    try:
        with h5py.File(p, "r") as f:
            rows = f.attrs.get("rows")
    except (OSError, ValueError):
        return False  # not HDF5, or torn: the family path says what is wrong with it
    return (rows.decode() if isinstance(rows, bytes) else rows) == ROWS


@dataclass
class EpisodeRecording:
    """An open episode recording; `close()` (or use as a context manager) when done with `layers`."""

    rec: Recording
    episodes: Episodes
    layers: dict
    """{layer: h5py dataset [H, T, d]} of `blocks.{layer}.hook_resid_post`, by layer."""
    random_layers: dict | None
    """The same for the random-init copy (`baseline/`), or None when it was not recorded."""
    logits: np.ndarray
    """[H, T, A] float64 action logits, NaN on padding."""

    def action_probs(self) -> np.ndarray:
        return action_probs(self.logits, self.episodes.valid)

    def close(self) -> None:
        self.rec.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def action_probs(logits: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """[H, T, A] float64 softmax of a model's action logits [H, T, A] on the valid steps (uniform on padding, where
    the logits are NaN and nothing reads them): what the behavioural fit explains (`fit_behaviour(action_probs=)`)."""
    z = np.where(np.asarray(valid, bool)[..., None], np.asarray(logits, np.float64), 0.0)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layers(f, group: str) -> dict:
    acts = f[group] if group in f else {}
    found = {int(m.group(1)): acts[k] for k in acts if (m := RESID.match(k))}
    return {k: found[k] for k in sorted(found)}


def open_episode_recording(path) -> EpisodeRecording:
    """Open an episode recording (checked whole by `Recording`) and read its histories back."""
    rec = Recording(path)
    try:
        if rec.attr("rows") != ROWS:
            raise UserError(f"{path}: not an episode recording (written by `record --episodes`)")
        missing = [n for n in ARRAYS if not rec.has(f"episodes/{n}")]
        if missing:
            raise UserError(f"{path}: the recording lacks episodes/{missing[0]} (recorded by an older version): "
                            "record it again")
        fmt = rec.attr("token_format") or {}
        arrays = {n: rec.array(f"episodes/{n}") for n in ARRAYS}
        discrete = arrays["observations"].ndim == 2
        episodes = Episodes(**arrays, n_actions=int(fmt.get("n_actions", 0)),
                            n_observations=int(fmt.get("obs_width", 0)) if discrete else None,
                            meta=rec.attr("episodes_meta") or {})
        layers = _layers(rec.f, "acts")
        if not layers:
            raise UserError(f"{path}: no residual stream recorded (acts/blocks.L.hook_resid_post): nothing to probe")
        base = _layers(rec.f, "baseline/acts") or None
        logits = np.asarray(rec.array("outputs/logits"), np.float64)
        return EpisodeRecording(rec, episodes, layers, base, logits)
    except BaseException:
        rec.close()
        raise
