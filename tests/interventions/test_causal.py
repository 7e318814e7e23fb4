"""The causal test of the TD-error direction (docs/causal.md): known answers on theta* of every family
(float64, 1e-10), LEACE against its closed form, the random control's reproducibility, a model whose
output ignores the direction, the random-init baseline (same tasks and draws; theta* exceeds it), and
the CLI's one-line errors."""
from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from icrl_interp.interventions import causal
from icrl_interp import cli
from icrl_interp.models import construct
from icrl_interp.tasks import reference
from icrl_interp.core.errors import UserError
from icrl_interp.models import theta_star_model
from icrl_interp.models.random_init import random_init_copy

from helpers import float_tol

TOL = 1e-10
FAMILIES = ("linear-td", "softmax-td", "sarsa", "actor-critic")


def star(family: str, **options):
    """theta* of a family and its task, from the family's construct options."""
    plan = construct.options(family, options).plan()
    return theta_star_model(family, **plan.model, **plan.constants), construct.task_config(family, options)


def edits(setup: causal.CausalSetup) -> dict:
    return {"zero": setup.erase("zero"), "mean": setup.erase("mean"), "leace": setup.erase("leace"),
            "steer": setup.steer(1.5)}


# ------------------------------------------------------------------ known answers
@pytest.mark.parametrize("untied, scale", [(False, 1.0), (True, -2.0)])
def test_linear_td_known_answers(untied, scale):
    """Any edit of the context columns at resid_post of layer l: the remaining L-l-1 layers run batch
    TD(0) from w = 0 on the edited columns read as transitions, and add its query value to v_{l+1}."""
    L = 4
    model, cfg = star("linear-td", layers=L, n=12, untied=untied, scale=scale)
    lay, g, a = model.layout, cfg.model.gamma, cfg.model.alpha
    for layer in range(L):
        for direction in ("construction", "probe"):
            st = causal.prepare(model, cfg, layer, direction=direction, tasks=24)
            z = st.z_test
            n = z.shape[1] - 1
            ref = cfg.reference(z)
            phi, gphi, phi_q = z[:, :n, lay.slice("phi")], z[:, :n, lay.slice("gamma_phi_next")], z[:, -1, lay.slice("phi")]
            post = np.concatenate([phi, gphi, ref["td_errors"][:, layer + 1, :, None]], -1)  # resid_post, context
            for name, edit in edits(st).items():
                e = edit.apply(post)
                rest = reference.batch_td(e[..., lay.slice("phi")], e[..., lay.slice("gamma_phi_next")] / g,
                                          e[..., lay.slice("reward")][..., 0], phi_q, g, a, L - layer - 1)
                want = ref["values"][:, layer + 1, 0] + rest.query_values[:, -1]
                np.testing.assert_allclose(st.output(edit)[:, 0], want, rtol=0, atol=TOL, err_msg=f"{layer} {name}")
            if direction != "construction":
                continue
            # the closed forms: zero-ablation stops TD after l + 1 steps; mean-ablation (and steering by eps)
            # is TD on the constant reward mu (eps) for the remaining steps
            ones = np.ones(phi.shape[:2])
            td_const = lambda r: reference.batch_td(phi, gphi / g, r * ones, phi_q, g, a, L - layer - 1).query_values[:, -1]  # noqa: E731
            np.testing.assert_allclose(st.output(st.erase("zero"))[:, 0], ref["values"][:, layer + 1, 0], atol=TOL)
            np.testing.assert_allclose(st.output(st.erase("mean"))[:, 0],
                                       ref["values"][:, layer + 1, 0] + td_const(st.mean), atol=TOL)
            np.testing.assert_allclose(st.output(st.steer(1.5))[:, 0],
                                       ref["values"][:, L, 0] + td_const(1.5 * st.std), atol=TOL)


def softmax_td_from(x, R, T, C, steps, gamma, alpha, score_scale, form):
    """Weighted softmax TD in value space from an edited memory: R, T at the n context columns, C at all
    n + 1 columns. tsm rebuilds T = gamma C(next) after each step; dual updates T by the shifted update."""
    K = reference.softmax_kernel(x, score_scale * np.eye(x.shape[-1]))
    for _ in range(steps):
        update = alpha * np.einsum("bk,bkj->bj", R + T - C[:, :-1], K)
        C = C + update
        T = gamma * C[:, 1:] if form == "tsm" else T + gamma * update[:, 1:]
    return C[:, -1]


