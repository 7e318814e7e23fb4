"""`models.hooks`, the package's own copy of TransformerLens' hook API, against TransformerLens itself.

Each model is run twice: as it is (our `HookPoint` / `HookedRootModule`) and as a twin that runs the
same forward code on TransformerLens 3.x's `HookPoint` and `HookedRootModule` (what the models were
built on before). Caches, hooked outputs, gradient hooks and the hook bookkeeping (context levels,
permanent hooks, order) must be the same. The values are compared exactly: both run the same float64
operations on the same weights in the same process, so any difference is a difference in the hooks.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from icrl_interp.models.base import ICRLModel
from icrl_interp.models import hooks
from icrl_interp.models.hooks import HookPoint

from helpers import plain
from .model_cases import one_torch_thread, random_model, random_prompt  # noqa: F401
from .test_hooks import CONFIGS


def _twin(model: ICRLModel):
    """A deep copy of `model` whose class runs the model's own methods on TL's HookedRootModule and
    whose hook points are TL HookPoints (swapped in at the same module paths). TL is optional: the tests
    that compare with it skip without it."""
    tl_hook_points = pytest.importorskip("transformer_lens.hook_points")
    TLRoot = pytest.importorskip("transformer_lens.HookedRootModule").HookedRootModule
    members = {k: v for cls in reversed(type(model).__mro__) if issubclass(cls, ICRLModel)
               for k, v in vars(cls).items() if not k.startswith("__")}
    twin_cls = type("TLTwin", (TLRoot,), members)
    twin = twin_cls.__new__(twin_cls)
    twin.__dict__.update(copy.deepcopy(model).__dict__)
    for parent in list(twin.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, HookPoint):
                setattr(parent, name, tl_hook_points.HookPoint())
    twin.setup()
    assert all(isinstance(hp, tl_hook_points.HookPoint) for hp in twin.hook_dict.values())
    return twin


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)  # same names, in the same (firing) order
    for name in a:
        assert a[name].shape == b[name].shape and a[name].dtype == b[name].dtype, name
        assert torch.equal(a[name], b[name]), name  # exact: the same computation (module docstring)


@pytest.mark.parametrize("key", CONFIGS)
def test_hook_names_and_full_cache_equal_transformer_lens(key):
    model = random_model(d=2, seed=1, **CONFIGS[key])
    twin = _twin(model)
    assert list(model.hook_dict) == list(twin.hook_dict) and list(model.mod_dict) == list(twin.mod_dict)
    assert all(model.mod_dict[n].name == n for n in model.mod_dict)
    z = random_prompt(model, 3, 6, 0)
    out, acts = model.run_with_cache(z)  # with autograd on: the cache holds detached tensors
    tl_out, tl_acts = twin.run_with_cache(z)
    assert type(acts) is dict and len(acts) == len(model.hook_dict)
    assert out.requires_grad and not any(t.requires_grad for t in acts.values())
    _same(acts, tl_acts)
    assert torch.equal(out, tl_out)


@pytest.mark.parametrize("kw", [
    dict(names_filter="blocks.1.attn.hook_v"),
    dict(names_filter=["blocks.0.hook_resid_post", "blocks.1.attn.hook_pattern"]),
    dict(names_filter=lambda n: n.endswith(("hook_z", "hook_attn_scores")), pos_slice=-1),
    dict(pos_slice=(1, 4)),
    dict(pos_slice=[0, 3, 5]),
    dict(pos_slice=slice(2, None), remove_batch_dim=True),
])
def test_cache_options_equal_transformer_lens(kw):
    model = random_model(d=2, seed=2, family="softmax-td", n_layers=2, tied=False)
    twin = _twin(model)
    z = random_prompt(model, 1 if kw.get("remove_batch_dim") else 2, 6, 1)
    with torch.no_grad():
        _same(model.run_with_cache(z, **kw)[1], twin.run_with_cache(z, **kw)[1])


def test_pos_slice_cuts_the_position_axis_of_the_dual_forms_target_head():
    """hook_v_target / hook_z_target are [batch, pos, 1, D] like hook_v (TL knows only its own names
    and would index the head axis)."""
    model = random_model(d=2, seed=2, family="softmax-td", n_layers=1, form="dual")
    z = random_prompt(model, 2, 6, 1)
    with torch.no_grad():
        full = model.run_with_cache(z)[1]
        cut = model.run_with_cache(z, pos_slice=[0, 3, 5])[1]
    for name, t in full.items():
        axis = 1 if t.ndim == 4 and name.split(".")[-1] not in ("hook_attn_scores", "hook_pattern") else t.ndim - 2
        assert torch.equal(cut[name], t.index_select(axis, torch.tensor([0, 3, 5]))), name  # exact: a copy


def test_a_bad_names_filter_or_pos_slice_is_refused_as_by_transformer_lens():
    with pytest.raises(ValueError, match="names_filter"):
        plain(hooks._names_filter)(3)
    with pytest.raises(ValueError, match="Invalid input_slice"):
        plain(hooks._pos_index)(2.5)


def _edits(log: list):
    """Forward hooks that replace activations (by name and by predicate) and one that only looks."""
    return [("blocks.0.attn.hook_pattern", lambda t, hook: 0.5 * t),
            (lambda n: n.endswith("hook_v"), lambda t, hook: t + 0.25),
            ("blocks.1.hook_resid_pre", lambda t, hook: log.append((hook.name, hook.layer(), float(t.sum())))),
            ("blocks.1.hook_attn_out", lambda t, hook: -t)]


@pytest.mark.parametrize("key", ["linear-tied", "softmax-tsm", "sarsa-2"])
def test_run_with_hooks_equals_transformer_lens(key):
    kw = dict(family="sarsa", n_layers=2) if key == "sarsa-2" else CONFIGS[key]
    model = random_model(d=2, seed=3, **kw)
    twin = _twin(model)
    z = random_prompt(model, 2, 7, 2)
    ours, theirs = [], []
    with torch.no_grad():
        out = model.run_with_hooks(z, fwd_hooks=_edits(ours))
        tl_out = twin.run_with_hooks(z, fwd_hooks=_edits(theirs))
        assert not torch.equal(out, model(z))  # the edits take effect
    assert torch.equal(out, tl_out) and ours == theirs and len(ours) == 1
    assert not model.list_hooks() and not any(hp._forward_hooks for hp in model.hook_dict.values())


def _backward(m, z):
    """Gradient hooks: one records d(sum out)/d(resid_pre) of every layer, one doubles layer 0's dv."""
    seen = {}

    def save(g, hook):
        seen[hook.name] = g.detach().clone()

    out = m.run_with_hooks(z, bwd_hooks=[(lambda n: n.endswith("hook_resid_pre"), save),
                                         ("blocks.0.attn.hook_v", lambda g, hook: 2 * g)], reset_hooks_end=False)
    attached = {n: len(h) for n, h in m.list_hooks(dir="bwd").items()}
    out.pow(2).sum().backward()
    m.reset_hooks()
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters()}
    m.zero_grad()
    return seen, grads, attached


