"""Prototypical Networks and Proto-MAML: learners whose task solution starts from class
prototypes (means of the support embeddings of each class)."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Union

import gin
import keras
import tensorflow as tf

from metalearn import functional
from metalearn.adapters.base import Adapter, NoAdaptation
from metalearn.functional import Weights
from metalearn.learners import Learner, MetricFn

PROTOTYPES = "prototypes"
"""The key under which :meth:`PrototypicalNetworks.adapt` returns a task's prototypes."""


def class_prototypes(embeddings: tf.Tensor, labels: tf.Tensor, ways: int) -> tf.Tensor:
    """Mean embedding of each class, ``[ways, features]``, from ``[n, features]``
    embeddings and ``n`` integer labels in ``[0, ways)``."""
    labels = tf.cast(tf.reshape(labels, [-1]), tf.int32)
    sums = tf.math.unsorted_segment_sum(embeddings, labels, ways)
    counts = tf.math.unsorted_segment_sum(tf.ones_like(labels, embeddings.dtype), labels, ways)
    return sums / tf.maximum(counts, 1)[:, None]


def squared_distances(embeddings: tf.Tensor, prototypes: tf.Tensor) -> tf.Tensor:
    """``[n, ways]`` squared Euclidean distances of each embedding to each prototype."""
    return tf.reduce_sum(tf.square(embeddings[:, None, :] - prototypes[None, :, :]), -1)


def _flat(embeddings: tf.Tensor) -> tf.Tensor:
    return tf.reshape(embeddings, [tf.shape(embeddings)[0], -1])  # [n, features]


def _check_ways(ways) -> int:
    if ways is gin.REQUIRED or ways is None or int(ways) < 2:
        raise ValueError(f"ways (classes per task) must be an int >= 2, got {ways!r}")
    return int(ways)


def softmax_cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Per-example softmax cross-entropy of integer labels, in the logits' dtype."""
    labels = tf.cast(tf.reshape(labels, tf.shape(logits)[:-1]), tf.int32)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)


def _layer(model: keras.Model, name: str) -> keras.layers.Layer:
    try:
        return model.get_layer(name)
    except ValueError as error:
        raise ValueError(f"model {model.name!r} has no layer {name!r}; its layers are "
                         f"{[layer.name for layer in model.layers]}") from error


def _classification_loss(loss):
    return softmax_cross_entropy if loss is None else loss


@gin.configurable
class PrototypicalNetworks(Learner):
    """Prototypical Networks (Snell et al., 2017): no inner loop; a query is classified by
    its negative squared Euclidean distance to each class's prototype, the mean embedding
    of that class's support examples.

    ``model`` is the embedding network (its output is flattened). :meth:`adapt` returns
    the initial weights plus the task's prototypes under the key :data:`PROTOTYPES`;
    :meth:`predict` gives logits ``-||f(x) - c_k||^2``, ``[queries, ways]``. The
    meta-gradient reaches the embedding through both prototypes and queries.

    Args:
      model: the embedding network, a built Keras model.
      ways: classes per task (support labels are ``0 .. ways - 1``).
      loss: defaults to :func:`softmax_cross_entropy` on the logits.
      metrics, **kwargs: as for :class:`Learner` (no ``adapter``: there is no inner loop).
      drop_head: name of a last layer of ``model`` to leave out, so the same classifier
        config serves MAML and ProtoNets: the embedding is that layer's input (the
        learner's ``model`` is then the network up to it).
    """

    def __init__(self, model: keras.Model, ways: int = gin.REQUIRED,
                 loss: Optional[Union[str, MetricFn]] = None,
                 metrics: Optional[Mapping[str, Union[str, MetricFn]]] = None,
                 drop_head: Optional[str] = None, **kwargs: Any):
        if "adapter" in kwargs:
            raise TypeError("PrototypicalNetworks has no inner loop and takes no adapter; "
                            "use ProtoMAML to fine-tune from prototypes")
        self.ways = _check_ways(ways)
        if drop_head is not None:
            functional.check_built(model)
            model = keras.Model(model.inputs, _layer(model, drop_head).input,
                                name=f"{model.name}_embedding")
        super().__init__(model, adapter=NoAdaptation(), loss=_classification_loss(loss),
                         metrics=metrics, **kwargs)

    def embed(self, weights: Weights, x: Any, training: bool = True) -> tf.Tensor:
        """Flattened embeddings ``[n, features]`` of ``x`` with the given weights."""
        weights = {p: w for p, w in weights.items() if p != PROTOTYPES}
        return _flat(self.forward(weights, x, training=training))

    def adapt(self, support_x: Any, support_y: Any, steps: Optional[int] = None,
              weights: Optional[Weights] = None) -> Weights:
        weights = dict(self.initial_weights() if weights is None else weights)
        weights[PROTOTYPES] = class_prototypes(self.embed(weights, support_x), support_y,
                                               self.ways)
        return weights

    def adapt_trajectory(self, support_x: Any, support_y: Any, steps: Optional[int] = None,
                         weights: Optional[Weights] = None) -> List[Weights]:
        return [self.adapt(support_x, support_y, steps, weights)]

    def predict(self, weights: Weights, x: Any) -> tf.Tensor:
        if PROTOTYPES not in weights:
            raise KeyError(f"predict needs the prototypes that adapt() returns under "
                           f"{PROTOTYPES!r}; got weights {sorted(weights)}")
        embeddings = self.embed(weights, x, training=self.query_training)
        return -squared_distances(embeddings, tf.cast(weights[PROTOTYPES], embeddings.dtype))