@pytest.mark.parametrize("form", ["tsm", "dual"])
def test_softmax_td_known_answers(form):
    L, s2 = 4, 3.0
    model, cfg = star("softmax-td", layers=L, n=10, score_scale=s2, form=form)
    lay, g, a = model.layout, cfg.model.gamma, cfg.model.alpha
    for layer in range(L):
        st = causal.prepare(model, cfg, layer, direction="construction", tasks=24)
        z = st.z_test
        n = z.shape[1] - 1
        ref = cfg.reference(z)
        v, x = ref["values"][:, layer + 1], z[..., lay.slice("x")]
        post = np.concatenate([x[:, :n], z[:, :n, lay.slice("reward")], g * v[:, 1:, None], v[:, :n, None]], -1)
        for name, edit in edits(st).items():
            e = edit.apply(post)
            want = softmax_td_from(np.concatenate([e[..., lay.slice("x")], x[:, -1:]], 1),
                                   e[..., lay.slice("reward")][..., 0], e[..., lay.slice("target_mem")][..., 0],
                                   np.concatenate([e[..., lay.slice("current_mem")][..., 0], v[:, -1:]], 1),
                                   L - layer - 1, g, a, s2, form)
            np.testing.assert_allclose(st.output(edit)[:, 0], want, rtol=0, atol=TOL, err_msg=f"{layer} {name}")
        if layer == L - 2:  # one layer left: zero-ablation makes its TD error 0, mean-ablation sqrt(3) mu
            np.testing.assert_allclose(st.output(st.erase("zero"))[:, 0], ref["values"][:, L - 1, -1], atol=TOL)
            np.testing.assert_allclose(st.output(st.erase("mean"))[:, 0],
                                       ref["values"][:, L - 1, -1] + a * np.sqrt(3.0) * st.mean, atol=TOL)


@pytest.mark.parametrize("family, options", [
    ("sarsa", {"states": 3, "actions": 2, "n": 10, "scale": -2.0}),
    ("actor-critic", {"states": 3, "actions": 2, "n": 10, "scale": 0.5, "critic_step": 0.7, "alpha": 0.3}),
])
def test_lsa_known_answers(family, options):
    """The query row of layer 0's scores holds c delta_k; an edit turns it into s'_k, and the output is
    the reference update with delta_k replaced by s'_k / c (zero-ablation: no update at all)."""
    model, cfg = star(family, **options)
    lay, c = model.layout, options["scale"]
    beta, alpha = options.get("critic_step", cfg.model.alpha), cfg.model.alpha
    assert causal.default_hook(model) == "attn_scores"
    for direction in ("construction", "probe"):
        st = causal.prepare(model, cfg, 0, direction=direction, tasks=24)
        z = st.z_test
        n = z.shape[1] - 1
        scores = c * cfg.reference(z)["td_errors"][:, 0, :, None]
        params = z[:, -1, lay.slice("w").start:]
        params = params[:, : st.base.shape[1]]
        for name, edit in edits(st).items():
            d = edit.apply(scores)[..., 0] / c
            want = z[:, -1, lay.slice("w")] + beta / n * np.einsum("bk,bkd->bd", d, z[:, :n, lay.slice("phi")])
            if "lam" in lay.names:
                want = np.concatenate([want, z[:, -1, lay.slice("lam")]
                                       + alpha / n * np.einsum("bk,bkd->bd", d, z[:, :n, lay.slice("score")])], -1)
            np.testing.assert_allclose(st.output(edit), want, rtol=0, atol=TOL, err_msg=name)
        np.testing.assert_allclose(st.output(st.erase("zero")), params, atol=TOL)


def test_probe_finds_the_construction_direction():
    model, cfg = star("softmax-td", layers=3, n=10)
    st = causal.prepare(model, cfg, 1, tasks=32)
    assert st.probe["r2_test"] > 1 - 1e-8 and st.probe["r2_train"] > 1 - 1e-8
    assert abs(st.probe["r2_shuffled"]) < 0.3
    assert st.probe["construction_cosine"] > 1 - 1e-8
    assert st.probe["target_iteration"] == 2  # resid_post of layer 1 carries delta^(2)


# ------------------------------------------------------------------ LEACE
def test_leace_matches_its_closed_form():
    from scipy.linalg import sqrtm

    g = np.random.default_rng(3)
    A = g.standard_normal((6, 4))
    X = g.standard_normal((400, 4)) @ A.T + 0.3  # rank-4 covariance in 6 dimensions
    z = X @ g.standard_normal(6) + 0.1 * g.standard_normal(400)
    mu, Xc = X.mean(0), X - X.mean(0)
    S, c = Xc.T @ Xc / len(X), Xc.T @ (z - z.mean()) / len(X)
    edit = causal.leace_edit(S, c, mu)
    W = np.linalg.pinv(np.real(sqrtm(S)), rcond=1e-6, hermitian=True)  # (Cov^{1/2})^+; Cov has rank 4
    Wc = W @ c
    P = np.outer(Wc, Wc) / (Wc @ Wc)
    E = np.eye(6) - np.linalg.pinv(W, rcond=1e-6, hermitian=True) @ P @ W  # I - W^+ P_{W c} W
    np.testing.assert_allclose(np.eye(6) - np.outer(edit.c, edit.b), E, atol=1e-8)
    Y = edit.apply(X)
    np.testing.assert_allclose((Y - Y.mean(0)).T @ (z - z.mean()) / len(X), 0.0, atol=1e-10)  # no linear info left
    np.testing.assert_allclose(Y.mean(0), mu, atol=1e-12)  # the mean is kept
    np.testing.assert_allclose(edit.apply(Y), Y, atol=1e-12)  # a projection


