"""The package's Gymnasium environments, registered on import: `icrl_interp/DarkRoom-v0` (Algorithm
Distillation's Dark Room), `icrl_interp/Bandit-v0` (a Bernoulli K-armed bandit) and `icrl_interp/Ledge-v0`
(a cliff walk where Q-learning and SARSA choose different paths); and `env_from_spec`, which makes any
environment from a registered id or `module:Class` (docs/episodes.md). Needs gymnasium (the `episodes`
extra); nothing below `commands` imports this at `import icrl_interp` time.
"""
from __future__ import annotations

import importlib

from ...core.errors import UserError

try:
    import gymnasium
except ImportError:
    raise UserError("the environments need gymnasium: pip install 'icrl_interp[episodes]'") from None

from .bandit import Bandit
from .dark_room import DarkRoom
from .ledge import Ledge

IDS = {"icrl_interp/DarkRoom-v0": DarkRoom, "icrl_interp/Bandit-v0": Bandit, "icrl_interp/Ledge-v0": Ledge}
"""The registered ids and their classes."""

for _id, _cls in IDS.items():
    if _id not in gymnasium.registry:  # importing twice (a reload) registers once
        gymnasium.register(id=_id, entry_point=f"{_cls.__module__}:{_cls.__name__}")


def env_from_spec(spec: str, **kwargs) -> "gymnasium.Env":
    """An environment from a Gymnasium id (`icrl_interp/DarkRoom-v0`, `FrozenLake-v1`; `module:id` imports
    `module` first) or a class of your own, `package.module:Class` (called with `kwargs`). A spec that names
    nothing, or kwargs the environment refuses, is a one-line UserError."""
    if not isinstance(spec, str) or not spec.strip():
        raise UserError(f"--env must name an environment (a Gymnasium id or module:Class), got {spec!r}")
    module, sep, name = spec.partition(":")
    if sep and name.isidentifier():  # module:Class (a Gymnasium `module:id` has '-v' in its id)
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError as e:
            raise UserError(f"--env {spec}: cannot import {module!r} ({e})") from None
        except AttributeError:
            raise UserError(f"--env {spec}: module {module!r} has no {name!r}") from None
        if not (isinstance(cls, type) and issubclass(cls, gymnasium.Env)):
            raise UserError(f"--env {spec}: {name} is not a gymnasium.Env class")
        make = cls
    else:
        def make(**kw):
            return gymnasium.make(spec, **kw)
    try:
        return make(**kwargs)
    except gymnasium.error.Error as e:  # an unknown id, namespace or version
        raise UserError(f"--env {spec}: {e}") from None
    except ModuleNotFoundError as e:
        raise UserError(f"--env {spec}: cannot import {e.name!r}") from None
    except TypeError as e:  # kwargs the environment does not take
        raise UserError(f"--env {spec}: {e}") from None
