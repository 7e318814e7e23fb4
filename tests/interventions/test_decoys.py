"""The causal test refuses decoys (issue 24): hand-built modules on linear-td prompts whose algorithm is known
exactly. One runs batch TD(0); the decoys read the reward (the matching state's reward, a nearest-neighbour
lookup) or regress the immediate reward (TD with discount 0). At layer 0 the old TD-direction test moves every
one of them (the TD error there is mostly the reward); `causal.conclusion` says "yes" for TD(0) only."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from icrl_interp.interventions import causal, conclusion
from icrl_interp.models import construct

ROLES = {"resid_post": "layers.{layer}"}


class Embed(nn.Module):
    """Stream [phi, gamma phi', r, rho, v, other]: the prompt column, a working copy rho of the reward, the query's
    value v, and channels of other content no layer reads (fixed nonlinear functions of the column, of several
    sizes, as a wide stream holds), so that a random direction of any size has somewhere else to go."""

    def __init__(self, d: int, other: int = 8):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.d = d
        self.M = torch.randn(2 * d + 1, other, generator=g, dtype=torch.float64)
        self.scale = torch.logspace(-1.5, 0.0, other, dtype=torch.float64)

    def forward(self, z):
        B, P, _ = z.shape
        work = torch.zeros(B, P, 2, dtype=z.dtype)
        work[..., 0] = z[..., 2 * self.d]
        return torch.cat([z, work, torch.sin(3 * z @ self.M) * self.scale], -1)


class TDStep(nn.Module):
    """One step of batch TD(0) on the rho row (bootstrap 1), or of reward regression (bootstrap 0): with
    dw = (alpha/n) sum_i rho_i phi_i, rho_j += dw.(bootstrap gamma phi'_j - phi_j) and the query's v += dw.phi_q.
    Written from the update rule, not from the package's reference or candidates."""

    def __init__(self, d: int, alpha: float, bootstrap: float):
        super().__init__()
        self.d, self.alpha, self.bootstrap = d, alpha, bootstrap

    def forward(self, h):
        d, n = self.d, h.shape[1] - 1
        phi, gphi, rho = h[:, :n, :d], h[:, :n, d:2 * d], h[:, :n, 2 * d + 1]
        dw = (self.alpha / n) * torch.einsum("bn,bnd->bd", rho, phi)
        out = h.clone()
        out[:, :n, 2 * d + 1] = rho + torch.einsum("bnd,bd->bn", self.bootstrap * gphi - phi, dw)
        out[:, -1, 2 * d + 2] = h[:, -1, 2 * d + 2] + torch.einsum("bd,bd->b", h[:, -1, :d], dw)
        return out


class Keep(nn.Module):
    def forward(self, h):
        return h.clone()


class NearestReward(nn.Module):
    """The query copies the reward of the context columns whose features match its own (a sharp softmax over
    -||phi_q - phi_i||^2): it reads the reward row and nothing else."""

    def __init__(self, d: int, beta: float = 50.0):
        super().__init__()
        self.d, self.beta = d, beta

    def forward(self, h):
        d, n = self.d, h.shape[1] - 1
        a = torch.softmax(-self.beta * ((h[:, :n, :d] - h[:, -1:, :d]) ** 2).sum(-1), -1)
        out = h.clone()
        out[:, -1, 2 * d + 2] = (a * h[:, :n, 2 * d]).sum(-1)
        return out


class Net(nn.Module):
    def __init__(self, d: int, layers):
        super().__init__()
        self.d = d
        self.embed = Embed(d)
        self.layers = nn.ModuleList(layers)
        self.unused = nn.Parameter(torch.zeros(1, dtype=torch.float64), requires_grad=False)  # dtype for the runner

    def forward(self, z):
        h = self.embed(z)
        for layer in self.layers:
            h = layer(h)
        return h[..., 2 * self.d + 2: 2 * self.d + 3]


def task():
    return construct.task_config("linear-td", {"n": 30, "d": 4, "n_layers": 3})


def model(kind: str, cfg) -> Net:
    d, a = cfg.model.d, cfg.model.alpha
    layers = {"td0": lambda: [TDStep(d, a, 1.0) for _ in range(3)],
              "reward_regression": lambda: [TDStep(d, a, 0.0) for _ in range(3)],
              "nearest_reward": lambda: [Keep(), NearestReward(d), Keep()]}[kind]()
    return Net(d, layers)


def run(kind: str, tasks: int, method: str = causal.DEFAULT_METHOD):
    cfg = task()
    return causal.causal_test(model(kind, cfg), cfg, 0, roles=ROLES, tasks=tasks, random_draws=8, bootstrap=300,
                              steer=(), baseline="none", method=method)


def test_the_td_model_is_exact():
    """The hand-built TD(0) model's output is the reference's to rounding (float64), so its answer is known."""
    cfg = task()
    batch = cfg.sample(16, np.random.default_rng(1))
    out = model("td0", cfg)(torch.from_numpy(batch.prompt.z))[:, -1, 0].numpy()
    np.testing.assert_allclose(out, batch.reference["output"][:, 0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", ["leace", "mean"])
@pytest.mark.parametrize("kind", ["reward_regression", "nearest_reward"])
def test_decoys_are_never_yes(kind, method):
    """Both decoys move the output when the old TD direction is mean-ablated (ratio above 1: the issue's false
    positive), carry no selective TD information (selectivity interval below the negligible size) and get "no", with
    the default erasure (LEACE) and with mean-ablation."""
    res = run(kind, 64, method)
    if method == "mean":
        assert res["erasure"]["output_change"]["ratio"]["ci"][0] > 1.0  # the decoy the old test let through
    sel = res["selective"]["selectivity"]
    assert sel["ci"][1] < conclusion.NEGLIGIBLE_SELECTIVITY
    assert res["conclusion"] == "no", res["conclusion_reason"]
    assert res["conclusion_reason"].startswith("no: selective probe <")


def test_td0_is_yes():
    """TD(0): the layer carries the bootstrapping part of delta (selectivity about 0.6), and erasing it moves the
    output more than random directions and than the input-explained direction of the same size."""
    res = run("td0", 256)
    assert res["selective"]["selectivity"]["ci"][0] > 0.4
    e = res["selective"]["erasure"]
    assert e["excess_over_random"]["ci"][0] > 0 and e["minus_input_explained"]["ci"][0] > 0
    assert e["erased_variance"]["input_explained"] == pytest.approx(e["erased_variance"]["selective"], rel=1e-9)
    assert e["erased_variance"]["random"] == pytest.approx(e["erased_variance"]["selective"], rel=1e-8)
    assert res["conclusion"] == "yes", res["conclusion_reason"]
    assert res["conclusion_detail"]["thresholds"] == conclusion.THRESHOLDS


def test_interchange_separates_td_from_the_decoys():
    """Counterfactual prompts with one transition's successor changed, patched at the context columns after layer 0:
    the TD(0) model transfers exactly the reference's predicted change (R^2 1, relative error 0); the decoys do not
    read successors, so nothing transfers (relative error 1, R^2 undefined)."""
    from icrl_interp.interventions import interchange

    cfg = task()
    td = interchange.interchange(model("td0", cfg), cfg, 0, change="transition", roles=ROLES, tasks=32, bootstrap=100)
    ref = td["candidates"]["reference"]
    assert ref["r2"]["mean"] == pytest.approx(1.0, abs=1e-9) and ref["relative_error"]["mean"] < 1e-12
    assert ref["predicted_change"] > 1e-3  # the counterfactual does change the reference's output
    for kind in ("reward_regression", "nearest_reward"):
        out = interchange.interchange(model(kind, cfg), cfg, 0, change="transition", roles=ROLES, tasks=32,
                                      bootstrap=100)
        c = out["candidates"]["reference"]
        assert out["observed_change"] == 0.0 and c["r2"]["mean"] is None  # exact: the successor rows are never read
        assert c["relative_error"]["mean"] == 1.0 and "note" in out
    # a reward change patched at the context columns transfers only part of TD's change (the query moved at
    # layer 0 already), patched everywhere all of it; a caller's candidate is scored beside the reference
    part = interchange.interchange(model("td0", cfg), cfg, 0, change="reward", roles=ROLES, tasks=32, bootstrap=100,
                                   predicted={"zero": lambda z, zc: np.zeros((z.shape[0], 1))})
    assert part["candidates"]["reference"]["correlation"]["mean"] > 0.8
    assert 0.05 < part["candidates"]["reference"]["relative_error"]["mean"] < 0.9
    assert part["candidates"]["zero"]["relative_error"]["mean"] is None  # no predicted change: undefined
    full = interchange.interchange(model("td0", cfg), cfg, 0, change="reward", positions="all", roles=ROLES, tasks=32,
                                   bootstrap=100)
    assert full["candidates"]["reference"]["relative_error"]["mean"] < 1e-20


def test_counterfactual_changes_one_place():
    cfg = task()
    z = cfg.sample(6, np.random.default_rng(0)).prompt.z
    from icrl_interp.interventions import interchange

    lay = cfg.model.layout
    for change, block in (("reward", "reward"), ("transition", "gamma_phi_next")):
        zc, j = interchange.counterfactual(z, lay, change, np.random.default_rng(1))
        diff = np.any(zc != z, axis=-1)  # [N, pos]
        assert diff.sum() == 6 and np.all(diff[np.arange(6), j])  # exactly the column j of each prompt
        assert np.all((zc != z)[..., [i for i in range(z.shape[-1]) if i not in range(*lay.slice(block).indices(99))]]
                      == False)  # noqa: E712 - only the changed block


def test_causation_scores_each_candidate_by_interchange():
    """verdicts.causal_evidence.causation(interchange=True): the candidates, fitted to the model's output on the
    training prompts, predict each counterfactual's change; at layer 0 a changed successor patched at the context
    columns transfers exactly TD(0)'s prediction (R^2 1, top td0) in the TD(0) model. (That nothing transfers in
    the decoys, whatever a candidate predicts, is `test_interchange_separates_td_from_the_decoys`.)"""
    from icrl_interp.families import registry
    from icrl_interp.interventions import causal as C
    from icrl_interp.verdicts import behaviour as V, causal_evidence

    cfg = task()
    batch = cfg.sample(48, np.random.default_rng(5))
    z = np.asarray(batch.prompt.z)
    test = np.arange(48) >= 24
    m = model("td0", cfg)
    site = C.site_of(m, 0, "resid_post", ROLES)
    out, feats = C.Runner(m, site, z.shape[1], 1).run(z, features=True)
    data = V.VerdictData(z=z, layout=cfg.model.layout, gamma=cfg.model.gamma, task_id=np.arange(48),
                         hints=registry.get("linear-td").hints, readouts={0: out}, output=out,
                         readout_kind="layout", acts={0: feats})
    # one readout: the candidates are fitted with up to default_steps(1) = 6 steps (TD(0) here needs 3)
    measure = causal_evidence.causation(m, roles=ROLES, draws=2, resamples=50, interchange=True)
    res = measure(data, 0, {"td0": np.eye(feats.shape[-1])[9]}, test)["interchange"]
    assert res["available"] and res["n_tasks"] == 24 and set(res) >= {"reward", "transition"}
    tr = res["transition"]
    assert tr["top"] == "td0" and tr["candidates"]["td0"]["r2"]["mean"] == pytest.approx(1.0, abs=1e-6)
    assert tr["candidates"]["td0"]["relative_error"]["mean"] < 1e-10
    assert not causal_evidence.causation(m, roles=ROLES, draws=2, resamples=50)(  # off by default
        data, 0, {"td0": np.eye(feats.shape[-1])[9]}, test).get("interchange")
