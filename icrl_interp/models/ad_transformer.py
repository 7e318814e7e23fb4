"""A small causal softmax transformer over episode tokens (`episode_tokens`): Algorithm Distillation's
model (Laskin et al. 2022), and the DPT model on the `dpt` format.

tokens [batch, pos, d_token] -> `hook_embed` (linear embedding) + `hook_pos_embed` (learned positions;
none for `dpt`, whose context is a set) -> L pre-LN blocks (causal multi-head softmax attention, then a
GELU MLP) -> final LayerNorm -> action logits [batch, pos, A] (and, with `value_head`, values [batch, pos]).
Hook points carry TransformerLens' names and shapes (`hooks.HookedRootModule`): `hook_embed`,
`hook_pos_embed`, `blocks.{l}.hook_resid_pre`, `blocks.{l}.attn.hook_q/k/v/z` [batch, pos, head, d_head],
`blocks.{l}.attn.hook_attn_scores/hook_pattern` [batch, head, pos_q, pos_k], `blocks.{l}.hook_attn_out`,
`blocks.{l}.hook_resid_mid`, `blocks.{l}.mlp.hook_pre/hook_post` [batch, pos, d_mlp],
`blocks.{l}.hook_mlp_out`, `blocks.{l}.hook_resid_post`, `ln_final.hook_normalized`.

Saved as a directory with `model.safetensors` and `config.json` (schema `icrl_interp.ad_model/1`: the
`ADConfig`, the token format, and what the caller adds: training, measured numbers); nothing pickled.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import Tensor, nn

from ..core.errors import UserError
from ..core.files import atomic_dir
from .episode_tokens import TokenFormat
from .hooks import HookedRootModule, HookPoint

SCHEMA = "icrl_interp.ad_model/1"
WEIGHTS, CONFIG = "model.safetensors", "config.json"


@dataclass(frozen=True)
class ADConfig:
    """The architecture (the token format it reads is `token_format`)."""

    token_format: dict
    """`TokenFormat.to_dict()`: what the model reads."""
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_mlp: int = 256
    value_head: bool = False

    def __post_init__(self):
        fmt = TokenFormat.from_dict(self.token_format)
        for name in ("d_model", "n_layers", "n_heads", "d_mlp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UserError(f"AD model {name} must be a positive integer, got {v!r}")
        if self.d_model % self.n_heads:
            raise UserError(f"AD model d_model = {self.d_model} is not a multiple of n_heads = {self.n_heads}")
        object.__setattr__(self, "token_format", fmt.to_dict())

    @property
    def format(self) -> TokenFormat:
        return TokenFormat.from_dict(self.token_format)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ADConfig":
        names = {f.name for f in fields(cls)}
        if not isinstance(d, dict) or "token_format" not in d or set(d) - names:
            raise UserError(f"not an AD model config (fields {sorted(names)}): {d!r}")
        return cls(**d)


class Attention(nn.Module):
    def __init__(self, cfg: ADConfig):
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.W_QKV = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.W_O = nn.Linear(cfg.d_model, cfg.d_model)
        for name in ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z"):
            setattr(self, name, HookPoint())

    def forward(self, x: Tensor) -> Tensor:
        b, p, _ = x.shape
        q, k, v = self.W_QKV(x).view(b, p, 3, self.n_heads, self.d_head).unbind(2)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.d_head)
        causal = torch.ones(p, p, dtype=torch.bool, device=x.device).triu(1)
        scores = self.hook_attn_scores(scores.masked_fill(causal, float("-inf")))
        pattern = self.hook_pattern(torch.softmax(scores, dim=-1))
        z = self.hook_z(torch.einsum("bhqk,bkhd->bqhd", pattern, v))
        return self.W_O(z.reshape(b, p, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ADConfig):
        super().__init__()
        self.W_in, self.W_out = nn.Linear(cfg.d_model, cfg.d_mlp), nn.Linear(cfg.d_mlp, cfg.d_model)
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        return self.W_out(self.hook_post(nn.functional.gelu(self.hook_pre(self.W_in(x)))))


class Block(nn.Module):
    def __init__(self, cfg: ADConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn, self.mlp = Attention(cfg), MLP(cfg)
        for name in ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post"):
            setattr(self, name, HookPoint())

    def forward(self, x: Tensor) -> Tensor:
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.attn(self.ln1(x))))
        return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.ln2(x))))


class FinalNorm(nn.LayerNorm):
    def __init__(self, d: int):
        super().__init__(d)
        self.hook_normalized = HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        return self.hook_normalized(super().forward(x))


class ADTransformer(HookedRootModule):
    """forward(tokens [batch, pos, d_token]) -> action logits [batch, pos, A]; with `return_values` (and a
    value head) (logits, values [batch, pos])."""

    def __init__(self, cfg: ADConfig):
        super().__init__()
        self.config, fmt = cfg, cfg.format
        self.token_format = fmt
        self.embed = nn.Linear(fmt.d_token, cfg.d_model)
        self.pos_embed = nn.Parameter(torch.zeros(fmt.positions, cfg.d_model)) if fmt.name != "dpt" else None
        if self.pos_embed is not None:
            nn.init.normal_(self.pos_embed, std=0.02)
        self.hook_embed, self.hook_pos_embed = HookPoint(), HookPoint()
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = FinalNorm(cfg.d_model)
        self.action_head = nn.Linear(cfg.d_model, fmt.n_actions)
        self.value_head = nn.Linear(cfg.d_model, 1) if cfg.value_head else None
        self.origin: dict = {"kind": "untrained"}
        self.setup()

    @property
    def n_layers(self) -> int:
        return self.config.n_layers

    def forward(self, tokens: Tensor, return_values: bool = False):
        fmt = self.token_format
        if tokens.ndim != 3 or tokens.shape[-1] != fmt.d_token or tokens.shape[1] > fmt.positions:
            raise UserError(f"the AD model reads tokens [batch, pos <= {fmt.positions}, {fmt.d_token}] "
                            f"({fmt.name}), got shape {tuple(tokens.shape)}")
        x = self.hook_embed(self.embed(tokens.to(self.embed.weight.dtype)))
        if self.pos_embed is not None:
            x = x + self.hook_pos_embed(self.pos_embed[: tokens.shape[1]][None].expand_as(x))
        for block in self.blocks:
            x = block(x)
        x = self.ln_final(x)
        logits = self.action_head(x)
        if not return_values:
            return logits
        if self.value_head is None:
            raise UserError("this AD model has no value head")
        return logits, self.value_head(x)[..., 0]


# ------------------------------------------------------------------ files
def save(model: ADTransformer, out_dir, extras: dict | None = None) -> Path:
    """`out_dir/{model.safetensors, config.json}` atomically; `extras` (JSON) join config.json."""
    from safetensors.torch import save_file

    from ..core.files import json_clean

    config = {"schema": SCHEMA, "model": model.config.to_dict(), "origin": model.origin, **(extras or {})}
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    with atomic_dir(out_dir) as tmp:
        save_file(state, str(tmp / WEIGHTS), metadata={"format": SCHEMA})
        config["weights_sha256"] = _file_sha256(tmp / WEIGHTS)  # `load` compares it
        (tmp / CONFIG).write_text(json.dumps(json_clean(config), indent=1, allow_nan=False) + "\n")
    return Path(out_dir)


def _file_sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_config(path) -> dict:
    """config.json of a saved AD model, checked for the schema."""
    file = Path(path) / CONFIG
    if not file.is_file():
        raise UserError(f"{path} is not an AD model directory (no {CONFIG})")
    try:
        config = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise UserError(f"{file} is not valid JSON ({type(e).__name__})") from None
    if not isinstance(config, dict) or config.get("schema") != SCHEMA:
        raise UserError(f"{file}: not an AD model config (schema {config.get('schema') if isinstance(config, dict) else None!r}, "
                        f"expected {SCHEMA!r})")
    return config


def load(path) -> ADTransformer:
    """The AD model saved in `path` (strict: every tensor present with its shape; no pickle)."""
    from .checkpoint import _check_safetensors
    from .user import check_parameters, load_weights

    config = read_config(path)
    model = ADTransformer(ADConfig.from_dict(config["model"]))
    _check_safetensors(Path(path) / WEIGHTS)  # framing first, as for the package's checkpoints
    if config.get("weights_sha256") not in (None, _file_sha256(Path(path) / WEIGHTS)):
        raise UserError(f"{Path(path) / WEIGHTS} is not the file its config.json was saved with (SHA-256 differs)")
    load_weights(model, Path(path) / WEIGHTS)
    check_parameters(model, str(path))
    model.origin = config.get("origin", {"kind": "unknown"})
    model.saved_config = config
    return model


def shipped() -> ADTransformer:
    """The AD model shipped in `data/ad/` (trained by `icrl_interp.train.ad`; its config.json holds the
    training config, seed and measured numbers): `record --model icrl_interp.models.ad_transformer:shipped`."""
    from ..core.resources import ad_dir

    return load(ad_dir())
