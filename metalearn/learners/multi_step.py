"""MAML++'s multi-step loss."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Union

import gin
import keras
import tensorflow as tf

from metalearn.adapters.base import Adapter
from metalearn.learners.learner import Learner, MetricFn, predict_on
from metalearn.learners.task import TaskRun
from metalearn.pieces import COUNT, check_range


@gin.configurable
class MultiStepLossLearner(Learner):
    """MAML++'s multi-step loss (Antoniou et al., 2019): the meta-objective is a weighted
    sum of the query losses after every inner step, the weights annealed towards the
    last step over ``anneal_steps`` meta-steps.

    The importance of step ``k = 1 .. K`` at meta-step ``t`` is
    ``(1 - a) / K + a * [k == K]`` with ``a = min(t / anneal_steps, 1)``: uniform at the
    start, the plain (last-step) MAML loss from meta-step ``anneal_steps`` on (MAML++
    keeps a small floor on the earlier steps; this does not). ``t`` is
    :attr:`meta_step`, read inside the compiled step, so nothing retraces.

    The weighted loss is the training objective: it is the ``"loss"`` metric when
    ``steps`` is left to the adapter (as the meta-step does). Given ``steps``
    explicitly (as evaluation does) every metric, loss included, is the last step's.
    Other metrics are always measured after the last step. It is an
    :meth:`~metalearn.Learner.objective_of` over the run's recorded trajectory
    (``records_trajectory``), so every outer rule sees it: under a carried trajectory
    (``TruncatedUnroll``, ``PersistentES``) each segment's objective is its steps' share
    of the horizon's, and with the truncation covering the horizon the update is
    ``MetaGradient``'s. Needs an adapter with ``adapt_trajectory`` (``GradientDescent``
    and its subclasses).

    Args:
      model, adapter, loss, metrics, **kwargs: as for :class:`Learner`.
      anneal_steps: meta-steps over which the weights move to the last step (>= 1).
    """

    def __init__(self, model: keras.Model, adapter: Optional[Adapter] = None,
                 loss: Optional[Union[str, MetricFn]] = None,
                 metrics: Optional[Mapping[str, Union[str, MetricFn]]] = None,
                 anneal_steps: int = 1000, **kwargs: Any):
        anneal_steps = check_range("MultiStepLossLearner", "anneal_steps", anneal_steps, COUNT)
        super().__init__(model, adapter=adapter, loss=loss, metrics=metrics, **kwargs)
        self.anneal_steps = anneal_steps

    def step_importance(self, num_steps: int) -> tf.Tensor:
        """The weights of the query losses after steps ``1 .. num_steps``, ``[num_steps]``."""
        progress = tf.minimum(tf.cast(self.meta_step, self._metric_dtype)
                              / float(self.anneal_steps), 1.0)
        last = tf.one_hot(num_steps - 1, num_steps, dtype=self._metric_dtype)
        return (1.0 - progress) / float(num_steps) + progress * last

    records_trajectory = True

    def objective_of(self, run: TaskRun) -> Dict[str, tf.Tensor]:
        """The run's figures, ``"loss"`` the importance-weighted sum of the query
        losses after each recorded inner step (:meth:`step_importance` over the
        trajectory's horizon, the entries of the steps this run made: a carried
        segment's share of the horizon's objective, so that the segments of a horizon
        sum to it). A run that recorded no trajectory (an explicit ``steps``) or made
        no step keeps the last step's query loss."""
        trajectory = run.trajectory
        if trajectory is None or not trajectory.weights:
            return run.metrics
        losses = [self.task_loss(run.query_y, predict_on(self, w, run.query_x, run.query_y))
                  for w in trajectory.weights[:-1]] + [run.metrics["loss"]]
        importance = self.step_importance(trajectory.horizon)
        if not (isinstance(trajectory.start, int) and trajectory.start == 0
                and len(losses) == trajectory.horizon):
            importance = tf.slice(importance, tf.reshape(trajectory.start, [1]),
                                  [len(losses)])
        return {**run.metrics, "loss": tf.reduce_sum(importance * tf.stack(losses))}
