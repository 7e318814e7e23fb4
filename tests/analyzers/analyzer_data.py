"""Schema-conforming inputs for the analyzer tests: theta*-exact recordings and checkpoints.

The activations come from small numpy forwards of each family's layer
(constructions.md), checked against the reference algorithms in
test_analyzer_fixtures.py, so the analyzers can be tested without torch. The
files are written with the project's own `RecordingWriter`.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from icrl_interp import layouts, sampling, theta_star
from icrl_interp.recording import RecordingWriter

CONFIGS = {
    "linear-td": {"family": "linear-td", "d": 3, "n_layers": 4, "gamma": 0.9, "alpha": 0.5, "tied": True,
                  "task": {"kind": "boyan", "n": 24, "n_states": 6, "features": "random", "rewards": "representable"}},
    "softmax-td": {"family": "softmax-td", "d": 5, "n_layers": 6, "gamma": 0.9, "alpha": 1.0, "tied": True,
                   "form": "tsm", "origin": {"kind": "theta_star", "score_scale": 8.0},
                   "task": {"kind": "boyan", "n": 30, "n_states": 5, "features": "onehot", "beta": 1.0}},
    "sarsa": {"family": "sarsa", "d": 6, "n_layers": 1, "gamma": 0.5, "alpha": 1.0, "tied": True,
              "task": {"kind": "mdp", "n": 20, "n_states": 3, "n_actions": 2}},
}


def config_for(family: str, **over) -> dict:
    cfg = json.loads(json.dumps(CONFIGS[family]))
    cfg.update(over)
    return cfg


def layout_of(cfg: dict) -> layouts.PromptLayout:
    return layouts.layout_for(cfg["family"], cfg["d"])


def theta_params(cfg: dict, c: float = 1.0) -> dict[str, np.ndarray]:
    """theta* under checkpoint names (tied: blocks.0 only)."""
    fam, d, alpha = cfg["family"], cfg["d"], cfg["alpha"]
    if fam == "linear-td":
        m = theta_star.linear_td(d, alpha)
        return {"blocks.0.attn.P": c * m["P"], "blocks.0.attn.Q": m["Q"] / c}
    if fam == "softmax-td":
        m = theta_star.softmax_td(d, alpha, cfg["gamma"], cfg.get("origin", {}).get("score_scale", 1.0))
        return {"blocks.0.attn.A": m["A"], "blocks.0.attn.V": m["V"]}
    m = theta_star.sarsa(d, alpha, c)
    return {"blocks.0.attn.P": m["P"], "blocks.0.attn.V": m["V"]}


# --------------------------------------------------------------- forwards
def wang_forward(z, P, Q, n_layers):
    """Linear TD layers; returns per layer (masked scores [B,1,q,k], values [B,pos,1,D], resid_post)."""
    n = z.shape[1] - 1
    out = []
    for _ in range(n_layers):
        scores = np.einsum("bid,de,bje->bji", z, Q, z)
        scores[:, :, n] = 0.0  # the query column is never a source
        v = z @ P.T
        z = z + np.einsum("bji,bid->bjd", scores, v) / n
        out.append((scores[:, None], v[:, :, None], z))
    return out


def softmax_forward(z, A, V, gamma, lay, n_layers):
    """Single head + TSM; returns per layer (pattern [B,1,q,k], values, resid_post)."""
    n = z.shape[1] - 1
    tgt, cur = lay.slice("target_mem").start, lay.slice("current_mem").start
    out = []
    for _ in range(n_layers):
        scores = np.einsum("bid,de,bje->bji", z, A, z)
        scores[:, :, n] = -np.inf
        scores -= scores.max(-1, keepdims=True)
        pat = np.exp(scores)
        pat /= pat.sum(-1, keepdims=True)
        v = z @ V.T
        zh = z + np.einsum("bji,bid->bjd", pat, v)
        z = zh.copy()
        z[:, :, tgt] = 0.0
        z[:, :-1, tgt] = gamma * zh[:, 1:, cur]
        out.append((pat[:, None], v[:, :, None], z))
    return out


def lsa_forward(z, P, V):
    n = z.shape[1] - 1
    scores = np.einsum("bid,de,bje->bji", z, P, z)
    v = z @ V.T
    z = z + np.einsum("bji,bid->bjd", scores, v) / n
    return [(scores[:, None], v[:, :, None], z)]


def forward(cfg: dict, z: np.ndarray, params: dict[str, np.ndarray]):
    lay = layout_of(cfg)
    fam, L = cfg["family"], cfg["n_layers"]
    p = {k.rsplit(".", 1)[-1]: v for k, v in params.items()}
    if fam == "linear-td":
        return wang_forward(z, p["P"], p["Q"], L)
    if fam == "softmax-td":
        return softmax_forward(z, p["A"], p["V"], cfg["gamma"], lay, L)
    return lsa_forward(z, p["P"], p["V"])


SCORE_HOOK = {"linear-td": "attn.hook_pattern", "softmax-td": "attn.hook_pattern", "sarsa": "attn.hook_attn_scores"}


# ------------------------------------------------------------- recordings
def write_recording(path, family: str, n_prompts: int = 96, batch: int = 32, seed: int = 0, cfg: dict | None = None,
                    params: dict | None = None, theta: dict | None = None, finish: bool = True,
                    hooks: tuple[str, ...] = ("score", "v", "resid_post"), positions: str = ":",
                    act_dtype=np.float64, bf16: bool = False, drop: tuple[str, ...] = (), transform=None) -> Path:
    """A recording of a (theta* by default) model of `family`, schema icrl_interp.recording/1.

    `transform(batch_dict)` may edit a batch before it is written (labels, tasks...).
    """
    cfg = cfg or config_for(family)
    lay = layout_of(cfg)
    params = theta_params(cfg) if params is None else params
    theta = theta_params(cfg) if theta is None else theta
    meta = {"family": family, "layout": lay.to_dict(), "probe_spec": "{}", "checkpoint_config": cfg,
            "checkpoint_sha256": "0" * 64, "n_layers": cfg["n_layers"], "gamma": cfg["gamma"], "seed": seed,
            "versions": {}, "created": "2026-01-01T00:00:00+00:00", "task_data": "present"}
    w = RecordingWriter(path, meta)
    w.write_static("params", params)
    w.write_static("theta_star", theta)
    sl = slice(*(int(x) if x else None for x in positions.split(":"))) if positions != ":" else slice(None)
    for i, lo in enumerate(range(0, n_prompts, batch)):
        pb = sampling.sample_batch(cfg, min(batch, n_prompts - lo), np.random.default_rng([seed, i]))
        z = pb.prompt.z
        data = {"prompts/z": z, "prompts/state": pb.prompt.states, "prompts/action": pb.prompt.actions,
                "prompts/reward": pb.prompt.rewards}
        data.update({f"tasks/{k}": v for k, v in pb.tasks.items()})
        data.update({f"reference/{k}": v for k, v in pb.reference.items()})
        attrs = {}
        for l, (scores, v, resid) in enumerate(forward(cfg, z, params)):
            acts = {"score": (f"blocks.{l}.{SCORE_HOOK[family]}", scores[:, :, sl]),
                    "v": (f"blocks.{l}.attn.hook_v", v[:, sl]), "resid_post": (f"blocks.{l}.hook_resid_post", resid[:, sl])}
            for key in hooks:
                name, arr = acts[key]
                if name in drop:
                    continue
                if bf16:
                    import torch

                    arr = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)).bfloat16().view(torch.int16).numpy()
                    attrs[f"acts/{name}"] = {"dtype": "bfloat16", "positions": positions}
                else:
                    arr = arr.astype(act_dtype)
                    attrs[f"acts/{name}"] = {"dtype": np.dtype(act_dtype).name, "positions": positions}
                data[f"acts/{name}"] = arr
        if transform is not None:
            transform(data)
        w.write_batch(data, attrs)
    if not finish:
        w.close()
        return Path(str(path) + ".partial")
    return w.finish()


def write_checkpoint(directory, cfg: dict, params: dict[str, np.ndarray]) -> Path:
    """A checkpoint directory written by the project's checkpoint writer (safetensors + JSON)."""
    from icrl_interp import checkpoint

    extras = {k: cfg[k] for k in ("family", "d", "n_layers", "gamma", "alpha", "tied")}
    if cfg["family"] == "softmax-td":
        extras["form"] = cfg.get("form", "tsm")
    extras.update({"dtype": "float64", "task": cfg.get("task"), "origin": cfg.get("origin") or {"kind": "theta_star"},
                   "seed": 0, "n": (cfg.get("task") or {}).get("n")})
    state = {k: np.ascontiguousarray(v, dtype=np.float64) for k, v in params.items()}
    return checkpoint.save(state, extras, directory)
