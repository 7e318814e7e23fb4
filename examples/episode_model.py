"""An AD-style model of your own, in plain PyTorch: a small causal transformer reading the documented `ad-step`
token tensor (docs/episodes.md, "Token formats") of Dark Room 5 x 5 learning histories and returning action
logits at every position.

A token is [one-hot(o_t) (25), one-hot(a_{t-1}) (5), r_{t-1}, new-episode flag]: 32 columns. The model has
`token_format` (what `record --episodes` and `collect --model` read), a linear embedding, learned positions,
`N_LAYERS` pre-LN blocks of causal `nn.MultiheadAttention` and an MLP, each ending in an `nn.Identity`
named `blocks.{l}.hook_resid_post` (so the default role `resid_post` maps onto it with no probe spec),
a final LayerNorm and a linear action head.

`make()` returns it untrained, with weights seeded by `SEED` (the same model every call): the examples run it
untrained, honestly so (it acts near uniformly and learns nothing in context; the pipeline runs, and the
verdict should say "none fits"). To train it, use `icrl_interp.train.ad`'s loop on its windows
(`training_windows`), as the shipped model was trained.
"""
from __future__ import annotations

import torch
from torch import nn

SIZE, HORIZON, EPISODES = 5, 10, 12
N_OBS, N_ACTIONS = SIZE * SIZE, 5
CONTEXT = HORIZON * EPISODES
D_TOKEN = N_OBS + N_ACTIONS + 2
D_MODEL, N_HEADS, N_LAYERS = 32, 4, 2
SEED = 0


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.attn = nn.MultiheadAttention(D_MODEL, N_HEADS, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(), nn.Linear(4 * D_MODEL, D_MODEL))
        self.hook_resid_post = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        P = x.shape[1]
        causal = torch.triu(torch.ones(P, P, dtype=torch.bool, device=x.device), 1)  # True: may not attend
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return self.hook_resid_post(x + self.mlp(self.ln2(x)))


class EpisodeModel(nn.Module):
    """tokens [N, P <= CONTEXT, D_TOKEN] -> action logits [N, P, N_ACTIONS]; position p sees positions <= p only."""

    token_format = {"name": "ad-step", "obs_width": N_OBS, "n_actions": N_ACTIONS, "context": CONTEXT}

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(D_TOKEN, D_MODEL)
        self.pos = nn.Parameter(0.02 * torch.randn(CONTEXT, D_MODEL))
        self.blocks = nn.ModuleList(Block() for _ in range(N_LAYERS))
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, N_ACTIONS)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def make() -> EpisodeModel:
    """The untrained model, seeded (what `--model examples/episode_model.py:make` calls)."""
    torch.manual_seed(SEED)
    return EpisodeModel()
