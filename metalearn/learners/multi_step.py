"""MAML++'s multi-step loss."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Union

import gin
import keras
import tensorflow as tf

from metalearn.adapters.base import Adapter
from metalearn.functional import Weights
from metalearn.learners.learner import Learner, MetricFn, predict_on
from metalearn.pieces import COUNT, check_range
from metalearn.tasks.episode import Episode


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
    Other metrics are always measured after the last step. Needs an adapter with
    ``adapt_trajectory`` (``GradientDescent`` and its subclasses).

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

    def episode_metrics(self, episode: Episode, steps: Optional[int] = None,
                        weights: Optional[Weights] = None) -> Dict[str, tf.Tensor]:
        if steps is not None:
            return super().episode_metrics(episode, steps, weights)
        support_x, support_y, query_x, query_y = self.split(episode)
        trajectory = self.adapt_trajectory(support_x, support_y, weights=weights)
        after_steps = trajectory[1:] or trajectory  # no steps: the initial weights
        losses = [self.task_loss(query_y, predict_on(self, w, query_x, query_y))
                  for w in after_steps[:-1]]
        results = self.query_metrics(query_y, predict_on(self, after_steps[-1], query_x,
                                                         query_y))
        losses.append(results["loss"])
        results["loss"] = tf.reduce_sum(self.step_importance(len(losses)) * tf.stack(losses))
        return results