@gin.configurable
class ProtoMAML(Learner):
    """Proto-MAML (Triantafillou et al., 2020): MAML whose linear head starts every task
    at the prototype classifier, ``W_k = 2 c_k``, ``b_k = -||c_k||^2`` (the linear part of
    ``-||f(x) - c_k||^2``, which gives the same softmax), then adapts with ``adapter``.

    The head is computed per task, not meta-learned: its variables are left out of
    :attr:`meta_variables`, and the meta-gradient flows into the body through the
    prototypes as well as through the inner loop.

    Args:
      model: a built Keras model whose last layer ``head`` is a ``Dense`` with bias and
        ``ways`` units, applied to the body's (flat) embedding.
      adapter: the inner loop (default ``GradientDescent()``).
      ways: classes per task.
      head: name of the head layer.
      loss: defaults to :func:`softmax_cross_entropy` on the logits.
      metrics, **kwargs: as for :class:`Learner`.
    """

    def __init__(self, model: keras.Model, adapter: Optional[Adapter] = None,
                 loss: Optional[Union[str, MetricFn]] = None,
                 metrics: Optional[Mapping[str, Union[str, MetricFn]]] = None,
                 ways: int = gin.REQUIRED, head: str = "head", **kwargs: Any):
        self.ways = _check_ways(ways)
        functional.check_built(model)
        layer = _layer(model, head)
        if not isinstance(layer, keras.layers.Dense) or not layer.use_bias \
                or layer.units != self.ways:
            raise ValueError(f"ProtoMAML's head {head!r} must be a Dense layer with bias "
                             f"and {self.ways} units, got {layer!r}")
        self.body = keras.Model(model.inputs, layer.input)
        self._head_paths = (layer.kernel.path, layer.bias.path)
        super().__init__(model, adapter=adapter, loss=_classification_loss(loss),
                         metrics=metrics, **kwargs)

    def generated_paths(self) -> List[str]:
        return super().generated_paths() + list(self._head_paths)

    def task_initial_weights(self, weights: Weights, support_x: Any,
                             support_y: Any) -> Weights:
        body = {p: w for p, w in weights.items() if p not in self._head_paths}
        embeddings = _flat(functional.call(self.body, body, support_x, training=True))
        prototypes = class_prototypes(embeddings, support_y, self.ways)  # [ways, features]
        weights = dict(weights)
        kernel, bias = self._head_paths
        weights[kernel] = 2.0 * tf.transpose(prototypes)
        weights[bias] = -tf.reduce_sum(tf.square(prototypes), axis=-1)
        return weights
