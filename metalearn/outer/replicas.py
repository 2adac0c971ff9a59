"""What an outer rule needs under ``tf.distribute``: the one home of the cross-replica
apply.

Inside a replica context each replica holds its share of the tasks; an update must be
that of the whole meta-batch, and a guarded update must be decided the same way on every
replica. Outside a strategy (one device) every function here is the plain operation.
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence

import tensorflow as tf

from metalearn import _compat


def count() -> int:
    """Replicas in sync in the current context (1 outside a strategy)."""
    context = tf.distribute.get_replica_context()
    return context.num_replicas_in_sync if context is not None else 1


def mean(tensors: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """Each tensor's mean over the replicas (the tensors themselves on one)."""
    tensors = list(tensors)
    if count() > 1:
        return list(tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.MEAN, tensors))
    return tensors


def total(tensor: tf.Tensor) -> tf.Tensor:
    """``tensor`` summed over the replicas (itself on one)."""
    if count() > 1:
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM,
                                                              tensor)
    return tensor


def gather_tasks(tensors: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """Each ``[tasks, ...]`` tensor (this replica's tasks) with every replica's tasks
    along the task axis, replica-major (the tensors themselves on one): what a rule
    whose update depends on the whole meta-batch's per-task values (gradient surgery
    across tasks) reads, so that every replica computes the whole batch's update."""
    tensors = list(tensors)
    if count() > 1:
        context = tf.distribute.get_replica_context()
        return [context.all_gather(t, axis=0) for t in tensors]
    return tensors


def apply_gradients(optimizer: Any, gradients: Sequence[tf.Tensor],
                    variables: Sequence[tf.Variable]) -> None:
    """A Keras optimizer's update with this replica's ``gradients`` (mean over its own
    tasks): the update uses their mean over the replicas. Keras sums gradients over
    replicas when it applies them, so it is handed ``1 / replicas`` of each."""
    replicas = count()
    if replicas > 1 or tf.distribute.has_strategy():
        gradients = [g / replicas for g in gradients] if replicas > 1 else list(gradients)
        optimizer.apply_gradients(zip(gradients, variables))
        return
    # One device, no strategy: applied in the default strategy's cross-replica context,
    # where Keras' TensorFlow optimizer skips its all-reduce of the gradients (a sum over
    # the one replica). That all-reduce is a graph-mode tf.custom_gradient, which
    # TensorFlow registers in its global gradient registry for good: it kept every traced
    # step (its graphs and the functions they call) alive for the life of the process.
    tf.distribute.get_replica_context().merge_call(
        lambda _: optimizer.apply_gradients(zip(list(gradients), variables)))


def run_if(condition: tf.Tensor, fn: Callable[[List[tf.Tensor]], Any],
           tensors: Sequence[tf.Tensor]) -> None:
    """``fn(tensors)`` (this replica's tensors) only where the scalar boolean
    ``condition``, the same on every replica, holds, inside the compiled step. A
    ``tf.cond`` in a replica context cannot hold the ``merge_call`` a Keras optimizer
    makes, so under such a strategy the decision is taken in the cross-replica context,
    as Keras' ``LossScaleOptimizer`` does."""
    tensors = list(tensors)
    context = tf.distribute.get_replica_context()
    if context is None or _compat.strategy_supports_no_merge_call():
        tf.cond(condition, lambda: (fn(tensors), None)[1], lambda: None)
        return

    def cross_replica(strategy, condition, tensors):
        agreed = strategy.experimental_local_results(condition)[0]
        tf.cond(agreed, lambda: (strategy.extended.call_for_each_replica(
            fn, args=(tensors,)), None)[1], lambda: None)

    context.merge_call(cross_replica, args=(condition, tensors))
