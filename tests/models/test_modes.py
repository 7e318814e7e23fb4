"""`models.modes`: eval mode for a run (the recorder's and the causal test's), every module's own
train/eval flag restored afterwards, and the modules that make train mode stochastic."""
import pytest
from torch import nn

from icrl_interp.models.modes import eval_mode, stochastic_modules


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5), nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.0)),
                         nn.MultiheadAttention(2, 1, dropout=0.1), nn.MultiheadAttention(2, 1))


def _modes(*models) -> list[bool]:
    return [m.training for model in models for m in model.modules()]


def test_eval_mode_inside_and_each_modules_own_mode_after_even_on_an_error():
    a, b = _net().train(), _net().eval()
    a[2].eval()  # mixed modes come back exactly
    b[1].train()
    before = _modes(a, b)
    assert True in before and False in before
    with pytest.raises(RuntimeError, match="inside"):
        with eval_mode(a, b) as got:
            assert got is a
            assert _modes(a, b) == [False] * len(before)
            raise RuntimeError("inside")
    assert _modes(a, b) == before


def test_stochastic_modules_are_dropouts_with_p_and_float_dropouts_above_0():
    assert stochastic_modules(_net()) == ["1", "3"]  # not Dropout(0.0) at 2.1, nor the MHA without dropout
    assert stochastic_modules(nn.Dropout(0.1)) == ["Dropout"]  # the root module has no name: its class
    assert stochastic_modules(nn.Linear(2, 2)) == []