def test_backward_hooks_equal_transformer_lens():
    model = random_model(d=2, seed=4, family="linear-td", n_layers=2, tied=False)
    twin = _twin(model)
    z = random_prompt(model, 2, 5, 3).requires_grad_()  # so that layer 0's input has a gradient too
    seen, grads, attached = _backward(model, z)
    tl_seen, tl_grads, tl_attached = _backward(twin, z)
    assert sorted(seen) == ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"]
    _same(seen, tl_seen)
    _same(grads, tl_grads)
    assert attached == tl_attached == {"blocks.0.hook_resid_pre": 1, "blocks.1.hook_resid_pre": 1,
                                       "blocks.0.attn.hook_v": 1}
    plain = {n: g for n, g in zip(grads, torch.autograd.grad(model(z).pow(2).sum(), list(model.parameters())))}
    assert not torch.equal(plain["blocks.0.attn.P"], grads["blocks.0.attn.P"])  # the doubling took effect
    assert not model.list_hooks() and not any(hp._backward_hooks for hp in model.hook_dict.values())


def _bookkeeping(m) -> list:
    """A scripted session of add_hook / hooks() / reset_hooks, and what is attached after each step."""
    calls: list = []

    def tag(label):
        return lambda t, hook: calls.append((label, hook.name))

    def state():
        listed = {n: [(h.is_permanent, h.context_level) for h in hs] for n, hs in m.list_hooks().items()}
        point = m.hook_dict["blocks.0.hook_resid_pre"]
        flags = [point.has_hooks(including_permanent=False), point.has_hooks(level=1), point.has_hooks("bwd"),
                 sorted(m.list_hooks(including_permanent=False)), sorted(m.list_hooks("blocks.0.hook_attn_out")),
                 dict(point.ctx), m.is_caching]
        return listed, flags, m.context_level

    z = random_prompt(m, 1, 3, 0)
    m.hook_dict["blocks.0.hook_resid_pre"].ctx["seen"] = 1  # kept by hooks(), cleared by reset_hooks()
    steps = []
    m.add_perma_hook("blocks.0.hook_resid_pre", tag("perma"))
    m.add_hook("blocks.0.hook_resid_pre", tag("last"))
    m.add_hook(lambda n: n.endswith("hook_resid_pre"), tag("first"), prepend=True)
    steps.append(state())
    with m.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", tag("outer"))]):
        steps.append(state())
        with m.hooks(fwd_hooks=[(lambda n: n.startswith("blocks.0.hook_resid"), tag("inner"))]):
            steps.append(state())
            with torch.no_grad():
                m(z)
        steps.append(state())
        with m.hooks(fwd_hooks=[("blocks.0.hook_attn_out", tag("kept"))], reset_hooks_end=False):
            pass
        steps.append(state())
    steps.append(state())
    m.add_hook("blocks.0.hook_resid_pre", tag("grad"), dir="bwd")
    m.get_caching_hooks()
    steps.append(state())
    m.reset_hooks(direction="fwd", clear_contexts=False)  # the gradient hook stays
    steps.append(state())
    m.reset_hooks()
    steps.append(state())
    m.hook_dict["blocks.0.hook_resid_pre"].remove_hooks("both", including_permanent=True)
    steps.append(state())
    return steps + [calls]


