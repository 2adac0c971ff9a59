"""The prototype head of Prototypical Networks (Snell et al., 2017), and its cosine form
(Meta-Baseline, Chen et al., 2021)."""

from __future__ import annotations

from typing import Any, List, Optional

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn.heads.base import Head, class_labels
from metalearn.pieces import POSITIVE, Capabilities, check_range

DISTANCES = ("squared_euclidean", "cosine")


def flat(embeddings: tf.Tensor) -> tf.Tensor:
    """``[n, ...]`` embeddings as ``[n, features]`` (the features' size static where
    the embeddings' is, whatever ``n``: a task of unknown size, as an export traces it,
    keeps the head's shapes)."""
    size = embeddings.shape[1:].num_elements()
    return tf.reshape(embeddings, [tf.shape(embeddings)[0], -1 if size is None else size])


def class_prototypes(embeddings: tf.Tensor, labels: tf.Tensor, ways: int) -> tf.Tensor:
    """Mean embedding of each class, ``[ways, features]``, from ``[n, features]``
    embeddings and ``n`` integer labels in ``[0, ways)`` (or
    :class:`~metalearn.tasks.episode.MaskedLabels`: the real examples only; a class
    without examples gets a zero prototype). A label outside ``0 .. ways - 1`` raises
    (:func:`~metalearn.heads.base.class_labels`)."""
    labels, mask, _, outside = class_labels(labels, ways)  # raises on a label outside
    weights = tf.ones_like(labels, embeddings.dtype) if mask is None else \
        tf.cast(tf.reshape(mask, [-1]), embeddings.dtype)
    if mask is not None:
        embeddings = tf.where(tf.reshape(mask, [-1, 1]), embeddings,
                              tf.zeros_like(embeddings))
    sums = tf.math.unsorted_segment_sum(embeddings, labels, ways)
    counts = tf.math.unsorted_segment_sum(weights, labels, ways)
    poison = tf.where(tf.reduce_any(outside), tf.constant(np.nan, embeddings.dtype),
                      tf.zeros([], embeddings.dtype))  # under XLA (class_labels)
    return sums / tf.maximum(counts, 1)[:, None] + poison


def squared_distances(embeddings: tf.Tensor, prototypes: tf.Tensor) -> tf.Tensor:
    """``[n, ways]`` squared Euclidean distances of each embedding to each prototype."""
    return tf.reduce_sum(tf.square(embeddings[:, None, :] - prototypes[None, :, :]), -1)


def cosine_similarities(embeddings: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
    """``[n, ways]`` cosines between each of ``[n, features]`` embeddings and each of
    ``[ways, features]`` class vectors (prototypes, classifier weights)."""
    return tf.matmul(tf.math.l2_normalize(embeddings, axis=-1),
                     tf.math.l2_normalize(weights, axis=-1), transpose_b=True)


@gin.configurable
class PrototypeHead(Head):
    """A query's logits compare it with each class's prototype, the mean embedding of
    that class's support examples. The state of a task is its prototypes,
    ``[ways, features]``.

    ``distance="squared_euclidean"`` (Prototypical Networks): logits
    ``-scale * ||f(x) - c_k||^2``. ``distance="cosine"`` (Meta-Baseline's classifier):
    logits ``scale * cos(f(x), c_k)``; cosines lie in [-1, 1], so the scale (Meta-Baseline:
    10, meta-learned) sets how peaked the softmax can be.

    Args:
      distance: ``"squared_euclidean"`` or ``"cosine"``.
      scale: the logits' scale (> 0; its initial value when learned).
      learn_scale: meta-learn the scale (one scalar, a meta-variable of the learner).
    """

    def own_capabilities(self) -> Capabilities:
        return Capabilities(task_axis=False, padding=True)

    def __init__(self, distance: str = "squared_euclidean", scale: float = 1.0,
                 learn_scale: bool = False, name: Optional[str] = None):
        super().__init__(name=name)
        if distance not in DISTANCES:
            raise ValueError(f"PrototypeHead.distance must be one of {DISTANCES}, "
                             f"got {distance!r}")
        self.distance = distance
        self.initial_scale = check_range("PrototypeHead", "scale", scale, POSITIVE)
        self.learn_scale = bool(learn_scale)
        self._scale: List[keras.Variable] = []

    def build(self, dtype: tf.DType) -> None:
        if self.learn_scale and not self._scale:
            self._scale = [keras.Variable(self.initial_scale, dtype=tf.as_dtype(dtype).name,
                                          name="scale")]

    def own_meta_variables(self):
        return list(self._scale)

    def fit(self, embeddings: tf.Tensor, labels: tf.Tensor, ways: int) -> tf.Tensor:
        return class_prototypes(embeddings, labels, ways)

    def logits(self, state: Any, embeddings: tf.Tensor) -> tf.Tensor:
        prototypes = tf.cast(state, embeddings.dtype)
        if self.distance == "cosine":
            logits = cosine_similarities(embeddings, prototypes)
        else:
            logits = -squared_distances(embeddings, prototypes)
        if self._scale:
            return tf.cast(self._scale[0], embeddings.dtype) * logits
        if self.initial_scale != 1.0:
            return tf.constant(self.initial_scale, embeddings.dtype) * logits
        return logits
