"""An experiment: everything a run builds from its gin config."""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

import gin
import numpy as np
import tensorflow as tf

from metalearn import execution
from metalearn import configurables
from metalearn.learners.learner import Learner
from metalearn.outer import MetaGradient, OuterRule
from metalearn.tasks.base import TaskSampler
from metalearn.runs import gin_text, modules as user_modules, validation
from metalearn.runs.workdir import Workdir

LOG_AVERAGES = ("window", "running")
ON_NON_FINITE = ("raise", "skip")


_MOVED = {
    "meta_optimizer": "Experiment.outer_rule (an outer rule of metalearn.outer: "
                      "@MetaGradient(), @Reptile(), guards such as @ClipDirections())",
    "seed": "Runtime.seed (metalearn.execution.Runtime: how the process runs)",
    "jit_compile": "Runtime.jit_compile",
    "dtype_policy": "Runtime.dtype_policy",
    "deterministic": "Runtime.deterministic",
    "threads": "Runtime.threads",
    "num_steps": "Loop.num_steps (metalearn.training.Loop: what may change on resume)",
    "log_every": "Loop.log_every",
    "log_average": "Loop.log_average",
    "checkpoint_every": "Loop.checkpoint_every",
    "keep_checkpoints": "Loop.keep_checkpoints",
    "on_non_finite": "Loop.on_non_finite",
    "max_skipped_fraction": "Loop.max_skipped_fraction",
}


def _whole(owner: str, name: str, value, minimum: Optional[int] = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer)) \
            or int(value) != value:
        raise TypeError(f"{owner}.{name} must be an integer, got {value!r} "
                        f"({type(value).__name__})")
    if minimum is not None and int(value) < minimum:
        raise ValueError(f"{owner}.{name} must be >= {minimum}, got {value}")
    return int(value)


@gin.configurable
class Loop:
    """The training loop's settings: exactly what may change when a run resumes
    (how long it runs, how it logs and checkpoints, what a non-finite step does).

    Args:
      num_steps: outer steps in all.
      log_every: outer steps between log lines and summaries.
      log_average: what a log line averages: ``"window"``, the steps since the previous
        log line, or ``"running"``, every step since the run started (across
        resumptions: the sums are checkpointed).
      checkpoint_every: outer steps between checkpoints.
      keep_checkpoints: checkpoints kept in the workdir.
      on_non_finite: what a NaN or infinite meta-loss or meta-gradient does (checked at
        every step; the step's update is never applied): ``"raise"`` stops the run with
        ``FloatingPointError`` naming the step (the latest checkpoint is from before
        it), ``"skip"`` carries on and counts the step in ``skipped_steps``.
      max_skipped_fraction: with ``on_non_finite="skip"``, the run fails
        (``FloatingPointError``) as soon as more than this fraction of ``num_steps``
        was skipped, instead of finishing with metrics of too few steps.
    """

    def __init__(self, num_steps: int = 1000, log_every: int = 100,
                 log_average: str = "window", checkpoint_every: int = 1000,
                 keep_checkpoints: int = 3, on_non_finite: str = "raise",
                 max_skipped_fraction: float = 0.25):
        self.num_steps = _whole("Loop", "num_steps", num_steps)
        self.log_every = _whole("Loop", "log_every", log_every)
        self.checkpoint_every = _whole("Loop", "checkpoint_every", checkpoint_every)
        self.keep_checkpoints = _whole("Loop", "keep_checkpoints", keep_checkpoints)
        if log_average not in LOG_AVERAGES:
            raise ValueError(f"Loop.log_average must be one of {LOG_AVERAGES}, "
                             f"got {log_average!r}")
        if on_non_finite not in ON_NON_FINITE:
            raise ValueError(f"Loop.on_non_finite must be one of {ON_NON_FINITE}, "
                             f"got {on_non_finite!r}")
        if isinstance(max_skipped_fraction, bool) or not isinstance(
                max_skipped_fraction, (int, float, np.integer, np.floating)) or \
                not 0 <= max_skipped_fraction <= 1:
            raise ValueError("Loop.max_skipped_fraction must be a number in [0, 1], "
                             f"got {max_skipped_fraction!r}")
        self.log_average = log_average
        self.on_non_finite = on_non_finite
        self.max_skipped_fraction = float(max_skipped_fraction)