def test_context_levels_permanent_hooks_and_order_equal_transformer_lens():
    model = random_model(d=2, seed=5, family="linear-td", n_layers=2)
    ours, theirs = _bookkeeping(model), _bookkeeping(_twin(model))
    assert ours == theirs
    calls = ours[-1]
    assert [c[0] for c in calls if c[1] == "blocks.0.hook_resid_pre"] == ["first", "perma", "last", "outer", "inner"]
    caching, fwd_reset, reset, removed = ours[-5:-1]
    assert caching[1][6] and not fwd_reset[1][6]  # is_caching: set by the caching hooks, cleared by a reset
    assert fwd_reset[1][2] and fwd_reset[1][5] == {"seen": 1}  # direction="fwd" keeps the gradient hook
    assert {n: len(h) for n, h in reset[0].items()} == {"blocks.0.hook_resid_pre": 1} and reset[1][5] == {}
    assert removed == ({}, [False, False, False, [], [], {}, False], 0)  # nothing left


def test_hook_point_name_layer_repr_and_refusals():
    model = random_model(d=2, family="linear-td", n_layers=3)
    hp = model.hook_dict["blocks.2.attn.hook_z"]
    assert hp.name == "blocks.2.attn.hook_z" and hp.layer() == 2 and repr(hp) == "HookPoint(name='blocks.2.attn.hook_z')"
    hp.add_hook(lambda t, hook: None)
    assert repr(hp) == "HookPoint(name='blocks.2.attn.hook_z', 1 fwd)"
    model.reset_hooks()
    with pytest.raises(ValueError, match="Name cannot be None"):
        HookPoint().layer()
    with pytest.raises(ValueError, match="Invalid direction"):
        plain(hp.add_hook)(lambda t, hook: None, dir="sideways")
    with pytest.raises(ValueError, match="Invalid direction"):
        plain(hp.remove_hooks)("sideways")
    with pytest.raises(TypeError, match="not a HookPoint"):
        model.add_hook("blocks.0.attn", lambda t, hook: None)
    with pytest.raises(KeyError):
        model.run_with_hooks(random_prompt(model, 1, 3, 0), fwd_hooks=[("blocks.9.hook_z", lambda t, hook: None)])
    assert not model.list_hooks() and model.context_level == 0


def test_a_raising_backward_hook_leaves_no_hook_attached():
    model = random_model(d=2, family="sarsa", n_layers=2)
    z = random_prompt(model, 2, 4, 0)

    def boom(g, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with model.hooks(bwd_hooks=[("blocks.1.hook_resid_post", boom)]):
            model(z).sum().backward()
    assert not model.list_hooks() and not any(hp._backward_hooks for hp in model.hook_dict.values())
    assert model.context_level == 0 and np.isfinite(model(z).detach().numpy()).all()


def test_a_transformer_lens_slice_object_is_read_as_its_slice():
    Slice = pytest.importorskip("transformer_lens.utilities.slice").Slice
    model = random_model(d=2, seed=2, family="linear-td", n_layers=1)
    z = random_prompt(model, 2, 6, 1)
    with torch.no_grad():
        _same(model.run_with_cache(z, pos_slice=Slice((1, 4)))[1], model.run_with_cache(z, pos_slice=(1, 4))[1])
        assert model.run_with_cache(z, pos_slice=Slice((1, 4)))[1]["blocks.0.hook_resid_post"].shape == (2, 3, 5)


def test_hooks_added_through_check_and_add_hook_are_temporary_by_default():
    model = random_model(d=2, family="sarsa")
    point = model.hook_dict["blocks.0.hook_resid_post"]
    model.check_and_add_hook(point, "blocks.0.hook_resid_post", lambda t, hook: None)
    assert [h.is_permanent for h in point.fwd_hooks] == [False]
    model.reset_hooks()
    assert not model.list_hooks() and not point._forward_hooks
