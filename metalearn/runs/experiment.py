"""An experiment: everything a run builds from its gin config."""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn.learners.learner import Learner
from metalearn.outer import MetaOptimizer
from metalearn.tasks.base import TaskSampler
from metalearn.runs import modules as user_modules, validation

CONFIG_FILE = "config.gin"
LOG_AVERAGES = ("window", "running")
ON_NON_FINITE = ("raise", "skip")


def set_threads(threads: Optional[Sequence[int]]) -> None:
    """Sizes TensorFlow's CPU thread pools: ``(intra_op, inter_op)`` threads (0: one per
    core, TensorFlow's default), or nothing for ``None``. Must run before TensorFlow's
    runtime starts (before any tensor, model or strategy is made);
    :func:`build_experiment` and ``python -m metalearn.train`` call it first.

    Raises:
      ValueError: not two whole numbers >= 0.
      RuntimeError: the runtime already started with other pool sizes.
    """
    if threads is None:
        return
    values = tuple(threads) if isinstance(threads, (list, tuple)) else (threads,)
    if len(values) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                   and v >= 0 for v in values):
        raise ValueError(f"Experiment.threads must be (intra_op, inter_op), two whole "
                         f"numbers >= 0 (0: one per core), got {threads!r}")
    current = (tf.config.threading.get_intra_op_parallelism_threads(),
               tf.config.threading.get_inter_op_parallelism_threads())
    if current == values:
        return
    try:
        tf.config.threading.set_intra_op_parallelism_threads(values[0])
        tf.config.threading.set_inter_op_parallelism_threads(values[1])
    except RuntimeError as error:
        raise RuntimeError(f"Experiment.threads={values}: TensorFlow's runtime already "
                           f"started with {current}; set the thread pools before any "
                           f"tensor, model or strategy is made ({error})") from error


