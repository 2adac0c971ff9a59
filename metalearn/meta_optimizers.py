"""Outer updates of a learner's meta-variables."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import gin
import keras
import tensorflow as tf

from metalearn.learners import Learner
from metalearn.tasks.episode import Episode

Gradients = List[Optional[tf.Tensor]]


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

    def apply_gradients(self, learner: Learner, gradients: Sequence[tf.Tensor]) -> None:
        """Applies (clipped) meta-gradients to the learner's meta-variables.

        Inside a ``tf.distribute`` replica context, ``gradients`` are this replica's
        (mean over its own tasks; every replica holds as many tasks) and the update uses
        their mean over all replicas, i.e. the meta-gradient of the whole meta-batch.
        """
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
