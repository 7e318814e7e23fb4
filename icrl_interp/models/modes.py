"""A model's train/eval mode during a run of the package: eval mode for the run, each module's own flag
restored afterwards (dropout would otherwise make two runs on the same prompts differ), and which of
its modules make train mode stochastic. Imports no torch until asked."""
from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def eval_mode(model, *more):
    """`model` (and `more` models) in eval mode inside the block; on leaving, every module gets back its own
    train/eval flag (a user's mixed modes come back exactly)."""
    modes = [(m, m.training) for each in (model, *more) for m in each.modules()]
    try:
        for m, _ in modes:
            m.training = False
        yield model
    finally:
        for m, mode in modes:
            m.training = mode


def stochastic_modules(model) -> list[str]:
    """Names of the modules of `model` that train mode makes stochastic: dropout with p > 0, and modules with
    a float `dropout` > 0 (e.g. nn.MultiheadAttention)."""
    from torch import nn

    kinds = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
    return [n or type(m).__name__ for n, m in model.named_modules()
            if (isinstance(m, kinds) and m.p > 0) or (isinstance(getattr(m, "dropout", None), float) and m.dropout > 0)]
