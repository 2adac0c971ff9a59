"""Gradient surgery across the tasks of a meta-batch (PCGrad, Yu et al., 2020): an outer
rule built on each task's own meta-gradient (``Formulation.task_gradients``)."""

from __future__ import annotations

from typing import List, Optional

import gin
import keras
import tensorflow as tf

from metalearn.outer import replicas
from metalearn.outer.rule import OptimizerRule


def project_conflicts(gradients: tf.Tensor) -> tf.Tensor:
    """PCGrad's projection of ``[tasks, n]`` flat per-task gradients: each task's
    gradient ``g_i``, for every other task ``j`` in index order, loses its component
    along ``g_j`` when the two conflict (``g_i . g_j < 0``):
    ``g_i <- g_i - (g_i . g_j) / |g_j|^2 g_j``. The order is fixed (the paper draws it at
    random), so the update is a function of the batch.

    Raises:
      ValueError: the number of tasks is not static.
    """
    tasks = gradients.shape[0]
    if tasks is None:
        raise ValueError("PCGrad needs the meta-batch size in the episodes' static shape")
    rows = [gradients[i] for i in range(tasks)]
    squared = [tf.reduce_sum(tf.square(g)) for g in rows]
    projected = []
    for i in range(tasks):
        g = rows[i]
        for j in range(tasks):
            if j == i:
                continue
            dot = tf.reduce_sum(g * rows[j])
            g = g - tf.math.divide_no_nan(tf.minimum(dot, 0.0), squared[j]) * rows[j]
        projected.append(g)
    return tf.stack(projected)


@gin.configurable
class PCGrad(OptimizerRule):
    """Projecting conflicting gradients (Yu et al., 2020) across the tasks of a
    meta-batch: each task's meta-gradient (the formulation's ``task_gradients``, batched
    where the formulation is) loses its components that conflict with the other tasks'
    (:func:`project_conflicts`), and the mean of the projected gradients is applied by a
    Keras optimizer. Under several replicas every replica gathers every task's gradient
    (:func:`metalearn.outer.replicas.gather_tasks`), so the update is the whole
    batch's, not each replica's.

    Args:
      optimizer: a Keras optimizer; defaults to Adam with learning rate 1e-3.
    """

    def __init__(self, optimizer: Optional[keras.optimizers.Optimizer] = None):
        super().__init__(optimizer)

    @classmethod
    def configured_class(cls) -> type:
        return PCGrad

    def directions(self, learner, episodes, formulation):
        variables = learner.meta_variables
        per_task, metrics = formulation.task_gradients(learner, episodes, variables)
        per_task = replicas.gather_tasks(per_task)
        tasks = per_task[0].shape[0]
        flat = tf.concat([tf.reshape(g, [tasks, -1]) for g in per_task], axis=1)
        mean = tf.reduce_mean(project_conflicts(flat), axis=0)
        sizes = [v.shape.num_elements() for v in variables]
        directions: List[tf.Tensor] = [tf.reshape(d, v.shape) for d, v in
                                       zip(tf.split(mean, sizes), variables)]
        return directions, metrics
