"""The algorithm verdict (icrl_interp.verdicts.behaviour, causal_verdict, commands/verdict): known answers.

* theta* of every registered family is attributed to its own algorithm (`Hints.algorithm`) with a margin
  whose interval lies above 0;
* outputs made by a candidate are attributed to that candidate, whichever it is (a verdict that always
  says TD fails), and noise is "none fits";
* the probes' evidence points at the candidate whose internal quantity the activations hold.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from icrl_interp.verdicts import candidates as C
from icrl_interp import cli
from icrl_interp.models import construct
from icrl_interp.families import registry
from icrl_interp.verdicts import behaviour as VD
from icrl_interp.core.errors import UserError
from icrl_interp.families import linear_td

SMALL = {
    "linear-td": {"d": 3, "n": 16, "n_layers": 2, "n_states": 6},
    "softmax-td": {"n_states": 4, "n": 16, "n_layers": 3},
    "sarsa": {"n_states": 3, "n_actions": 2, "n": 24},
    "actor-critic": {"n_states": 3, "n_actions": 2, "n": 24},
}
"""Small construct options per family (a family not listed runs with its defaults)."""


@pytest.fixture(scope="module")
def star(tmp_path_factory):
    """star(family) -> (theta* model, its task, a recording of it on 128 tasks), made once per module."""
    from icrl_interp.models import theta_star_model
    from icrl_interp.recording.recorder import record_model

    made = {}

    def get(family: str):
        if family not in made:
            options = SMALL.get(family, {})
            plan = construct.options(family, options).plan()
            model = theta_star_model(family, **plan.model, **plan.constants)
            config = construct.task_config(family, options)
            path = tmp_path_factory.mktemp("star") / f"{family}.h5"
            record_model(model, config, path, tasks=128, progress=False, baseline="none")
            made[family] = (model, config, path)
        return made[family]

    return get


def test_every_built_in_family_names_the_algorithm_its_theta_star_runs():
    for name in registry.names():
        fam = registry.get(name)
        if fam.sample.__module__ in registry.BUILTIN:
            assert fam.hints.algorithm in C.CANDIDATES, name


@pytest.mark.parametrize("family", [n for n in registry.names() if registry.get(n).hints.algorithm])
def test_theta_star_is_attributed_to_its_own_algorithm(family, star):
    _, _, path = star(family)
    v = VD.run(VD.load(path), resamples=200, steps=None)
    own = registry.get(family).hints.algorithm
    assert v["verdict"]["best"] == own, v["verdict"]
    assert v["verdict"]["clear"] and v["verdict"]["margin_ci"][0] > 0
    assert v["output"]["behaviour"][own]["r2"] > 1 - 1e-8  # exact: theta* runs it
    for layer in v["layers"]:
        assert layer["verdict"]["best"] == own
    assert v["candidates"][own]["applicable"]
    growth = v["step_growth"][own]["steps"]
    if len(growth) > 1:  # one more step per layer
        assert growth == list(range(1, len(growth) + 1))


# ------------------------------------------------------------------ synthetic models: the mechanism
def synthetic(make_output, tasks=240, n=14, seed=0, acts=None):
    """VerdictData of linear-td prompts whose 'model' output (and layer readout) is make_output(transitions)."""
    rng = np.random.default_rng(seed)
    from icrl_interp.tasks import envs

    mrp = envs.sample_boyan_chains(tasks, 6, 3, 0.9, rng, "random", 1.0, "uniform")
    traj = mrp.sample(n, rng)
    p = linear_td.prompt_from_mrp(mrp, traj, rng.integers(0, 6, size=tasks))
    data = VD.VerdictData(z=p.z, layout=p.layout, gamma=0.9, task_id=np.arange(tasks),
                          hints=registry.get("linear-td").hints, readouts={}, output=np.zeros((tasks, 1)),
                          readout_kind="layout", states=p.states, task_family="linear-td")
    tr = VD.transitions(data)
    out = make_output(tr, rng)
    data.readouts, data.output = {0: out}, out
    if acts is not None:
        data.acts = {0: acts(tr, rng)}
    return data


GENERATORS = {
    "td0": lambda tr, rng: C.td_lambda(tr, 0.7, 2).outputs[:, 2],
    "mc_regression": lambda tr, rng: C.mc_regression(tr, 0.4, 3).outputs[:, 3],
    "lstd": lambda tr, rng: C.lstd(tr, {}, 0).outputs[:, 0],
    "td_lambda_0.5": lambda tr, rng: C.td_lambda(tr, 0.5, 2, lam=0.5).outputs[:, 2],
    "residual_gradient": lambda tr, rng: C.residual_gradient(tr, 1.0, 2).outputs[:, 2],
}


@pytest.mark.parametrize("algorithm", sorted(GENERATORS))
def test_the_verdict_follows_the_algorithm_that_made_the_output(algorithm):
    data = synthetic(GENERATORS[algorithm])
    v = VD.run(data, resamples=100, steps=4)
    assert v["verdict"]["best"] == algorithm, v["verdict"]
    assert v["verdict"]["fits"] and v["verdict"]["margin_ci"][0] > 0
    assert v["output"]["verdict"]["runner_up"] != algorithm


def test_same_seed_same_verdict_and_the_seed_moves_the_split():
    data = synthetic(GENERATORS["td0"], tasks=60)
    a, b = VD.run(data, resamples=50, steps=3), VD.run(data, resamples=50, steps=3)
    assert json.dumps(a, default=str) == json.dumps(b, default=str)  # exact: the same computation rerun
    c = VD.run(data, resamples=50, steps=3, seed=1)
    assert c["settings"]["n_test_prompts"] != a["settings"]["n_test_prompts"] or \
        c["output"]["verdict"]["margin"] != a["output"]["verdict"]["margin"]


def test_noise_fits_nothing():
    data = synthetic(lambda tr, rng: rng.standard_normal((tr.shape[0], 1)))
    v = VD.run(data, resamples=100, steps=4)
    assert v["verdict"]["best"] is None and not v["verdict"]["fits"]
    assert v["verdict"]["text"].startswith("none fits")


def test_probes_point_at_the_candidate_whose_error_the_activations_hold():
    def acts(tr, rng):
        delta = C.td_lambda(tr, 0.7, 2).internals["td_error"][:, 1]  # td0's error after one step
        noise = rng.standard_normal(delta.shape + (3,))
        return np.concatenate([delta[..., None], noise], -1)

    data = synthetic(GENERATORS["td0"], acts=acts)
    v = VD.run(data, resamples=100, steps=4, candidates=["td0", "mc_regression", "residual_gradient"])
    rep = v["layers"][0]["representation"]
    assert rep["available"]
    # layer 0's readout is td0 at step 2; its fitted internals are at step 2, the activations hold step 1:
    # the probes still rank td0's error first, and say the random-init baseline is missing
    td0 = rep["candidates"]["td0"]["quantities"]["td_error"]
    assert td0["r2_random_init"] is None and td0["r2_input"] is not None
    assert v["layers"][0]["verdict"]["representation_top"] == "td0"
    assert v["layers"][0]["causation"]["available"] is False


def test_bad_options_are_user_errors():
    data = synthetic(GENERATORS["td0"], tasks=40)
    with pytest.raises(UserError, match="test fraction"):
        VD.run(data, test_fraction=1.5)
    with pytest.raises(UserError, match="unknown candidate"):
        VD.run(data, candidates=["sarsa_lambda"])
    with pytest.raises(UserError, match="no candidate applies"):
        VD.run(data, candidates=["q_learning"])


def test_cli_on_a_recording(tmp_path, capsys, star):
    _, _, path = star("linear-td")
    out, fig = tmp_path / "v.json", tmp_path / "v.png"
    assert cli.main(["verdict", str(path), "--json", str(out), "--figure", str(fig), "--bootstrap", "50"]) == 0
    v = json.loads(out.read_text())
    assert v["schema"] == VD.SCHEMA and v["verdict"]["best"] == "td0" and fig.stat().st_size > 0
    assert "model: td0" in capsys.readouterr().out
    assert v["layers"][0]["causation"]["available"] is False and "needs the model" in v["layers"][0]["causation"]["reason"]


def test_python_api_with_the_model_adds_causal_evidence(star):
    import icrl_interp

    model, config, path = star("linear-td")
    v = icrl_interp.verdict(path, model=model, bootstrap=50, causal_draws=4, causal_tasks=12)
    cau = v["layers"][0]["causation"]
    assert cau["available"] and cau["random_draws"] == 4 and "td0" in cau["candidates"]
    assert cau["candidates"]["td0"]["excess_ci"] is not None
    last = v["layers"][-1]["causation"]  # nothing after the last layer reads the context columns
    assert all(c["output_change"] == 0 for c in last["candidates"].values())  # exact: within the rounding floor
    assert "no later layer reads" in last["note"] and last["top"] is None
    # without a recording: the model is recorded on its task first
    w = icrl_interp.verdict(model=model, task=config, tasks=48, bootstrap=50, causal=False, progress=False)
    assert w["verdict"]["best"] == "td0" and w["source"].endswith("on linear-td")
    assert w["layers"][0]["causation"]["available"] is False


def test_control_transitions_read_every_next_action_from_one_hot_prompts():
    from icrl_interp.models.config import CheckpointConfig, ModelConfig
    from icrl_interp.tasks.sampling import TaskSpec

    cfg = CheckpointConfig(model=ModelConfig(family="sarsa", d=6, n_layers=1, gamma=0.5, alpha=1.0),
                           task=TaskSpec.from_dict({"family": "sarsa", "kind": "mdp", "n": 10, "n_states": 3,
                                                    "n_actions": 2}), origin={"kind": "theta_star"})
    pb = cfg.sample(12, np.random.default_rng(3))
    data = VD.VerdictData(z=pb.prompt.z, layout=cfg.model.layout, gamma=0.5, task_id=np.arange(12),
                          hints=registry.get("sarsa").hints, readouts={}, output=np.zeros((12, 6)),
                          readout_kind="layout", policy=pb.tasks["policy"])
    tr = VD.transitions(data)
    s = np.asarray(pb.prompt.states)
    # the next state of column i is the state of column i + 1; its every action's features are one-hot rows
    s_next = np.argmax(tr.next_options[:, :-1, 0], -1) // 2
    np.testing.assert_array_equal(s_next, s[:, 1:-1])
    np.testing.assert_allclose(tr.next_policy[:, :-1], pb.tasks["policy"][np.arange(12)[:, None], s[:, 1:-1]])
    assert np.all((tr.next_options == tr.phi_next[:, :, None]).all(-1).any(-1))  # the sampled action is one of them
    # one SARSA step from the prompt's w is the reference teacher
    np.testing.assert_allclose(C.td_lambda(tr, 1.0, 1).outputs[:, 1], pb.reference["output"], atol=1e-12)


def test_a_model_without_a_readout_gets_a_tuned_linear_lens_per_layer():
    data = synthetic(GENERATORS["mc_regression"], tasks=120)
    rng = np.random.default_rng(5)
    out = data.output
    mix = rng.standard_normal((4, 4))  # the output sits in a random direction of a 4-wide residual stream
    data.resid_last = {0: np.concatenate([out, rng.standard_normal((out.shape[0], 3))], 1) @ mix}
    data.readouts, data.readout_kind = {}, "tuned-linear"
    v = VD.run(data, resamples=50, steps=4)
    assert v["readout"]["kind"] == "tuned-linear" and v["layers"][0]["verdict"]["best"] == "mc_regression"
    assert v["layers"][0]["behaviour"]["mc_regression"]["r2"] > 0.99
