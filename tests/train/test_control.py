"""In-context control (Algorithm 1): theta* tracks the analytic teacher exactly in closed loop,
returns are exact (not sampled), the loop continues from the last state, tracking metrics have
known answers, and the CLI writes its JSON atomically and refuses bad input in one line."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from icrl_interp.models import checkpoint
from icrl_interp.train import control
from icrl_interp.tasks import envs
from icrl_interp.cli import main
from icrl_interp.models.construct import construct
from icrl_interp.families import actor_critic, sarsa
from icrl_interp.models import ModelConfig, theta_star_model

from helpers import raises_user

SMALL = dict(mdps=6, iterations=12, n=16)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("control")
    task = {"kind": "mdp", "n": 16, "n_states": 3, "n_actions": 2}
    sarsa = checkpoint.save(theta_star_model("sarsa", 6, gamma=0.5, alpha=1.0, c=-2.0), {"n": 16, "task": task},
                            root / "sarsa")
    ac = construct("actor-critic", {"n_states": 3, "n_actions": 2, "n": 16, "alpha": 20.0, "critic_step": 0.5, "scale": 0.5},
                   root / "ac")
    half = theta_star_model("sarsa", 6, gamma=0.5, alpha=1.0)
    with torch.no_grad():
        half.blocks[0].attn.V.mul_(0.5)  # outputs w + (1/2) * the SARSA step, while config.alpha says 1
    half.origin = {"kind": "user"}
    half = checkpoint.save(half, {"n": 16, "task": task}, root / "half")
    return {"sarsa": sarsa, "ac": ac, "half": half}


@pytest.mark.parametrize("name", ["sarsa", "ac"])
def test_theta_star_tracks_the_teacher_exactly(ckpts, name):
    res = control.run_checkpoint(ckpts[name], control.ControlConfig(**SMALL), progress=False)
    tr = res["tracking"]
    # exact: shares of counts (ties between actions are judged with the package's own tolerance)
    assert tr["greedy_agreement"]["mean"] == 1.0 and tr["greedy_agreement_min"] == 1.0
    assert tr["rel_param_distance_max"] < 1e-12 and tr["final_param_distance"] < 1e-12
    assert abs(res["transformer_minus_teacher"]["mean"]) < 1e-12 and len(res["per_mdp"]["teacher"]) == SMALL["mdps"]
    np.testing.assert_allclose(res["curves"]["transformer"]["mean"], res["curves"]["teacher"]["mean"], atol=1e-12)
    r = res["returns"]
    assert r["oracle"]["mean"] >= r["teacher"]["mean"] - 1e-12 and r["oracle"]["mean"] >= r["random"]["mean"]
    assert res["settings"]["n"] == 16 and len(res["curves"]["iteration"]) == SMALL["iterations"] + 1


def test_known_answer_tracking_of_a_half_step_model(ckpts):
    """A model that takes half the teacher's step from w = 0 is at relative distance exactly 1/2 at update 1."""
    config, _ = checkpoint.read(ckpts["half"])
    algo = control.algorithm_for(config)
    cfg = control.ControlConfig(mdps=5, iterations=3, n=16)
    mdp = control.draw_mdps(cfg, algo)
    trace = control.closed_loop(mdp, algo, 16, 3, np.random.default_rng(0), control.model_step(checkpoint.load(ckpts["half"]), algo))
    np.testing.assert_allclose(trace.rel_distance[:, 0], 0.5, atol=1e-12)
    # half a step from 0 has the same greedy actions as the full step: agreement 1 at update 1
    assert np.all(trace.agreement[:, 0] == 1.0)  # exact: a share of counts


def test_returns_are_exact_policy_values():
    algo = sarsa.Control(3, 2, 0.5, 1.0, 1.0, epsilon=0.2)
    cfg = control.ControlConfig(mdps=4, iterations=5, n=8)
    mdp = control.draw_mdps(cfg, algo)
    trace = control.closed_loop(mdp, algo, 8, 5, np.random.default_rng(1))
    pi = algo.policy(trace.params)
    # independent: iterate the Bellman operator of pi to convergence
    v = np.zeros((4, 3))
    for _ in range(200):
        v = np.einsum("bsa,bsa->bs", pi, mdp.R) + 0.5 * np.einsum("bsa,bsat,bt->bs", pi, mdp.P, v)
    np.testing.assert_allclose(trace.returns[:, -1], np.einsum("bs,bs->b", mdp.start, v), atol=1e-12)
    # w = 0: ties broken towards action 0, so the first policy is (1 - eps + eps/2) on action 0
    assert np.allclose(algo.policy(np.zeros((1, 6)))[0, :, 0], 0.9)


