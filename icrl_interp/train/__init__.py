"""Pretraining of the three families (objectives, task sampling, the resumable trainer).

Importing this package does not import transformer_lens; the models are built on first use.
"""
from .config import (CONFIG_CLASSES, LinearTDTrainConfig, SarsaTrainConfig, SoftmaxTDTrainConfig, TrainConfig,
                     config_for, config_from_dict)
from .trainer import RunResult, list_checkpoints, load_run_config, train

__all__ = ["CONFIG_CLASSES", "LinearTDTrainConfig", "SarsaTrainConfig", "SoftmaxTDTrainConfig", "TrainConfig",
           "config_for", "config_from_dict", "RunResult", "list_checkpoints", "load_run_config", "train"]