def enable_determinism(seed: Optional[int] = None) -> None:
    """Turns on TensorFlow's op determinism (``tf.config.experimental.
    enable_op_determinism``: every op gives the same result for the same inputs, and
    ops without a deterministic kernel raise) and, if ``seed`` is given, seeds Python,
    NumPy, TensorFlow and Keras (``keras.utils.set_random_seed``). Process-wide, and
    cannot be turned off again in the same process."""
    if seed is not None:
        keras.utils.set_random_seed(int(seed))
    tf.config.experimental.enable_op_determinism()


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
        log line, or ``"running"``, every step since the run started (across
        resumptions: the sums are checkpointed), like the crash course's
        ``sum(losses) / len(losses)``.
      checkpoint_every: outer steps between checkpoints.
      keep_checkpoints: checkpoints kept in the workdir.
      on_non_finite: what a NaN or infinite meta-loss or meta-gradient does (checked
        at every step; the step's update is never applied): ``"raise"`` stops the run
        with ``FloatingPointError`` naming the step (the latest checkpoint is from
        before it), ``"skip"`` carries on and counts the step in ``skipped_steps``.
      deterministic: turn on TensorFlow's op determinism (see
        :func:`enable_determinism`); :func:`build_experiment` does so before building
        anything, this constructor otherwise.
      dtype_policy: the Keras dtype policy the model is built under, e.g.
        ``"mixed_bfloat16"`` (bfloat16 compute, float32 weights; CPUs and recent GPUs)
        or ``"mixed_float16"`` (GPUs). Weights, losses, metrics and meta-gradients stay
        float32. Set globally by :func:`build_experiment` before the model is built.
      threads: ``(intra_op, inter_op)`` sizes of TensorFlow's CPU thread pools (see
        :func:`set_threads`; 0 is one thread per core); ``None`` leaves TensorFlow's
        defaults. ``(1, 1)`` took 20% less CPU time and ~30 MiB less memory per step
        on 2 shared cores (benchmarks/README.md, "Thread pools").
      max_skipped_fraction: with ``on_non_finite="skip"``, the run fails
        (``FloatingPointError``) as soon as more than this fraction of
        ``num_steps`` was skipped, instead of finishing with metrics of too few steps.
      warm_start: called with the learner when the run starts from nothing (not when
        it resumes), e.g. ``WarmStart(source=<a pre-training workdir>)``
        (:class:`metalearn.training.WarmStart`): a pre-trained backbone as the start.
    """

    def __init__(self, learner: Learner = gin.REQUIRED, sampler: TaskSampler = gin.REQUIRED,
                 meta_optimizer: Optional[MetaOptimizer] = None, meta_batch_size: int = 25,
                 num_steps: int = 1000, seed: int = 0, jit_compile: bool = False,
                 log_every: int = 100, checkpoint_every: int = 1000,
                 keep_checkpoints: int = 3, log_average: str = "window",
                 on_non_finite: str = "raise", deterministic: bool = False,
                 dtype_policy: str = "float32", max_skipped_fraction: float = 0.25,
                 threads: Optional[Sequence[int]] = None,
                 warm_start: Optional[Callable[[Learner], object]] = None):
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
        if on_non_finite not in ON_NON_FINITE:
            raise ValueError(f"Experiment.on_non_finite must be one of {ON_NON_FINITE}, "
                             f"got {on_non_finite!r}")
        if isinstance(max_skipped_fraction, bool) or not isinstance(
                max_skipped_fraction, (int, float, np.integer, np.floating)) or \
                not 0 <= max_skipped_fraction <= 1:
            raise ValueError("Experiment.max_skipped_fraction must be a number in [0, 1], "
                             f"got {max_skipped_fraction!r}")
        if not isinstance(learner, Learner):
            raise TypeError(f"Experiment.learner must be a metalearn.Learner, got {learner!r}")
        if not isinstance(sampler, TaskSampler):
            raise TypeError("Experiment.sampler must be a metalearn.tasks.TaskSampler, "
                            f"got {sampler!r}")
        if warm_start is not None and not callable(warm_start):
            raise TypeError(f"Experiment.warm_start must be callable with the learner "
                            f"(e.g. @WarmStart()), got {warm_start!r}")
        self.learner = learner
        self.sampler = sampler
        self.warm_start = warm_start
        self.meta_optimizer = meta_optimizer if meta_optimizer is not None else MetaOptimizer()
        self.meta_batch_size = int(meta_batch_size)
        self.num_steps = int(num_steps)
        self.seed = int(seed)
        self.jit_compile = bool(jit_compile)
        self.log_every = int(log_every)
        self.log_average = log_average
        self.checkpoint_every = int(checkpoint_every)
        self.keep_checkpoints = int(keep_checkpoints)
        self.on_non_finite = on_non_finite
        self.max_skipped_fraction = float(max_skipped_fraction)
        set_threads(threads)
        self.threads = None if threads is None else tuple(threads)
        self.deterministic = bool(deterministic)
        if self.deterministic:
            enable_determinism()
        self.dtype_policy = keras.dtype_policies.get(dtype_policy).name
        self.config: str = ""


def _bound(name: str, default):
    try:
        return gin.query_parameter(f"Experiment.{name}")
    except ValueError:  # not bound: the constructor's default
        return default


def apply_configured_threads() -> None:
    """:func:`set_threads` with the gin binding ``Experiment.threads`` (if any): what
    the entry points call before they make a strategy."""
    try:
        set_threads(_bound("threads", None))
    except (ValueError, RuntimeError) as error:
        validation.raise_with_sources(error, configurables=["Experiment"],
                                      params=["threads"])


def build_experiment(strategy: Optional[tf.distribute.Strategy] = None) -> Experiment:
    """Builds the experiment from the parsed gin config, seeding weight initialisation
    with ``Experiment.seed`` first so that the same config gives the same weights (and,
    with ``Experiment.deterministic = True``, turning on op determinism first).

    Args:
      strategy: a ``tf.distribute`` strategy whose scope holds every variable (model,
        adapter state, optimizer slots); defaults to the current one.
    """
    apply_configured_threads()  # before anything starts the runtime
    seed = int(_bound("seed", 0))
    if _bound("deterministic", False):
        enable_determinism(seed)
    else:
        keras.utils.set_random_seed(seed)
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
                 skip_unknown: bool = False, saved_config: Optional[str] = None,
                 modules: Sequence[str] = ()) -> None:
    """Clears gin and parses a run's config: the workdir's saved one first (if any), then
    ``gin_files`` and ``gin_params`` on top.

    Args:
      saved_config: the run's config as its checkpoint carries it, parsed in place of
        the workdir's ``config.gin`` when that file is missing.
      modules: the user's modules (``.py`` files or dotted names) whose configurables
        the config binds, imported first (:mod:`metalearn.runs.modules`); with a
        ``workdir``, the modules it records are imported before them. They are part
        of the config: ``train`` records them in its workdir.

    Raises:
      FileNotFoundError: ``workdir`` has no ``config.gin`` and no ``saved_config`` is
        given.
      metalearn.runs.modules.ModuleImportError: a module file does not exist or fails
        to import (the message names it).
    """
    from metalearn import configurables  # noqa: F401  (registers Keras configurables)
    gin.clear_config()
    recorded = user_modules.recorded(workdir) if workdir is not None else []
    user_modules.use(user_modules.import_modules(list(recorded) + list(modules)))
    files = list(gin_files)
    if workdir is not None:
        saved = os.path.join(workdir, CONFIG_FILE)
        if os.path.exists(saved):
            files.insert(0, saved)
        elif saved_config:
            from absl import logging
            logging.warning("%s is missing: using the config its checkpoint carries", saved)
            gin.parse_config(saved_config, skip_unknown=skip_unknown)
        else:
            raise FileNotFoundError(f"no {CONFIG_FILE} in workdir {workdir!r}: is it a "
                                    "metalearn run directory?")
    validation.record_sources(files, list(gin_params))  # syntax and includes first
    try:
        gin.parse_config_files_and_bindings(files, list(gin_params),
                                            skip_unknown=skip_unknown)
    except ValueError as error:  # e.g. a macro never given a value: say where it is used
        validation.raise_with_sources(error)
