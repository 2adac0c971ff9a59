"""A clipped-ratio outer rule (PPO, Schulman et al. 2017; ProMP, Rothfuss et al. 2019):
several epochs of a Keras optimizer on the clipped likelihood-ratio surrogate of the
same collected trajectories.

Each step collects the batch's trajectories at the current meta-variables ``theta``
(:class:`~metalearn.rl.trpo.TrustRegion`: every inner step's support trajectories
and the adapted policy's query trajectories, held fixed), then runs ``epochs`` updates;
in each, every task is adapted again on its collected support trajectories (their
surrogates weighted by the likelihood ratio to the collecting policy, so the inner
loop is a function of the current values whose derivatives at ``theta`` are the
estimator's: DiCE's, or with :class:`~metalearn.rl.LVC`, ProMP's inner step, LVC's)
and the objective is ProMP's::

    J = mean_i E[min(r_t A_t, clip(r_t, 1 - clip, 1 + clip) A_t)]
        - kl_penalty * mean_i E[log pi_collected(a | s) - log pi_current(a | s)]

with ``r_t`` the ratio of the adapted policy's probability of a query action to the
collecting one's, and the penalty the KL divergence from the collecting pre-update
policy to the current one on the first inner step's trajectories (estimated on their
actions: the mean of ``log pi_collected - log pi_current``; ProMP penalises the inner
policies' KL to keep the pre-update sampling distribution close).

With ``kl_target`` the coefficient adapts as ProMP's (and PPO's adaptive KL penalty,
Schulman et al. 2017): after each step, the KL at the new values measured on the same
trajectories, the coefficient is doubled if that KL exceeds ``1.5 kl_target`` and
halved if it is below ``kl_target / 1.5`` (:func:`adapted_kl_coefficient`). It is a
variable of the rule, checkpointed with the run, so a resumed run continues it.
"""

from __future__ import annotations

from typing import Optional

import gin
import keras
import tensorflow as tf

from metalearn.outer.rule import Metrics, OptimizerRule
from metalearn.rl.trpo import TRPO, TrustRegion, query_ratios
from metalearn.pieces import COUNT, NON_NEGATIVE, POSITIVE, check_range
from metalearn.tasks.episode import Episode


def clipped_figures(learner, episode: Episode, old_outputs: tf.Tensor, clip: float
                    ) -> Metrics:
    """:func:`~metalearn.rl.trpo.trust_region_figures` of one collected task (one
    adaptation, :func:`~metalearn.rl.trpo.query_ratios`) and
    ``"clipped"`` (the weighted mean over the query steps of ``min(r A, clip(r) A)``)
    and ``"inner_kl"`` (the mean over the first inner step's support steps of
    ``log pi_collected - log pi_current`` of the actions: the KL estimate from the
    collecting pre-update policy)."""
    outputs, old_outputs, ratio, weights, advantages, figures = query_ratios(
        learner, episode, old_outputs)
    figures["surrogate"] = tf.reduce_sum(weights * ratio * advantages)
    figures["kl"] = tf.reduce_sum(weights * learner.distribution.kl(old_outputs, outputs))
    clipped = tf.minimum(ratio * advantages,
                         tf.clip_by_value(ratio, 1.0 - clip, 1.0 + clip) * advantages)
    figures["clipped"] = tf.reduce_sum(weights * clipped)
    support = episode.support_y
    if support.weights.shape[0] == 0:  # no inner step: no pre-update trajectories
        figures["inner_kl"] = tf.zeros([], outputs.dtype)
        return figures
    first = tf.nest.map_structure(lambda t: t[0], support)
    trajectories = first.trajectories
    current = learner.policy_log_probs(learner.initial_weights(), trajectories.observations,
                                       trajectories.actions, trajectories.mask)
    mask = tf.cast(trajectories.mask, outputs.dtype) * tf.cast(first.weights[:, None],
                                                               outputs.dtype)
    figures["inner_kl"] = tf.reduce_sum(
        mask * (tf.cast(first.log_probs, outputs.dtype) - current)) / tf.reduce_sum(mask)
    return figures


def adapted_kl_coefficient(coefficient: tf.Tensor, kl: tf.Tensor, target: float
                           ) -> tf.Tensor:
    """ProMP's (and PPO's) update of a KL coefficient after a step whose measured KL is
    ``kl``: doubled if ``kl > 1.5 target``, halved if ``kl < target / 1.5``, else kept
    (a non-finite ``kl`` keeps it)."""
    coefficient = tf.convert_to_tensor(coefficient)
    kl = tf.cast(kl, coefficient.dtype)
    return tf.where(kl > 1.5 * target, 2.0 * coefficient,
                    tf.where(kl < target / 1.5, 0.5 * coefficient, coefficient))