def test_leace_agrees_with_concept_erasure():
    ce = pytest.importorskip("concept_erasure")
    g = np.random.default_rng(4)
    X = g.standard_normal((500, 5)) @ g.standard_normal((5, 5))
    z = X @ g.standard_normal(5) + g.standard_normal(500)
    mu, Xc = X.mean(0), X - X.mean(0)
    ours = causal.leace_edit(Xc.T @ Xc / len(X), Xc.T @ (z - z.mean()) / len(X), mu).apply(X)
    # the package's defaults add covariance shrinkage and a trace constraint; the plain LEACE is without them
    eraser = ce.LeaceEraser.fit(torch.from_numpy(X), torch.from_numpy(z[:, None]), shrinkage=False,
                                constrain_cov_trace=False)
    np.testing.assert_allclose(eraser(torch.from_numpy(X)).numpy(), ours, atol=1e-10)


class LinearFeatures(nn.Module):
    """Fixed features h = z @ E at every position (layer0), output read from them: a model whose feature
    covariance is set by E (float64: the test runs in the parameter's dtype)."""

    def __init__(self, E: np.ndarray):
        super().__init__()
        self.E = nn.Parameter(torch.from_numpy(np.asarray(E, dtype=np.float64)), requires_grad=False)
        self.layer0 = nn.Identity()

    def forward(self, z):
        h = self.layer0(z @ self.E)
        return h[:, -1, :1] + torch.tanh(h[:, :-1]).mean(1)[:, :1]


def test_variance_matched_bends_g_to_the_target_variance():
    """Cov^p g: p = 0 is g itself when g already has the target variance, p = 1 the eraser of the raw
    concept g.x (LEACE); any reachable target is met; beyond the range, the nearest eigenvector's."""
    rng = np.random.default_rng(7)
    Q = np.linalg.qr(rng.standard_normal((5, 5)))[0]
    lam = np.array([0.01, 0.3, 1.0, 4.0, 50.0])
    S = (Q * lam) @ Q.T
    g = causal.random_directions(5, 1, seed=1)[0]
    unit = lambda v: v / np.linalg.norm(v)  # noqa: E731
    np.testing.assert_allclose(unit(causal.variance_matched(S, g, g @ S @ g)), g, atol=1e-9)
    Sg = S @ g
    np.testing.assert_allclose(unit(causal.variance_matched(S, g, Sg @ Sg / (g @ S @ g), leace=True)), unit(Sg),
                               atol=1e-9)
    for target in (0.05, 2.0, 30.0):
        u = unit(causal.variance_matched(S, g, target))
        assert causal.erased_variance(S, causal.projection_edit(u)) == pytest.approx(target, rel=1e-9)
        c = causal.variance_matched(S, g, target, leace=True)
        assert causal.erased_variance(S, causal.leace_edit(S, c, np.zeros(5))) == pytest.approx(target, rel=1e-9)
    top = unit(causal.variance_matched(S, g, 1e3))
    assert abs(top @ Q[:, 4]) == pytest.approx(1.0, abs=1e-9)  # unreachable: the top eigenvector


def test_random_erasures_remove_the_variance_the_td_erasure_removes():
    """Each control draw is as large as the TD erasure (erased variance E||x - edit(x)||^2, checked on the
    training features themselves), for every method; unmatched unit directions would not be."""
    E = np.random.default_rng(5).standard_normal((9, 6)) * np.array([30.0, 1, 1, 1, 1, 1])  # one dominant axis
    cfg = construct.task_config("linear-td", {"layers": 2, "n": 8})
    st = causal.prepare(LinearFeatures(E), cfg, 0, roles={"resid_post": "layer{layer}"}, tasks=32)
    X = st.features[st.train_index].reshape(-1, 6)
    erased = lambda edit: float(np.mean(np.sum((X - edit.apply(X)) ** 2, -1)))  # noqa: E731
    assert causal.erased_variance(st.cov_x, st.erase("mean")) == pytest.approx(st.std ** 2, rel=1e-10)
    G = causal.random_directions(6, 6, seed=0)
    for method in ("mean", "zero", "leace"):
        td = st.erase(method)
        target = causal.erased_variance(st.cov_x, td)
        if method != "zero":  # zero-ablation also moves the mean: its erased variance is the centred part
            assert erased(td) == pytest.approx(target, rel=1e-9)
        for g in G:
            edit = st.erase_random(method, g)
            assert causal.erased_variance(st.cov_x, edit) == pytest.approx(target, rel=1e-8), method
    plain = [g @ st.cov_x @ g for g in G]  # what unmatched unit directions would remove
    assert max(abs(v / st.std ** 2 - 1) for v in plain) > 0.5


