"""A model acting in closed loop (models.closed_loop.ModelPolicy through tasks.collect.collect, `icrl-interp collect
--model`), in every token format: at every step it reads the documented tokens of its *own* history up to o_t
(never a_t, never another history's), the logits it acts on are those the recorder stores for that step, sampled
actions are collect's draws from its softmax, the window slides past its context, and what it cannot run is
refused in one line."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gymnasium")

from icrl_interp import cli  # noqa: E402
from icrl_interp.core.errors import UserError  # noqa: E402
from icrl_interp.models import episode_tokens as et  # noqa: E402
from icrl_interp.models.ad_transformer import ADConfig, ADTransformer  # noqa: E402
from icrl_interp.models.closed_loop import ModelPolicy  # noqa: E402
from icrl_interp.tasks import collect as C  # noqa: E402
from icrl_interp.tasks import learners  # noqa: E402
from icrl_interp.tasks.episodes import ARRAYS, read_episodes  # noqa: E402

from test_doc_commands import argv_of, doc_commands  # noqa: E402

DARK = "icrl_interp/DarkRoom-v0"
ROOM = {"size": 3, "horizon": 4}


def tiny(context: int, name: str = "ad-step", seed: int = 0) -> ADTransformer:
    torch.manual_seed(seed)
    fmt = et.TokenFormat(name, 9, 5, context)
    model = ADTransformer(ADConfig(fmt.to_dict(), d_model=16, n_layers=1, n_heads=2, d_mlp=16))
    with torch.no_grad():  # sharper logits than at init, so greedy and sampled choices depend on the history
        model.action_head.weight.mul_(8.0)
    return model


def logits_on(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(tokens)).double().numpy()


def test_greedy_actions_are_the_argmax_on_the_documented_tokens_of_its_own_history():
    model = tiny(context=12)
    eps = C.collect(DARK, ModelPolicy(model, greedy=True), histories=5, steps=12, seed=3, env_kwargs=ROOM)
    tokens, pmap = et.encode(eps, model.token_format)  # one window per history: the tokens the model read
    chosen = pmap.to_steps(logits_on(model, tokens).argmax(-1).astype(float))
    # exact: the same float32 forward pass on the same tokens, argmax of it
    assert np.array_equal(chosen, eps.actions)
    assert len({tuple(a) for a in eps.actions}) > 1  # the histories differ, so reading another's would show
    assert eps.meta["policy"] == "model" and eps.meta["model"]["greedy"] is True and eps.meta["params"] == {}
    assert model.training  # its mode given back (eval only while it acts)


@pytest.mark.parametrize("name", et.FORMATS)
def test_sampled_actions_are_collects_draws_from_its_softmax_and_a_history_is_the_same_alone(name):
    model = tiny(context=12, name=name, seed=1)
    eps = C.collect(DARK, ModelPolicy(model), histories=4, steps=12, seed=5, env_kwargs=ROOM)
    tokens, pmap = et.encode(eps, model.token_format)
    p = torch.softmax(torch.from_numpy(logits_on(model, tokens)), -1).numpy()
    probs = pmap.to_steps(p)  # [H, T, A]
    for h in range(4):
        u = np.random.default_rng(np.random.SeedSequence(5, spawn_key=(h, 1))).random(12)
        assert np.array_equal(learners.sample(probs[h], u), eps.actions[h])
    assert not np.array_equal(eps.actions, probs.argmax(-1))  # it samples, not argmax
    alone = C.collect(DARK, ModelPolicy(model), histories=[2], steps=12, seed=5, env_kwargs=ROOM)
    assert all(np.array_equal(getattr(alone, n)[0], getattr(eps, n)[2]) for n in ARRAYS)


SEQUENCE_LENGTH = {  # what the model reads at step t with context K (docs/episodes.md, closed loop)
    "ad-step": lambda t, K: min(t + 1, K),  # the tokens of steps t-K+1 .. t
    "ad-element": lambda t, K: min(3 * t + 1, 3 * K - 2),  # o, a, r of steps t-K+1 .. t-1, then o_t
    "dpt": lambda t, K: 1 + min(t, K),  # the query o_t, then the last min(t, K) transitions
}


def collect_acting(policy: ModelPolicy, **kwargs):
    """(episodes, the probabilities `probs` returned at each step [H, T, A], the length of each sequence read)."""
    probs, lengths, real = [], [], policy.probs
    hook = policy.model.register_forward_pre_hook(lambda m, args: lengths.append(args[0].shape[1]))
    policy.probs = lambda obs: probs.append(real(obs)) or probs[-1]
    try:
        eps = C.collect(DARK, policy, env_kwargs=ROOM, **kwargs)
    finally:
        hook.remove()
    return eps, np.stack(probs, 1), lengths


@pytest.mark.parametrize("name", et.FORMATS)
def test_the_logits_it_acts_on_are_the_recorders_at_each_steps_read_position(tmp_path, name):
    """Acting and recording agree: the distribution a history's action at step t is drawn from is the softmax
    of the logits `record_episodes` stores for step t (one forward pass per window over the finished history,
    stride 1, read at the position `encode` maps step t to). Past the context (T > K + 1) the window slides,
    and at most K steps' tokens are read. Kills a read position one off (e.g. the r_{t-1} token of
    ad-element), r_t or a_t leaking into the recorded read position, a window of K +- 1 steps, and a history's
    tokens taken in another order."""
    import h5py

    from icrl_interp.recording.episodes import record_episodes

    K, T = 3, 9
    model = tiny(context=K, name=name, seed=5)  # every format's sampled actions vary with the history
    eps, acted, lengths = collect_acting(ModelPolicy(model), histories=3, steps=T, seed=7)
    record_episodes(model, eps, tmp_path / "rec.h5", stride=1, baseline="none", progress=False)
    with h5py.File(tmp_path / "rec.h5") as f:
        recorded = f["outputs/logits"][...].astype(np.float64)  # [H, T, A]
    # float32 forward passes over sequences of different lengths: sums may differ in order; softmax is
    # 1/2-Lipschitz in the max norm, so the logits' error bound covers the probabilities
    tol = 16 * np.finfo(np.float32).eps * np.abs(recorded).max()
    assert np.abs(acted - torch.softmax(torch.from_numpy(recorded), -1).numpy()).max() <= tol
    assert lengths == [SEQUENCE_LENGTH[name](t, K) for t in range(T)]
    assert len({tuple(a) for a in eps.actions}) > 1  # the histories differ: reading another's would show

def test_past_its_context_it_reads_the_last_context_steps():
    K, T = 4, 11
    model = tiny(context=K, seed=2)
    eps = C.collect(DARK, ModelPolicy(model, greedy=True), histories=3, steps=T, seed=0, env_kwargs=ROOM)
    full = et.encode(eps, et.TokenFormat("ad-step", 9, 5, T))[0]  # [H, T, d]: the whole history's tokens
    want = np.stack([logits_on(model, full[:, max(0, t + 1 - K): t + 1])[:, -1].argmax(-1) for t in range(T)], 1)
    assert np.array_equal(want, eps.actions)


def test_what_it_cannot_run_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"has no token_format attribute: give the token format and its context \("
                                        r"--token-format NAME --context K\)"):
        ModelPolicy(torch.nn.Linear(3, 5), "dpt")
    with pytest.raises(UserError, match="the model reads dpt tokens with context 4; drop --token-format"):
        ModelPolicy(tiny(context=4, name="dpt"), "ad-step")
    with pytest.raises(UserError, match="the model reads dpt tokens with context 4; drop --token-format"):
        ModelPolicy(tiny(context=4, name="dpt"), context=5)
    with pytest.raises(UserError, match="token format must be one of ad-step, ad-element, dpt, got 'gpt'"):
        ModelPolicy(torch.nn.Linear(3, 5), "gpt", context=4)
    with pytest.raises(UserError, match="width 9 and 5 actions; the environment has 25 and 5"):
        C.collect(DARK, ModelPolicy(tiny(context=4)), histories=1, steps=2, env_kwargs={"size": 5})
    with pytest.raises(UserError, match="no parameter alpha"):
        C.collect(DARK, ModelPolicy(tiny(context=4)), histories=1, steps=2, env_kwargs=ROOM, alpha=0.1)

    class Broken(torch.nn.Module):
        token_format = et.TokenFormat("ad-step", 9, 5, 4).to_dict()

        def forward(self, x):
            return torch.full((*x.shape[:2], 5), float("nan"))

    with pytest.raises(UserError, match="non-finite output"):
        C.collect(DARK, ModelPolicy(Broken()), histories=1, steps=2, env_kwargs=ROOM)


@pytest.mark.parametrize("argv, words", [
    (["--agent", "random", "--model", "data/ad"], "--agent NAME (a source agent) or --model MODEL (not both)"),
    ([], "--agent NAME (a source agent) or --model MODEL"),
    (["--agent", "random", "--greedy"], "--greedy goes with --model"),
    (["--agent", "random", "--context", "4"], "--context goes with --model"),
])
def test_cli_agent_or_model_is_one_line_exit_2(tmp_path, capsys, argv, words):
    out = tmp_path / "x.h5"
    assert cli.main(["collect", "--env", DARK, *argv, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("icrl-interp collect: error: ") and err.count("\n") == 1 and words in err, err
    assert not out.exists()


def test_cli_collect_model_writes_its_own_actions(tmp_path):
    """`collect --model DIR`: the shipped AD model acts; greedy, its actions are its argmax on its own history."""
    from icrl_interp.core.resources import ad_dir
    from icrl_interp.models.ad_transformer import load

    out = tmp_path / "cl.h5"
    assert cli.main(["collect", "--env", DARK, "--env-kwargs", '{"size": 5, "horizon": 10}', "--model", str(ad_dir()),
                     "--greedy", "--histories", "2", "--steps-per-history", "20", "--out", str(out),
                     "--no-progress"]) == 0
    eps = read_episodes(out)
    model = load(ad_dir())
    fmt = model.token_format
    tokens, pmap = et.encode(eps, et.TokenFormat("ad-step", fmt.obs_width, fmt.n_actions, fmt.context))
    assert np.array_equal(pmap.to_steps(logits_on(model, tokens).argmax(-1).astype(float)), eps.actions)
    assert eps.meta["agent"] == f"model {ad_dir()}" and eps.meta["model"]["token_format"] == fmt.to_dict()


REPO = Path(__file__).resolve().parents[2]


def _section_lines(page: Path, heading: str) -> tuple[list[list[str]], list[str]]:
    """(the command lines, the Python blocks) of one `## heading` section of a Markdown page."""
    parts = re.split(r"^## (.+)$", page.read_text(), flags=re.M)
    text = dict(zip((h.strip() for h in parts[1::2]), parts[2::2]))[heading]
    mine = page.parent / f".{page.stem}-section.md"
    try:
        mine.write_text(text)
        lines = [argv_of(c) for _, c, whole, _ in doc_commands(mine) if whole]
    finally:
        mine.unlink()
    return lines, re.findall(r"```python\n(.*?)```", text, re.S)


@pytest.fixture
def in_repo_copy(tmp_path, monkeypatch):
    """A working directory where `data/` and `examples/` are the repository's (as the pages' lines assume)."""
    for name in ("data", "examples"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.slow  # ~10 s unloaded (the shipped model over 8 x 120 steps, then a verdict); fast sibling:
# test_cli_collect_model_writes_its_own_actions
def test_the_docs_closed_loop_lines_run_and_the_verdict_judges_the_models_own_actions(in_repo_copy):
    lines, blocks = _section_lines(REPO / "docs" / "episodes.md", "A model acting in closed loop")
    assert [a[0] for a in lines] == ["collect", "verdict", "collect"] and len(blocks) == 1
    for argv in lines[:2]:  # the third (a model of your own): test_the_docs_line_of_a_model_without_a_token_format
        assert cli.main(argv) == 0, argv
    eps = read_episodes("ad-closed.h5")
    verdict = json.loads(Path("ad-closed_verdict.json").read_text())
    assert eps.meta["policy"] == "model" and verdict["schema"] == "icrl_interp.episode_verdict/2"
    assert verdict["fitted_to"] == "actions" and verdict["histories"]["train"] + verdict["histories"]["held_out"] == 8
    scope: dict = {}
    exec(compile(blocks[0], "docs/episodes.md", "exec"), scope)  # noqa: S102  the page's own example
    assert scope["runs"].actions.shape == (4, 120) and scope["runs"].meta["tasks"][0] == {"goal": [1, 3]}


MY_MODEL = """
import torch
from torch import nn


