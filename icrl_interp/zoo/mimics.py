"""The trained part of the known-answer zoo: transformers trained to mimic a teacher (docs/training.md,
"Trained zoo models").

Each entry of `SPECS` names an architecture (a plain PyTorch transformer, or the package's own linear
attention of the linear-td family), the teacher it was trained to mimic (`training.target`), optionally an
*intermediate target* (a linear readout of `blocks.{layer}.hook_resid_post` trained to equal one of the
teacher's internal quantities, so the layer of that computation is known), and its ground truth.

Trained models are shipped in `data/zoo/<name>-s<seed>/` (made by `python -m icrl_interp.zoo.training`):

    model.safetensors    the weights (for the package's architecture with config.json: a checkpoint)
    aux.safetensors      the intermediate readout (entries with an intermediate target only)
    zoo.json             ground truth, seed, versions, config, training, held-out fit, sha256 of each file

`load(name, seed)` checks every file against the sha256 in zoo.json before reading it (safetensors only,
nothing unpickled): a truncated or altered file is a one-line `UserError` naming it.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..core.errors import UserError, one_line
from ..core.resources import zoo_dir
from ..families.linear_td import NAME as LINEAR_TD
from .registry import LINEAR, NONE_FITS, REWARD_REGRESSION, Entry, Truth

META = "zoo.json"
WEIGHTS = "model.safetensors"
AUX = "aux.safetensors"
FORMAT = "icrl_interp.zoo_mimic/1"
MIN_R2 = 0.95
"""A mimic whose held-out R^2 to its teacher is below this is not shipped as a known answer (0.9 until 2026-12-02:
a layer-targeted mimic at R^2 0.913 was no longer the teacher's computation at its layer, docs/zoo.md; training
climbs `training.LADDER` to reach it)."""
TASK = {**LINEAR, "n_layers": 3}
"""The linear-td task every trained entry is trained and judged on (the exact teachers' task, 10-state Boyan
chains; n_layers: the reference steps recorded beside the activations)."""
GAMMA = LINEAR["gamma"]

PLAIN = "plain-transformer"
"""Architecture: `PlainTransformer` (nn.MultiheadAttention blocks), recorded through `PLAIN_ROLES`."""
OWN = "package"
"""Architecture: the package's model of the task's family (linear-td: masked linear attention)."""

PLAIN_ROLES = {"resid_post": "blocks.{layer}", "pattern": "blocks.{layer}.attn#1",
               "attn_out": "blocks.{layer}.attn#0", "readout": ["ln_f", "head"]}
"""[roles] of `PlainTransformer` (docs/byom.md): what `record`, `causal` and `verdict` need."""


@dataclass(frozen=True)
class Intermediate:
    """A known intermediate quantity: a linear readout of `blocks.{layer}.hook_resid_post` at the context columns
    is trained to equal the teacher's error row at the same layer (its TD errors at the parameters after layer
    `layer`, one scalar per context column: for TD(0) what the causal test's probe at that layer reads; for TD(lambda)
    the TD errors at its own iterate, correlated 0.97 with that, tests/zoo/test_mimics.py)."""

    layer: int
    weight: float = 1.0
    """Weight of the auxiliary loss beside the output loss (both divided by their target's variance)."""
    bottleneck: int | None = None
    """Plain architecture: the rank of the linear map `squeeze` between block `layer` and the next, so every later
    layer sees only this many directions of that layer's stream; the readout reads the squeezed code, so the TD
    errors are among what passes. Without it a later layer may compute the output from other directions and
    leave the readout's TD errors unused (a layer that carries delta without being used: the causal test says
    "no" or "inconclusive" there, rightly)."""


@dataclass(frozen=True)
class MimicSpec:
    """One trained zoo entry."""

    name: str
    architecture: str
    """`PLAIN` or `OWN`."""
    teacher: dict
    """What the model is trained to match (`training.teacher_module`): {"algorithm", "n_layers", params} of an
    exact teacher, {"decoy": class name} of `zoo.decoys`, or {"task_data": "query_reward"} (r(s_q))."""
    truth: Truth
    intermediate: Intermediate | None = None
    steps: int = 2400
    lr: float = 3e-3
    batch: int = 128
    sets: tuple[str, ...] = ("full",)


def _td(algorithm: str, gamma: float, **more) -> tuple[dict, dict]:
    """(teacher, truth parameters) of `algorithm` run one step per layer over 3 layers from w = 0 (3 steps)."""
    teacher = {"algorithm": algorithm, "n_layers": 3, "alpha": 1.0, "gamma": gamma, "steps_per_layer": 1, **more}
    return teacher, {"alpha": 1.0, "gamma": gamma, **more, "steps": 3}


def _mimic(name, architecture, algorithm, gamma=GAMMA, layer=None, bottleneck=None, causal=True, **kw) -> MimicSpec:
    """`causal=False`: the intermediate readout marks where delta is carried, but the entry names no layer for the
    causal test (`Truth.target_layer` None): nothing makes the output read it there rather than elsewhere."""
    more = {"lambda": float(algorithm.removeprefix("td_lambda_"))} if algorithm.startswith("td_lambda_") else {}
    teacher, params = _td(algorithm, gamma, **more)
    inter = None if layer is None else Intermediate(layer, bottleneck=bottleneck)
    truth = Truth(algorithm, params, False, layer if causal else None)
    return MimicSpec(name, architecture, teacher, truth, inter, **kw)


BOTTLENECK = 8
"""Rank of the squeeze after a plain layer-targeted mimic's target layer: room for the TD errors and the features
the last step's attention keys on (4), not for the whole prompt column (9)."""


def _decoy(name, architecture, teacher, algorithm, params, layer=0, **kw) -> MimicSpec:
    truth = Truth(algorithm, params, True, layer, (REWARD_REGRESSION, NONE_FITS))
    return MimicSpec(name, architecture, teacher, truth, **kw)


SPECS: dict[str, MimicSpec] = {s.name: s for s in [
    _mimic("mimic_plain_td0_layer1", PLAIN, "td0", layer=1, bottleneck=BOTTLENECK),
    _mimic("mimic_plain_td0_layer0", PLAIN, "td0", layer=0, bottleneck=BOTTLENECK),
    _mimic("mimic_plain_td_lambda0.5_layer1", PLAIN, "td_lambda_0.5", layer=1, bottleneck=BOTTLENECK),
    _mimic("mimic_plain_td_lambda0.5", PLAIN, "td_lambda_0.5"),
    _mimic("mimic_plain_mc", PLAIN, "mc_regression"),  # seed 1 shipped with --steps 3600 (2400: R² 0.891 < MIN_R2)
    _decoy("decoy_trained_plain_immediate_reward", PLAIN, {"task_data": "query_reward"}, "immediate_reward",
           {"gamma": 0.0}),
    _decoy("decoy_trained_plain_last_reward", PLAIN, {"decoy": "LastReward"}, "last_reward", {}, steps=800),
    # the squeezed layer-targeted mimic's control: the same architecture and readout, trained on TD with gamma' 0
    # (reward regression), whose error row at layer 1 the squeeze must pass: the causal test must not say "yes"
    _decoy("decoy_trained_plain_reward_regression_layer1", PLAIN, _td("td0", 0.0)[0], "immediate_reward",
           _td("td0", 0.0)[1], layer=1, intermediate=Intermediate(1, bottleneck=BOTTLENECK), steps=1200),
    _mimic("mimic_lin_td0", OWN, "td0", lr=1e-2, steps=800),
    _mimic("mimic_lin_td0_gamma0.5", OWN, "td0", gamma=0.5, lr=1e-2, steps=800),
    # the package's linear attention has no room beside the prompt column (width 9): every direction of its stream
    # is read by the next layer, so a delta carried at layer 1 is no causal known answer there (docs/zoo.md)
    _mimic("mimic_lin_td0_layer1", OWN, "td0", layer=1, causal=False, lr=1e-2, steps=800),
    _decoy("decoy_trained_lin_immediate_reward", OWN, _td("td0", 0.0)[0], "immediate_reward", _td("td0", 0.0)[1],
           lr=1e-2, steps=800),
]}
"""The trained zoo entries, by name. Mimics run 3 steps (alpha 1) in total; how a trained model spreads them
over its layers is not known, except at an intermediate target's layer (`Truth.target_layer`)."""


# ------------------------------------------------------------------ architectures
class Block(nn.Module):
    """Pre-LN residual block: x + attn(ln1(x)), then + mlp(ln2(.)); its output is the residual stream."""

    def __init__(self, d_model: int, n_heads: int, d_mlp: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_mlp), nn.GELU(), nn.Linear(d_mlp, d_model))

    def forward(self, x):
        h = self.ln1(x)
        # element 1 of the output: the per-head pattern (the `pattern` role)
        a, _ = self.attn(h, h, h, need_weights=True, average_attn_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class PlainTransformer(nn.Module):
    """A small plain PyTorch transformer: z[batch, pos, d_in] -> [batch, 1] (the prediction at the query).

    nn.Linear embedding plus a sinusoidal code of each column's distance from the query (order matters to
    Monte-Carlo returns, TD(lambda) traces and "copy the last reward"; counting from the end keeps the code
    defined on longer contexts), pre-LN blocks, a final LayerNorm and a linear head.

    `bottleneck=(layer, rank)`: the stream after block `layer` (its `resid_post`, what the toolkit records and
    edits) passes to the next block through `squeeze`, a rank-`rank` linear map (down to a code, back up), at
    every column: a narrow residual stream at one point, nothing else changed."""

    FREQS = 8

    def __init__(self, d_in: int, n_layers: int = 3, d_model: int = 24, n_heads: int = 4, d_mlp: int = 48,
                 bottleneck: tuple[int, int] | None = None):
        super().__init__()
        self.embed = nn.Linear(d_in, d_model)
        self.pos = nn.Linear(2 * self.FREQS, d_model, bias=False)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_mlp) for _ in range(n_layers))
        self.ln_f, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, 1)
        self.squeeze_after = None if bottleneck is None else int(bottleneck[0])
        if bottleneck is not None:
            self.squeeze = nn.Sequential(nn.Linear(d_model, int(bottleneck[1])), nn.Linear(int(bottleneck[1]), d_model))

    def position_code(self, pos: int, like: torch.Tensor) -> torch.Tensor:
        back = torch.arange(pos - 1, -1, -1, dtype=like.dtype, device=like.device)  # the query column is 0
        freqs = 2.0 ** -torch.arange(self.FREQS, dtype=like.dtype, device=like.device)
        angle = back[:, None] * freqs[None] * (math.pi / 2)
        return torch.cat([torch.sin(angle), torch.cos(angle)], -1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.embed(z) + self.pos(self.position_code(z.shape[1], z))
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i == self.squeeze_after:
                x = self.squeeze(x)
        return self.head(self.ln_f(x[:, -1]))


class LayoutReadout(nn.Module):
    """The package's model's readout as a module (no parameters): residual vector(s) [..., D] -> the layout's
    output block (linear-td: -reward row). Attached as `unembed`, it is the logit lens the zoo's [roles] name."""

    def __init__(self, layout):
        super().__init__()
        self.layout = layout

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.layout.readout(h[..., None, :])


def task_config():
    """The task every trained entry is trained and judged on (a CheckpointConfig: `.sample(batch, rng)`)."""
    from ..models.construct import task_config as make

    return make(LINEAR_TD, task_options())


def task_options() -> dict:
    return dict(TASK)


def build(spec: MimicSpec, seed: int = 0):
    """A freshly initialised model of `spec`'s architecture, reproducible from `seed`."""
    config = task_config()
    if spec.architecture == OWN:
        from ..models import ModelConfig, build_model

        mc = ModelConfig(family=LINEAR_TD, d=TASK["d"], n_layers=TASK["n_layers"], gamma=GAMMA, tied=False)
        return build_model(mc, seed=seed, gain=0.1)
    inter = spec.intermediate
    squeeze = None if inter is None or inter.bottleneck is None else (inter.layer, inter.bottleneck)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return PlainTransformer(config.model.D, TASK["n_layers"], bottleneck=squeeze)


def predict(model, z):
    """The model's prediction [batch, k] on prompts z (a tensor of the model's dtype)."""
    own = hasattr(model, "readout") and hasattr(model, "config")
    return model.readout(model(z)) if own else model(z)


def resid_module(model, layer: int):
    """The module whose output is the residual stream after `layer` (`blocks.{layer}.hook_resid_post`)."""
    block = model.blocks[layer]
    return getattr(block, "hook_resid_post", block)


class CodeReadout(nn.Module):
    """The intermediate readout of a squeezed model while it trains: a linear map of the squeeze's code (so the
    readout's quantity passes the bottleneck), applied to the stream after the target layer. `as_linear` folds it
    into the shipped nn.Linear(width, 1) of that stream, the same map."""

    def __init__(self, down: nn.Linear):
        super().__init__()
        self.down = down  # the model's own squeeze[0] (shared, not a copy)
        self.head = nn.Linear(down.out_features, 1)

    def forward(self, x):
        return self.head(self.down(x))

    def as_linear(self) -> nn.Linear:
        with torch.no_grad():
            out = nn.Linear(self.down.in_features, 1).to(self.head.weight.dtype)
            out.weight.copy_(self.head.weight @ self.down.weight)
            out.bias.copy_(self.head.weight @ self.down.bias + self.head.bias)
        return out


def roles(spec: MimicSpec) -> dict | None:
    """[roles] of the entry's architecture (None: the registry's `ZOO_ROLES`, which fit the package's model with
    its `unembed`)."""
    return dict(PLAIN_ROLES) if spec.architecture == PLAIN else None


# ------------------------------------------------------------------ shipped files
def folder_name(name: str, seed: int) -> str:
    return f"{name}-s{seed}"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_meta(folder: Path) -> dict:
    """zoo.json of a shipped entry, checked: format, and every listed file present with its recorded sha256."""
    path = Path(folder) / META
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{folder} is not a trained zoo entry (no {META})") from None
    except (OSError, ValueError, RecursionError) as e:
        raise UserError(f"{path} is not readable JSON ({one_line(e)})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("files"), dict):
        raise UserError(f"{path} is not a trained zoo entry's metadata (format {FORMAT!r} expected)")
    for name, record in meta["files"].items():
        if not isinstance(record, dict) or "/" in name or name.startswith("."):
            raise UserError(f"{path} lists a file {name!r} that is not a file record of this folder")
        file = Path(folder) / name
        if not file.is_file():
            raise UserError(f"trained zoo entry {folder} is missing {name}")
        size = file.stat().st_size
        if size != record.get("bytes") or sha256(file) != record.get("sha256"):
            raise UserError(f"trained zoo entry file {file} is corrupt: {size} bytes whose sha256 differs from the "
                            f"{record.get('bytes')} bytes recorded in {META}; retrain it "
                            f"(python -m icrl_interp.zoo.training --only {meta.get('name')})")
    return meta


def load(name: str, seed: int = 0, root=None):
    """(model, aux readout or None, metadata) of a shipped entry, every file checked against its sha256.

    The aux readout is an nn.Linear(width, 1) applied to `blocks.{layer}.hook_resid_post` at context columns."""
    from safetensors.torch import load_file

    if name not in SPECS:
        raise UserError(f"unknown trained zoo entry {name!r} (known: {', '.join(SPECS)})")
    spec = SPECS[name]
    folder = Path(root or zoo_dir()) / folder_name(name, seed)
    meta = read_meta(folder)
    unlisted = [f for f in [WEIGHTS] + ([AUX] if spec.intermediate is not None else []) if f not in meta["files"]]
    if unlisted:  # an unlisted file would be read unchecked
        raise UserError(f"{folder / META} does not list {', '.join(unlisted)} with its sha256")
    model = build(spec, seed)
    model.load_state_dict(load_file(str(folder / WEIGHTS)), strict=True)
    model.eval()
    aux = None
    if spec.intermediate is not None:
        state = load_file(str(folder / AUX))
        aux = torch.nn.Linear(state["weight"].shape[1], 1)
        aux.load_state_dict(state, strict=True)
    return model, aux, meta


def shipped(seed: int = 0, root=None) -> list[str]:
    """Names of the entries shipped for `seed` (their folder exists)."""
    base = Path(root or zoo_dir())
    return [name for name in SPECS if (base / folder_name(name, seed) / META).is_file()]


def builder(name: str, seed: int, root=None):
    """The registry's builder of a trained entry: the shipped model trained with `seed`, its files checked. The
    package's model gets `unembed` (its readout as a module), so the registry's `ZOO_ROLES` fit it; a plain model's
    roles are the entry's `roles` (`PLAIN_ROLES`)."""

    def build(entry: Entry, config):
        model, _, _ = load(name, seed, root)
        if SPECS[name].architecture == OWN:
            model.unembed = LayoutReadout(model.layout)  # ZOO_ROLES' readout; no parameters, the weights unchanged
        return model

    return build


def entries(zoo_seed: int = 0, root=None) -> list[Entry]:
    """The registry's provider hook (`registry.PROVIDERS`): the trained entries shipped for `zoo_seed` (their
    training seed) whose held-out R^2 to their teacher is at least MIN_R2; none for a seed not shipped."""
    base = Path(root or zoo_dir())
    out = []
    for name in shipped(zoo_seed, base):
        spec = SPECS[name]
        meta = read_meta(base / folder_name(name, zoo_seed))
        if meta["fit"]["held_out_r2"] < MIN_R2:
            continue
        kind = "decoy" if spec.truth.decoy else "trained"
        arch = "plain PyTorch transformer" if spec.architecture == PLAIN else "linear attention (the package's)"
        out.append(Entry(name, kind, "td0", spec.truth, builder(name, zoo_seed, root), task_options(), spec.sets,
                         seed=int(zoo_seed), roles=roles(spec),
                         description=f"trained {arch} mimicking {_teacher_text(spec.teacher)}, held-out R² "
                                     f"{meta['fit']['held_out_r2']:.3f}"))
    return out


def _teacher_text(teacher: dict) -> str:
    if "algorithm" in teacher:
        return ", ".join(f"{k} {v}" for k, v in teacher.items())
    return next(iter(teacher.values()))
