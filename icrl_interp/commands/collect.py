"""`icrl-interp collect --env ID --agent NAME --out eps.h5`: learning histories of a source agent in an
environment (Algorithm Distillation's training data), written atomically as an episodes file
(`icrl_interp.episodes/1`, docs/episodes.md). With `--model MODEL` instead of `--agent`, a sequence model
(an AD model directory, or FILE.py:FUNC with a `token_format` or `--token-format NAME --context K`) acts in
closed loop, reading its own history in its token format (`models.closed_loop`), and the file records its
actions."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..core.cli_fields import add_fields, parsed


def _agents() -> tuple[str, ...]:
    from ..tasks.collect import AGENTS  # numpy and h5py only: the parser stays light

    return AGENTS


@dataclass
class CollectOptions:
    """The environment, the agent, and the histories collected."""

    env: str = field(metadata={"metavar": "ID"})
    """The environment: a Gymnasium id (icrl_interp/DarkRoom-v0, icrl_interp/Bandit-v0, icrl_interp/Ledge-v0,
    FrozenLake-v1, ...) or a class of your own, package.module:Class."""
    out: str = field(metadata={"metavar": "FILE.h5"})
    """The episodes file to write."""
    agent: str | None = field(default=None, metadata={"choices": _agents})
    """The source agent: random, or a learning rule acting by softmax(beta Q) (epsilon-greedy with --epsilon)."""
    model: str | None = field(default=None, metadata={"metavar": "MODEL"})
    """Instead of --agent, a model acting in closed loop on its own history: an AD model directory (data/ad) or
    FILE.py:FUNC returning a module (with a token_format attribute, or give --token-format and --context)."""
    token_format: str | None = field(default=None, metadata={"choices": ("ad-step", "ad-element", "dpt")})
    """With --model, a model without a token_format attribute: the token format it reads."""
    context: int | None = field(default=None, metadata={"metavar": "K"})
    """With --token-format: steps (AD formats) or transitions of context (dpt) the model reads at most."""
    greedy: bool = False
    """With --model: act by the argmax of the model's logits instead of sampling from its softmax."""
    histories: int = 16
    """Learning histories, one environment (task: a goal, arm probabilities) each."""
    steps_per_history: int = 200
    """Environment steps of each history (episodes are reset within it)."""
    prompt_seed: int = 0
    """Seed of the histories: history h draws its task and actions from its own streams of this seed."""
    env_kwargs: str = field(default="{}", metadata={"metavar": "JSON"})
    """Keyword arguments of the environment, a JSON object (e.g. '{"size": 5}')."""
    alpha: float | None = None
    """Step size of the learning rule (None: 0.1; rules without one refuse it)."""
    gamma: float | None = None
    """Discount of the learning rule (None: 0.9)."""
    inverse_temperature: float | None = None
    """beta of the rule's softmax(beta Q) policy (None: 1.0)."""
    lam: float | None = None
    """Trace decay of sarsa-lambda (None: 0.8)."""
    epsilon: float | None = None
    """Act epsilon-greedy on Q with this epsilon instead of by softmax(beta Q)."""
    force: bool = False
    """Replace an existing episodes file at --out."""
    progress: bool = True
    """Show a progress bar over the steps on stderr."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_fields(p, CollectOptions)


def run(args) -> int:
    import json
    from pathlib import Path

    from ..core.errors import UserError
    from ..core.outputs import check_finite, check_fits, output_file
    from ..tasks.collect import collect
    from ..tasks.episodes import write_episodes

    o = parsed(args, CollectOptions)
    check_finite(o)
    output_file(o.out, "--out", suffixes=(".h5", ".hdf5"))
    if (o.agent is None) == (o.model is None):
        raise UserError("give the agent that acts: --agent NAME (a source agent) or --model MODEL (not both)")
    model_only = [f for f, v in (("--greedy", o.greedy or None), ("--token-format", o.token_format),
                                 ("--context", o.context)) if v is not None]
    if model_only and o.model is None:
        raise UserError(f"{model_only[0]} goes with --model (a source agent acts by its own policy)")
    if Path(o.out).exists() and not o.force:
        raise UserError(f"--out {o.out} already exists; pass --force to replace it")
    for flag, value in (("--histories", o.histories), ("--steps-per-history", o.steps_per_history)):
        if value < 1:
            raise UserError(f"{flag} must be a positive integer, got {value}")
    if o.prompt_seed < 0:
        raise UserError(f"--prompt-seed must be a non-negative integer, got {o.prompt_seed}")
    try:
        kwargs = json.loads(o.env_kwargs)
    except ValueError as e:
        raise UserError(f"--env-kwargs is not JSON ({e})") from None
    if not isinstance(kwargs, dict):
        raise UserError(f"--env-kwargs must be a JSON object, got {o.env_kwargs}")
    # the [H, T] arrays: int64 observations and actions, float64 rewards and the uniforms, three masks
    check_fits(lambda s: s["h"] * s["t"] * 43, {"h": o.histories, "t": o.steps_per_history},
               {"h": "--histories", "t": "--steps-per-history"}, "the histories")
    agent = o.agent
    if o.model is not None:
        from ..models.closed_loop import ModelPolicy
        from ..recording.episodes import load_episode_model

        agent = ModelPolicy(load_episode_model(o.model), o.token_format, context=o.context, greedy=o.greedy,
                            name=f"model {o.model}")
    episodes = collect(o.env, agent, histories=o.histories, steps=o.steps_per_history, seed=o.prompt_seed,
                       env_kwargs=kwargs, alpha=o.alpha, gamma=o.gamma, beta=o.inverse_temperature, lam=o.lam,
                       epsilon=o.epsilon, progress=o.progress)
    write_episodes(o.out, episodes)
    q = max(1, episodes.n_steps // 4)
    first, last = episodes.rewards[:, :q].mean(), episodes.rewards[:, -q:].mean()
    print(f"wrote {o.out}: {episodes.n_histories} histories x {episodes.n_steps} steps of {episodes.meta['agent']} on {o.env} "
          f"({int(episodes.dones.sum())} episodes ended); mean reward per step {first:.3f} in the first quarter, "
          f"{last:.3f} in the last")
    return 0
