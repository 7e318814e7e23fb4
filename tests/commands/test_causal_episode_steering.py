"""`icrl-interp causal --episodes` with steering, the closed loop and a user's model without a `token_format`
attribute (`--token-format ad-step --context K`): the JSON is what `causal_episodes` returns on the same inputs, and
the refusals are one line with nothing written."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from icrl_interp import cli
from icrl_interp.analyzers.episode_probes import replay_targets
from icrl_interp.interventions.episode_causal import causal_episodes
from icrl_interp.models.random_init import random_init_copy
from icrl_interp.tasks.collect import collect
from icrl_interp.tasks.episodes import Episodes, write_episodes

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
from episode_models import ALPHA, BETA, GAMMA, KnownModel, token_format  # noqa: E402

T = 20
GIVEN = ["--candidate", "q-learning", "--alpha", str(ALPHA), "--gamma", str(GAMMA), "--inverse-temperature", str(BETA)]
MODEL = f"""import sys
sys.path.insert(0, {str(TESTS)!r})
from episode_models import KnownModel
from icrl_interp.models.episode_tokens import TokenFormat


def make():  # a user's model: no token_format attribute
    return KnownModel(TokenFormat("ad-step", 1, 2, {T}), "q_reader")
"""


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    t = tmp_path_factory.mktemp("causal-steer")
    eps = collect("icrl_interp/Bandit-v0", "q-learning", histories=16, steps=T, seed=0,
                  env_kwargs={"arms": 2, "probs": [0.1, 0.9]}, alpha=ALPHA, gamma=GAMMA, beta=BETA)
    write_episodes(t / "eps.h5", eps)
    (t / "user_model.py").write_text(MODEL)
    return t, eps


def _cli(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_user_model_with_token_format_steering_and_closed_loop_is_causal_episodes(made, capsys):
    """Kills: --token-format/--context ignored, --steer or --closed-loop-histories not passed on, another seed."""
    t, eps = made
    rc, out, err = _cli(capsys, "causal", "--model", f"{t / 'user_model.py'}:make", "--episodes", t / "eps.h5",
                        "--token-format", "ad-step", "--context", T, "--layer", "0", *GIVEN, "--steer", "2",
                        "--closed-loop-histories", "2", "--random-draws", "2", "--bootstrap", "50",
                        "--json", t / "c.json")
    assert rc == 0, err
    got = json.loads((t / "c.json").read_text())
    model = KnownModel(token_format(eps), "q_reader")
    want = causal_episodes(model, eps, token_format(eps), replay_targets(eps, "q_learning", alpha=ALPHA, gamma=GAMMA,
                                                                         beta=BETA),
                           layer=0, draws=2, n_boot=50, test_fraction=0.5, random_model=random_init_copy(model, 0)[0],
                           steer=(2.0,), closed_loop_histories=2)
    assert got["schema"] == "icrl_interp.episode_causal/2" and got["token_format"]["context"] == T
    assert [p["scale"] for p in got["steering"]["points"]] == [2.0]
    # the same float64 arithmetic on the same arrays: equal (up to JSON's float round trip, exact for float64)
    for key in ("steering", "closed_loop", "effects"):
        assert json.dumps(got[key], sort_keys=True) == json.dumps(want[key], sort_keys=True), key
    assert "steering (one step of each of" in out and "closed loop on 2 fresh histories" in out


def test_refusals_are_one_line_exit_2_and_write_nothing(made, capsys):
    t, eps = made
    hand = Episodes(**{k: getattr(eps, k) for k in ("observations", "actions", "rewards", "next_observations",
                                                     "terminations", "truncations", "valid")},
                    n_actions=2, n_observations=1, meta={"source": "minari", "dataset_id": "x"})
    write_episodes(t / "minari-like.h5", hand)
    user = ["--model", f"{t / 'user_model.py'}:make"]
    fmt = ["--token-format", "ad-step", "--context", str(T)]
    for argv, words in (
            ([*user, "--episodes", t / "eps.h5", "--layer", "0"], "give the token format and its context"),
            ([*user, "--episodes", t / "minari-like.h5", *fmt, "--layer", "0", "--closed-loop-histories", "2"],
             "(source minari) has none to re-make"),
            ([t / "nowhere", "--layer", "0", "--token-format", "ad-step"], "--token-format goes with --episodes"),
            ([t / "nowhere", "--layer", "0", "--closed-loop-histories", "2"],
             "--closed-loop-histories goes with --episodes")):
        rc, _, err = _cli(capsys, "causal", *argv, *GIVEN, "--json", t / "refused.json")
        assert rc == 2 and err.startswith("icrl-interp causal: error: ") and err.count("\n") == 1, err
        assert words in err, err
        assert not (t / "refused.json").exists()