@gin.configurable
@configurables.moved_keywords(_MOVED)
class Experiment:
    """The learner, task sampler, outer rule, formulation and schedule of one run.

    Built by gin at the entry points (``Experiment.meta_batch_size = 25``,
    ``Loop.num_steps = 70000``, ``Runtime.seed = 0`` ...) or by hand.

    Args:
      learner: the learner to meta-train.
      sampler: task sampler for meta-training, and for evaluation on its test split.
      outer_rule: how the meta-variables move (:mod:`metalearn.outer`); defaults to
        ``MetaGradient()`` (Adam 1e-3).
      formulation: how a batch of tasks runs (:mod:`metalearn.execution`), in training
        and evaluation alike; defaults to ``Auto()``.
      meta_batch_size: tasks per outer step.
      runtime: how the process runs (:class:`~metalearn.execution.Runtime`: seed, XLA,
        dtype policy, determinism, threads); defaults to ``Runtime()``, which
        :func:`build_experiment` applies before anything is built (by hand: call
        ``runtime.apply()`` before building the model; this constructor turns on op
        determinism if asked).
      loop: the training loop's settings (:class:`Loop`); defaults to ``Loop()``.
      warm_start: called with the learner when the run starts from nothing (not when
        it resumes), e.g. ``WarmStart(source=<a pre-training workdir>)``
        (:class:`metalearn.training.WarmStart`): a pre-trained backbone as the start.
    """

    def __init__(self, learner: Learner = gin.REQUIRED, sampler: TaskSampler = gin.REQUIRED,
                 outer_rule: Optional[OuterRule] = None,
                 formulation: Optional[execution.Formulation] = None,
                 meta_batch_size: int = 25, runtime: Optional[execution.Runtime] = None,
                 loop: Optional[Loop] = None,
                 warm_start: Optional[Callable[[Learner], object]] = None):
        self.meta_batch_size = _whole("Experiment", "meta_batch_size", meta_batch_size)
        if not isinstance(learner, Learner):
            raise TypeError(f"Experiment.learner must be a metalearn.Learner, got {learner!r}")
        if not isinstance(sampler, TaskSampler):
            raise TypeError("Experiment.sampler must be a metalearn.tasks.TaskSampler, "
                            f"got {sampler!r}")
        if outer_rule is not None and not isinstance(outer_rule, OuterRule):
            raise TypeError("Experiment.outer_rule must be a metalearn outer rule "
                            f"(@MetaGradient(), @Reptile(), ...), got {outer_rule!r}")
        if runtime is not None and not isinstance(runtime, execution.Runtime):
            raise TypeError(f"Experiment.runtime must be a metalearn.execution.Runtime, "
                            f"got {runtime!r}")
        if loop is not None and not isinstance(loop, Loop):
            raise TypeError(f"Experiment.loop must be a metalearn.runs.Loop, got {loop!r}")
        if warm_start is not None and not callable(warm_start):
            raise TypeError(f"Experiment.warm_start must be callable with the learner "
                            f"(e.g. @WarmStart()), got {warm_start!r}")
        self.learner = learner
        self.sampler = sampler
        self.outer_rule = outer_rule if outer_rule is not None else MetaGradient()
        self.formulation = execution.formulation(formulation)
        self.runtime = runtime if runtime is not None else execution.Runtime()
        self.loop = loop if loop is not None else Loop()
        self.warm_start = warm_start
        if self.runtime.deterministic:
            execution.enable_determinism()
        self.config: str = ""

    @property
    def seed(self) -> int:
        """The run's seed (:attr:`Runtime.seed`): initialisation and task streams."""
        return self.runtime.seed


