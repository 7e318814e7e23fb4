"""examples/' decoy: the plain PyTorch example's architecture and probe spec, trained on the query state's
immediate reward r(s_q) instead of its value (train_example.py --target reward). Fast checks that it is
that model; what the toolkit answers for it (none fits / reward regression, causal not "yes") is measured
by examples/run_all.py at full size and written in examples/README.md."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

import run_all  # noqa: E402 - from examples/
import train_example as T  # noqa: E402


def test_the_decoy_is_the_torch_example_with_the_reward_as_its_target():
    decoy, torch_spec = run_all.MODELS["decoy"], run_all.MODELS["torch"]
    assert (decoy["file"], decoy["probe"]) == (torch_spec["file"], torch_spec["probe"])
    assert (decoy["target"], torch_spec["target"], run_all.MODELS["tl"]["target"]) == ("reward", "value", "value")
    assert run_all.example_module("decoy") is run_all.example_module("torch")


def test_the_reward_target_is_the_query_states_immediate_reward():
    config = T.task()
    z, r, _ = T.batch(config, 32, np.random.default_rng(3), "reward")
    pb = config.sample(32, np.random.default_rng(3))  # the same draws, read independently
    query = pb.prompt.states[:, -1]
    # exact: the same float64 numbers cast to float32 on both sides
    np.testing.assert_array_equal(r[:, 0].numpy(), pb.tasks["r"][np.arange(32), query].astype(np.float32))
    z_value, v, _ = T.batch(config, 32, np.random.default_rng(3), "value")
    assert torch.equal(z, z_value)  # the same prompts: only the target differs
    np.testing.assert_array_equal(v[:, 0].numpy(), pb.tasks["values"][np.arange(32), query].astype(np.float32))


def test_fit_scores_the_decoy_against_the_reward():
    """The held-out numbers `fit` reports are against the decoy's own target: predicting the mean scores the
    spread of r(s_q) over the held-out tasks, not that of v_pi(s_q)."""
    out = run_all.example_module("decoy").train(1, 0, None, target="reward", batch_size=8, held_out_size=64,
                                                log_every=0, quiet=True)
    _, r, _ = T.held_out(64, "reward")
    assert abs(out["mean_predictor"] - float(r.std(unbiased=False))) <= 1e-6 * float(r.abs().max())
    _, v, _ = T.held_out(64, "value")
    assert abs(out["mean_predictor"] - float(v.std(unbiased=False))) > 0.1
