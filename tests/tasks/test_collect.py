"""Source agents collecting learning histories (icrl_interp.tasks.collect) and `icrl-interp collect`: seeding per
history, the agents' parameters and policies, known answers on the bandit and Dark Room, the CLI end to end, and
every command line and Python block of docs/episodes.md run."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from icrl_interp import cli  # noqa: E402
from icrl_interp.tasks import collect as C  # noqa: E402
from icrl_interp.tasks import learners  # noqa: E402
from icrl_interp.tasks.episodes import ARRAYS, read_episodes  # noqa: E402

from helpers import raises_user, se_tolerance  # noqa: E402
from test_doc_commands import argv_of, doc_commands  # noqa: E402

DARK = "icrl_interp/DarkRoom-v0"
REPO = Path(__file__).resolve().parents[2]


def same_arrays(a, b) -> bool:
    return all(np.array_equal(getattr(a, n), getattr(b, n)) for n in ARRAYS)


def test_same_seed_same_histories_and_a_history_is_reproduced_alone():
    kw = dict(histories=4, steps=60, env_kwargs={"size": 5, "horizon": 10})
    a = C.collect(DARK, "q-learning", seed=3, **kw)
    assert same_arrays(a, C.collect(DARK, "q-learning", seed=3, **kw))
    assert not np.array_equal(a.actions, C.collect(DARK, "q-learning", seed=4, **kw).actions)
    alone = C.collect(DARK, "q-learning", seed=3, **{**kw, "histories": [2]})
    assert same_arrays(alone, a.select([2])) and alone.meta["tasks"] == [a.meta["tasks"][2]]
    assert len({tuple(t["goal"]) for t in a.meta["tasks"]}) > 1  # each history its own goal
    assert a.meta["histories"] == [0, 1, 2, 3] and alone.meta["histories"] == [2]


def test_meta_names_the_source():
    e = C.collect(DARK, "sarsa", histories=2, steps=5, seed=1, env_kwargs={"size": 3}, epsilon=0.2, gamma=0.5)
    m = e.meta
    assert (m["env"], m["env_kwargs"], m["agent"], m["seed"], m["policy"]) == (DARK, {"size": 3}, "sarsa", 1,
                                                                              "epsilon-greedy")
    assert m["params"] == {"alpha": 0.1, "gamma": 0.5, "beta": 1.0, "epsilon": 0.2}
    assert m["gymnasium_version"] and m["package_version"] and len(m["tasks"]) == 2


def test_dark_room_histories_pay_only_on_the_goal_and_end_at_the_horizon():
    e = C.collect(DARK, "random", histories=3, steps=45, seed=0, env_kwargs={"size": 4, "horizon": 9})
    goals = np.array([g["goal"][1] * 4 + g["goal"][0] for g in (t for t in e.meta["tasks"])])
    np.testing.assert_array_equal(e.rewards, (e.next_observations == goals[:, None]).astype(float))  # exact: 0 or 1
    assert not e.terminations.any() and np.array_equal(np.flatnonzero(e.truncations[0]), np.arange(8, 45, 9))
    starts = e.episode_step == 0
    assert np.all(e.observations[starts] == 2 * 4 + 2)  # every episode starts at the centre
    inside = ~e.dones[:, :-1]
    assert np.array_equal(e.observations[:, 1:][inside], e.next_observations[:, :-1][inside])  # s_{t+1} = s'_t


def test_bandit_mean_rewards_converge_to_the_arm_probabilities():
    probs = np.array([0.2, 0.5, 0.8])
    e = C.collect("icrl_interp/Bandit-v0", "random", histories=8, steps=400, seed=0,
                  env_kwargs={"arms": 3, "probs": probs.tolist()})
    counts = np.array([(e.actions == a).sum() for a in range(3)])
    means = np.array([e.rewards[e.actions == a].mean() for a in range(3)])
    assert np.all(np.abs(means - probs) <= se_tolerance(probs, counts))
    assert np.all(np.abs(counts / counts.sum() - 1 / 3) <= se_tolerance(np.full(3, 1 / 3), np.full(3, counts.sum())))
    assert e.terminations.all() and np.all(e.episode_step == 0)


def test_a_learning_agent_learns_and_epsilon_sets_its_exploration():
    """Q-learning on a bandit whose arm 2 always pays: it comes to choose arm 2; epsilon = 1 keeps it uniform."""
    kw = dict(histories=6, steps=300, seed=0, env_kwargs={"arms": 3, "probs": [0.0, 0.0, 1.0]})
    e = C.collect("icrl_interp/Bandit-v0", "q-learning", alpha=0.5, beta=8.0, **kw)
    assert (e.actions[:, -100:] == 2).mean() > 0.95
    u = C.collect("icrl_interp/Bandit-v0", "q-learning", epsilon=1.0, **kw)
    share = (u.actions == 2).mean()
    assert abs(share - 1 / 3) <= se_tolerance(np.array(1 / 3), np.array(u.actions.size))


def test_sample_and_epsilon_greedy_known_answers():
    p = np.tile([[0.2, 0.3, 0.5]], (5, 1))
    np.testing.assert_array_equal(learners.sample(p, np.array([0.1, 0.2, 0.49, 0.51, 0.99])), [0, 0, 1, 2, 2])
    np.testing.assert_allclose(C.epsilon_greedy(np.array([[1.0, 3.0, 3.0], [0.0, -1.0, 2.0]]), 0.3),
                               [[0.1, 0.45, 0.45], [0.1, 0.1, 0.8]], rtol=0, atol=4 * np.finfo(float).eps)


def test_agent_parameters_are_checked():
    assert C.agent_params("model-based") == {"gamma": 0.9, "beta": 1.0}
    assert C.agent_params("sarsa-lambda", lam=0.5)["lam"] == 0.5
    assert C.agent_params("random") == {}
    with raises_user("agent model-based has no parameter alpha"):
        C.agent_params("model-based", alpha=0.2)
    with raises_user("agent random has no parameter epsilon"):
        C.agent_params("random", epsilon=0.1)
    with raises_user("epsilon must lie in [0, 1]"):
        C.agent_params("sarsa", epsilon=1.5)
    with raises_user("unknown agent"):
        C.agent_params("dqn")


def test_collect_refuses_what_it_cannot_run():
    with raises_user("learning agents need Discrete observations"):
        C.collect("CartPole-v1", "q-learning", histories=1, steps=2)
    with raises_user("histories must be"):
        C.collect(DARK, "random", histories=[1, 1], steps=2)
    with raises_user("steps per history must be an integer >= 1"):
        C.collect(DARK, "random", histories=1, steps=0)
    box = C.collect("CartPole-v1", "random", histories=2, steps=30, seed=0)
    assert box.observations.shape == (2, 30, 4) and box.n_observations is None


# ------------------------------------------------------------------ the CLI
def test_cli_writes_the_file_and_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "e.h5"
    argv = ["collect", "--env", DARK, "--env-kwargs", '{"size": 3}', "--agent", "expected-sarsa", "--histories", "2",
            "--steps-per-history", "20", "--prompt-seed", "5", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    e = read_episodes(out)
    assert e.meta["agent"] == "expected-sarsa" and e.meta["seed"] == 5 and e.actions.shape == (2, 20)
    assert same_arrays(e, C.collect(DARK, "expected-sarsa", histories=2, steps=20, seed=5, env_kwargs={"size": 3}))
    before = out.read_bytes()
    assert cli.main(argv) == 2 and "pass --force" in capsys.readouterr().err and out.read_bytes() == before
    assert cli.main([*argv, "--force", "--prompt-seed", "6"]) == 0 and read_episodes(out).meta["seed"] == 6
    foreign = tmp_path / "mine.h5"
    foreign.write_bytes(b"not ours")
    assert cli.main([*argv[:-3], "--out", str(foreign), "--force"]) == 2
    assert "not written by icrl-interp" in capsys.readouterr().err and foreign.read_bytes() == b"not ours"


def test_cli_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    """Refused before anything runs (an unknown environment; kwargs that are no JSON object; kwargs the environment
    refuses: after the other histories' copies are made); the other refusals are the Python API's, tested above."""
    out = tmp_path / "e.h5"
    argv = ["collect", "--env", DARK, "--agent", "q-learning", "--steps-per-history", "5", "--out", str(out),
            "--no-progress"]
    for extra, words in ((["--env", "Nope-v0"], "--env Nope-v0"), (["--env-kwargs", "[1]"], "must be a JSON object"),
                         (["--env-kwargs", '{"size": 0}'], "DarkRoom size must be an integer >= 1")):
        assert cli.main([*argv, *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("icrl-interp collect: error: ") and err.count("\n") == 1 and words in err, err
        assert list(tmp_path.iterdir()) == []


SECTIONS = ("Episodes", "Environments", "`icrl-interp collect`")
"""The sections of docs/episodes.md on episodes, environments and collect (the later ones, on learners, the verdict
and recording, run their examples in their own tests)."""


def test_every_command_and_python_block_of_the_episodes_sections_runs(tmp_path, monkeypatch):
    page = REPO / "docs" / "episodes.md"
    parts = re.split(r"^## (.+)$", page.read_text(), flags=re.M)
    text = "".join(body for head, body in zip(parts[1::2], parts[2::2]) if head.strip() in SECTIONS)
    assert text.count("```") >= 6  # the sections are there, with their code blocks
    mine = tmp_path / "episodes.md"
    mine.write_text(text)
    lines = [argv_of(c) for _, c, whole, _ in doc_commands(mine) if whole]
    assert len(lines) == 3 and all(a[0] == "collect" for a in lines)
    monkeypatch.chdir(tmp_path)
    for argv in lines:
        assert cli.main(argv) == 0, argv
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 2
    scope: dict = {}
    for block in blocks:  # in order, in one namespace, as a reader would run them (the first reads dark.h5)
        exec(compile(block, str(page), "exec"), scope)  # noqa: S102  the page's own examples
    assert same_arrays(scope["alone"], scope["episodes"].select([3]))
    assert read_episodes("dark-test.h5").meta["histories"] == [6, 7]
    assert read_episodes("ledge.h5").meta["policy"] == "epsilon-greedy"


@pytest.mark.slow
def test_on_the_ledge_learning_sarsa_takes_the_safe_path_and_q_learning_the_edge():
    """The fixed points of tests/tasks/test_environments.py reached by the learning agents themselves: after 20,000
    steps (alpha 0.1, gamma 0.9, softmax beta 1) the greedy action in cell 12 (row 2, beside the ledge's start)
    is right (the edge) for Q-learning and up (the safe path) for SARSA. Measured with 32 histories: 32/32 each."""
    from icrl_interp.tasks import learners

    greedy = {}
    for agent in ("q-learning", "sarsa"):
        e = C.collect("icrl_interp/Ledge-v0", agent, histories=8, steps=20000, seed=0, alpha=0.1, gamma=0.9, beta=1.0)
        q = learners.replay(agent.replace("-", "_"), e, alpha=0.1, gamma=0.9, beta=1.0).q
        greedy[agent] = [int(np.argmax(q[h, np.flatnonzero(e.observations[h] == 12)[-1]])) for h in range(8)]
    assert greedy["q-learning"].count(3) >= 7 and greedy["sarsa"].count(0) >= 7, greedy
