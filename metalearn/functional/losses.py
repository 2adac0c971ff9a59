"""The one softmax cross-entropy: the default loss of the embedding learners and the
loss of the shipped contract's and gradient checks' classification tasks."""

from __future__ import annotations

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
