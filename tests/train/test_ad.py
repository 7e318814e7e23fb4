"""Algorithm Distillation on Dark Room, tiny: the source's histories are on the goals asked for, the training
targets are each step's own action, training lowers the loss, the closed loop feeds the model the documented
tokens of its own history, and the improvement statistic (per-goal means, Student-t interval over goals)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from icrl_interp.models import episode_tokens as et
from icrl_interp.train import ad

pytest.importorskip("gymnasium")

TINY = ad.ADTrainConfig(size=3, horizon=4, episodes=3, held_out=2, histories_per_goal=4, d_model=16, n_layers=1,
                        n_heads=2, d_mlp=32, steps=40, batch_size=8, lr=3e-3, rollouts_per_goal=2,
                        relabel=False)  # relabelled windows take longer to learn from than this test runs


@pytest.fixture(scope="module")
def data():
    train_goals, test_goals = ad.goal_split(TINY)
    return train_goals, test_goals, ad.source_histories(TINY, train_goals[:3], TINY.histories_per_goal, seed=0)


def test_split_and_source_goals(data):
    train_goals, test_goals, eps = data
    assert len(test_goals) == 2 and not set(train_goals) & set(test_goals) and len(train_goals) == 7
    big = ad.goal_split(ad.ADTrainConfig(size=5, held_out=6, split_seed=3))[1]
    assert (2, 2) not in big and len(big) == 6  # never the start cell; never two held-out goals side by side
    assert all(abs(a[0] - b[0]) + abs(a[1] - b[1]) > 1 for a in big for b in big if a != b)
    assert eps.n_histories == 12 and eps.n_steps == TINY.context
    assert [tuple(t["goal"]) for t in eps.meta["tasks"]] == [g for g in train_goals[:3] for _ in range(4)]
    assert len(set(eps.meta["histories"])) == 12  # distinct seeds per history
    # every reward is earned on the goal cell (y * size + x of the next observation)
    goal_cell = np.array([t["goal"][1] * 3 + t["goal"][0] for t in eps.meta["tasks"]])
    assert np.array_equal(eps.rewards == 1, eps.next_observations == goal_cell[:, None])


def test_targets_are_each_steps_own_action(data):
    eps = data[2]
    fmt = et.format_for(eps, "ad-step", TINY.context)
    tokens, targets = ad.training_windows(eps, fmt)
    assert np.array_equal(targets, eps.actions)  # one window per history, position t -> a_t
    # and the token at t + 1 carries a_t as its previous action (the model is trained to predict what comes)
    assert np.array_equal(tokens[:, 1:, fmt.columns["prev_action"]].argmax(-1), eps.actions[:, :-1])


def test_training_lowers_the_loss_and_the_closed_loop_reads_documented_tokens(data):
    eps = data[2]
    model, log = ad.train_model(TINY, eps)
    assert log["final_loss"] < np.log(5) - 0.1  # below the uniform policy's cross-entropy
    assert not model.training
    goals = data[1]
    runs = ad.concatenate([ad.rollout(model, {"size": 3, "horizon": 4, "goal": list(g)}, range(2 * i, 2 * i + 2),
                                      TINY.context, seed=0, greedy=True) for i, g in enumerate(goals)])
    tokens, pmap = et.encode(runs, model.token_format)
    with torch.no_grad():
        chosen = pmap.to_steps(model(torch.from_numpy(tokens)).argmax(-1).numpy().astype(float))
    assert np.array_equal(chosen, runs.actions)  # greedy: the action is the argmax on its own documented history
    assert [t["goal"] for t in runs.meta["tasks"]] == [list(goals[i // 2]) for i in range(4)]


def test_episode_returns_and_improvement():
    from icrl_interp.tasks.episodes import Episodes

    H, T = 2, 8
    rewards = np.arange(H * T, dtype=float).reshape(H, T) % 3
    trunc = np.zeros((H, T), bool)
    trunc[:, 1::2] = True  # episodes of 2 steps
    z = np.zeros((H, T), np.int64)
    eps = Episodes(z, z, rewards, z, np.zeros((H, T), bool), trunc, np.ones((H, T), bool), 2, 1)
    want = rewards.reshape(H, 4, 2).sum(-1)
    assert np.array_equal(ad.episode_returns(eps), want)  # exact: sums of small integers
    returns = np.array([[0, 1, 2, 3], [1, 1, 1, 5], [0, 0, 0, 0], [2, 2, 2, 6], [0, 1, 1, 1], [3, 3, 3, 3.0]])
    goal_of = np.array([0, 0, 1, 1, 2, 2])
    out = ad.improvement(returns, goal_of)
    per_goal = np.array([(3 + 4) / 2, (0 + 4) / 2, (1 + 0) / 2])  # last quarter (episode 4) - first, per run
    assert np.allclose(out["per_goal"], per_goal, rtol=0, atol=1e-12)
    t975_df2 = 4.302652729911275  # Student t, 97.5 % quantile, 2 degrees of freedom
    half = t975_df2 * per_goal.std(ddof=1) / np.sqrt(3)
    assert np.allclose(out["ci95"], [per_goal.mean() - half, per_goal.mean() + half], rtol=0, atol=1e-9)
    assert out["goals"] == 3 and out["runs"] == 6


def test_relabel_permutes_each_sequences_cells_consistently(data):
    eps = data[2]
    fmt = et.format_for(eps, "ad-step", TINY.context)
    tokens = torch.from_numpy(et.encode(eps, fmt)[0])
    out = ad.relabel(tokens, fmt, np.random.default_rng(0))
    obs = fmt.columns["obs"]
    assert torch.equal(out[..., obs.stop:], tokens[..., obs.stop:])  # actions, rewards, flags untouched
    before, after = tokens[..., obs].argmax(-1).numpy(), out[..., obs].argmax(-1).numpy()
    moved = 0
    for b, a in zip(before, after):  # one bijection of the cells per sequence, the same at every step
        mapping = dict(zip(b.tolist(), a.tolist()))
        assert len(set(mapping.values())) == len(mapping) and all(mapping[x] == y for x, y in zip(b, a))
        moved += any(x != y for x, y in mapping.items())
    assert moved > 0