def test_loop_continues_from_the_last_state(monkeypatch):
    algo = actor_critic.Control(3, 2, 0.5, 5.0, 1.0)
    cfg = control.ControlConfig(mdps=7, iterations=4, n=5)
    mdp = control.draw_mdps(cfg, algo)
    seen = []
    original = envs.MDPBatch.sample

    def spy(self, pi, n_steps, rng, start_states=None):
        traj = original(self, pi, n_steps, rng, start_states)
        seen.append((None if start_states is None else start_states.copy(), traj.states.copy()))
        return traj

    monkeypatch.setattr(envs.MDPBatch, "sample", spy)
    control.closed_loop(mdp, algo, 5, 4, np.random.default_rng(0))
    assert len(seen) == 4
    for (_, prev), (start, cur) in zip(seen, seen[1:]):
        np.testing.assert_array_equal(start, prev[:, -1])  # states: integers
        np.testing.assert_array_equal(cur[:, 0], prev[:, -1])


def test_teacher_learns_on_held_out_mdps():
    algo = sarsa.Control(4, 3, 0.5, 1.0, 1.0, epsilon=0.1)
    cfg = control.ControlConfig(mdps=24, iterations=60, n=32, seed=3)
    mdp = control.draw_mdps(cfg, algo)
    trace = control.closed_loop(mdp, algo, 32, 60, np.random.default_rng(0))
    random = mdp.discounted_return(np.full(mdp.R.shape, 1 / 3)).mean()
    _, _, oracle = mdp.optimal()
    # U(-1, 1) rewards, gamma 0.5: random ~ 0, oracle ~ 1; the teacher closes most of the gap
    assert trace.returns[:, -1].mean() > random + 0.5 * (oracle.mean() - random)
    assert trace.greedy_returns.mean() <= oracle.mean() + 1e-12


def test_normal_rewards_and_mdp_stream_are_seeded():
    algo = sarsa.Control(3, 2, 0.5, 1.0, 1.0)
    a = control.draw_mdps(control.ControlConfig(mdps=3, seed=5, rewards="normal"), algo)
    b = control.draw_mdps(control.ControlConfig(mdps=3, seed=5, rewards="normal"), algo)
    c = control.draw_mdps(control.ControlConfig(mdps=3, seed=5), algo)
    np.testing.assert_array_equal(a.R, b.R)  # exact here and below: the same draws from the same seed
    np.testing.assert_array_equal(a.P, c.P)  # same transitions, other rewards
    assert np.abs(c.R).max() <= 1 and np.abs(a.R).max() > 0 and not np.allclose(a.R, c.R)


def test_cli_writes_json_and_prints_table(ckpts, tmp_path, capsys):
    out = tmp_path / "sub" / "res.json"
    out.parent.mkdir()  # commands create no missing parent directories
    fig = tmp_path / "ret.png"
    code = main(["control", str(ckpts["ac"]), "--mdps", "3", "--iterations", "4", "--prompt-seed", "2", "--json", str(out),
                 "--figure", str(fig), "--no-progress"])
    assert code == 0
    text = capsys.readouterr().out
    for word in ("random policy", "analytic teacher", "transformer", "oracle", "greedy-action agreement"):
        assert word in text
    res = json.loads(out.read_text())
    assert res["family"] == "actor-critic" and res["settings"]["mdps"] == 3 and res["settings"]["seed"] == 2
    assert res["settings"]["alpha"] == 20.0 and res["settings"]["beta"] == 0.5
    assert sorted(res["returns"]) == ["oracle", "random", "teacher", "transformer"]
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in out.parent.iterdir()] == ["res.json"]  # no temp files left


