"""The latent-variable neural process's learner: its loss is the negative ELBO."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import gin
import tensorflow as tf

from metalearn.adapters.neural_process import CONTEXT, LatentNeuralProcess, gaussian_kl
from metalearn.learners.learner import Learner
from metalearn.learners.task import TaskRun
from metalearn.tasks.episode import MaskedLabels


@gin.configurable
class LatentNeuralProcessLearner(Learner):
    """A :class:`~metalearn.adapters.LatentNeuralProcess` meta-trained on the negative
    ELBO of the query targets (Garnelo et al., 2018b), per query point:

        loss = task_loss(y_q, decoder(x_q, r, z)) + KL(q(z | C, T) || q(z | C)) / |T|,

    ``z = mu + sigma * e`` one reparameterised sample of the posterior ``q(z | C, T)``
    (support and query pairs), ``e ~ N(0, I)`` drawn statelessly from the learner's
    ``meta_step`` and the episode (the same episode at the same step draws the same
    ``e``: the loss is a deterministic function of the weights, and finite differences
    check its gradient), ``task_loss`` the learner's loss (``gaussian_nll``), the KL in
    closed form.

    Besides ``"loss"`` it reports ``"kl"`` and ``"nll"``, the task loss of the prediction
    from the support set alone (the prior's mean ``z``, no query target seen), with the
    learner's metrics (``"mse"``) of that prediction: those are the test figures.

    Args: as :class:`~metalearn.Learner`, with ``adapter`` a ``LatentNeuralProcess``.
    """

    def __init__(self, model, adapter: Optional[LatentNeuralProcess] = None, **kwargs: Any):
        if not isinstance(adapter, LatentNeuralProcess):
            raise TypeError(f"LatentNeuralProcessLearner needs a LatentNeuralProcess "
                            f"adapter, got {adapter!r}")
        for name in ("nll", "kl"):
            if name in dict(kwargs.get("metrics") or {}):
                raise ValueError(f"{name!r} is reported by LatentNeuralProcessLearner; "
                                 "rename that metric")
        super().__init__(model, adapter=adapter, **kwargs)

    @property
    def metric_names(self) -> List[str]:
        return super().metric_names + ["nll", "kl"]

    def noise(self, episode_x: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
        """``e ~ N(0, I) [z]`` from the meta-step and the episode's support inputs."""
        content = tf.cast(tf.reduce_sum(tf.abs(tf.cast(episode_x, tf.float64))) * 1e6
                          % 2.0 ** 31, tf.int64)
        seed = tf.stack([self.meta_step, content])
        return tf.random.stateless_normal([self.adapter.latent_size], seed, dtype=dtype)

    def objective_of(self, run: TaskRun) -> Dict[str, tf.Tensor]:
        """``"nll"``, the learner's metrics of the prediction from the support set alone,
        ``"kl"``, and ``"loss"``, the negative ELBO (the class's docstring)."""
        support_x, support_y, query_x, query_y = (run.support_x, run.support_y,
                                                  run.query_x, run.query_y)
        if isinstance(query_y, MaskedLabels):
            raise ValueError("LatentNeuralProcessLearner does not take padded episodes "
                             "(MaskedLabels): sample episodes of one size")
        results = dict(run.metrics)
        results["nll"] = results.pop("loss")
        prior = self.adapter.latent(support_x, support_y)
        posterior = self.adapter.latent(tf.concat([support_x, query_x], 0),
                                        tf.concat([support_y, query_y], 0))
        z = posterior.mean + posterior.scale * self.noise(support_x, posterior.mean.dtype)
        state = dict(run.adapted.state)
        state[CONTEXT] = {**state[CONTEXT], "latent": z}
        sampled = run.adapted._replace(state=state)
        reconstruction = self.task_loss(query_y, self.predict(sampled, query_x))
        kl = tf.cast(gaussian_kl(posterior, prior), reconstruction.dtype)
        queries = tf.cast(tf.shape(tf.nest.flatten(query_x)[0])[0], reconstruction.dtype)
        results["kl"] = kl
        results["loss"] = reconstruction + kl / queries
        return results
