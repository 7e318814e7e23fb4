"""Pretraining of the registered families (configs, the resumable trainer, held-out evaluation).

Each family's torch half (`registry.Family.training`, e.g. `icrl_interp.train.recipes.sarsa`)
holds its `TrainConfig` subclass and its `Recipe`; this package only holds generic code. Importing
it imports neither torch nor transformer_lens: the trainer, and each family's config class (e.g.
`from icrl_interp.train import SarsaTrainConfig`), are imported on first use.
"""
from __future__ import annotations

import importlib

from .config import TrainConfig, config_classes, config_for, config_from_dict
from .recipe import Recipe, Trends, recipe, recipe_of, training_families

_TRAINER = ("RunResult", "export_final", "list_checkpoints", "load_run_config", "train")

__all__ = ["TrainConfig", "config_classes", "config_for", "config_from_dict", "Recipe", "Trends", "recipe",
           "recipe_of", "training_families", "CONFIG_CLASSES", *_TRAINER]


def __getattr__(name: str):
    """The trainer's names, CONFIG_CLASSES ({family: config class}) and each family's config class by name."""
    if name in _TRAINER:
        return getattr(importlib.import_module(".trainer", __name__), name)
    if name == "CONFIG_CLASSES":
        return config_classes()
    if name.endswith("TrainConfig") and not name.startswith("_"):
        for cls in config_classes().values():
            if cls.__name__ == name:
                return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | {cls.__name__ for cls in config_classes().values()})
