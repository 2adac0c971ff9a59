"""Prototypical Networks and Proto-MAML: learners whose task solution starts from class
prototypes (means of the support embeddings of each class)."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

import gin
import keras

from metalearn.adapters.base import Adapter
from metalearn.functional import softmax_cross_entropy
from metalearn.heads.prototypes import PrototypeHead
from metalearn.learners.embedding import EmbeddingLearner, check_ways
from metalearn.learners.learner import Learner, MetricFn
from metalearn.learners.task_init import PrototypeInit


@gin.configurable
class PrototypicalNetworks(EmbeddingLearner):
    """Prototypical Networks (Snell et al., 2017): no inner loop; a query is classified by
    its negative squared Euclidean distance to each class's prototype, the mean embedding
    of that class's support examples.

    ``EmbeddingLearner(model, head=PrototypeHead(), ways=ways)``: :meth:`adapt` returns
    ``Adapted(weights, {"head": prototypes})``; :meth:`predict` gives logits
    ``-||f(x) - c_k||^2``, ``[queries, ways]``.

    Args:
      model: the embedding network, a built Keras model.
      ways: classes per task.
      loss, metrics, drop_head, **kwargs: as for :class:`EmbeddingLearner` (no
        ``adapter``: use ProtoMAML to fine-tune from prototypes).
    """

    def __init__(self, model: keras.Model, ways: int = gin.REQUIRED,
                 loss: Optional[Union[str, MetricFn]] = None,
                 metrics: Optional[Mapping[str, Union[str, MetricFn]]] = None,
                 drop_head: Optional[str] = None, **kwargs: Any):
        if "adapter" in kwargs:
            raise TypeError("PrototypicalNetworks has no inner loop and takes no adapter; "
                            "use ProtoMAML to fine-tune from prototypes")
        super().__init__(model, head=PrototypeHead(), ways=ways, loss=loss,
                         metrics=metrics, drop_head=drop_head, **kwargs)


@gin.configurable
class ProtoMAML(Learner):
    """Proto-MAML (Triantafillou et al., 2020): MAML whose linear head starts every task
    at the prototype classifier (``Learner(task_init=[PrototypeInit(ways, head)])``),
    then adapts with ``adapter``.

    The head is computed per task, not meta-learned: its variables are left out of
    :attr:`meta_variables`, and the meta-gradient flows into the body through the
    prototypes as well as through the inner loop.

    Args:
      model: a built Keras model whose last layer ``head`` is a ``Dense`` with bias and
        ``ways`` units, applied to the body's (flat) embedding.
      adapter: the inner loop (default ``GradientDescent()``).
      ways: classes per task.
      head: name of the head layer.
      loss: defaults to softmax cross-entropy on the logits.
      metrics, **kwargs: as for :class:`Learner`.
    """

    def __init__(self, model: keras.Model, adapter: Optional[Adapter] = None,
                 loss: Optional[Union[str, MetricFn]] = None,
                 metrics: Optional[Mapping[str, Union[str, MetricFn]]] = None,
                 ways: int = gin.REQUIRED, head: str = "head", **kwargs: Any):
        task_init = [PrototypeInit(check_ways(ways), head)] + list(kwargs.pop("task_init", ()))
        self.ways = int(ways)
        super().__init__(model, adapter=adapter,
                         loss=softmax_cross_entropy if loss is None else loss,
                         metrics=metrics, task_init=task_init, **kwargs)
