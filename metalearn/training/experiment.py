"""An experiment: everything a run builds from its gin config."""

from __future__ import annotations

import os
from typing import Optional

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn.learners import Learner
from metalearn.meta_optimizers import MetaOptimizer
from metalearn.tasks.base import TaskSampler
from metalearn.training import validation

CONFIG_FILE = "config.gin"
LOG_AVERAGES = ("window", "running")


@gin.configurable
class Experiment:
    """The learner, task sampler, meta-optimizer and schedule of one run.

    Built by gin at the entry points (``Experiment.num_steps = 70000`` ...) or by hand.

    Args:
      learner: the learner to meta-train.
      sampler: task sampler for meta-training, and for evaluation on its test split.
      meta_optimizer: the outer update; defaults to ``MetaOptimizer()`` (Adam 1e-3).
      meta_batch_size: tasks per outer step.
      num_steps: outer steps in all.
      seed: the run's seed (weight initialisation and task streams).
      jit_compile: compile the meta-step with XLA.
      log_every: outer steps between log lines and summaries.
      log_average: what a log line averages: ``"window"``, the steps since the previous
        log line, or ``"running"``, every step since this run (or its resumption)
        started, like the crash course's ``sum(losses) / len(losses)``.
      checkpoint_every: outer steps between checkpoints.
      keep_checkpoints: checkpoints kept in the workdir.
      dtype_policy: the Keras dtype policy the model is built under, e.g.
        ``"mixed_bfloat16"`` (bfloat16 compute, float32 weights; CPUs and recent GPUs)
        or ``"mixed_float16"`` (GPUs). Weights, losses, metrics and meta-gradients stay
        float32. Set globally by :func:`build_experiment` before the model is built.
    """

    def __init__(self, learner: Learner = gin.REQUIRED, sampler: TaskSampler = gin.REQUIRED,
                 meta_optimizer: Optional[MetaOptimizer] = None, meta_batch_size: int = 25,
                 num_steps: int = 1000, seed: int = 0, jit_compile: bool = False,
                 log_every: int = 100, checkpoint_every: int = 1000,
                 keep_checkpoints: int = 3, log_average: str = "window",
                 dtype_policy: str = "float32"):
        for name, value in (("meta_batch_size", meta_batch_size), ("num_steps", num_steps),
                            ("log_every", log_every), ("checkpoint_every", checkpoint_every),
                            ("keep_checkpoints", keep_checkpoints), ("seed", seed)):
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer)) \
                    or int(value) != value:
                raise TypeError(f"Experiment.{name} must be an integer, got {value!r} "
                                f"({type(value).__name__})")
            if name != "seed" and int(value) < 1:
                raise ValueError(f"Experiment.{name} must be >= 1, got {value}")
        if log_average not in LOG_AVERAGES:
            raise ValueError(f"Experiment.log_average must be one of {LOG_AVERAGES}, "
                             f"got {log_average!r}")
        if not isinstance(learner, Learner):
            raise TypeError(f"Experiment.learner must be a metalearn.Learner, got {learner!r}")
        if not isinstance(sampler, TaskSampler):
            raise TypeError("Experiment.sampler must be a metalearn.tasks.TaskSampler, "
                            f"got {sampler!r}")
        self.learner = learner
        self.sampler = sampler
        self.meta_optimizer = meta_optimizer if meta_optimizer is not None else MetaOptimizer()
        self.meta_batch_size = int(meta_batch_size)
        self.num_steps = int(num_steps)
        self.seed = int(seed)
        self.jit_compile = bool(jit_compile)
        self.log_every = int(log_every)
        self.log_average = log_average
        self.checkpoint_every = int(checkpoint_every)
        self.keep_checkpoints = int(keep_checkpoints)
        self.dtype_policy = keras.dtype_policies.get(dtype_policy).name
        self.config: str = ""


def _bound(name: str, default):
    try:
        return gin.query_parameter(f"Experiment.{name}")
    except ValueError:  # not bound: the constructor's default
        return default


def build_experiment(strategy: Optional[tf.distribute.Strategy] = None) -> Experiment:
    """Builds the experiment from the parsed gin config, seeding weight initialisation
    with ``Experiment.seed`` first so that the same config gives the same weights.

    Args:
      strategy: a ``tf.distribute`` strategy whose scope holds every variable (model,
        adapter state, optimizer slots); defaults to the current one.
    """
    keras.utils.set_random_seed(int(_bound("seed", 0)))
    policy = _bound("dtype_policy", "float32")
    try:
        keras.mixed_precision.set_global_policy(policy)
    except ValueError as error:
        raise ValueError(f"Experiment.dtype_policy: {error}") from error
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        try:
            experiment = Experiment()
        except Exception as error:  # noqa: BLE001  (re-raised, same type)
            validation.raise_with_sources(error)  # adds the gin file and line
        experiment.meta_optimizer.build(experiment.learner)
    experiment.config = gin.config_str()
    return experiment


def parse_config(gin_files=(), gin_params=(), workdir: Optional[str] = None,
                 skip_unknown: bool = False) -> None:
    """Clears gin and parses a run's config: the workdir's saved one first (if any), then
    ``gin_files`` and ``gin_params`` on top."""
    from metalearn import configurables  # noqa: F401  (registers Keras configurables)
    gin.clear_config()
    files = list(gin_files)
    if workdir is not None:
        saved = os.path.join(workdir, CONFIG_FILE)
        if not os.path.exists(saved):
            raise FileNotFoundError(f"no {CONFIG_FILE} in workdir {workdir!r}: is it a "
                                    "metalearn run directory?")
        files.insert(0, saved)
    gin.parse_config_files_and_bindings(files, list(gin_params),
                                        skip_unknown=skip_unknown)
    validation.record_sources(files, list(gin_params))