class LinearReadout(LinearFeatures):
    """LinearFeatures with a linear readout: out = h_q.w + a.mean_k h_k, so an erasure x -> x - c (b.x - m)
    of the context columns moves the output by exactly -(a.c) mean_k (b.x_k - m)."""

    def __init__(self, E: np.ndarray, a: np.ndarray):
        super().__init__(E)
        self.a = nn.Parameter(torch.from_numpy(np.asarray(a, dtype=np.float64)), requires_grad=False)

    def forward(self, z):
        h = self.layer0(z @ self.E)
        return (h[:, -1, :1] + h[:, :-1].mean(1) @ self.a[:, None])


@pytest.mark.parametrize("method", ["mean", "leace"])
def test_random_draws_are_the_matched_erasures_on_a_linear_model(method):
    """Known answer: on a linear readout every draw's output change is |a.c| |mean_k (b.x_k - m)| of its
    variance-matched edit, and the TD erasure's is the same formula with the TD edit (mean-ablation and LEACE)."""
    rng = np.random.default_rng(8)
    E = rng.standard_normal((9, 6)) * np.array([10.0, 1, 1, 1, 1, 0.1])
    a = rng.standard_normal(6)
    cfg = construct.task_config("linear-td", {"layers": 2, "n": 8})
    model, roles = LinearReadout(E, a), {"resid_post": "layer{layer}"}
    kw = dict(roles=roles, tasks=32, seed=3)
    res = causal.causal_test(model, cfg, 0, method=method, random_draws=5, bootstrap=50, steer=(), baseline="none",
                             refits=0, **kw)
    st = causal.prepare(model, cfg, 0, **kw)
    X = st.features[st.test_index]

    def change(edit):
        return np.abs(a @ edit.c) * np.abs((X @ edit.b - edit.m).mean(1))

    G = causal.random_directions(6, 5, seed=3, layer=0)
    want = [float(change(st.erase_random(method, g)).mean()) for g in G]
    np.testing.assert_allclose(res["erasure"]["output_change"]["random"]["draws"], want, rtol=1e-10)
    assert res["erasure"]["output_change"]["td"]["mean"] == pytest.approx(float(change(st.erase(method)).mean()),
                                                                           rel=1e-10)
    v = res["erasure"]["erased_variance"]
    size = st.std ** 2 if method == "mean" else causal.erased_variance(st.cov_x, st.erase("leace"))
    assert v["random"] == pytest.approx(v["td"], rel=1e-8) and v["td"] == pytest.approx(size, rel=1e-10)


def test_r2_after_says_whether_delta_is_left():
    """An edit that changes no feature leaves the probe's held-out R^2 exactly; LEACE leaves about 0, and
    the result reports both (erasure.r2_after)."""
    E = np.random.default_rng(6).standard_normal((9, 5))
    E[:, 4] = 0.0  # feature 4 is constant: mean-ablating it changes nothing
    cfg = construct.task_config("linear-td", {"layers": 2, "n": 8})
    model, roles = LinearFeatures(E), {"resid_post": "layer{layer}"}
    st = causal.prepare(model, cfg, 0, roles=roles, tasks=48)
    assert st.probe["r2_test"] > 0.3
    idle = causal.projection_edit(np.eye(5)[4], 0.0)
    assert st.r2_after(idle) == st.probe["r2_test"]  # exact: x - e4 (x4 - 0) with x4 = 0 is x, so the same refit
    assert abs(st.r2_after(st.erase("leace"))) < 0.02
    assert st.r2_after(st.erase("mean")) < st.probe["r2_test"] - 0.1  # the probe's own readout is gone
    res = causal.causal_test(model, cfg, 0, roles=roles, method="leace", tasks=48, random_draws=4, bootstrap=50,
                             refits=0,
                             steer=(), baseline="none")
    after = res["erasure"]["r2_after"]
    assert after["before"] == res["direction"]["r2_test"]  # a copy
    assert abs(after["td"]) < 0.02 and after["random"] > after["td"] + 0.1  # random concepts leave more of delta