def apply_configured_threads() -> None:
    """The thread pools the gin configuration gives :class:`Runtime` (``Runtime.threads``),
    applied: what the entry points call before they make a strategy (which starts
    TensorFlow's runtime)."""
    try:
        execution.Runtime().apply_threads()
    except (ValueError, RuntimeError, TypeError) as error:
        validation.raise_with_sources(error, configurables=["Runtime"])


def build_experiment(strategy: Optional[tf.distribute.Strategy] = None) -> Experiment:
    """Builds the experiment from the parsed gin config: the :class:`Runtime` first
    (thread pools, seeds so that the same config gives the same weights, op
    determinism, dtype policy), then everything else.

    Args:
      strategy: a ``tf.distribute`` strategy whose scope holds every variable (model,
        adapter state, optimizer slots); defaults to the current one.
    """
    try:
        runtime = execution.Runtime()
        runtime.apply()  # before anything is built
    except Exception as error:  # noqa: BLE001  (re-raised, same type)
        validation.raise_with_sources(error, configurables=["Runtime"])
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        try:
            experiment = Experiment(runtime=runtime)
        except Exception as error:  # noqa: BLE001  (re-raised, same type)
            validation.raise_with_sources(error)  # adds the gin file and line
        experiment.outer_rule.build(experiment.learner)
    experiment.config = gin.config_str()
    return experiment


def parse_config(gin_files=(), gin_params=(), workdir: Optional[str] = None,
                 skip_unknown: bool = False, saved_config: Optional[str] = None,
                 modules: Sequence[str] = (), trust_workdir: bool = False) -> None:
    """Clears gin and parses a run's config: the workdir's saved one first (if any), then
    ``gin_files`` and ``gin_params`` on top.

    Args:
      saved_config: the run's config as its checkpoint carries it, parsed in place of
        the workdir's ``config.gin`` when that file is missing.
      modules: the user's modules (``.py`` files or dotted names) whose configurables
        the config binds, imported first (:mod:`metalearn.runs.modules`); with a
        ``workdir``, the modules it records are imported before them. They are part
        of the config: ``train`` records them in its workdir.
      trust_workdir: import whatever the ``workdir`` names (its ``modules.json``, the
        ``import`` lines of its config); without it, only those also in ``modules``.

    Raises:
      FileNotFoundError: ``workdir`` has no ``config.gin`` and no ``saved_config`` is
        given.
      metalearn.runs.modules.ModuleImportError: a module file does not exist or fails
        to import (the message names it).
      metalearn.runs.modules.UntrustedModulesError: the workdir names modules the user
        did not give (listed, with how to allow them); nothing is imported.
      metalearn.runs.validation.RoleOrderError: role files (experiments/setups/,
        learners/, budgets/) combined against the repository's rule
        (:func:`~metalearn.runs.validation.check_roles`): a setup after a learner, a
        learner re-binding an earlier learner's key, a budget leaving part of another.
    """
    gin.clear_config()
    recorded = []
    if workdir is not None:  # a workdir is data: what it names, only if asked for
        saved = Workdir(workdir).config
        text, name = saved_config, "the config its checkpoint carries"
        if os.path.exists(saved):
            text, name = gin_text.read_gin_file(saved), saved
        recorded = user_modules.allowed(workdir, modules, trust_workdir, text, name)
    user_modules.use(user_modules.import_modules(list(recorded) + list(modules)))
    files = list(gin_files)
    if workdir is not None:
        if os.path.exists(saved):
            files.insert(0, saved)
        elif saved_config:
            from absl import logging
            logging.warning("%s is missing: using the config its checkpoint carries", saved)
            gin.parse_config(saved_config, skip_unknown=skip_unknown)
        else:
            raise FileNotFoundError(f"no {Workdir.CONFIG} in workdir {workdir!r}: is it a "
                                    "metalearn run directory?")
    validation.record_sources(files, list(gin_params))  # syntax and includes first
    validation.check_roles(files, list(gin_params))  # role files, however they are given
    try:
        gin.parse_config_files_and_bindings(files, list(gin_params),
                                            skip_unknown=skip_unknown)
    except ValueError as error:  # e.g. a macro never given a value: say where it is used
        validation.raise_with_sources(error)
