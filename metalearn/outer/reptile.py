"""Reptile (Nichol et al., 2018): batched and serial, as two outer rules."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import gin
import keras
import tensorflow as tf

from metalearn.learners import task_batching
from metalearn.learners.learner import Learner
from metalearn.outer.meta_optimizer import Gradients, MetaOptimizer
from metalearn.tasks.episode import Episode


@gin.configurable
class Reptile(MetaOptimizer):
    """Reptile (Nichol et al., 2018): move the initial weights towards the adapted ones.

    No outer gradient is taken: for each task the learner's adapter runs ``inner_steps``
    steps from the initial weights ``theta`` to ``phi_i``, and the outer optimizer is
    given ``theta - phi_i`` as the "gradient", so plain SGD with learning rate
    ``epsilon`` gives Reptile's update, once per meta-batch with the mean over its tasks:
    ``theta <- theta + epsilon * (mean_i phi_i - theta)``. :class:`SerialReptile` updates
    after every task instead.

    Reported metrics are the query metrics after adaptation, before the update.

    Args:
      optimizer: the outer Keras optimizer; defaults to ``SGD(learning_rate=1.0)``
        (epsilon = 1; anneal it with a schedule, as the paper does).
      inner_steps: inner steps per task; defaults to the adapter's ``steps``.
      clipnorm: as for :class:`MetaOptimizer`.
      serial: must be ``False``; serial Reptile is :class:`SerialReptile` (metalearn
        0.2), and ``True`` says so instead of running another algorithm.
    """

    def __init__(self, optimizer: Optional[keras.optimizers.Optimizer] = None,
                 inner_steps: Optional[int] = None, clipnorm: Optional[float] = None,
                 serial: bool = False):
        if serial and not isinstance(self, SerialReptile):
            raise TypeError("Reptile(serial=True) is its own outer rule since metalearn "
                            "0.2: use SerialReptile(...) (gin: @SerialReptile())")
        super().__init__(optimizer if optimizer is not None else
                         keras.optimizers.SGD(learning_rate=1.0), clipnorm=clipnorm)
        if inner_steps is not None and int(inner_steps) < 1:
            raise ValueError(f"inner_steps must be >= 1, got {inner_steps}")
        self.inner_steps = None if inner_steps is None else int(inner_steps)

    @staticmethod
    def _check(learner: Learner) -> None:
        # task_init weights restart every task: nothing to move, nothing to train
        learned = [v.path for piece in learner.pieces for v in piece.meta_variables]
        generated = list(learner.adapter.task_paths(learner.initial_weights()))
        if learned or generated:
            raise ValueError(
                "Reptile moves the model's initial weights only; the learner's pieces "
                f"have meta-learned state {learned} or generate weights {generated} "
                "that it cannot train")

    def _adapted(self, learner: Learner, episodes: Episode
                 ) -> Tuple[Dict[str, tf.Tensor], Dict[str, tf.Tensor]]:
        """Per-task adapted weights (``[tasks, ...]`` by path) and query metrics."""
        weights = learner.initial_weights()

        def one_task(episode):
            support_x, support_y, query_x, query_y = learner.split(episode)
            adapted = learner.adapt(support_x, support_y, steps=self.inner_steps,
                                    weights=weights)
            adapted = {p: tf.stop_gradient(adapted[p]) for p in weights}
            predictions = learner.predict_on(adapted, query_x, query_y)
            return adapted, learner.query_metrics(query_y, predictions)

        signature = ({p: tf.TensorSpec(w.shape, w.dtype) for p, w in weights.items()},
                     {k: tf.TensorSpec([], learner.metric_dtype)
                      for k in learner.query_metric_names})
        return task_batching.per_task(learner, one_task, episodes, signature)

    def compute_gradients(self, learner: Learner, episodes: Episode
                          ) -> Tuple[Gradients, Dict[str, tf.Tensor]]:
        """Reptile's update direction ``theta - mean_i phi_i`` (not a gradient of any
        loss), one entry per :attr:`Learner.meta_variables`, and per-task metrics."""
        self._check(learner)
        adapted, metrics = self._adapted(learner, episodes)
        directions = [tf.convert_to_tensor(v) - tf.reduce_mean(adapted[v.path], axis=0)
                      for v in learner.meta_variables]
        return directions, metrics


@gin.configurable
class SerialReptile(Reptile):
    """Reptile with an update after every task: the tasks of a meta-batch one after
    another, each adapted from the weights the previous task's update left,
    ``theta <- theta + epsilon * (phi_i - theta)``.

    Guarded (non-finite checks), each task's update is applied only if it and every
    earlier task's are finite, so the tasks of the batch before the first non-finite one
    keep their updates. Cannot run under several replicas (each update depends on the
    previous task's). Arguments as for :class:`Reptile`.
    """

    def __init__(self, optimizer: Optional[keras.optimizers.Optimizer] = None,
                 inner_steps: Optional[int] = None, clipnorm: Optional[float] = None):
        super().__init__(optimizer, inner_steps=inner_steps, clipnorm=clipnorm,
                         serial=True)

    def step(self, learner: Learner, episodes: Episode, guard: bool = False,
             jit_compile: bool = False) -> Tuple[Dict[str, tf.Tensor], Optional[tf.Tensor]]:
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            raise ValueError("serial Reptile updates after each task in turn, which "
                             f"{context.num_replicas_in_sync} replicas cannot share; use "
                             "Reptile (batched) under a distribution strategy")
        compute = self.compute(jit_compile)
        per_task, flags = [], None
        for i in range(episodes.num_tasks):
            one = tf.nest.map_structure(lambda t: t[i:i + 1], episodes)  # [1, ...]
            directions, metrics = compute(learner, one)
            if guard:
                task_flags = self.non_finite(metrics["loss"], directions)
                flags = task_flags if flags is None else flags + task_flags
                self.apply_gradients(learner, directions, only_if=tf.reduce_all(flags == 0))
            else:
                self.apply_gradients(learner, directions)
            per_task.append(metrics)
        return {k: tf.concat([m[k] for m in per_task], axis=0) for k in per_task[0]}, flags