# ------------------------------------------------------------------ the control and the statistics
def test_random_directions_draw_reproducibly_from_the_seed():
    a, b = causal.random_directions(7, 5, seed=3, layer=1), causal.random_directions(7, 5, seed=3, layer=1)
    np.testing.assert_array_equal(a, b)  # exact: the same draws
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0)
    assert not np.allclose(a, causal.random_directions(7, 5, seed=4, layer=1))
    assert not np.allclose(a, causal.random_directions(7, 5, seed=3, layer=2))
    model, cfg = star("linear-td", layers=2, n=8)
    kw = dict(tasks=16, random_draws=4, bootstrap=50, steer=(1.0,), refits=0)
    first, again = causal.causal_test(model, cfg, 0, **kw), causal.causal_test(model, cfg, 0, **kw)
    assert json.dumps(first) == json.dumps(again)  # exact: the same computation rerun
    other = causal.causal_test(model, cfg, 0, seed=1, **kw)
    assert other["erasure"]["output_change"]["random"]["draws"] != first["erasure"]["output_change"]["random"]["draws"]


def test_editing_the_last_layer_of_wang_changes_nothing():
    """Nothing reads the context columns after the last layer: effect exactly 0, interval covers 0."""
    model, cfg = star("linear-td", layers=3, n=8)
    res = causal.causal_test(model, cfg, 2, tasks=16, random_draws=4, bootstrap=50, steer=(2.0,), refits=0)
    out = res["erasure"]["output_change"]
    # exact: the forward passes differ by rounding alone (1e-17 on some kernels), below the rounding floor
    assert out["td"]["mean"] == 0.0 and out["td"]["ci"][0] <= 0.0 <= out["td"]["ci"][1]
    assert out["difference"]["ci"][0] <= 0.0 <= out["difference"]["ci"][1]
    assert out["cohen_d"]["value"] == 0.0 and out["ratio"]["value"] is None
    assert res["steering"][0]["td"]["change"] == 0.0
    assert any("layer 2 is the last of 3" in n and "no later layer reads them" in n for n in res["notes"])
    # no edit moves the output, so the site cannot answer: inconclusive, whatever the intervals (all [0, 0])
    assert res["conclusion"] == "inconclusive" and "no edit at this site changes the output" in res["conclusion_reason"]
    assert "layer 2 is the last of 3" in res["conclusion_reason"]
    earlier = causal.causal_test(model, cfg, 1, tasks=16, random_draws=4, bootstrap=50, steer=(), baseline="none",
                                 refits=0)
    assert not any("last of" in n for n in earlier["notes"])
    assert "no edit at this site" not in earlier["conclusion_reason"]


class IgnoresU(nn.Module):
    """Own residual width 6; the output reads the context columns only orthogonally to U."""

    def __init__(self, u):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(9, 6).double()
        self.layer0 = nn.Identity()
        self.head = nn.Linear(6, 1).double()
        u = torch.as_tensor(u / np.linalg.norm(u))
        self.register_buffer("perp", torch.eye(6, dtype=torch.float64) - torch.outer(u, u))

    def forward(self, z):
        h = self.layer0(self.embed(z))
        return self.head(h[:, -1] + torch.tanh(h[:, :-1] @ self.perp).mean(1))


def test_a_model_whose_output_ignores_the_direction_gives_zero_effect():
    u = np.random.default_rng(0).standard_normal(6)
    cfg = construct.task_config("linear-td", {"layers": 2, "n": 8})
    res = causal.causal_test(IgnoresU(u), cfg, 0, roles={"resid_post": "layer{layer}"}, direction=u, method="mean",
                             tasks=32, random_draws=8, bootstrap=200, steer=(1.0,), refits=0)
    out = res["erasure"]["output_change"]
    assert res["direction"]["source"] == "given" and res["direction"]["width"] == 6
    # exact: the output reads u only through the rounding of u.(I - u u^T) (1e-17), below the rounding floor
    assert out["td"]["mean"] == 0.0 and out["td"]["ci"] == [0.0, 0.0]
    assert out["random"]["mean"] > 1e-3 and out["difference"]["ci"][1] < 0  # random directions do matter
    assert res["steering"][0]["td"]["change"] == 0.0 < 1e-3 < res["steering"][0]["random"]["change"]
    assert "uses its own probe direction" in res["baseline"]["notes"][0]  # a given direction is the model's own
    assert res["baseline"]["direction"]["source"] == "probe"


def test_the_rounding_floor_on_known_numbers():
    """64 eps of the model's dtype at the largest |unedited output|; a task whose output moved by no more
    keeps its unedited output, one that moved more keeps its own."""
    base = np.array([[1.0, -2.0], [0.5, 0.0]])
    assert causal.rounding_floor(torch.float64, base) == 64 * 2.0 ** -52 * 2.0  # exact: powers of 2
    assert causal.rounding_floor(torch.float32, base) == 64 * 2.0 ** -23 * 2.0
    floor = causal.rounding_floor(torch.float64, base)
    out = base + np.array([[floor, 0.0], [0.0, 2 * floor]])
    got = causal.unchanged_within_rounding(out, base, torch.float64)
    np.testing.assert_array_equal(got, [base[0], out[1]])  # exact: rows copied from one or the other


