"""Outer rules as pieces: how a meta-batch's result moves the meta-variables.

An outer rule has a small interface, in the spirit of the inner update transforms:

* :meth:`OuterRule.build` creates its state (eagerly), e.g. a Keras optimizer's slots;
* :meth:`OuterRule.directions` goes from a learner, a batch of tasks and a formulation
  (:mod:`metalearn.execution`) to update directions (one per meta-variable) and per-task
  figures; it is a pure function that XLA may compile;
* :meth:`OuterRule.apply` moves the meta-variables along the directions (in a replica
  context: the update is the whole meta-batch's, see :mod:`metalearn.outer.replicas`)
  and returns the figures (guards add theirs);
* :meth:`OuterRule.step` puts them together; a rule that interleaves them (serial
  Reptile) overrides it, calling the ``apply`` it is given so that guards wrap each
  update.

Guards are wrappers around any rule (:mod:`metalearn.outer.guards`), as optax's
``apply_if_finite`` wraps a transformation. An outer rule is a ``tf.Module``: its state
(optimizer slots, a PES accumulator) is checkpointed with the run.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn import _compat, configurables
from metalearn.execution import Formulation
from metalearn.learners.learner import Learner
from metalearn.outer import replicas
from metalearn.tasks.episode import Episode

Directions = List[tf.Tensor]
Metrics = Dict[str, tf.Tensor]
ApplyFn = Callable[[Learner, Directions, Metrics], Metrics]


class OuterRule(tf.Module):
    """The interface every outer rule meets (see the module's docstring).

    Subclass it and override :meth:`directions` (and :meth:`build` / :meth:`apply` if the
    rule has state of its own or moves the variables another way); :meth:`step` then
    runs under every formulation, one device or a strategy, XLA or not, guarded or not
    (docs/tutorials/outer_rule.md).
    """

    #: Whether :meth:`step` applies several updates in turn (serial Reptile): the step
    #: builder then compiles each :meth:`directions` with XLA rather than the whole step
    #: (a guarded update's ``tf.cond`` inside one XLA cluster was seen not to order the
    #: next task's variable reads after it in the batched formulation).
    interleaves_updates: bool = False

    #: Why this rule's step cannot be compiled with XLA (``None``: it can). The step
    #: builder refuses ``jit_compile=True`` for such a rule, naming it and the reason,
    #: before anything runs.
    xla_unsupported: Optional[str] = None

    #: Why this rule cannot run on several replicas (``None``: it can, its update the
    #: whole meta-batch's). The step builder refuses a strategy of several replicas for
    #: such a rule, naming it and the reason, before anything runs.
    replicas_unsupported: Optional[str] = None

    def __init__(self, name: Optional[str] = None):
        super().__init__(name=name)
        self._compiled: Optional[Callable[..., Tuple[Directions, Metrics]]] = None

    @property
    def rule(self) -> "OuterRule":
        """The innermost rule (itself; a guard's :attr:`rule` is the rule it wraps)."""
        return self

    def build(self, learner: Learner) -> None:
        """Creates the rule's state for the learner's meta-variables (eagerly, before
        the step is traced). Nothing by default."""

    def directions(self, learner: Learner, episodes: Episode, formulation: Formulation
                   ) -> Tuple[Directions, Metrics]:
        """Update directions (one per :attr:`Learner.meta_variables`, in order: what a
        descent step subtracts) and per-task figures (``[tasks]`` each, ``"loss"``
        among them) of a batch of tasks. Subclasses must override it."""
        raise NotImplementedError(f"{type(self).__name__} must define directions()")

    def apply(self, learner: Learner, directions: Directions, metrics: Metrics) -> Metrics:
        """Moves the meta-variables along ``directions`` and returns ``metrics`` (with
        any figures of the update added). Nothing by default."""
        return metrics

    def step(self, learner: Learner, episodes: Episode, formulation: Formulation,
             apply: Optional[ApplyFn] = None, jit_compile: bool = False) -> Metrics:
        """One outer step on this replica's episodes: :meth:`directions`, then ``apply``
        (the outermost guard's :meth:`apply`, or this rule's own).

        Args:
          jit_compile: compile :meth:`directions` (inner loops and meta-gradient) with
            XLA (what a multi-replica step compiles; on one replica the step builder
            compiles the whole step).

        Returns:
          The per-task figures of the batch before the update (and the guards' entries).
        """
        directions, metrics = self.compiled_directions(jit_compile)(learner, episodes,
                                                                     formulation)
        return (apply or self.apply)(learner, directions, metrics)

    def compiled_directions(self, jit_compile: bool = False
                            ) -> Callable[..., Tuple[Directions, Metrics]]:
        """:meth:`directions`, compiled by XLA when ``jit_compile``."""
        if not jit_compile:
            return self.directions
        if self._compiled is None:
            self._compiled = tf.function(self.directions, jit_compile=True)
        return self._compiled


def _constant_learning_rate(optimizer: keras.optimizers.Optimizer) -> Optional[float]:
    """The optimizer's learning rate if it is a constant (``None`` for a schedule, a
    callable or a value that cannot be read here)."""
    rate = _compat.optimizer_learning_rate(optimizer)
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) or callable(rate):
        return None
    try:
        return float(np.asarray(optimizer.learning_rate))
    except (TypeError, ValueError):
        return None


def check_optimizer(optimizer: Any, owner: str) -> keras.optimizers.Optimizer:
    """``optimizer`` if it is a Keras optimizer with a positive (or scheduled) rate.

    Raises:
      TypeError: not a Keras optimizer. ValueError: a constant rate that is not > 0.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"{owner}.optimizer must be a keras.optimizers.Optimizer, got "
                        f"{optimizer!r}")
    rate = _constant_learning_rate(optimizer)
    if rate is not None and not rate > 0:
        raise ValueError(f"the optimizer's learning_rate must be > 0, got {rate:g} "
                         f"({type(optimizer).__name__})")
    return optimizer


class OptimizerRule(OuterRule):
    """An outer rule whose directions a Keras optimizer applies (its slots and iteration
    count are the rule's state, checkpointed as ``optimizer``).

    Args:
      optimizer: a Keras optimizer; ``None``: the binding gin gives the nearest parent
        class (``MetaGradient.optimizer`` for a subclass of :class:`MetaGradient`), else
        ``default()``.
    """

    def __init__(self, optimizer: Optional[keras.optimizers.Optimizer] = None,
                 name: Optional[str] = None):
        super().__init__(name=name)
        optimizer = configurables.inherited(self, self.configured_class(), "optimizer",
                                            optimizer)
        self.optimizer = check_optimizer(optimizer if optimizer is not None
                                         else self.default(), type(self).__name__)

    @classmethod
    def configured_class(cls) -> type:
        """The shipped class whose gin bindings a research subclass inherits."""
        return cls

    @staticmethod
    def default() -> keras.optimizers.Optimizer:
        """The optimizer when none is given or bound."""
        return keras.optimizers.Adam(learning_rate=1e-3)

    def build(self, learner: Learner) -> None:
        if not self.optimizer.built:
            self.optimizer.build(learner.meta_variables)

    def apply(self, learner: Learner, directions: Directions, metrics: Metrics) -> Metrics:
        replicas.apply_gradients(self.optimizer, directions, learner.meta_variables)
        return metrics


@gin.configurable
@configurables.moved_keywords({
    "clipnorm": "a guard: ClipDirections(MetaGradient(optimizer), max_norm) "
                "(metalearn.outer; gin: Experiment.outer_rule = @ClipDirections(), "
                "ClipDirections.rule = @MetaGradient(), ClipDirections.max_norm = ...)"})
class MetaGradient(OptimizerRule):
    """Gradient descent on the meta-loss with any Keras optimizer: the directions are
    the meta-gradient of the mean query loss over the meta-batch with respect to
    :attr:`Learner.meta_variables`, as the formulation computes it (one tape around
    every task's inner loop, or one task's tape at a time with ``Accumulate``).

    Args:
      optimizer: a Keras optimizer; defaults to Adam with learning rate 1e-3 (or, for a
        subclass, what gin binds to ``MetaGradient.optimizer``).
    """

    def __init__(self, optimizer: Optional[keras.optimizers.Optimizer] = None):
        super().__init__(optimizer)

    @classmethod
    def configured_class(cls) -> type:
        return MetaGradient

    def directions(self, learner, episodes, formulation):
        return formulation.gradients(learner, episodes, learner.meta_variables)


@gin.configurable
def MetaOptimizer(*args: Any, **kwargs: Any) -> OuterRule:  # noqa: N802  (the old class name)
    """Renamed in metalearn 0.3: raises ``TypeError`` naming the new spelling."""
    raise TypeError("MetaOptimizer is MetaGradient since metalearn 0.3: "
                    "MetaGradient(optimizer) (gin: Experiment.outer_rule = @MetaGradient(), "
                    "MetaGradient.optimizer = ...); clipnorm is the guard "
                    "ClipDirections(MetaGradient(optimizer), max_norm) (CHANGELOG.md, "
                    "'Migration')")


def check_replicas(rule: OuterRule, replicas: int) -> None:
    """Refuses several replicas for a rule (or a guard around one) whose
    :attr:`~OuterRule.replicas_unsupported` says why it cannot run on them.

    Raises:
      ValueError: naming the rule, the replicas and the reason.
    """
    if replicas > 1 and rule.replicas_unsupported:
        raise ValueError(f"{type(rule.rule).__name__} cannot run on {replicas} replicas: "
                         f"{rule.replicas_unsupported}; run it on one device")


def check_compiles(rule: OuterRule, jit_compile: bool) -> None:
    """Refuses ``jit_compile`` for a rule (or a guard around one) whose
    :attr:`~OuterRule.xla_unsupported` says why it cannot be compiled with XLA.

    Raises:
      ValueError: naming the rule, the reason and the setting to change.
    """
    if jit_compile and rule.xla_unsupported:
        raise ValueError(f"{type(rule.rule).__name__} cannot be compiled with XLA: "
                         f"{rule.xla_unsupported}; run it with jit_compile=False "
                         "(Runtime.jit_compile = False)")
