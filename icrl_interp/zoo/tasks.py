"""The tasks the zoo's models run on: a family found by the algorithm its theta* runs (`Hints.algorithm`, so no
family name is spelled out here) and the construct options of the zoo's value tasks."""
from __future__ import annotations

from ..core.errors import UserError
from ..families import registry as families

LINEAR = {"d": 4, "n": 30, "gamma": 0.9}
"""The value task of the exact teachers (linear-td defaults: random features, 10-state Boyan chains)."""
SHORT = {"d": 4, "n": 20, "gamma": 0.5}
"""A second value task for decoys: shorter contexts, a smaller discount."""
SMALL_MDP = {"n_states": 5, "n_actions": 3, "n": 40}
"""The control task of the zoo: tabular MDPs of 5 states x 3 actions (one-hot features, d 15), n 40, the
families' gamma 0.5 (the families' 9 x 4 default costs the verdict several times more per model)."""
CONTROL = {"batch_sarsa": "batch_sarsa", "expected_sarsa": "batch_sarsa", "q_learning": "batch_sarsa",
           "actor_critic": "actor_critic"}
"""Control candidates -> the algorithm of the family whose task they run on (every other candidate: td0's)."""


def family_of(algorithm: str) -> str:
    """The registered family whose theta* runs `algorithm` (Hints.algorithm)."""
    hits = families.where(lambda f: f.hints.algorithm == algorithm)
    if not hits:
        raise UserError(f"no registered family runs {algorithm!r}")
    return hits[0]


def config_for(algorithm: str, task: dict | None = None, seed: int | None = 0):
    """The task (a checkpoint config of `models.construct.task_config`) a teacher of `algorithm` runs on:
    value candidates linear-td with `LINEAR` unless `task` says otherwise, the SARSA kin the sarsa family's,
    actor_critic the actor-critic family's (their construct defaults unless `task` says otherwise)."""
    from ..models.construct import task_config

    home = CONTROL.get(algorithm, "td0")
    return task_config(family_of(home), dict(task if task is not None else (LINEAR if home == "td0" else {})),
                       seed=seed)