@gin.configurable
class ClippedRatio(OptimizerRule):
    """PPO / ProMP on the meta-objective: ``epochs`` updates of a Keras optimizer on
    the clipped surrogate of one collected batch (the module's docstring), for a
    learner :class:`~metalearn.rl.TRPO` can run (:class:`metalearn.rl.PolicyLearner`).

    The figures reported are the learner's per-task figures before the first update
    (on the collected trajectories, equal to the on-policy ones). Several updates per
    step: under :class:`~metalearn.outer.SkipNonFinite` each epoch's update is applied
    only if it and every earlier one are finite; not under several replicas.

    Args:
      optimizer: a Keras optimizer; defaults to Adam with learning rate 1e-3.
      epochs: updates per collected batch (ProMP's ``num_ppo_steps``, 5).
      clip: the ratio's clipping range ``[1 - clip, 1 + clip]`` (ProMP's 0.3).
      kl_penalty: the weight of the pre-update policies' KL (ProMP's inner KL penalty;
        0 for none); with ``kl_target``, its initial value (> 0).
      kl_target: ``None``: the coefficient stays ``kl_penalty``. A number (> 0, ProMP's
        ``target_inner_step``, 0.01): the coefficient adapts after every step (the
        module's docstring); the figures then hold ``"inner_kl"`` (measured after the
        step) and ``"kl_coefficient"`` (the coefficient for the next step), each
        broadcast over the tasks.
    """

    interleaves_updates = True

    def __init__(self, optimizer: Optional[keras.optimizers.Optimizer] = None,
                 epochs: int = 5, clip: float = 0.2, kl_penalty: float = 0.0,
                 kl_target: Optional[float] = None):
        super().__init__(optimizer)
        self.epochs = check_range("ClippedRatio", "epochs", epochs, COUNT)
        self.clip = check_range("ClippedRatio", "clip", clip, POSITIVE)
        self.kl_target = None if kl_target is None else check_range(
            "ClippedRatio", "kl_target", kl_target, POSITIVE)
        self.kl_penalty = check_range("ClippedRatio", "kl_penalty", kl_penalty,
                                      NON_NEGATIVE if kl_target is None else POSITIVE)
        self.kl_coefficient = None
        if self.kl_target is not None:  # the rule's state, checkpointed with the run
            self.kl_coefficient = tf.Variable(
                self.kl_penalty, dtype=tf.float64, trainable=False, name="kl_coefficient",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

    def coefficient(self, dtype: tf.DType) -> tf.Tensor:
        """The KL penalty's coefficient of this step, in ``dtype``."""
        if self.kl_coefficient is None:
            return tf.constant(self.kl_penalty, dtype)
        return tf.cast(tf.convert_to_tensor(self.kl_coefficient), dtype)

    def adapt(self, region: TrustRegion) -> Metrics:
        """After a step: the inner KL at the meta-variables' values now (on the
        collected trajectories), the coefficient adapted to it
        (:func:`adapted_kl_coefficient`), both as figures broadcast over the tasks."""
        figures = region.figures()
        kl = region.mean(figures, "inner_kl")
        self.kl_coefficient.assign(adapted_kl_coefficient(self.kl_coefficient, kl,
                                                          self.kl_target))
        dtype, tasks = figures["loss"].dtype, tf.shape(figures["loss"])
        return {"inner_kl": tf.fill(tasks, tf.cast(kl, dtype)),
                "kl_coefficient": tf.fill(tasks, self.coefficient(dtype))}

    @classmethod
    def configured_class(cls) -> type:
        return ClippedRatio

    def build(self, learner):
        TRPO.check(learner)
        super().build(learner)

    def region(self, learner, episodes, formulation) -> TrustRegion:
        """The collected batch, with the clipped figures."""
        TRPO.check(learner)
        return TrustRegion(learner, episodes, formulation,
                           figures=lambda l, e, o: clipped_figures(l, e, o, self.clip))

    def objective_gradient(self, region: TrustRegion):
        """Minus the gradient of ``J`` at the current values (a descent direction by
        meta-variable) and the per-task figures there."""
        with tf.GradientTape() as tape:
            figures = region.figures()
            inner_kl = region.mean(figures, "inner_kl")
            loss = self.coefficient(inner_kl.dtype) * inner_kl - region.mean(
                figures, "clipped")
        gradients = tape.gradient(loss, region.variables)
        metrics = {k: v for k, v in figures.items()
                   if k not in ("surrogate", "kl", "clipped", "inner_kl")}
        return gradients, metrics

    def directions(self, learner, episodes, formulation):
        """The first epoch's direction (what one update would apply) and the figures."""
        return self.objective_gradient(self.region(learner, episodes, formulation))

    def step(self, learner, episodes, formulation, apply=None, jit_compile=False):
        """``epochs`` updates on one collected batch, each through ``apply`` (guards
        see every update; the figures a guard adds to one are handed to the next);
        then, with ``kl_target``, the coefficient's adaptation."""
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            raise ValueError("ClippedRatio updates several times per step, which "
                             f"{context.num_replicas_in_sync} replicas cannot share")
        apply = apply or self.apply
        region = self.region(learner, episodes, formulation)
        # one graph for the objective's gradient, called at each epoch's values (traced
        # inline, each epoch added a copy of the double pass through the inner loops)
        gradient = tf.function(lambda: self.objective_gradient(region), autograph=False)
        first, carried = None, {}
        for _ in range(self.epochs):
            gradients, metrics = gradient()
            given = set(metrics)
            result = apply(learner, gradients, {**metrics, **carried})
            carried = {k: v for k, v in result.items() if k not in given}
            first = first or {k: result[k] for k in given}
        if self.kl_target is not None:
            with tf.control_dependencies(tf.nest.flatten(carried)):  # after the updates
                first = {**first, **self.adapt(region)}
        return {**first, **carried}