@pytest.mark.parametrize("factor", [0.1, 1000.0])
def test_output_changes_below_the_rounding_floor_are_zero(factor):
    """A linear readout of the context columns whose weight is scaled so that the largest erasure moves the
    output by `factor` times the rounding floor. At 0.1 every effect is exactly 0 and the notes say that no
    edit moved the output, on every BLAS kernel: the change (about 6 eps) is far above the kernels' own
    rounding (about 1 eps), so without the floor it would be reported. At 1000 the effects are the known
    answer, |a.c| |mean_k (b.x_k - m)| per task."""
    rng = np.random.default_rng(8)
    E, a0 = rng.standard_normal((9, 6)), rng.standard_normal(6)
    cfg = construct.task_config("linear-td", {"layers": 2, "n": 8})
    kw = dict(roles={"resid_post": "layer{layer}"}, tasks=32, seed=3)
    st = causal.prepare(LinearReadout(E, np.zeros(6)), cfg, 0, **kw)  # features and direction do not depend on a
    X = st.features[st.test_index]

    def change(edit, a):
        return np.abs(a @ edit.c) * np.abs((X @ edit.b - edit.m).mean(1))

    erasures = [st.erase("mean")] + [st.erase_random("mean", g) for g in causal.random_directions(6, 4, 3, 0)]
    floor = float_tol(torch.float64, st.base, k=64)  # the documented floor, computed here independently
    a = a0 * factor * floor / max(change(e, a0).max() for e in erasures)
    res = causal.causal_test(LinearReadout(E, a), cfg, 0, method="mean", random_draws=4, bootstrap=50, steer=(),
                             baseline="none", refits=0, **kw)
    out = res["erasure"]["output_change"]
    moved = [n for n in res["notes"] if "no edit" in n and "changed the output" in n]
    if factor < 1:
        assert out["td"]["mean"] == 0.0 and out["random"]["mean"] == 0.0 and out["td"]["ci"] == [0.0, 0.0]
        assert out["cohen_d"]["value"] == 0.0 and out["ratio"]["value"] is None and moved
    else:
        assert out["td"]["mean"] == pytest.approx(change(st.erase("mean"), a).mean(), rel=1e-2)
        assert out["random"]["mean"] > 0 and not moved


def test_compare_on_known_numbers():
    rng = np.random.default_rng(0)
    td = np.full(50, 2.0)
    rand = np.ones((50, 8))
    res = causal.compare(td, rand, rng, 100)
    assert res["ratio"]["value"] == 2.0 and res["difference"]["mean"] == 1.0  # exact: means of 2s and 1s
    assert res["p_random"] == pytest.approx(1 / 9)
    zero = causal.compare(np.zeros(20), np.zeros((20, 4)), rng, 100)
    assert zero["cohen_d"] == {"value": 0.0, "ci": [0.0, 0.0]} and zero["ratio"]["value"] is None


def test_theta_star_td_direction_beats_random_when_steering():
    model, cfg = star("linear-td", layers=3, n=12)
    res = causal.causal_test(model, cfg, 0, tasks=48, random_draws=8, bootstrap=200, steer=(2.0,), refits=0)
    point = res["steering"][0]
    assert point["td"]["change"] > point["random"]["band"][1] and point["ratio"] > 1.5


