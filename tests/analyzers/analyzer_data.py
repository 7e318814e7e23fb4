"""Schema-conforming inputs for the analyzer tests: theta*-exact recordings and checkpoints.

The activations come from small numpy forwards of each family's layer (docs/concepts.md),
checked against the reference algorithms in test_analyzer_data.py, so the analyzers can be
tested without torch. Prompts, task data and the reference come from the family registry's
sampler; the files are written with the project's own `RecordingWriter` (schema 2) and
checkpoint writer (format 2).
"""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from icrl_interp.tasks import layouts
from icrl_interp.families import registry
from icrl_interp.models.config import CheckpointConfig, ModelConfig
from icrl_interp.recording.format import RecordingWriter
from icrl_interp.tasks.sampling import TaskSpec

CONFIGS = {
    "linear-td": {"model": {"family": "linear-td", "d": 3, "n_layers": 4, "gamma": 0.9, "alpha": 0.5, "tied": True,
                            "dtype": "float64"},
                  "task": {"kind": "boyan", "n": 24, "n_states": 6, "features": "random", "rewards": "representable"},
                  "origin": {"kind": "theta_star"}},
    "softmax-td": {"model": {"family": "softmax-td", "d": 5, "n_layers": 6, "gamma": 0.9, "alpha": 1.0, "tied": True,
                             "form": "tsm", "dtype": "float64"},
                   "task": {"kind": "boyan", "n": 30, "n_states": 5, "features": "onehot", "beta": 1.0},
                   "origin": {"kind": "theta_star", "score_scale": 8.0}},
    "sarsa": {"model": {"family": "sarsa", "d": 6, "n_layers": 1, "gamma": 0.5, "alpha": 1.0, "tied": True,
                        "dtype": "float64"},
              "task": {"kind": "mdp", "n": 20, "n_states": 3, "n_actions": 2},
              "origin": {"kind": "theta_star"}},
}


def config_for(family: str, task: dict | None = None, origin: dict | None = None, **model) -> CheckpointConfig:
    """The test config of a family; keyword arguments override model fields (d, n_layers, ...)."""
    spec = copy.deepcopy(CONFIGS[family])
    spec["model"].update(model)
    spec["task"].update(task or {})
    return CheckpointConfig(model=ModelConfig(**spec["model"]),
                            task=TaskSpec.from_dict({"family": family, **spec["task"]}),
                            origin=origin or spec["origin"])


def layout_of(cfg: CheckpointConfig) -> layouts.PromptLayout:
    return cfg.model.layout


def theta_params(cfg: CheckpointConfig, c: float = 1.0) -> dict[str, np.ndarray]:
    """theta* under checkpoint names (tied: blocks.0 only), moved along the gauge by c (BlockFit families)."""
    theta = cfg.theta_star()
    if c != 1.0:
        fit = registry.get(cfg.family).hints.weight_fit
        for name in theta:
            if name.endswith("." + fit.x[0]):
                theta[name] = c * theta[name]
            elif name.endswith("." + fit.y[0]):
                theta[name] = theta[name] / c
    return theta


def sample(cfg: CheckpointConfig, batch: int, rng):
    """A registry-sampled prompt batch of the config's task."""
    return registry.get(cfg.task.family).sample(cfg, cfg.task, batch, np.random.default_rng(rng))


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


def forward(cfg: CheckpointConfig, z: np.ndarray, params: dict[str, np.ndarray]):
    lay = layout_of(cfg)
    fam, L = cfg.family, cfg.model.n_layers
    p = {k.rsplit(".", 1)[-1]: v for k, v in params.items()}
    if fam == "linear-td":
        return wang_forward(z, p["P"], p["Q"], L)
    if fam == "softmax-td":
        return softmax_forward(z, p["A"], p["V"], cfg.model.gamma, lay, L)
    return lsa_forward(z, p["P"], p["V"])


SCORE_HOOK = {"linear-td": "attn.hook_pattern", "softmax-td": "attn.hook_pattern", "sarsa": "attn.hook_attn_scores"}


# ------------------------------------------------------------- recordings
def write_recording(path, family: str, n_prompts: int = 96, batch: int = 32, seed: int = 0,
                    cfg: CheckpointConfig | None = None, params: dict | None = None, theta: dict | None = None,
                    finish: bool = True, hooks: tuple[str, ...] = ("score", "v", "resid_post"), positions: str = ":",
                    act_dtype=np.float64, bf16: bool = False, drop: tuple[str, ...] = (), transform=None,
                    model: dict | None = None, task_family: str | None = None, score_hook: str | None = None) -> Path:
    """A recording of a (theta* by default) model of `family`, schema icrl_interp.recording/2.

    `transform(batch_dict)` may edit a batch before it is written (labels, tasks...). `model`
    replaces the recorded model info (default: the family's model), `task_family` the recorded
    task family (default: the config's), `score_hook` the name of the score / pattern hook.
    """
    cfg = cfg or config_for(family)
    lay = layout_of(cfg)
    params = theta_params(cfg) if params is None else params
    theta = theta_params(cfg) if theta is None else theta
    model = model or {"family": cfg.family, "architecture": cfg.model.architecture, "class": "numpy-forward"}
    meta = {"task_family": cfg.task.family if task_family is None else task_family, "model": model,
            "layout": lay.to_dict(), "probe_spec": "{}", "checkpoint_config": cfg.to_dict(),
            "checkpoint_sha256": "0" * 64, "n_layers": cfg.model.n_layers, "gamma": cfg.model.gamma, "seed": seed,
            "versions": {}, "created": "2026-01-01T00:00:00+00:00", "task_data": "present"}
    w = RecordingWriter(path, meta)
    w.write_static("params", params)
    w.write_static("theta_star", theta)
    sl = slice(*(int(x) if x else None for x in positions.split(":"))) if positions != ":" else slice(None)
    for i, lo in enumerate(range(0, n_prompts, batch)):
        pb = sample(cfg, min(batch, n_prompts - lo), [seed, i])
        z = pb.prompt.z
        data = {"prompts/z": z, "prompts/state": pb.prompt.states, "prompts/action": pb.prompt.actions,
                "prompts/reward": pb.prompt.rewards}
        data.update({f"tasks/{k}": v for k, v in pb.tasks.items()})
        data.update({f"reference/{k}": v for k, v in pb.reference.items()})
        attrs = {}
        for l, (scores, v, resid) in enumerate(forward(cfg, z, params)):
            acts = {"score": (f"blocks.{l}.{score_hook or SCORE_HOOK[family]}", scores[:, :, sl]),
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


def write_checkpoint(directory, cfg: CheckpointConfig, params: dict[str, np.ndarray]) -> Path:
    """A checkpoint directory written by the project's checkpoint writer (safetensors + JSON)."""
    from icrl_interp.models import checkpoint

    state = {k: np.ascontiguousarray(v, dtype=np.float64) for k, v in params.items()}
    return checkpoint.save(state, cfg, directory)
