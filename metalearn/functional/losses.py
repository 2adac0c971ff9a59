"""The losses: the one softmax cross-entropy (the default loss of the embedding learners
and the loss of the shipped contract's and gradient checks' classification tasks) and the
Gaussian predictive distribution's negative log-likelihood (the neural processes' loss,
:mod:`metalearn.adapters.neural_process`) with the squared error of its mean."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import gin
import tensorflow as tf


def softmax_cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Per-example softmax cross-entropy of integer labels, in the logits' dtype.

    Args:
      labels: one class index per row of ``logits`` (any integer or float dtype; a
        trailing axis of size 1 is fine: they are reshaped to ``logits``' leading axes).
      logits: ``[..., classes]`` unnormalised log-probabilities.

    Returns:
      ``[...]``: ``-log softmax(logits)[label]`` per example (not averaged).
    """
    labels = tf.cast(tf.reshape(labels, tf.shape(logits)[:-1]), tf.int32)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)


class Gaussian(NamedTuple):
    """A predictive distribution: independent Gaussians ``N(mean, scale**2)`` per output.

    What a neural process predicts (:mod:`metalearn.adapters.neural_process`): a model's
    output that is a distribution, not a point. It is a nest of two tensors (it crosses
    ``tf.function``, ``tf.map_fn`` and ``tf.nest`` as one), and it has the ``shape`` and
    ``dtype`` of one of them, so the learner's shape checks compare the targets with
    the mean's shape.

    Attributes:
      mean: ``[examples, outputs]``.
      scale: the standard deviation, positive, the mean's shape.
    """

    mean: tf.Tensor
    scale: tf.Tensor

    @property
    def shape(self) -> tf.TensorShape:
        """The mean's (one value per target)."""
        return self.mean.shape

    @property
    def dtype(self) -> tf.DType:
        return self.mean.dtype


def _gaussian(what: str, prediction: Any) -> Gaussian:
    if not isinstance(prediction, Gaussian):
        raise TypeError(f"{what} needs a Gaussian(mean, scale) prediction (a neural "
                        f"process's output), got {type(prediction).__name__}: for a point "
                        "prediction use keras.losses.MeanSquaredError()")
    return prediction


def _targets(y_true: Any, mean: tf.Tensor) -> tf.Tensor:
    return tf.reshape(tf.cast(y_true, mean.dtype), tf.shape(mean))


@gin.configurable
def gaussian_nll(y_true: Any, prediction: Gaussian) -> tf.Tensor:
    """Per-example negative log-likelihood of ``y_true`` under ``prediction``, summed over
    the outputs: ``sum_j log scale_j + (y_j - mean_j)**2 / (2 scale_j**2) +
    log(2 pi) / 2``.

    Args:
      y_true: ``[examples, outputs]`` targets (any shape with the mean's values).
      prediction: the :class:`Gaussian`.

    Returns:
      ``[examples]``.

    Raises:
      TypeError: ``prediction`` is not a :class:`Gaussian`.
      tf.errors.InvalidArgumentError: a scale is not positive (the message shows it).
    """
    mean, scale = _gaussian("gaussian_nll", prediction)
    check = tf.debugging.assert_positive(
        scale, message="gaussian_nll: the predicted scale (standard deviation) must be "
                       "positive; a decoder's raw output needs a positive transform, e.g. "
                       "softplus")
    with tf.control_dependencies([check]):
        y = _targets(y_true, mean)
        values = (tf.math.log(scale) + 0.5 * tf.square((y - mean) / scale)
                  + 0.5 * math.log(2 * math.pi))
    return tf.reduce_sum(tf.reshape(values, [tf.shape(mean)[0], -1]), axis=-1)


@gin.configurable
def predictive_mse(y_true: Any, prediction: Gaussian) -> tf.Tensor:
    """Per-example squared error of the predictive mean, averaged over the outputs:
    ``[examples]`` (the mean of it is the MSE that point predictors report)."""
    mean = _gaussian("predictive_mse", prediction).mean
    error = tf.square(_targets(y_true, mean) - mean)
    return tf.reduce_mean(tf.reshape(error, [tf.shape(mean)[0], -1]), axis=-1)
