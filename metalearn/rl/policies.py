"""Policies over any unmodified Keras model: what a model's outputs mean as a
distribution over actions.

A distribution object turns the model's outputs into sampled actions
(:meth:`~Categorical.sample`, for rollouts) and log-probabilities of given actions
(:meth:`~Categorical.log_prob`, for the estimators' surrogate losses). The model is
called by the learner with whatever weights it has at that point (initial, adapted), so
the same model serves the pre-update and the post-update policy.

Both give the KL divergence between two sets of outputs (:meth:`~Categorical.kl`: what
a trust region, :class:`metalearn.rl.TRPO`, bounds).

* :class:`Categorical`: the model's outputs are the logits of the actions.
* :class:`Gaussian`: the outputs are a mean and a log standard deviation per action
  dimension; :func:`gaussian_policy` wraps a model that outputs only the mean with a
  learned, state-independent log standard deviation (as the MAML code's policies), a
  weight of the wrapping model, so the inner loop adapts it like any other weight.
"""

from __future__ import annotations

import math
from typing import Optional

import gin
import keras
import tensorflow as tf


@gin.configurable
class Categorical:
    """Actions ``0 .. n - 1`` with probabilities ``softmax(outputs)``; outputs ``[..., n]``."""

    kind = "discrete"

    def output_size(self, action_size: int) -> int:
        """The model outputs this distribution needs for ``action_size`` actions."""
        return int(action_size)

    def sample(self, outputs: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        """``[n]`` int32 actions for ``[n, actions]`` logits (a pure function of ``seed``)."""
        return tf.random.stateless_categorical(outputs, 1, seed, dtype=tf.int32)[:, 0]

    def log_prob(self, outputs: tf.Tensor, actions: tf.Tensor) -> tf.Tensor:
        """``[...]`` log-probabilities of integer ``actions [...]`` under ``outputs [..., n]``."""
        log_probs = tf.nn.log_softmax(outputs, axis=-1)
        return tf.reduce_sum(tf.one_hot(tf.cast(actions, tf.int32), tf.shape(outputs)[-1],
                                        dtype=outputs.dtype) * log_probs, -1)

    def kl(self, p: tf.Tensor, q: tf.Tensor) -> tf.Tensor:
        """``[...]`` KL divergences ``KL(p || q)`` between the distributions of logits
        ``p`` and ``q`` (``[..., n]`` each)."""
        log_p, log_q = tf.nn.log_softmax(p, axis=-1), tf.nn.log_softmax(q, axis=-1)
        return tf.reduce_sum(tf.exp(log_p) * (log_p - log_q), -1)


@gin.configurable
class Gaussian:
    """A diagonal Gaussian: outputs ``[..., 2 * d]`` are the mean and the log standard
    deviation of ``d`` action dimensions (:func:`gaussian_policy` makes such a model).

    Args:
      min_log_std: if set, the log standard deviation is clipped from below where it is
        used (a safeguard against a collapsing exploration noise).
    """

    kind = "continuous"

    def __init__(self, min_log_std: Optional[float] = None):
        self.min_log_std = None if min_log_std is None else float(min_log_std)

    def output_size(self, action_size: int) -> int:
        return 2 * int(action_size)

    def _split(self, outputs):
        mean, log_std = tf.split(outputs, 2, axis=-1)
        if self.min_log_std is not None:
            log_std = tf.maximum(log_std, self.min_log_std)
        return mean, log_std

    def sample(self, outputs: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        mean, log_std = self._split(outputs)
        noise = tf.random.stateless_normal(tf.shape(mean), seed, dtype=mean.dtype)
        return mean + tf.exp(log_std) * noise

    def log_prob(self, outputs: tf.Tensor, actions: tf.Tensor) -> tf.Tensor:
        mean, log_std = self._split(outputs)
        z = (tf.cast(actions, mean.dtype) - mean) * tf.exp(-log_std)
        return tf.reduce_sum(-0.5 * tf.square(z) - log_std - 0.5 * math.log(2 * math.pi), -1)

    def kl(self, p: tf.Tensor, q: tf.Tensor) -> tf.Tensor:
        """``[...]`` KL divergences ``KL(p || q)`` between the diagonal Gaussians of
        outputs ``p`` and ``q`` (``[..., 2 d]`` each), summed over the dimensions."""
        mean_p, log_std_p = self._split(p)
        mean_q, log_std_q = self._split(q)
        ratio = tf.exp(2.0 * (log_std_p - log_std_q))
        return tf.reduce_sum(log_std_q - log_std_p - 0.5
                             + 0.5 * (ratio + tf.square(mean_p - mean_q)
                                      * tf.exp(-2.0 * log_std_q)), -1)


class LogStd(keras.layers.Layer):
    """Appends a learned, input-independent log standard deviation to a mean:
    ``[..., d] -> [..., 2 d]``."""

    def __init__(self, initial: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.initial = float(initial)

    def build(self, input_shape):
        self.log_std = self.add_weight(
            name="log_std", shape=(int(input_shape[-1]),),
            initializer=keras.initializers.Constant(self.initial))

    def call(self, mean):
        log_std = tf.broadcast_to(tf.cast(self.log_std, mean.dtype), tf.shape(mean))
        return tf.concat([mean, log_std], axis=-1)

    def get_config(self):
        return {**super().get_config(), "initial": self.initial}


@gin.configurable
def gaussian_policy(model: keras.Model, initial_log_std: float = 0.0,
                    name: str = "gaussian_policy") -> keras.Model:
    """``model`` (observations to action means, left unmodified) with a learned log
    standard deviation per action dimension: a Keras model whose outputs are
    ``[mean, log_std]``, what :class:`Gaussian` reads.

    Args:
      model: a built Keras model with one input.
      initial_log_std: the log standard deviation's initial value (0: std 1).
    """
    if not model.built:
        raise ValueError(f"gaussian_policy needs a built model, got {model.name!r}")
    inputs = keras.Input(tuple(model.input_shape[1:]), dtype=model.inputs[0].dtype)
    outputs = LogStd(initial_log_std, dtype=model.outputs[0].dtype, name="log_std")(
        model(inputs))
    return keras.Model(inputs, outputs, name=name)
