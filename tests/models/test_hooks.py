"""Hook points: every documented hook fires in every layer with the documented shape and
meaning, names filters select exactly, interventions take effect, and a hook that raises
leaves no hook attached."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from icrl_interp.models import ModelConfig, build_model
from icrl_interp.models.base import shift_back

from .model_cases import assert_close, cache, one_torch_thread, random_model, random_prompt  # noqa: F401

CONFIGS = {
    "linear-tied": dict(family="linear-td", n_layers=2),
    "linear-untied": dict(family="linear-td", n_layers=3, tied=False),
    "linear-tanh": dict(family="linear-td", n_layers=2, activation="tanh"),
    "softmax-tsm": dict(family="softmax-td", n_layers=2),
    "softmax-dual": dict(family="softmax-td", n_layers=3, form="dual", tied=False),
    "sarsa": dict(family="sarsa"),
    "actor-critic": dict(family="actor-critic", m=2),
}
COMMON = ["hook_resid_pre", "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_v", "attn.hook_z",
          "hook_attn_out", "hook_resid_post"]
EXTRA = {"tsm": ["hook_resid_mid", "hook_tsm_out"], "dual": ["hook_v_target", "hook_z_target"]}


def _model(key: str):
    return random_model(d=2, seed=1, **CONFIGS[key])


def _documented(model) -> list[str]:
    extra = EXTRA.get(model.config.form, [])
    return [f"blocks.{l}.{name}" for l in range(model.n_layers) for name in COMMON + extra]


@pytest.mark.parametrize("key", CONFIGS)
@pytest.mark.parametrize("pos", [4, 40])
def test_every_documented_hook_fires_with_its_shape(key, pos):
    model = _model(key)
    D = model.config.D
    assert sorted(model.hook_dict) == sorted(_documented(model))
    out, acts = cache(model, random_prompt(model, 3, pos, 0))
    assert sorted(acts) == sorted(_documented(model))
    shapes = model.hook_shapes(3, pos)
    for name, t in acts.items():
        assert tuple(t.shape) == shapes[name], name
        kind = name.split(".")[-1]
        expected = {"hook_attn_scores": (3, 1, pos, pos), "hook_pattern": (3, 1, pos, pos), "hook_v": (3, pos, 1, D),
                    "hook_z": (3, pos, 1, D), "hook_v_target": (3, pos, 1, D), "hook_z_target": (3, pos, 1, D)}
        assert tuple(t.shape) == expected.get(kind, (3, pos, D)), name
    assert_close(acts[f"blocks.{model.n_layers - 1}.hook_resid_post"], out, tol=0)


@pytest.mark.parametrize("key", CONFIGS)
def test_hooks_mean_what_the_docs_say(key):
    """z = pattern @ v; the residual updates; linear pattern = masked act(scores) / n."""
    model = _model(key)
    pos = 7
    z = random_prompt(model, 2, pos, 3)
    _, acts = cache(model, z)
    n = pos - 1
    for l in range(model.n_layers):
        a = {name.split(f"blocks.{l}.")[1]: t for name, t in acts.items() if name.startswith(f"blocks.{l}.")}
        mixed = torch.einsum("bhqk,bkhe->bqhe", a["attn.hook_pattern"], a["attn.hook_v"])
        assert_close(a["attn.hook_z"], mixed, tol=1e-12)
        params = model.layer_params(l)
        value = params["P"] if model.config.family == "linear-td" else params["V"]
        assert_close(a["attn.hook_v"][:, :, 0], a["hook_resid_pre"] @ value.T, tol=1e-12)
        if model.config.family != "softmax-td":
            kernel = params["Q"] if model.config.family == "linear-td" else params["P"]
            x = a["hook_resid_pre"]
            scores = torch.einsum("bkd,de,bqe->bqk", x, kernel, x)
            assert_close(a["attn.hook_attn_scores"][:, 0], scores, tol=1e-12)
            act = torch.tanh(scores) if model.config.activation == "tanh" else scores
            mask = torch.ones(pos, dtype=torch.float64)
            if model.config.family == "linear-td":
                mask[-1] = 0.0  # query column is never a source
            assert_close(a["attn.hook_pattern"][:, 0], act * mask / n, tol=1e-12)
        if model.config.form == "tsm":
            assert_close(a["hook_resid_mid"], a["hook_resid_pre"] + a["hook_attn_out"], tol=1e-14)
            assert_close(a["hook_resid_post"], a["hook_resid_mid"] + a["hook_tsm_out"], tol=1e-14)
        else:
            assert_close(a["hook_resid_post"], a["hook_resid_pre"] + a["hook_attn_out"], tol=1e-14)
            target = shift_back(a["hook_z_target"][:, :, 0]) if model.config.form == "dual" else 0.0
            assert_close(a["hook_attn_out"], a["attn.hook_z"][:, :, 0] + target, tol=1e-14)


@pytest.mark.parametrize("key", ["linear-untied", "softmax-dual", "sarsa"])
def test_names_filter_returns_exactly_those_names(key):
    model = _model(key)
    z = random_prompt(model, 2, 5, 0)
    chosen = ["blocks.0.attn.hook_pattern", f"blocks.{model.n_layers - 1}.hook_resid_post", "blocks.0.attn.hook_v"]
    assert sorted(cache(model, z, chosen)[1]) == sorted(chosen)
    assert list(cache(model, z, "blocks.0.hook_attn_out")[1]) == ["blocks.0.hook_attn_out"]
    picked = cache(model, z, lambda name: name.endswith("hook_z"))[1]
    assert sorted(picked) == [f"blocks.{l}.attn.hook_z" for l in range(model.n_layers)]


def _attached(model) -> int:
    return sum(len(hp._forward_hooks) + len(hp._forward_pre_hooks) + len(hp._backward_hooks) + len(hp.fwd_hooks)
               + len(hp.bwd_hooks) for hp in model.hook_dict.values())


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("key", ["linear-untied", "softmax-tsm", "sarsa"])
def test_a_raising_hook_leaves_no_hook_attached(key):
    model = _model(key)
    z = random_prompt(model, 2, 30, 0)
    expected = cache(model, z)[0]

    def boom(t, hook):
        raise Boom(hook.name)

    with pytest.raises(Boom):
        model.run_with_hooks(z, fwd_hooks=[("blocks.0.hook_resid_pre", lambda t, hook: t), (f"blocks.{model.n_layers - 1}.attn.hook_pattern", boom)])
    assert _attached(model) == 0
    with pytest.raises(Boom):  # caching hooks too
        with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", boom)]):
            model.run_with_cache(z)
    assert _attached(model) == 0
    with torch.no_grad():
        assert_close(model(z), expected, tol=1e-12)
    if model.config.family != "softmax-td":
        assert model.blocks[0].attn.last_path == "associative"  # no stale listener forces the quadratic path


def test_tied_layers_share_parameters_but_not_hook_points():
    model = _model("linear-tied")
    assert [n for n, _ in model.named_parameters()] == ["blocks.0.attn.P", "blocks.0.attn.Q"]
    assert list(model.state_dict()) == ["blocks.0.attn.P", "blocks.0.attn.Q"]
    assert model.layer_params(1)["P"] is model.blocks[0].attn.P
    seen = []
    model.run_with_hooks(random_prompt(model, 1, 4, 0), fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda t, hook: seen.append(hook.name))])
    assert seen == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]


@pytest.mark.parametrize("family,tied,form,expected", [
    ("linear-td", False, None, ["blocks.{l}.attn.P", "blocks.{l}.attn.Q"]),
    ("softmax-td", False, "tsm", ["blocks.{l}.attn.A", "blocks.{l}.attn.V"]),
    ("softmax-td", False, "dual", ["blocks.{l}.attn.A", "blocks.{l}.attn.V", "blocks.{l}.attn.V_target"]),
    ("sarsa", False, None, ["blocks.{l}.attn.P", "blocks.{l}.attn.V"]),
])
def test_named_parameters_are_the_checkpoint_names(family, tied, form, expected):
    model = build_model(ModelConfig(family, 2, n_layers=2, tied=tied, form=form))
    names = [n.format(l=l) for l in range(2) for n in expected]
    assert sorted(n for n, _ in model.named_parameters()) == sorted(names)
    assert sorted(model.config.parameter_shapes()) == sorted(names)


@pytest.mark.parametrize("key", ["linear-tied", "softmax-tsm"])
def test_pattern_interventions_take_effect(key):
    """Zeroing layer 0's pattern removes its update: the output equals skipping that layer's attention."""
    model = _model(key)
    z = random_prompt(model, 2, 40, 0)
    with torch.no_grad():
        out = model.run_with_hooks(z, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda t, hook: torch.zeros_like(t))])
        _, acts = model.run_with_cache(z, names_filter="blocks.0.attn.hook_z")
        patched_z = model.run_with_hooks(z, fwd_hooks=[("blocks.0.attn.hook_z", lambda t, hook: torch.zeros_like(t))])
    assert_close(out, patched_z, tol=1e-14)
    assert not torch.allclose(out, cache(model, z)[0])
    assert acts["blocks.0.attn.hook_z"].abs().sum() > 0


def test_importing_the_package_does_not_import_transformer_lens():
    code = ("import sys, icrl_interp, icrl_interp.models, icrl_interp.models.checkpoint\n"
            "from icrl_interp.models import ModelConfig\n"
            "ModelConfig('sarsa', 2).parameter_shapes()\n"
            "assert 'transformer_lens' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
