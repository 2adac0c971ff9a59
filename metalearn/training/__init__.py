"""Training: the one meta-step builder, distribution, checkpoints, the loop, evaluation."""

from metalearn.execution import Runtime, enable_determinism
from metalearn.runs.experiment import Experiment, Loop, build_experiment, parse_config
from metalearn.training import distribute
from metalearn.training.checkpoint import restore
from metalearn.training.distribute import make_strategy
from metalearn.training.evaluation import evaluate, mean_and_interval
from metalearn.training.loop import train
from metalearn.training.step import (build_meta_step, make_distributed_meta_step,
                                     make_meta_step)
from metalearn.training.warm_start import WarmStart, restore_weights

__all__ = ["Experiment", "Loop", "Runtime", "build_experiment", "build_meta_step",
           "distribute", "enable_determinism", "evaluate", "make_distributed_meta_step",
           "make_meta_step", "make_strategy", "mean_and_interval", "parse_config",
           "restore", "restore_weights", "train", "WarmStart"]
