"""The prototype head of Prototypical Networks (Snell et al., 2017)."""

from __future__ import annotations

from typing import Any

import gin
import tensorflow as tf

from metalearn.heads.base import Head
from metalearn.tasks.episode import unmask


def flat(embeddings: tf.Tensor) -> tf.Tensor:
    """``[n, ...]`` embeddings as ``[n, features]``."""
    return tf.reshape(embeddings, [tf.shape(embeddings)[0], -1])


def class_prototypes(embeddings: tf.Tensor, labels: tf.Tensor, ways: int) -> tf.Tensor:
    """Mean embedding of each class, ``[ways, features]``, from ``[n, features]``
    embeddings and ``n`` integer labels in ``[0, ways)`` (or
    :class:`~metalearn.tasks.episode.MaskedLabels`: the real examples only; a class
    without examples gets a zero prototype)."""
    labels, mask, _ = unmask(labels)
    labels = tf.cast(tf.reshape(labels, [-1]), tf.int32)
    weights = tf.ones_like(labels, embeddings.dtype) if mask is None else \
        tf.cast(tf.reshape(mask, [-1]), embeddings.dtype)
    if mask is not None:
        embeddings = tf.where(tf.reshape(mask, [-1, 1]), embeddings,
                              tf.zeros_like(embeddings))
    sums = tf.math.unsorted_segment_sum(embeddings, labels, ways)
    counts = tf.math.unsorted_segment_sum(weights, labels, ways)
    return sums / tf.maximum(counts, 1)[:, None]


def squared_distances(embeddings: tf.Tensor, prototypes: tf.Tensor) -> tf.Tensor:
    """``[n, ways]`` squared Euclidean distances of each embedding to each prototype."""
    return tf.reduce_sum(tf.square(embeddings[:, None, :] - prototypes[None, :, :]), -1)


@gin.configurable
class PrototypeHead(Head):
    """A query's logits are its negative squared Euclidean distances to each class's
    prototype, the mean embedding of that class's support examples. The state of a
    task is its prototypes, ``[ways, features]``."""

    def fit(self, embeddings: tf.Tensor, labels: tf.Tensor, ways: int) -> tf.Tensor:
        return class_prototypes(embeddings, labels, ways)

    def logits(self, state: Any, embeddings: tf.Tensor) -> tf.Tensor:
        return -squared_distances(embeddings, tf.cast(state, embeddings.dtype))
