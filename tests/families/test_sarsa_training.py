"""sarsa's training recipe: the teacher is the reference SARSA update and theta* mimics it; the lazy
blocks stay exactly zero under training and move under the ablation."""
import json

import numpy as np
from safetensors.numpy import load_file

from icrl_interp.tasks import reference
from icrl_interp.train.recipes import sarsa as S
from icrl_interp.models import theta_star_model
from icrl_interp.train import config_for, list_checkpoints, train
from icrl_interp.train.util import lazy_slice


def test_sarsa_teacher_is_the_reference_update_and_theta_star_mimics_it():
    cfg = config_for("sarsa", n_states=3, n_actions=2, n=16, tasks_per_step=20, epsilon=0.3, dtype="float64")
    b = S.sample_sarsa(cfg, np.random.default_rng(0))
    d = 6
    z = b.z.numpy()
    want = reference.sarsa_update(z[:, :-1, :d], z[:, :-1, d : 2 * d] / cfg.gamma, z[:, :-1, 2 * d], z[:, -1, 2 * d + 2 :],
                                  cfg.gamma, cfg.alpha)
    np.testing.assert_allclose(b.target.numpy(), want, atol=1e-12)
    assert np.all(z[:, -1, 2 * d + 1] == 1.0)  # exact: a literal 1
    for c in (1.0, -2.5):
        model = theta_star_model("sarsa", d, gamma=cfg.gamma, alpha=cfg.alpha, c=c)
        assert S.teacher_mimicking(model, b).item() < 1e-24
    # a wrong step alpha' leaves exactly ||(alpha'/alpha - 1)(target - w)||^2
    model = theta_star_model("sarsa", d, gamma=cfg.gamma, alpha=1.5)
    want = np.mean(np.sum((0.5 * (b.target - b.w).numpy()) ** 2, -1))
    assert abs(S.teacher_mimicking(model, b).item() - want) < 1e-12
    assert S.TRAINING.objective(cfg) is S.teacher_mimicking


def test_evaluation_of_theta_star_is_on_the_manifold():
    cfg = config_for("sarsa", n_states=3, n_actions=2, n=16, eval_tasks=16, dtype="float64")
    m = S.evaluate(theta_star_model("sarsa", 6, gamma=cfg.gamma, alpha=cfg.alpha, c=-2.0), cfg, np.random.default_rng(1))
    assert m["loss"] < 1e-24 and abs(m["scale_c"] + 2.0) < 1e-9 and m["rel_err_P12"] < 1e-9
    assert m["lazy_P22"] == 0.0 and m["lazy_V22"] == 0.0  # exact: masked to literal zeros
    series = S.TRAINING.trends.series([{"step": 1, **m}])
    assert "rel err P12 mod u" in series and S.TRAINING.trends.log_scale


def _cfg(**kw):
    return config_for("sarsa", **{**dict(n_states=2, n_actions=2, n=8, tasks_per_step=4, eval_tasks=4, steps=30,
                                         checkpoint_every=10, log_every=1, lr=0.05), **kw})


def _params(step_dir):
    return load_file(str(step_dir / "model.safetensors"))


def test_lazy_blocks_stay_exactly_zero_and_drift_under_the_ablation(tmp_path):
    run = train(_cfg(), tmp_path / "lazy", progress=False, evaluate=False)
    two = lazy_slice(run.model.layout)
    assert two == slice(run.model.layout.slice("param_one").start, run.model.layout.d_model)
    for _, d in list_checkpoints(run.run_dir):
        p = _params(d)
        # exact: the trainer masks the lazy blocks to literal zeros
        assert np.all(p["blocks.0.attn.P"][two, two] == 0.0) and np.all(p["blocks.0.attn.V"][two, two] == 0.0)
    assert all(json.loads(x)["lazy_max_abs"] == 0.0 for x in (run.run_dir / "metrics.jsonl").read_text().splitlines())
    abl = train(_cfg(lazy_ablation=True), tmp_path / "abl", progress=False, evaluate=False)
    first, last = (_params(d) for _, d in (list_checkpoints(abl.run_dir)[0], list_checkpoints(abl.run_dir)[-1]))
    for name in ("blocks.0.attn.P", "blocks.0.attn.V"):
        assert np.abs(last[name][two, two]).max() > 0
    assert not np.array_equal(first["blocks.0.attn.V"][two, two], last["blocks.0.attn.V"][two, two])  # they move


def test_update_constraint_only_with_span_projection():
    from icrl_interp.train.trainer import build

    model = build(_cfg())[0]
    assert S.TRAINING.update_constraint(model, _cfg()) is None
    assert callable(S.TRAINING.update_constraint(model, _cfg(span_projection=True)))