class Mean(nn.Module):  # causal: position p's output is the mean of the embedded tokens at positions <= p
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(26, 16), nn.Linear(16, 5)  # dpt tokens of Dark Room 3 x 3: 26 columns

    def forward(self, tokens):
        h = torch.tanh(self.embed(tokens)).cumsum(1)
        return 4 * self.head(h / torch.arange(1, tokens.shape[1] + 1).view(1, -1, 1))


def make():
    torch.manual_seed(0)
    return Mean()
"""


def test_the_docs_line_of_a_model_without_a_token_format_runs_and_acts_on_its_dpt_history(tmp_path, monkeypatch, capsys):
    """`collect --model my_model.py:make --token-format dpt --context 8` (the page's line, 24 steps: the context
    slides): the format is fitted to the room, and the actions are collect's draws from the softmax of the model's
    logits on the documented dpt sequences of its own history (a draw flips only if its uniform lies within
    float rounding of a CDF step). Without the flags, the model is refused in one line."""
    from icrl_interp.models.user import load

    lines, _ = _section_lines(REPO / "docs" / "episodes.md", "A model acting in closed loop")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_model.py").write_text(MY_MODEL)
    assert cli.main(lines[2]) == 0
    eps = read_episodes("mine.h5")
    fmt = et.TokenFormat("dpt", 9, 5, 8)
    assert eps.meta["model"]["token_format"] == fmt.to_dict() and eps.actions.shape == (4, 24)
    tokens, pmap = et.encode(eps, fmt)
    probs = pmap.to_steps(torch.softmax(torch.from_numpy(logits_on(load("my_model.py:make"), tokens)), -1).numpy())
    for h in range(4):
        u = np.random.default_rng(np.random.SeedSequence(0, spawn_key=(h, 1))).random(24)
        assert np.array_equal(learners.sample(probs[h], u), eps.actions[h])
    capsys.readouterr()
    bare = [a for a in lines[2] if a not in ("--token-format", "dpt", "--context", "8")] + ["--force"]
    assert cli.main(bare) == 2
    err = capsys.readouterr().err
    assert err.startswith("icrl-interp collect: error: the model has no token_format attribute") and err.count("\n") == 1


@pytest.mark.slow  # ~40 s unloaded; fast sibling: test_the_example_model_is_causal_and_acts_on_its_own_history
def test_the_examples_episode_model_lines_run_end_to_end(in_repo_copy):
    """Every line of the section (collect, record, analyze, causal, verdict of the recording, closed loop, its
    verdict) and its Python block, on the untrained example model: each output is filled, and the answers are the
    honest ones for a model that learns nothing in context ("none fits", causal not "yes", TD error not carried)."""
    lines, blocks = _section_lines(REPO / "examples" / "README.md", "Your own model over episodes")
    assert [a[0] for a in lines] == ["collect", "record", "analyze", "causal", "verdict", "collect", "verdict"]
    assert len(blocks) == 1
    for argv in lines:
        assert cli.main(argv) == 0, argv
    probes = json.loads(Path("episode_model_probes.json").read_text())
    assert probes["schema"] == "icrl_interp.episode_probes/1" and probes["candidate"]["source"] == "behavioural fit"
    assert probes["candidate"]["fitted_to"] == "action_probs" and probes["candidate"]["label"] == "none fits"
    assert sorted(probes["layers"]) == ["0", "1"]  # both blocks' resid_post, the default role
    for per in probes["layers"].values():
        for name in ("delta", "delta_selective", "q", "v"):
            p = per[name]
            assert np.isfinite(p["r2"]) and not p["selective"]
            assert all(np.isfinite(p["baselines"][b]) for b in ("input", "random_init", "shuffled"))  # baseline recorded
    causal = json.loads(Path("episode_model_causal.json").read_text())
    assert causal["schema"] == "icrl_interp.episode_causal/2" and causal["site"] == "blocks.0.hook_resid_post"
    assert causal["draws"] == 8 and causal["steering"] is None and causal["random_init"] == {"seed": 0}
    assert causal["candidate"]["fitted_to"] == "action_probs" and np.isfinite(causal["selectivity"]["mean"])
    assert causal["conclusion"] == "no"  # measured: selectivity -0.00001 [-0.0007, 0.0002], far below 0.02
    rec = json.loads(Path("episode_model_verdict-rec.json").read_text())
    assert rec["schema"] == "icrl_interp.episode_verdict/2" and rec["fitted_to"] == "action_probs"
    assert rec["verdict"]["label"] == "none fits" and not rec["verdict"]["clear"]
    agreement = rec["representation"]["agreement"]
    assert agreement["label"] == "not carried" and agreement["winner"] == rec["verdict"]["closest"]
    assert set(rec["representation"]["candidates"]) >= {"q_learning", "sarsa", "mc_control"}
    closed = read_episodes("episode_model-closed.h5")
    assert closed.meta["agent"] == "model examples/episode_model.py:make" and closed.meta["policy"] == "model"
    verdict = json.loads(Path("episode_model_verdict.json").read_text())["verdict"]
    assert verdict["label"] == "none fits"  # untrained: near-uniform actions, no learning rule beats the baselines
    scope: dict = {}
    exec(compile(blocks[0], "examples/README.md", "exec"), scope)  # noqa: S102  the section's own Python
    assert scope["probes"] == probes  # exact: the same computation on the same arrays (JSON floats round-trip)
    assert scope["chosen"]["label"] == "none fits" and scope["causal"]["conclusion"] != "yes"
    assert scope["causal"]["split"]["test_histories"] == 3 and np.isfinite(scope["causal"]["selectivity"]["mean"])
    py = scope["verdict"]  # the same defaults as `verdict episode_model.h5`: the same fit, to float rounding
    assert py["verdict"]["label"] == rec["verdict"]["label"] and py["verdict"]["closest"] == rec["verdict"]["closest"]
    assert py["verdict"]["best_loglik"] == pytest.approx(rec["verdict"]["best_loglik"], rel=1e-9)


def test_the_example_model_is_causal_and_acts_on_its_own_history():
    from icrl_interp.recording.episodes import load_episode_model

    model = load_episode_model(str(REPO / "examples" / "episode_model.py") + ":make")
    x = torch.rand(2, 6, 32)
    y = x.clone()
    y[:, 4:] = torch.rand(2, 2, 32)  # change the future only
    with torch.no_grad():
        assert torch.equal(model(x)[:, :4], model(y)[:, :4])  # exact: position p's output reads positions <= p only
        assert not torch.equal(model(x)[:, 4:], model(y)[:, 4:])
    eps = C.collect(DARK, ModelPolicy(model, greedy=True), histories=2, steps=10, seed=0,
                    env_kwargs={"size": 5, "horizon": 10})
    tokens, pmap = et.encode(eps, et.TokenFormat.from_dict(model.token_format))
    assert np.array_equal(pmap.to_steps(logits_on(model, tokens).argmax(-1).astype(float)), eps.actions)
