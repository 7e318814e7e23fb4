"""A plain PyTorch transformer (nn.MultiheadAttention blocks) that predicts the value of the query state.

    icrl-interp record --model examples/torch_model.py:make --weights torch_model.safetensors \
        --task linear-td --d 4 --n 30 --n-layers 3 --probe examples/torch_model.toml --out torch.h5

The module takes the task's prompts z[batch, pos, 9] (linear-td with d = 4: phi, gamma*phi', r per
transition, the query state's phi in the last position), embeds them with its own nn.Linear, runs
two pre-LayerNorm residual blocks (attention + MLP) and reads the last position out through a final
LayerNorm and a linear head: forward(z) -> [batch, 1], the predicted v_pi(s_q).

Its modules, which `torch_model.toml` maps onto the analyzers' roles:

    embed                 nn.Linear(9, 32)         the residual stream before block 0
    blocks.{l}            Block                    output = the residual stream after block l
    blocks.{l}.attn       nn.MultiheadAttention    returns (output, weights [batch, heads, q, k])
    ln_f, head            nn.LayerNorm, nn.Linear  the readout: residual stream -> value

No attention mask: every position sees the whole context (the query reads all transitions).
"""
from __future__ import annotations

import torch
from torch import nn

D_IN = 9        # linear-td prompt width for d = 4: 2d + 1
D_MODEL = 32
N_HEADS = 4
N_LAYERS = 2
D_MLP = 128


class Block(nn.Module):
    """Pre-LN residual block: x + attn(ln1(x)), then + mlp(ln2(.)). Its output is the residual stream."""

    def __init__(self, d_model: int = D_MODEL, n_heads: int = N_HEADS, d_mlp: int = D_MLP):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_mlp), nn.GELU(), nn.Linear(d_mlp, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        # need_weights + average_attn_weights=False: element 1 of the output is the per-head pattern
        a, _ = self.attn(h, h, h, need_weights=True, average_attn_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class ValueTransformer(nn.Module):
    """z[batch, pos, 9] -> predicted value of the query state [batch, 1]."""

    def __init__(self, d_in: int = D_IN, d_model: int = D_MODEL, n_layers: int = N_LAYERS):
        super().__init__()
        self.embed = nn.Linear(d_in, d_model)
        self.blocks = nn.ModuleList(Block(d_model) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.embed(z)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x[:, -1]))


def make() -> ValueTransformer:
    """The untrained model (what `--model examples/torch_model.py:make` calls)."""
    return ValueTransformer()


def train(steps: int = 1200, seed: int = 0, out="torch_model.safetensors", **options) -> dict:
    """Train on fresh linear-td tasks toward v_pi(s_q) and save the weights (safetensors); prints the
    held-out value error before and after (train_example.fit)."""
    import sys
    from pathlib import Path

    here = str(Path(__file__).resolve().parent)  # train_example.py sits next to this file
    if here not in sys.path:
        sys.path.insert(0, here)
    from train_example import fit

    return fit(make, steps, seed, out, **options)


if __name__ == "__main__":
    import sys

    train(int(sys.argv[1]) if len(sys.argv) > 1 else 1200)
