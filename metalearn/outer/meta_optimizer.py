"""The outer update rule: a meta-gradient step with any Keras optimizer.

An outer rule has two halves: :meth:`MetaOptimizer.compute_gradients` (the per-task
inner loops and the meta-gradient, a pure function that XLA may compile) and
:meth:`MetaOptimizer.apply_gradients` (the optimizer's update, all-reduced under a
strategy). :meth:`MetaOptimizer.step` puts them together, guarded against non-finite
values or not; :func:`metalearn.training.make_meta_step` is the one builder that
compiles it, for one device or a strategy. A rule that interleaves the halves (serial
Reptile) overrides :meth:`step`.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn import _compat
from metalearn.learners import task_batching
from metalearn.learners.learner import Learner
from metalearn.tasks.episode import Episode

Gradients = List[Optional[tf.Tensor]]
ComputeFn = Callable[[Learner, Episode], Tuple[Gradients, Dict[str, tf.Tensor]]]


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


@gin.configurable
class MetaOptimizer:
    """Gradient-based outer step with any Keras optimizer.

    The meta-gradient is that of :meth:`Learner.meta_loss` (the mean query loss over the
    meta-batch) with respect to :attr:`Learner.meta_variables`, taken with one
    ``tf.GradientTape`` around the whole batch of inner loops.

    Args:
      optimizer: a Keras optimizer; defaults to Adam with learning rate 1e-3.
      clipnorm: if set, clip the meta-gradient to this global norm before applying it.
    """

    def __init__(self, optimizer: Optional[keras.optimizers.Optimizer] = None,
                 clipnorm: Optional[float] = None):
        self.optimizer = optimizer if optimizer is not None else \
            keras.optimizers.Adam(learning_rate=1e-3)
        if not isinstance(self.optimizer, keras.optimizers.Optimizer):
            raise TypeError(f"optimizer must be a keras.optimizers.Optimizer, got "
                            f"{self.optimizer!r}")
        rate = _constant_learning_rate(self.optimizer)
        if rate is not None and not rate > 0:
            raise ValueError(f"the optimizer's learning_rate must be > 0, got {rate:g} "
                             f"({type(self.optimizer).__name__})")
        if clipnorm is not None and not float(clipnorm) > 0:
            raise ValueError(f"clipnorm must be > 0, got {clipnorm}")
        self.clipnorm = None if clipnorm is None else float(clipnorm)
        self._compiled: Optional[ComputeFn] = None

    def build(self, learner: Learner) -> None:
        """Creates the optimizer's slots for the learner's meta-variables (eagerly)."""
        if not self.optimizer.built:
            self.optimizer.build(learner.meta_variables)

    def compute_gradients(self, learner: Learner, episodes: Episode
                          ) -> Tuple[Gradients, Dict[str, tf.Tensor]]:
        """Meta-gradients and per-task metrics (``[tasks]`` each) of a batch of episodes."""
        variables = learner.meta_variables
        if learner.task_batching_for(episodes) == "accumulate":  # one task's tape at a time
            return task_batching.accumulate(learner, episodes, variables)
        handles = learner.gradient_metrics
        with tf.GradientTape() as tape:
            metrics = learner.meta_metrics(episodes)
            loss = tf.reduce_mean(metrics["loss"])
        gradients = tape.gradient(loss, variables + list(handles.values()))
        gradients, measured = gradients[:len(variables)], gradients[len(variables):]
        missing = [v.path for v, g in zip(variables, gradients) if g is None]
        if missing:
            raise ValueError(f"no meta-gradient reaches {missing}: the meta-loss does not "
                             "depend on them (is the graph disconnected?)")
        metrics = dict(metrics)
        metrics.update(task_batching.gradient_metrics(
            learner, dict(zip(handles, measured)), tf.shape(metrics["loss"])[0]))
        return gradients, metrics

    def apply_gradients(self, learner: Learner, gradients: Sequence[tf.Tensor],
                        only_if: Optional[tf.Tensor] = None) -> None:
        """Applies (clipped) meta-gradients to the learner's meta-variables.

        Inside a ``tf.distribute`` replica context, ``gradients`` are this replica's
        (mean over its own tasks; every replica holds as many tasks) and the update uses
        their mean over all replicas, i.e. the meta-gradient of the whole meta-batch.

        Args:
          learner: whose meta-variables are updated.
          gradients: one per :attr:`Learner.meta_variables`.
          only_if: a scalar boolean, the same on every replica (e.g. from
            :meth:`non_finite`): when false, nothing changes (weights, optimizer slots
            and the optimizer's iteration count), inside the compiled step.
        """
        if only_if is None:
            self._apply(learner, gradients)
            return
        context = tf.distribute.get_replica_context()
        if context is None or _compat.strategy_supports_no_merge_call():
            tf.cond(only_if, lambda: self._apply(learner, gradients), lambda: None)
            return

        # A cond in a replica context cannot hold a merge_call (which the Keras
        # optimizer makes): decide in the cross-replica context, as Keras'
        # LossScaleOptimizer does. ``only_if`` agrees on every replica.
        def cross_replica(strategy, gradients, only_if):
            agreed = strategy.experimental_local_results(only_if)[0]
            tf.cond(agreed, lambda: strategy.extended.call_for_each_replica(
                self._apply, args=(learner, gradients)), lambda: None)

        context.merge_call(cross_replica, args=(gradients, only_if))

    def non_finite(self, loss: tf.Tensor, gradients: Sequence[tf.Tensor]) -> tf.Tensor:
        """Which of the loss and the gradients hold a NaN or an infinity.

        Returns:
          A float32 vector ``[1 + len(gradients)]``: entry 0 counts the replicas whose
          loss is not finite, entry ``1 + i`` those whose gradient ``i`` is not. Inside a
          ``tf.distribute`` replica context it is summed over all replicas, so every
          replica (and worker) sees the same vector and takes the same decision.
        """
        flags = [tf.logical_not(tf.reduce_all(tf.math.is_finite(loss)))]
        flags += [tf.logical_not(tf.reduce_all(tf.math.is_finite(g))) for g in gradients]
        flags = tf.cast(tf.stack(flags), tf.float32)
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            flags = context.all_reduce(tf.distribute.ReduceOp.SUM, flags)
        return flags

    def _apply(self, learner: Learner, gradients: Sequence[tf.Tensor]) -> None:
        gradients = list(gradients)
        replicas = tf.distribute.get_replica_context()
        replicas = replicas.num_replicas_in_sync if replicas is not None else 1
        if self.clipnorm is not None:
            if replicas > 1:  # clip the whole meta-batch's gradient, not a replica's
                gradients = tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.MEAN, gradients)
            gradients, _ = tf.clip_by_global_norm(gradients, self.clipnorm)
        # Keras sums gradients over replicas when it applies them: hand it 1/R of each.
        gradients = [g / replicas for g in gradients] if replicas > 1 else gradients
        self.optimizer.apply_gradients(zip(gradients, learner.meta_variables))

    def compute(self, jit_compile: bool = False) -> ComputeFn:
        """:meth:`compute_gradients`, compiled by XLA when ``jit_compile``."""
        if not jit_compile:
            return self.compute_gradients
        if self._compiled is None:
            self._compiled = tf.function(self.compute_gradients, jit_compile=True)
        return self._compiled

    def step(self, learner: Learner, episodes: Episode, guard: bool = False,
             jit_compile: bool = False) -> Tuple[Dict[str, tf.Tensor], Optional[tf.Tensor]]:
        """One outer step on this replica's episodes.

        Args:
          learner: whose meta-variables are updated.
          episodes: a batch of episodes (this replica's share under a strategy).
          guard: apply the update only if the meta-loss and every meta-gradient are
            finite on every replica (otherwise nothing changes).
          jit_compile: compile the inner loops and meta-gradient with XLA.

        Returns:
          The per-task metrics of the batch before the update, and (with ``guard``)
          :meth:`non_finite`'s vector, all zero when the update was applied (else
          ``None``).
        """
        gradients, metrics = self.compute(jit_compile)(learner, episodes)
        if not guard:
            self.apply_gradients(learner, gradients)
            return metrics, None
        flags = self.non_finite(metrics["loss"], gradients)
        self.apply_gradients(learner, gradients, only_if=tf.reduce_all(flags == 0))
        return metrics, flags
