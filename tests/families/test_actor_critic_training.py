"""actor-critic's training recipe: the teacher is the reference actor-critic step and theta* mimics
it exactly; the evaluation and its trend series are the family's own (no SARSA-only metrics)."""
import numpy as np
import pytest

from icrl_interp.core.errors import UserError
from icrl_interp.families import actor_critic
from icrl_interp.train.recipes import actor_critic as AC
from icrl_interp.models import theta_star_model
from icrl_interp.train import config_for
from icrl_interp.train.trainer import build


def _cfg(**kw):
    return config_for("actor-critic", **{**dict(n_states=3, n_actions=2, n=12, tasks_per_step=10, eval_tasks=16,
                                                dtype="float64", alpha=2.0, critic_step=0.5, lam_std=0.7), **kw})


def test_teacher_is_the_reference_step_and_theta_star_mimics_it():
    cfg = _cfg()
    b = AC.sample_actor_critic(cfg, np.random.default_rng(0))
    d = 6
    want = actor_critic.reference_step(b.z.numpy(), d, d, cfg.gamma, cfg.alpha, cfg.critic_step)
    np.testing.assert_allclose(b.target.numpy(), want["output"], atol=1e-12)
    np.testing.assert_array_equal(b.w.numpy(), np.concatenate([want["w"], want["lam"]], -1))  # exact: copies
    for c in (1.0, -0.5):
        model = theta_star_model("actor-critic", d, m=d, gamma=cfg.gamma, alpha=cfg.alpha, critic_step=cfg.critic_step, c=c)
        assert AC.mimicking_loss(model, b).item() < 1e-24
    assert AC.TRAINING.objective(cfg) is AC.mimicking_loss


def test_model_and_task_of_the_config():
    cfg = _cfg()
    mc = AC.TRAINING.model_config(cfg)
    assert (mc.family, mc.d, mc.m, mc.alpha) == ("actor-critic", 6, 6, 2.0)
    task = AC.TRAINING.task(cfg)
    assert task["family"] == "actor-critic" and task["kind"] == "mdp" and task["w_scale"] == cfg.w_std


def test_evaluation_and_trend_series_of_theta_star():
    cfg = _cfg()
    model = theta_star_model("actor-critic", 6, m=6, gamma=cfg.gamma, alpha=cfg.alpha, critic_step=cfg.critic_step, c=1.5)
    m = AC.evaluate(model, cfg, np.random.default_rng(1))
    assert m["loss"] < 1e-24 and abs(m["scale_c"] - 1.5) < 1e-9 and m["rel_err_P12"] < 1e-9
    assert m["block_scales"]["critic"] == pytest.approx(1.5) and m["block_scales"]["actor"] == pytest.approx(1.5)
    assert "mod_null" not in m
    series = AC.TRAINING.trends.series([{"step": 1, **m}, {"step": 2, **m}])
    assert all(len(v) == 2 for v in series.values()) and "rel err P12" in series


def test_lazy_ablation_and_span_projection():
    model, masks = build(_cfg(lazy_ablation=True))
    two = slice(model.layout.slice("param_one").start, model.layout.d_model)
    assert masks == {} and np.abs(model.layer_params(0)["P"].detach().numpy()[two, two]).max() > 0
    with pytest.raises(UserError, match="span_projection is implemented for sarsa only, not actor-critic"):
        _cfg(span_projection=True)


def test_critic_weight_and_the_critic_rows_step_factor():
    """critic_weight multiplies the critic's squared error; critic_lr_factor k scales the init and every Adam step
    of V's critic rows by k (Adam on V / k), leaving every other entry as plain Adam leaves it."""
    import torch

    cfg = _cfg(critic_weight=9.0)
    b = AC.sample_actor_critic(cfg, np.random.default_rng(0))
    model = build(_cfg())[0]
    err = (actor_critic.readout(model(b.z), model.layout) - b.target).pow(2)
    want = (9.0 * err[:, :6].sum(-1) + err[:, 6:].sum(-1)).mean()
    assert abs(AC.mimicking_loss(model, b).item() - want.item()) < 1e-12
    # exact: the evaluation ignores the weight, so both are the same computation
    assert AC.evaluate(model, cfg, np.random.default_rng(1))["loss"] == AC.evaluate(model, _cfg(), np.random.default_rng(1))["loss"]
    k = 0.01
    plain_model, scaled = build(_cfg())[0], build(_cfg(critic_lr_factor=k))[0]
    rows = plain_model.layout.slice("w")
    Vp, Vs = plain_model.layer_params(0)["V"].detach(), scaled.layer_params(0)["V"].detach()
    torch.testing.assert_close(Vs[rows], k * Vp[rows], rtol=0, atol=1e-15)
    assert torch.equal(Vs[: rows.start], Vp[: rows.start]) and torch.equal(Vs[rows.stop :], Vp[rows.stop :])  # same init
    assert AC.TRAINING.update_constraint(plain_model, _cfg()) is None
    fix = AC.TRAINING.update_constraint(scaled, _cfg(critic_lr_factor=k))
    named = dict(scaled.named_parameters())
    before = {n: p.detach().clone() for n, p in named.items()}
    with torch.no_grad():
        for p in named.values():
            p.add_(1.0)  # a pretend optimizer step of +1 everywhere
    fix(named, before)
    V = named["blocks.0.attn.V"].detach()
    torch.testing.assert_close(V[rows] - before["blocks.0.attn.V"][rows], torch.full_like(V[rows], k))
    untouched = V[: rows.start] - before["blocks.0.attn.V"][: rows.start]
    torch.testing.assert_close(untouched, torch.ones_like(untouched))
    torch.testing.assert_close(named["blocks.0.attn.P"].detach(), before["blocks.0.attn.P"] + 1.0)
    with pytest.raises(UserError, match="critic_lr_factor must be positive"):
        _cfg(critic_lr_factor=0.0)


def test_parameter_scale_mixture():
    """lam_std_max / w_std_max: one std per prompt, log-uniform in [std, std_max]; without them the draw is the
    original one, bit for bit."""
    from icrl_interp.train.recipes import sarsa as sarsa_training

    x = sarsa_training.draw_params(0.5, 4.0, 4000, 200, np.random.default_rng(0))
    std = x.std(-1)
    # per-prompt sample stds of 200 entries: within ~15% of a scale in [0.5, 4], median at the geometric mean
    assert std.min() > 0.4 and std.max() < 4.6 and abs(np.median(np.log(std)) - np.log(np.sqrt(2.0))) < 0.1
    np.testing.assert_array_equal(sarsa_training.draw_params(0.5, None, 3, 4, np.random.default_rng(1)),  # same draws
                                  0.5 * np.random.default_rng(1).standard_normal((3, 4)))
    b = AC.sample_actor_critic(_cfg(lam_std_max=5.0, batch=400), np.random.default_rng(2))
    lam_std, w_std = b.w.numpy()[:, 6:].std(-1), b.w.numpy()[:, :6].std(-1)
    assert lam_std.max() > 3.0 and w_std.max() < 1.5  # lam spreads over the mixture, w keeps its one std
    with pytest.raises(UserError, match="lam_std_max must be at least lam_std"):
        _cfg(lam_std_max=0.1)
