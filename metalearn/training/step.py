"""The one meta-step builder: one device or a ``tf.distribute`` strategy, XLA or not,
guarded against non-finite values or not.

Every path that trains (the training loop, benchmarks, research code) builds its step
here, so the step a benchmark measures is the step a run takes. The outer rule decides
what a step does (:meth:`OuterRule.step`: directions, then apply; serial Reptile
interleaves them per task) and the formulation how its tasks run; this module compiles
it, runs it per replica, averages the metrics over all tasks and advances the learner's
``meta_step``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple, Optional, Union

import tensorflow as tf

from metalearn import execution
from metalearn.learners.learner import Learner
from metalearn.outer.guards import NON_FINITE, SkipNonFinite, guarded
from metalearn.outer.rule import OuterRule, check_compiles, check_replicas

MetaStep = Callable[[Any], Dict[str, tf.Tensor]]


class StepFunction(NamedTuple):
    """The meta-step before it is compiled (:func:`build_meta_step`).

    Attributes:
      step: the step as a plain Python function of a batch of episodes, for a caller
        that traces it inside its own ``tf.function`` (``make_meta_step``; a Keras
        ``train_step``, :class:`metalearn.keras.MetaModel`).
      jit_compile: whether that ``tf.function`` compiles the whole step with XLA (on
        one replica, for a rule that applies one update; otherwise the step compiles
        each computation of the directions itself).
      in_replica: on one replica, the same step for a caller that already runs it
        inside the replica (a Keras ``train_step``, which Keras' ``train_function``
        runs under ``strategy.run``): the rule's step, the means over the tasks, the
        step counter advanced, with no ``strategy.run`` of its own; ``None`` on
        several replicas.
    """

    step: MetaStep
    jit_compile: bool
    in_replica: Optional[MetaStep] = None


def make_meta_step(learner: Learner, outer_rule: OuterRule,
                   formulation: Union[None, str, execution.Formulation] = None,
                   jit_compile: bool = False, skip_non_finite: bool = False,
                   strategy: Optional[tf.distribute.Strategy] = None) -> MetaStep:
    """The whole outer step (inner loops, meta-gradient, update) as one ``tf.function``.

    Returns a function of a batch of episodes giving the metrics' means over all tasks
    (``{"loss": ..., ...}``) before the update; each call advances ``learner.meta_step``
    by one after the update (what schedules over meta-training read).

    Args:
      learner, outer_rule: what is trained, and the outer rule
        (:mod:`metalearn.outer`: ``MetaGradient(optimizer)``, ``Reptile()``, guards).
      formulation: how the tasks of a batch run (:mod:`metalearn.execution`);
        ``None``: :class:`~metalearn.execution.Auto`.
      jit_compile: compile with XLA (refused, naming the reason, for a rule whose
        :attr:`~metalearn.outer.OuterRule.xla_unsupported` says why not). On one replica the whole step is compiled; under a
        strategy with several replicas, or for a rule that applies several updates in
        turn (:attr:`~metalearn.outer.OuterRule.interleaves_updates`: serial Reptile),
        each computation of the directions is (the all-reduce and the updates run
        outside XLA).
      skip_non_finite: wrap the rule in :class:`~metalearn.outer.SkipNonFinite` (unless
        it holds one): an update is applied only if the meta-loss and every direction
        are finite on every replica. The result then has one more entry,
        ``NON_FINITE``: :func:`metalearn.outer.guards.non_finite`'s vector (entry 0 the
        loss, ``1 + i`` the direction of ``learner.meta_variables[i]``; all zero when
        the update was applied).
      strategy: a ``tf.distribute`` strategy (the learner built in its scope); the step
        then takes per-replica episodes (from
        :func:`~metalearn.training.distribute.episode_stream` or
        :func:`~metalearn.training.distribute.split_episodes`). ``None``: the current
        strategy (one device by default), taking a plain batch of episodes.
    """
    built = build_meta_step(learner, outer_rule, formulation, jit_compile=jit_compile,
                            skip_non_finite=skip_non_finite, strategy=strategy)
    return tf.function(built.step, jit_compile=built.jit_compile)


def build_meta_step(learner: Learner, outer_rule: OuterRule,
                    formulation: Union[None, str, execution.Formulation] = None,
                    jit_compile: bool = False, skip_non_finite: bool = False,
                    strategy: Optional[tf.distribute.Strategy] = None) -> StepFunction:
    """:func:`make_meta_step`'s step before it is compiled, and whether to compile it
    with XLA: the one builder, for a caller that compiles the step inside its own
    ``tf.function`` (:class:`metalearn.keras.MetaModel`'s ``train_step``). The checks
    and the outer rule's ``build`` run here, at once; the arguments are
    :func:`make_meta_step`'s."""
    if not isinstance(outer_rule, OuterRule):
        raise TypeError(f"make_meta_step needs a metalearn outer rule (MetaGradient(), "
                        f"Reptile(), ...: metalearn.outer), got {outer_rule!r}")
    check_compiles(outer_rule, jit_compile)
    formulation = execution.formulation(formulation)
    formulation.check(learner)
    if skip_non_finite and not guarded(outer_rule, SkipNonFinite):
        outer_rule = SkipNonFinite(outer_rule)
    guard = guarded(outer_rule, SkipNonFinite)
    strategy = strategy or tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    check_replicas(outer_rule, replicas)
    with strategy.scope():
        outer_rule.build(learner)
    # One replica: XLA compiles the whole step. Several, or a rule that applies several
    # updates in turn: each computation of directions.
    whole_jit = jit_compile and replicas == 1 and not outer_rule.interleaves_updates
    inner_jit = jit_compile and not whole_jit

    def replica_step(episodes):
        return outer_rule.step(learner, episodes, formulation, jit_compile=inner_jit)

    def finish(per_replica, mean, local) -> Dict[str, tf.Tensor]:
        metrics = {name: mean(value) for name, value in per_replica.items()
                   if name != NON_FINITE}
        if guard:  # already summed over replicas: any local copy
            metrics[NON_FINITE] = local(per_replica[NON_FINITE])
        with tf.control_dependencies(tf.nest.flatten(metrics)):
            learner.meta_step.assign_add(1)  # what meta-training schedules read
        return metrics

    def step(episodes) -> Dict[str, tf.Tensor]:
        return finish(strategy.run(replica_step, args=(episodes,)),
                      lambda value: strategy.reduce(tf.distribute.ReduceOp.MEAN, value,
                                                    axis=0),
                      lambda value: strategy.experimental_local_results(value)[0])

    def in_replica(episodes) -> Dict[str, tf.Tensor]:
        return finish(replica_step(episodes), lambda value: tf.reduce_mean(value, axis=0),
                      lambda value: value)

    return StepFunction(step, whole_jit, in_replica if replicas == 1 else None)


def make_distributed_meta_step(strategy: tf.distribute.Strategy, learner: Learner,
                               outer_rule: OuterRule,
                               formulation: Union[None, str, execution.Formulation] = None,
                               jit_compile: bool = False,
                               skip_non_finite: bool = False) -> MetaStep:
    """:func:`make_meta_step` under ``strategy`` (the same builder)."""
    return make_meta_step(learner, outer_rule, formulation, jit_compile=jit_compile,
                          skip_non_finite=skip_non_finite, strategy=strategy)