def test_cli_refuses_bad_input(ckpts, tmp_path, capsys):
    lin = checkpoint.save(theta_star_model("linear-td", 3), {"n": 10}, tmp_path / "lin")
    assert main(["control", str(lin), "--mdps", "2", "--iterations", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "linear-td checkpoint" in err[0] and "sarsa, actor-critic" in err[0]
    assert main(["control", str(ckpts["sarsa"]), "--mdps", "0"]) == 2
    assert "mdps must be a positive integer" in capsys.readouterr().err
    assert main(["control", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_config_validation():
    with raises_user("epsilon"):
        control.ControlConfig(epsilon=1.5).validate()
    with raises_user("reward distribution"):
        control.ControlConfig(rewards="cauchy").validate()
    with raises_user("n must be"):
        control.ControlConfig(n=0).validate()
    with raises_user("d = 12", "n_states*n_actions = 36"):
        control.algorithm_for(checkpoint.make_config(ModelConfig("sarsa", 12, gamma=0.5), {"task": {"kind": "mdp"}}))


def test_divergence_is_recorded_not_fatal():
    """An output with Inf freezes that MDP's parameters and is reported; the other MDPs carry on."""
    algo = sarsa.Control(3, 2, 0.5, 1.0, 1.0)
    cfg = control.ControlConfig(mdps=4, iterations=5, n=8)
    mdp = control.draw_mdps(cfg, algo)
    calls = []

    def step(z):
        calls.append(1)
        out = z[:, -1, -6:].copy() + 0.1  # w + 0.1: finite for every MDP ...
        if len(calls) >= 3:
            out[1] = np.inf  # ... until update 3 of MDP 1
        return out

    trace = control.closed_loop(mdp, algo, 8, 5, np.random.default_rng(0), step)
    np.testing.assert_array_equal(trace.diverged_at, [-1, 3, -1, -1])
    np.testing.assert_allclose(trace.params[1], 0.2)  # frozen after two finite updates
    np.testing.assert_allclose(trace.params[0], 0.5)
    assert np.all(np.isnan(trace.agreement[1, 2:])) and not np.any(np.isnan(trace.agreement[[0, 2, 3]]))
    assert np.all(np.isfinite(trace.returns))


@pytest.mark.parametrize("family", ["sarsa", "actor-critic"])
def test_theta_star_on_random_features_tracks_the_teacher_exactly(tmp_path, family):
    """With a random feature map the held-out MDPs get their own features (stream 2 of the seed), the rule acts
    on them, and theta* still reproduces the teacher to rounding."""
    opts = {"n_states": 3, "n_actions": 2, "n": 16, "d": 4, "sa_features": "gaussian"}
    if family == "actor-critic":
        opts.update(alpha=20.0, critic_step=0.1)
    ck = construct(family, opts, tmp_path / family)
    res = control.run_checkpoint(ck, control.ControlConfig(**SMALL), progress=False)
    # the agreement is a share of counts: exact
    assert res["tracking"]["rel_param_distance_max"] < 1e-12 and res["tracking"]["greedy_agreement_min"] == 1.0
    config, _ = checkpoint.read(ck)
    algo = control.algorithm_for(config)
    mdp = control.draw_mdps(control.ControlConfig(**SMALL), algo)
    hot = control.draw_mdps(control.ControlConfig(**SMALL), sarsa.Control(3, 2, 0.5, 1.0, 1.0))
    np.testing.assert_array_equal(mdp.P, hot.P)  # the same MDPs as for one-hot, with features added (same draws)
    np.testing.assert_array_equal(mdp.R, hot.R)
    assert mdp.phi.shape == (SMALL["mdps"], 3, 2, 4) and hot.phi is None
    with raises_user("must be bound to MDPs"):
        algo.policy(np.zeros((1, algo.size)))
    bound = algo.bind(mdp)
    w = np.random.default_rng(0).standard_normal((SMALL["mdps"], algo.size))
    lin = w[:, :4] if family == "sarsa" else w[:, 4:]
    np.testing.assert_allclose(bound.action_values(w), np.einsum("bsad,bd->bsa", mdp.phi, lin), atol=1e-14)
    with raises_user("one-hot"):
        algo.bind(hot)
