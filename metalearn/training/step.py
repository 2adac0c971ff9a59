"""The one meta-step builder: one device or a ``tf.distribute`` strategy, XLA or not,
guarded against non-finite values or not.

Every path that trains (the training loop, benchmarks, research code) builds its step
here, so the step a benchmark measures is the step a run takes. The outer rule decides
what a step does (:meth:`MetaOptimizer.step`: compute, then apply; serial Reptile
interleaves them per task); this module compiles it, runs it per replica, averages the
metrics over all tasks and advances the learner's ``meta_step``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import tensorflow as tf

from metalearn.learners.learner import Learner
from metalearn.outer.meta_optimizer import MetaOptimizer

MetaStep = Callable[[Any], Dict[str, tf.Tensor]]

NON_FINITE = "non_finite"  # the meta-step's output key for MetaOptimizer.non_finite


def make_meta_step(learner: Learner, meta_optimizer: MetaOptimizer,
                   jit_compile: bool = False, skip_non_finite: bool = False,
                   strategy: Optional[tf.distribute.Strategy] = None) -> MetaStep:
    """The whole outer step (inner loops, meta-gradient, update) as one ``tf.function``.

    Returns a function of a batch of episodes giving the metrics' means over all tasks
    (``{"loss": ..., ...}``) before the update; each call advances ``learner.meta_step``
    by one after the update (what schedules over meta-training read).

    Args:
      learner, meta_optimizer: what is trained, and the outer rule.
      jit_compile: compile with XLA. On one replica the whole step is compiled; under a
        strategy with several replicas each replica's inner loops and meta-gradient are
        (the all-reduce and the update run outside XLA).
      skip_non_finite: apply an update only if the meta-loss and every meta-gradient are
        finite on every replica (decided inside the step; otherwise weights, optimizer
        slots and iteration count are left as they were). The result then has one more
        entry, ``NON_FINITE``: :meth:`MetaOptimizer.non_finite`'s vector (entry 0 the
        loss, ``1 + i`` the gradient of ``learner.meta_variables[i]``; all zero when
        the update was applied).
      strategy: a ``tf.distribute`` strategy (the learner built in its scope); the step
        then takes per-replica episodes (from
        :func:`~metalearn.training.distribute.episode_stream` or
        :func:`~metalearn.training.distribute.split_episodes`). ``None``: the current
        strategy (one device by default), taking a plain batch of episodes.
    """
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        meta_optimizer.build(learner)
    replicas = strategy.num_replicas_in_sync
    # One replica: XLA compiles the whole step. Several: each replica's computation.
    inner_jit = jit_compile and replicas > 1

    def replica_step(episodes):
        metrics, flags = meta_optimizer.step(learner, episodes, guard=skip_non_finite,
                                             jit_compile=inner_jit)
        return metrics if flags is None else {**metrics, NON_FINITE: flags}

    def step(episodes) -> Dict[str, tf.Tensor]:
        per_replica = strategy.run(replica_step, args=(episodes,))
        metrics = {name: strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=0)
                   for name, value in per_replica.items() if name != NON_FINITE}
        if skip_non_finite:  # already summed over replicas: any local copy
            metrics[NON_FINITE] = strategy.experimental_local_results(
                per_replica[NON_FINITE])[0]
        with tf.control_dependencies(tf.nest.flatten(metrics)):
            learner.meta_step.assign_add(1)  # what meta-training schedules read
        return metrics

    return tf.function(step, jit_compile=jit_compile and replicas == 1)


def make_distributed_meta_step(strategy: tf.distribute.Strategy, learner: Learner,
                               meta_optimizer: MetaOptimizer, jit_compile: bool = False,
                               skip_non_finite: bool = False) -> MetaStep:
    """:func:`make_meta_step` under ``strategy`` (the same builder)."""
    return make_meta_step(learner, meta_optimizer, jit_compile=jit_compile,
                          skip_non_finite=skip_non_finite, strategy=strategy)