# ------------------------------------------------------------------ the random-init baseline
class SpareOnly(nn.Module):
    """Fixed buffers do the work; the only parameters (`spare`) are never used, so the random-init copy
    (which redraws them) behaves exactly like the model."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("embed", torch.randn(9, 6, generator=g, dtype=torch.float64))
        self.register_buffer("head", torch.randn(6, 1, generator=g, dtype=torch.float64))
        self.layer0 = nn.Identity()
        self.spare = nn.Linear(3, 3).double()

    def forward(self, z):
        h = self.layer0(z @ self.embed)
        return (h[:, -1] + torch.tanh(h[:, :-1]).mean(1)) @ self.head


def test_the_baseline_runs_the_identical_test():
    """A model whose random-init copy behaves identically: the baseline's statistics equal the model's
    (same tasks, split, random draws and bootstrap resamples), and the difference is 0 with interval [0, 0]."""
    cfg = construct.task_config("linear-td", {"layers": 2, "n": 8})
    model = SpareOnly()
    res = causal.causal_test(model, cfg, 0, roles={"resid_post": "layer{layer}"}, tasks=32, random_draws=6,
                             bootstrap=100, steer=(1.0,), refits=0)
    base = res["baseline"]
    assert base["kind"] == "random-init" and base["seed"] == 0 and base["reset_modules"] == 1
    assert not torch.equal(random_init_copy(model, 0)[0].spare.weight, model.spare.weight)  # it is redrawn
    for key in ("tasks", "direction", "value_error", "erasure", "steering"):  # exact: the same computation
        assert json.dumps(base[key]) == json.dumps(res[key]), key
    cmp = base["comparison"]
    assert res["erasure"]["output_change"]["random"]["mean"] > 1e-3  # the edits do move the output
    for v in (cmp["erasure"]["output_change"], cmp["erasure"]["td_output_change"], cmp["steering"][0],
              cmp["probe_r2_test"]):
        assert v["difference"] == {"mean": 0.0, "ci": [0.0, 0.0]}  # exact: differences of identical numbers
    assert cmp["erasure"]["output_change"]["trained"] == res["erasure"]["output_change"]["difference"]
    assert cmp["exceeds_random_init"].startswith("no: the paired difference's interval includes 0")
    assert cmp["probe_exceeds_random_init"].startswith("no: the paired difference's interval includes 0")
    none = causal.causal_test(model, cfg, 0, roles={"resid_post": "layer{layer}"}, tasks=32, random_draws=6,
                              bootstrap=100, steer=(1.0,), baseline="none", refits=0)
    assert "baseline" not in none and json.dumps(none) == json.dumps({k: v for k, v in res.items() if k != "baseline"})
    with pytest.raises(UserError, match="--baseline 'trained'"):
        causal.causal_test(model, cfg, 0, roles={"resid_post": "layer{layer}"}, baseline="trained")


def test_theta_star_exceeds_its_random_init_copy():
    """theta* linear-td uses delta: erasing it moves the output more than random directions by more
    than the random-init copy's probe direction does (absolute excess, intervals apart). The random-init
    copy of this architecture varies with its seed (docs/causal.md); this is seed 0."""
    model, cfg = star("linear-td", layers=3, n=30)
    res = causal.causal_test(model, cfg, 0, tasks=256, random_draws=8, bootstrap=200, steer=(2.0,), refits=0)
    cmp = res["baseline"]["comparison"]
    assert cmp["exceeds_random_init"].startswith("yes: the paired difference lies above 0"), cmp["exceeds_random_init"]
    assert cmp["erasure"]["output_change"]["difference"]["ci"][0] > 0
    assert cmp["steering"][0]["exceeds_random_init"].startswith("yes")
    assert cmp["probe_exceeds_random_init"].startswith("yes")  # R^2 1 against ~0.75
    assert cmp["probe_r2_test"]["trained"]["mean"] == pytest.approx(res["direction"]["r2_test"], abs=1e-9)
    assert cmp["probe_r2_test"]["random_init"]["mean"] == pytest.approx(res["baseline"]["direction"]["r2_test"],
                                                                         abs=1e-9)
    assert set(cmp["scale"]) == {"trained", "random_init", "target"}


# ------------------------------------------------------------------ errors and the CLI
def test_bad_layer_hook_and_direction_are_one_line_errors():
    model, cfg = star("linear-td", layers=2, n=8)
    with pytest.raises(UserError, match=r"--layer 2: the model has resid_post at layers 0\.\.1"):
        causal.prepare(model, cfg, 2)
    with pytest.raises(UserError, match="--layer must be an integer"):
        causal.prepare(model, cfg, -1)
    with pytest.raises(UserError, match="--hook 'mlp'"):
        causal.prepare(model, cfg, 0, hook="mlp")
    with pytest.raises(UserError, match="--method 'pca'"):
        causal.causal_test(model, cfg, 0, method="pca")
    with pytest.raises(UserError, match="names no TD direction"):
        causal.prepare(IgnoresU(np.ones(6)), cfg, 0, roles={"resid_post": "layer{layer}"}, direction="construction",
                       tasks=16)
    with pytest.raises(UserError, match="not a TransformerLens model"):
        causal.prepare(IgnoresU(np.ones(6)), cfg, 0, tasks=16)


MODEL_FILE = """
import torch
from torch import nn


