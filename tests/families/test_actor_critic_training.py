"""actor-critic's training recipe: the teacher is the reference actor-critic step and theta* mimics
it exactly; the evaluation and its trend series are the family's own (no SARSA-only metrics)."""
import numpy as np
import pytest

from icrl_interp.errors import UserError
from icrl_interp.families import actor_critic, actor_critic_training as AC
from icrl_interp.models import theta_star_model
from icrl_interp.train import config_for
from icrl_interp.train.trainer import build


def _cfg(**kw):
    return config_for("actor-critic", **{**dict(n_states=3, n_actions=2, n=12, batch=10, eval_tasks=16,
                                                dtype="float64", alpha=2.0, beta=0.5, lam_std=0.7), **kw})


def test_teacher_is_the_reference_step_and_theta_star_mimics_it():
    cfg = _cfg()
    b = AC.sample_actor_critic(cfg, np.random.default_rng(0))
    d = 6
    want = actor_critic.reference_step(b.z.numpy(), d, d, cfg.gamma, cfg.alpha, cfg.beta)
    np.testing.assert_allclose(b.target.numpy(), want["output"], atol=1e-12)
    np.testing.assert_array_equal(b.w.numpy(), np.concatenate([want["w"], want["lam"]], -1))
    for c in (1.0, -0.5):
        model = theta_star_model("actor-critic", d, m=d, gamma=cfg.gamma, alpha=cfg.alpha, beta=cfg.beta, c=c)
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
    model = theta_star_model("actor-critic", 6, m=6, gamma=cfg.gamma, alpha=cfg.alpha, beta=cfg.beta, c=1.5)
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
