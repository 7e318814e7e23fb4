"""A TransformerLens HookedTransformer that predicts the value of the query state, fed by a linear embedding.

    icrl-interp record --model examples/tl_model.py:make --weights tl_model.safetensors \
        --task linear-td --d 4 --n 30 --n-layers 3 --out tl.h5

The wrapper embeds the task's prompts z[batch, pos, 9] with its own nn.Linear and runs the
HookedTransformer from the residual stream (`self.tl(x, start_at_layer=0)`: TransformerLens skips its
token and position embeddings and runs blocks 0, 1, ln_final and unembed). With d_vocab_out = 1 the
unembedding is the value readout; forward(z) -> [batch, 1], the predicted v_pi(s_q) at the last position.

No probe spec is needed: the recorder finds the HookedTransformer inside the wrapper and records its own
hooks (blocks.{l}.hook_resid_post, blocks.{l}.attn.hook_pattern, ...); its readout for the logit lens
is tl.ln_final then tl.unembed. Attention is causal (the TransformerLens default): the query, in the
last position, still sees every transition.

The HookedTransformer's embed.W_E ([d_vocab = 1, 32]) and pos_embed.W_pos ([n_ctx, 32]) are never used
(start_at_layer=0); they stay in the state dict, so saved weights load back with strict=True.
"""
from __future__ import annotations

import torch
from torch import nn
from transformer_lens import HookedTransformer, HookedTransformerConfig

D_IN = 9        # linear-td prompt width for d = 4: 2d + 1
N_CTX = 128     # longest prompt the causal mask covers (n + 1 positions; the examples use n = 30)


def config() -> HookedTransformerConfig:
    return HookedTransformerConfig(
        n_layers=2, d_model=32, n_heads=4, d_head=8, d_mlp=128, n_ctx=N_CTX,
        d_vocab=1, d_vocab_out=1, act_fn="gelu", normalization_type="LN", attn_only=False,
        attention_dir="causal", default_prepend_bos=False, device="cpu",
    )


class TLValueModel(nn.Module):
    """z[batch, pos, 9] -> nn.Linear embedding -> HookedTransformer blocks -> value of the query [batch, 1]."""

    def __init__(self, d_in: int = D_IN):
        super().__init__()
        self.tl = HookedTransformer(config())
        self.embed = nn.Linear(d_in, self.tl.cfg.d_model)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out = self.tl(self.embed(z), start_at_layer=0)  # [batch, pos, 1]: the readout at every position
        return out[:, -1]


def make() -> TLValueModel:
    """The untrained model (what `--model examples/tl_model.py:make` calls)."""
    return TLValueModel()


def train(steps: int = 1200, seed: int = 0, out="tl_model.safetensors", **options) -> dict:
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