class Mix(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.lin = nn.Linear(w, w)

    def forward(self, h):
        return h + torch.tanh(self.lin(h + h[:, :-1].mean(1, keepdim=True)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(9, 12)
        self.layers = nn.ModuleList([Mix(12), Mix(12)])
        self.head = nn.Linear(12, 1)

    def forward(self, z):
        h = self.embed(z)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def build():
    return Net()
"""


@pytest.fixture
def files(tmp_path):
    (tmp_path / "m.py").write_text(textwrap.dedent(MODEL_FILE))
    (tmp_path / "roles.toml").write_text('[roles]\nresid_post = "layers.{layer}"\n')
    (tmp_path / "nothing.toml").write_text('[roles]\nresid_post = "blocks.{layer}"\n')
    construct.construct("linear-td", {"layers": 2, "n": 8}, tmp_path / "star")
    return tmp_path


def _cli(capsys, *argv):
    code = cli.main(["causal", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_on_a_checkpoint_and_on_a_user_model(files, capsys):
    d = files
    code, out, err = _cli(capsys, d / "star", "--layer", "0", "--tasks", "16", "--random-draws", "4",
                          "--bootstrap", "50", "--steer", "-1", "1", "--json", d / "c.json", "--figure", d / "c.png",
                          "--interchange", "transition", "--refits", "0")
    assert code == 0, err
    doc = json.loads((d / "c.json").read_text())
    sec = doc["causal"]
    assert sec["conclusion"] in causal.ANSWERS and f"conclusion: {sec['conclusion_reason']}" in out
    assert sec["selective"]["selectivity"]["ci"] is not None and "selective probe" in out
    assert sec["selective"]["refits"] == 0  # the flag reaches the test
    ic = sec["interchange"]  # theta* runs the reference: a changed successor transfers its predicted change
    assert ic["change"] == "transition" and ic["candidates"]["reference"]["correlation"]["mean"] > 0.9
    assert "interchange (transition, context patched): reference: R²" in out
    assert doc["schema"] == causal.SCHEMA and doc["causal"]["hook"] == "blocks.0.hook_resid_post"
    assert [p["scale"] for p in doc["causal"]["steering"]] == [-1.0, 1.0]
    assert (d / "c.png").stat().st_size > 1000 and "erase: |Δ output|" in out
    assert doc["causal"]["baseline"]["comparison"]["exceeds_random_init"].split(":")[0] in ("yes", "no")
    assert "exceeds random init (erasure):" in out and "random-init copy (seed 0)" in out
    # a second run replaces its own JSON and figure; a file of the user's at those paths is refused
    code, out, err = _cli(capsys, d / "star", "--layer", "0", "--tasks", "16", "--random-draws", "4",
                          "--bootstrap", "50", "--baseline", "none", "--json", d / "c.json", "--figure", d / "c.png",
                          "--refits", "0")
    assert code == 0, err
    (d / "mine.png").write_bytes(b"\x89PNG\r\n\x1a\n not ours")
    code, out, err = _cli(capsys, d / "star", "--layer", "0", "--figure", d / "mine.png")
    assert code == 2 and "was not written by icrl-interp" in err
    assert (d / "mine.png").read_bytes() == b"\x89PNG\r\n\x1a\n not ours"
    code, out, err = _cli(capsys, "--model", f"{d}/m.py:build", "--task", "linear-td", "--d", "4", "--n", "8",
                          "--probe", d / "roles.toml", "--layer", "1", "--tasks", "16", "--random-draws", "4",
                          "--bootstrap", "50", "--steer", "--method", "leace", "--baseline", "none",
                          "--json", d / "u.json", "--refits", "2")
    assert code == 0, err
    sec = json.loads((d / "u.json").read_text())["causal"]
    assert sec["selective"]["refits"] == 2 and "refit_sd" in sec["selective"]["erasure"]["minus_input_explained"]
    assert "baseline" not in sec and "random-init copy" not in out
    assert sec["module"] == "layers.1" and sec["direction"]["width"] == 12 and sec["method"] == "leace"
    assert sec["model"]["family"] is None and sec["steering"] == []


@pytest.mark.parametrize("argv, fragment", [
    (["{d}/star", "--layer", "7"], "--layer 7: the model has resid_post at layers 0..1"),
    (["{d}/star", "--layer", "0", "--hook", "attn_scores", "--direction", "construction"], "names no TD direction"),
    (["--model", "{d}/m.py:build", "--task", "linear-td", "--probe", "{d}/nothing.toml", "--layer", "0"],
     "maps to nothing"),
    (["--model", "{d}/m.py:build", "--task", "linear-td", "--layer", "0"], "not a TransformerLens model"),
    (["--model", "{d}/m.py:build", "--layer", "0"], "--model needs --task"),
    (["{d}/star", "--layer", "0", "--task", "linear-td"], "--task and --weights go with --model"),
    (["{d}/star", "--layer", "0", "--tasks", "3"], "--tasks must be an integer >= 8"),
    (["{d}/star", "--layer", "0", "--random-draws", "1"], "--random-draws must be an integer >= 2"),
    (["{d}/star", "--layer", "0", "--baseline", "trained"], "invalid choice: 'trained'"),
    (["{d}/star", "--layer", "0", "--interchange", "sideways"], "invalid choice: 'sideways'"),
])
def test_cli_errors_are_one_line(files, capsys, argv, fragment):
    code, out, err = _cli(capsys, *[a.format(d=files) for a in argv])
    assert code == 2
    assert fragment in err and len(err.strip().splitlines()) == 1, err
