"""Outer updates of a learner's meta-variables."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn.learners import Learner
from metalearn.tasks.episode import Episode

Gradients = List[Optional[tf.Tensor]]


def _constant_learning_rate(optimizer: keras.optimizers.Optimizer) -> Optional[float]:
    """The optimizer's learning rate if it is a constant (``None`` for a schedule, a
    callable or a value that cannot be read here)."""
    rate = getattr(optimizer, "_learning_rate", None)
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

    def build(self, learner: Learner) -> None:
        """Creates the optimizer's slots for the learner's meta-variables (eagerly)."""
        if not self.optimizer.built:
            self.optimizer.build(learner.meta_variables)

    def compute_gradients(self, learner: Learner, episodes: Episode
                          ) -> Tuple[Gradients, Dict[str, tf.Tensor]]:
        """Meta-gradients and per-task metrics (``[tasks]`` each) of a batch of episodes."""
        variables = learner.meta_variables
        with tf.GradientTape() as tape:
            metrics = learner.meta_metrics(episodes)
            loss = tf.reduce_mean(metrics["loss"])
        gradients = tape.gradient(loss, variables)
        missing = [v.path for v, g in zip(variables, gradients) if g is None]
        if missing:
            raise ValueError(f"no meta-gradient reaches {missing}: the meta-loss does not "
                             "depend on them (is the graph disconnected?)")
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
        if context is None or tf.__internal__.distribute.strategy_supports_no_merge_call():
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

    def step(self, learner: Learner, episodes: Episode) -> Dict[str, tf.Tensor]:
        """One outer step; returns the per-task metrics of the batch before the update."""
        gradients, metrics = self.compute_gradients(learner, episodes)
        self.apply_gradients(learner, gradients)
        return metrics

    def finite_step(self, learner: Learner, episodes: Episode
                    ) -> Tuple[Dict[str, tf.Tensor], tf.Tensor]:
        """One outer step that changes nothing unless the meta-loss and every
        meta-gradient are finite (on every replica).

        Returns:
          The per-task metrics (as :meth:`step`) and :meth:`non_finite`'s vector
          (all zero when the update was applied).
        """
        gradients, metrics = self.compute_gradients(learner, episodes)
        flags = self.non_finite(metrics["loss"], gradients)
        self.apply_gradients(learner, gradients, only_if=tf.reduce_all(flags == 0))
        return metrics, flags


@gin.configurable
class Reptile(MetaOptimizer):
    """Reptile (Nichol et al., 2018): move the initial weights towards the adapted ones.

    No outer gradient is taken: for each task the learner's adapter runs ``inner_steps``
    steps from the initial weights ``theta`` to ``phi_i``, and the outer optimizer is
    given ``theta - phi_i`` as the "gradient", so plain SGD with learning rate
    ``epsilon`` gives Reptile's update.

    * batched (``serial=False``): one update with the mean over the meta-batch,
      ``theta <- theta + epsilon * (mean_i phi_i - theta)``;
    * serial (``serial=True``): the tasks one after another, each adapted from the
      weights the previous task's update left, ``theta <- theta + epsilon * (phi_i - theta)``.

    Reported metrics are the query metrics after adaptation, before the update.

    Args:
      optimizer: the outer Keras optimizer; defaults to ``SGD(learning_rate=1.0)``
        (epsilon = 1; anneal it with a schedule, as the paper does).
      serial: update after every task instead of once per meta-batch.
      inner_steps: inner steps per task; defaults to the adapter's ``steps``.
      clipnorm: as for :class:`MetaOptimizer`.
    """

    def __init__(self, optimizer: Optional[keras.optimizers.Optimizer] = None,
                 serial: bool = False, inner_steps: Optional[int] = None,
                 clipnorm: Optional[float] = None):
        super().__init__(optimizer if optimizer is not None else
                         keras.optimizers.SGD(learning_rate=1.0), clipnorm=clipnorm)
        if inner_steps is not None and int(inner_steps) < 1:
            raise ValueError(f"inner_steps must be >= 1, got {inner_steps}")
        self.serial = bool(serial)
        self.inner_steps = None if inner_steps is None else int(inner_steps)

    @staticmethod
    def _check(learner: Learner) -> None:
        # zero_init weights restart at zero every task: nothing to move, nothing to train
        generated = [p for p in learner.generated_paths()
                     if p not in learner.zero_init_paths]
        if learner.adapter.meta_variables or generated:
            raise ValueError(
                "Reptile moves the model's initial weights only; the learner's adapter "
                f"{type(learner.adapter).__name__} has meta-learned state "
                f"{[v.path for v in learner.adapter.meta_variables]} or generates weights "
                f"{generated} that it cannot train")

    def _adapted(self, learner: Learner, episodes: Episode
                 ) -> Tuple[Dict[str, tf.Tensor], Dict[str, tf.Tensor]]:
        """Per-task adapted weights (``[tasks, ...]`` by path) and query metrics."""
        weights = learner.initial_weights()

        def one_task(episode):
            support_x, support_y, query_x, query_y = learner.split(episode)
            adapted = learner.adapt(support_x, support_y, steps=self.inner_steps,
                                    weights=weights)
            adapted = {p: tf.stop_gradient(adapted[p]) for p in weights}
            return adapted, learner.query_metrics(query_y, learner.predict(adapted, query_x))

        if learner.task_batching == "unrolled":
            results = [one_task(episodes.task(i)) for i in range(episodes.num_tasks)]
            return tf.nest.map_structure(lambda *t: tf.stack(t), *results)
        signature = ({p: tf.TensorSpec(w.shape, w.dtype) for p, w in weights.items()},
                     {k: tf.TensorSpec([], learner.metric_dtype)
                      for k in learner.metric_names})
        return tf.map_fn(one_task, episodes, fn_output_signature=signature,
                         parallel_iterations=learner.parallel_iterations)

    def compute_gradients(self, learner: Learner, episodes: Episode
                          ) -> Tuple[Gradients, Dict[str, tf.Tensor]]:
        """Reptile's update direction ``theta - mean_i phi_i`` (not a gradient of any
        loss), one entry per :attr:`Learner.meta_variables`, and per-task metrics."""
        self._check(learner)
        adapted, metrics = self._adapted(learner, episodes)
        directions = [tf.convert_to_tensor(v) - tf.reduce_mean(adapted[v.path], axis=0)
                      for v in learner.meta_variables]
        return directions, metrics

    def step(self, learner: Learner, episodes: Episode) -> Dict[str, tf.Tensor]:
        if not self.serial:
            return super().step(learner, episodes)
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            raise ValueError("serial Reptile updates after each task in turn, which "
                             f"{context.num_replicas_in_sync} replicas cannot share; use "
                             "Reptile(serial=False) under a distribution strategy")
        per_task = []
        for i in range(episodes.num_tasks):
            one = tf.nest.map_structure(lambda t: t[i:i + 1], episodes)  # [1, ...]
            directions, metrics = self.compute_gradients(learner, one)
            self.apply_gradients(learner, directions)
            per_task.append(metrics)
        return {k: tf.concat([m[k] for m in per_task], axis=0) for k in per_task[0]}

    def finite_step(self, learner: Learner, episodes: Episode
                    ) -> Tuple[Dict[str, tf.Tensor], tf.Tensor]:
        """As :meth:`MetaOptimizer.finite_step`; serially, each task's update is applied
        only if it and every earlier task's are finite, so the tasks of the batch before
        the first non-finite one keep their updates."""
        if not self.serial:
            return super().finite_step(learner, episodes)
        per_task, flags = [], None
        for i in range(episodes.num_tasks):
            one = tf.nest.map_structure(lambda t: t[i:i + 1], episodes)  # [1, ...]
            directions, metrics = self.compute_gradients(learner, one)
            task_flags = self.non_finite(metrics["loss"], directions)
            flags = task_flags if flags is None else flags + task_flags
            self.apply_gradients(learner, directions, only_if=tf.reduce_all(flags == 0))
            per_task.append(metrics)
        return {k: tf.concat([m[k] for m in per_task], axis=0) for k in per_task[0]}, flags
