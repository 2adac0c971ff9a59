"""Training: the compiled meta-step, the loop, evaluation and checkpoints."""

from metalearn.training import distribute
from metalearn.training.distribute import make_distributed_meta_step, make_strategy
from metalearn.training.evaluation import evaluate, mean_and_interval, restore
from metalearn.training.experiment import (Experiment, build_experiment, enable_determinism,
                                           parse_config)
from metalearn.training.loop import make_meta_step, train

__all__ = ["Experiment", "build_experiment", "distribute", "enable_determinism", "evaluate",
           "make_distributed_meta_step", "make_meta_step", "make_strategy",
           "mean_and_interval", "parse_config", "restore", "train"]
