"""Command-line options shared by the commands that read a model over learning histories (`analyze REC.h5` of an
episode recording, `causal MODEL --episodes EPS.h5`, `record --episodes`): the candidate whose TD error, Q and V
are the targets, and the model (docs/episodes.md, "Representation and causation")."""
from __future__ import annotations

from dataclasses import dataclass

from ..core.cli_fields import given, given_flags, parsed

CANDIDATE_TASK_OPTIONS = ("alpha", "gamma")
"""The family task options (`task_options.add`) that are a candidate's parameters too: the same meaning."""


@dataclass
class EpisodeTargets:
    """The targets over learning histories: a candidate learner replayed on them (verdicts.episode_targets)."""

    candidate: str | None = None
    """The learning rule whose TD error, Q and V are the targets (q-learning, sarsa, expected-sarsa, sarsa-lambda,
    mc-control, model-based), replayed with --alpha, --gamma, --inverse-temperature and --lam as it has them (None:
    the rule the behavioural fit ranks first, with its fitted parameters, fitted to the model's action
    probabilities)."""
    inverse_temperature: float | None = None
    """With --candidate: beta of its softmax(beta Q) policy."""
    lam: float | None = None
    """With --candidate: its trace decay lambda (sarsa-lambda)."""


def target_flags(args) -> list[str]:
    """The candidate's flags the user gave (--alpha and --gamma only as a candidate's: see `CANDIDATE_TASK_OPTIONS`)."""
    return given_flags(args, EpisodeTargets)


def other_task_flags(args) -> list[str]:
    """--task and the family task options given, but --alpha and --gamma (a candidate's parameters here)."""
    from . import task_options

    return [f for f in task_options.task_flags(args) if f.lstrip("-").replace("-", "_") not in CANDIDATE_TASK_OPTIONS]


def candidate_of(args) -> dict:
    """{candidate, params} from the parsed flags (`episode_targets.choose`'s arguments; candidate None: the
    behavioural fit chooses), refusing a candidate's parameters without --candidate."""
    from ..core.errors import UserError

    t = parsed(args, EpisodeTargets)
    task = given(args, list(CANDIDATE_TASK_OPTIONS))
    params = {"alpha": task.get("alpha"), "gamma": task.get("gamma"), "beta": t.inverse_temperature, "lam": t.lam}
    if t.candidate is None and (flags := [f"--{k}" for k in task] + target_flags(args)):
        raise UserError(f"{', '.join(flags)}: a candidate's parameters: give --candidate NAME with them (without it the "
                        "behavioural fit chooses the candidate and its parameters)")
    return {"candidate": t.candidate, "params": params}


def targets(args, episodes, *, action_probs=None, split_seed: int = 0, test_fraction: float = 0.3):
    """(targets {name: [H, T]}, what they are) from the parsed flags (`episode_targets.choose`)."""
    from ..verdicts.episode_targets import choose

    return choose(episodes, action_probs=action_probs, split_seed=split_seed, test_fraction=test_fraction,
                  **candidate_of(args))


def load_model(args, directory: str | None):
    """(model, its spec) of a command that reads episodes, as `record --episodes` loads it
    (`recording.episodes.load_episode_model`): an AD model directory, or --model FILE.py:FUNC [--weights W]."""
    from ..core.errors import UserError
    from ..recording.episodes import load_episode_model

    if (args.model is None) == (directory is None):
        raise UserError("--episodes needs the model: an AD model directory, or --model FILE.py:FUNC (not both)")
    spec = directory if directory is not None else args.model
    return load_episode_model(spec, args.weights), str(spec)
