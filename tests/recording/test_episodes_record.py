"""Recording a model over episodes: the rows are the model's own activations and logits at each step's read
position (checked against a plain forward pass), batches do not change them, the random-init baseline,
patterns aligned to key steps, a user's model, eval mode restored, and refusals that leave no file."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from icrl_interp.core.errors import ModelFault, UserError
from icrl_interp.models import episode_tokens as et
from icrl_interp.models.ad_transformer import ADConfig, ADTransformer
from icrl_interp.recording.episodes import record_episodes
from icrl_interp.recording.format import Recording
from icrl_interp.tasks.episodes import Episodes, write_episodes

H, T, O, A = 5, 9, 4, 3


def episodes(seed=0) -> Episodes:
    rng = np.random.default_rng(seed)
    trunc = np.zeros((H, T), bool)
    trunc[:, 2::3] = True
    valid = np.ones((H, T), bool)
    valid[3, 6:] = False
    return Episodes(rng.integers(0, O, (H, T)), rng.integers(0, A, (H, T)), rng.random((H, T)),
                    rng.integers(0, O, (H, T)), np.zeros((H, T), bool), trunc, valid, A, O)


def model(name="ad-step", context=4, stride=None, value_head=False) -> ADTransformer:
    torch.manual_seed(0)
    fmt = et.TokenFormat(name, O, A, context, stride)
    return ADTransformer(ADConfig(fmt.to_dict(), d_model=8, n_layers=2, n_heads=2, d_mlp=16,
                                  value_head=value_head)).eval()


class WithValues(nn.Module):
    """A model returning (logits, values), as a user's actor-critic would."""

    def __init__(self, inner: ADTransformer):
        super().__init__()
        self.inner, self.token_format = inner, inner.token_format

    def forward(self, x):
        return self.inner(x, return_values=True)


@pytest.mark.parametrize("name,stride", [("ad-step", 2), ("ad-element", None), ("dpt", None)])
def test_rows_are_the_models_activations_at_each_steps_read_position(tmp_path, name, stride):
    ep, m = episodes(), model(name, stride=stride)
    s = record_episodes(m, ep, tmp_path / "r.h5", batch_size=2, baseline="none", progress=False, patterns=True)
    tokens, pmap = et.encode(ep, m.token_format)
    with torch.no_grad():
        logits, cache = m.run_with_cache(torch.from_numpy(tokens))
    with Recording(s.path) as rec:
        got = rec.array("outputs/logits")
        resid = rec.read("blocks.1.hook_resid_post")
        pattern = rec.read("blocks.0.attn.hook_pattern")
        key_step = rec.array("maps/key_step")
        assert np.array_equal(rec.array("episodes/actions"), ep.actions)
        assert rec.n_prompts == H and rec.attr("token_format")["name"] == name
    want = pmap.to_steps(logits.numpy())
    tol = 50 * np.finfo(np.float32).eps * max(1.0, np.nanmax(np.abs(want)))  # batches of 2 vs all: float32 rounding
    assert np.allclose(got[ep.valid], want[ep.valid], atol=tol, rtol=0) and np.all(np.isnan(got[~ep.valid]))
    assert np.allclose(resid[ep.valid], pmap.to_steps(cache["blocks.1.hook_resid_post"].numpy())[ep.valid], atol=1e-4)
    # the pattern row of step (h, t) attends over its own sequence's keys: the weight on keys after the read
    # position is 0 (causal), and the key map says those keys' steps
    m_idx = np.flatnonzero((pmap.read_history == 2) & (pmap.read_step == 7))[0]
    seq, pos = pmap.read_seq[m_idx], pmap.read_pos[m_idx]
    assert np.allclose(pattern[2, 7], cache["blocks.0.attn.hook_pattern"][seq, :, pos].numpy(), atol=1e-5)
    assert np.array_equal(key_step[2, 7], pmap.step[seq])


def test_baseline_is_the_random_init_copy_and_values_are_kept(tmp_path):
    ep, m = episodes(), model()
    s = record_episodes(m, ep, tmp_path / "r.h5", progress=False, baseline="random-init", baseline_seed=3)
    v = WithValues(model(value_head=True))
    record_episodes(v, ep, tmp_path / "v.h5", progress=False, baseline="none", roles={"resid_post": "inner.blocks.{layer}"})
    tokens, pmap = et.encode(ep, m.token_format)
    with Recording(tmp_path / "v.h5") as rec, torch.no_grad():
        want = pmap.to_steps(v(torch.from_numpy(tokens))[1].numpy())
        assert rec.array("outputs/values").shape == (H, T)
        assert np.allclose(rec.array("outputs/values")[ep.valid], want[ep.valid], atol=1e-5)
    from icrl_interp.models.random_init import random_init_copy

    base, _ = random_init_copy(m, 3)
    tokens, pmap = et.encode(ep, m.token_format)
    with Recording(s.path) as rec, torch.no_grad():
        got = rec.array("baseline/outputs/logits")
        assert np.allclose(got[ep.valid], pmap.to_steps(base(torch.from_numpy(tokens)).numpy())[ep.valid], atol=1e-5)
        assert not np.allclose(got[ep.valid], rec.array("outputs/logits")[ep.valid])


class UserModel(nn.Module):
    """A user's model: no hook points, a dropout (train mode would make it stochastic), its own layer names."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        d = et.TokenFormat("ad-step", O, A, 4).d_token
        self.layers = nn.ModuleList([nn.Linear(d, 6), nn.Linear(6, 6)])
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(6, A)

    def forward(self, x):
        for layer in self.layers:
            x = self.drop(torch.tanh(layer(x)))
        return self.head(x)


def test_user_model_with_roles_and_mode_restored(tmp_path):
    ep, m = episodes(), UserModel()
    m.train()
    s = record_episodes(m, ep, tmp_path / "r.h5", token_format="ad-step", context=4, progress=False, baseline="none",
                        roles={"resid_post": "layers.{layer}"})
    assert m.training and m.drop.training  # restored after the run in eval mode
    tokens, pmap = et.encode(ep, et.format_for(ep, "ad-step", 4))
    with torch.no_grad(), Recording(s.path) as rec:
        m.eval()
        want = pmap.to_steps(m.layers[0](torch.from_numpy(tokens)).numpy())  # the Linear module's own output
        assert np.allclose(rec.read("blocks.0.hook_resid_post")[ep.valid], want[ep.valid], atol=1e-6)
        assert rec.hooks() == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]


class NaNModel(UserModel):
    def forward(self, x):
        y = super().forward(x)
        return torch.where(torch.arange(x.shape[0])[:, None, None] == x.shape[0] - 1, torch.nan, y)


def test_refusals_leave_nothing(tmp_path):
    ep = episodes()
    write_episodes(tmp_path / "eps.h5", ep)
    out = tmp_path / "r.h5"
    with pytest.raises(UserError, match="no token_format"):
        record_episodes(UserModel(), tmp_path / "eps.h5", out, progress=False)
    with pytest.raises(UserError, match="expects"):
        record_episodes(model(), Episodes(ep.observations % 2, ep.actions, ep.rewards, ep.next_observations % 2,
                                          ep.terminations, ep.truncations, ep.valid, A, 2), out, progress=False)
    with pytest.raises(ModelFault, match="NaN"):
        record_episodes(NaNModel(), ep, out, token_format="ad-step", context=4, progress=False, baseline="none",
                        roles={"resid_post": "layers.{layer}"}, batch_size=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eps.h5"]
