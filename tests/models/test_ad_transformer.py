"""The AD transformer: causal (no position sees a later token), TL hook names and shapes, a value head,
and save / load round-trips the outputs exactly and refuses what is not its own."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from icrl_interp.core.errors import UserError
from icrl_interp.models import episode_tokens as et
from icrl_interp.models.ad_transformer import ADConfig, ADTransformer, load, save


def small(name="ad-step", value_head=False, seed=0) -> ADTransformer:
    torch.manual_seed(seed)
    fmt = et.TokenFormat(name, 4, 3, 6)
    return ADTransformer(ADConfig(fmt.to_dict(), d_model=16, n_layers=2, n_heads=2, d_mlp=32, value_head=value_head))


def tokens(model, batch=3, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    fmt = model.token_format
    return torch.randn(batch, fmt.positions, fmt.d_token, generator=g)


@pytest.mark.parametrize("name", et.FORMATS)
def test_causal(name):
    """Changing the token at position p leaves every output before p unchanged (exactly: the masked
    scores are -inf, their weights exactly 0) and changes the output at p."""
    model = small(name).eval()
    x = tokens(model)
    p = 3
    y = x.clone()
    y[:, p] += 1.0
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.equal(a[:, :p], b[:, :p])
    assert not torch.allclose(a[:, p], b[:, p])


def test_hooks_and_value_head():
    model = small(value_head=True).eval()
    x = tokens(model)
    (logits, values), cache = model.run_with_cache(x, return_values=True)
    B, P = x.shape[:2]
    assert logits.shape == (B, P, 3) and values.shape == (B, P)
    assert cache["hook_embed"].shape == (B, P, 16)
    assert cache["blocks.1.attn.hook_pattern"].shape == (B, 2, P, P)
    assert cache["blocks.0.attn.hook_v"].shape == (B, P, 2, 8)
    assert cache["blocks.1.mlp.hook_post"].shape == (B, P, 32)
    # the pattern is causal and each row a distribution (sums to 1 within float32 rounding)
    pattern = cache["blocks.0.attn.hook_pattern"]
    assert torch.all(pattern.triu(1) == 0)
    assert torch.allclose(pattern.sum(-1), torch.ones(B, 2, P), atol=10 * torch.finfo(torch.float32).eps)
    # the last resid_post, normalized, is what the head reads
    head = model.action_head(model.ln_final(cache["blocks.1.hook_resid_post"]))
    assert torch.allclose(head, logits, atol=1e-5)
    assert not model.hook_dict["blocks.0.hook_resid_pre"].fwd_hooks  # run_with_cache took its hooks off


def test_refuses_wrong_tokens():
    model = small()
    with pytest.raises(UserError, match="reads tokens"):
        model(torch.zeros(2, 7, model.token_format.d_token))  # longer than the context
    with pytest.raises(UserError, match="no value head"):
        model(tokens(model), return_values=True)


def test_save_load_round_trip(tmp_path):
    model = small(value_head=True).eval()
    save(model, tmp_path / "m", {"training": {"steps": 1}})
    back = load(tmp_path / "m")
    x = tokens(model)
    with torch.no_grad():
        assert torch.equal(model(x), back(x))  # the same float32 weights: exactly the same outputs
    assert back.saved_config["training"] == {"steps": 1} and back.config == model.config


def test_load_refusals(tmp_path):
    model = small()
    save(model, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["model"]["d_model"] = 32
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="do not fit"):
        load(tmp_path / "m")
    config["schema"] = "something/1"
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="not an AD model config"):
        load(tmp_path / "m")
    with pytest.raises(UserError, match="no config.json"):
        load(tmp_path)
    save(small(seed=1), tmp_path / "other")  # same shapes, other weights: the recorded SHA-256 tells them apart
    save(model, tmp_path / "m2")
    (tmp_path / "m2" / "model.safetensors").write_bytes((tmp_path / "other" / "model.safetensors").read_bytes())
    with pytest.raises(UserError, match="SHA-256 differs"):
        load(tmp_path / "m2")
    with pytest.raises(UserError, match="multiple of n_heads"):
        ADConfig(et.TokenFormat("ad-step", 4, 3, 6).to_dict(), d_model=10, n_heads=4)
