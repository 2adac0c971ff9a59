"""Embedding learners: a meta-learned embedding and a closed-form head fitted per task.

The task's solution is the head's state (prototypes, a ridge solution) computed from the
support embeddings; it travels in its own structure, :class:`Solution`, beside the
weights, never inside the weights dict.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple, Union

import gin
import keras
import tensorflow as tf

from metalearn import functional
from metalearn.adapters.base import Adapter, NoAdaptation
from metalearn.functional import Weights, softmax_cross_entropy
from metalearn.heads.base import Head
from metalearn.heads.prototypes import flat
from metalearn.learners.learner import Learner, MetricFn
from metalearn.pieces import Pieces
from metalearn.tasks.episode import MaskedLabels, example_mask


class Solution(NamedTuple):
    """One task's solution for an embedding learner.

    Attributes:
      weights: the (adapted) embedding weights by path.
      head: the head's state for the task (e.g. prototypes ``[ways, features]``).
    """

    weights: Weights
    head: Any


def check_ways(ways) -> int:
    if ways is gin.REQUIRED or ways is None or int(ways) < 2:
        raise ValueError(f"ways (classes per task) must be an int >= 2, got {ways!r}")
    return int(ways)


def _subclasses(cls: type) -> List[type]:
    return [c for s in cls.__subclasses__() for c in [s] + _subclasses(s)]


@gin.configurable
class EmbeddingLearner(Learner):
    """An embedding network and a :class:`~metalearn.heads.Head` fitted per task.

    :meth:`adapt` embeds the support set (after the adapter's inner loop on the
    embedding, :class:`NoAdaptation` by default) and fits the head:
    ``Solution(weights, head_state)``; :meth:`predict` gives the head's logits of the
    query embeddings. The meta-gradient reaches the embedding through the support set
    (the head's fit) and the queries, and the head's own meta-variables if it has any.

    Args:
      model: the embedding network, a built Keras model (its output is flattened).
      head: the task solver.
      ways: classes per task (support labels are ``0 .. ways - 1``).
      adapter: an inner loop on the embedding's weights before the head is fitted
        (its support loss is the head's loss, fitted and evaluated on the support set).
      loss: defaults to softmax cross-entropy on the logits.
      metrics, **kwargs: as for :class:`Learner`.
      drop_head: name of a last layer of ``model`` to leave out, so the same classifier
        config serves MAML and embedding learners: the embedding is that layer's input.
      support_training: embed the support set in training mode (BatchNorm on the
        support batch's statistics, the default); ``False``: with the moving
        statistics, as pre-trained backbones are evaluated (with
        ``query_training=False`` for the queries).
    """

    def __init__(self, model: keras.Model, head: Head = gin.REQUIRED, ways: int = gin.REQUIRED,
                 adapter: Optional[Adapter] = None,
                 loss: Optional[Union[str, MetricFn]] = None,
                 metrics: Optional[Mapping[str, Union[str, MetricFn]]] = None,
                 drop_head: Optional[str] = None, support_training: bool = True,
                 **kwargs: Any):
        if not isinstance(head, Head):
            raise TypeError(f"head must be a metalearn.heads.Head, got {head!r}")
        self.ways = check_ways(ways)
        if drop_head is not None:
            functional.check_built(model)
            model = keras.Model(model.inputs, functional.layer(model, drop_head).input,
                                name=f"{model.name}_embedding")
        super().__init__(model, adapter=NoAdaptation() if adapter is None else adapter,
                         loss=softmax_cross_entropy if loss is None else loss,
                         metrics=metrics, **kwargs)
        self.head = head
        self.support_training = bool(support_training)
        head.bind(self.meta_step)
        head.build(tf.as_dtype(self.model.trainable_variables[0].dtype))

    @property
    def pieces(self) -> Pieces:
        head = getattr(self, "head", None)  # set after Learner.__init__
        return super().pieces + ([head] if head is not None else [])

    def embed(self, weights: Weights, x: Any, training: bool = True) -> tf.Tensor:
        """Flattened embeddings ``[n, features]`` of ``x`` with the given weights."""
        return flat(self.forward(weights, x, training=training))

    def fit_head(self, embeddings: tf.Tensor, labels: Any) -> Any:
        """The head's state for one task's support ``embeddings`` and ``labels``.

        Raises:
          ValueError: for padded episodes (``MaskedLabels``) and a head that cannot fit
            on their real examples only (``Head.supports_padding`` False).
        """
        if isinstance(labels, MaskedLabels) and not self.head.supports_padding:
            padding = sorted({c.__name__ for c in _subclasses(Head) if c.supports_padding})
            raise ValueError(
                f"{type(self.head).__name__} cannot fit padded episodes (MaskedLabels, from "
                f"a variable-way, variable-shot sampler such as MetaDataset): it would fit "
                f"the padding. Use a head that supports them ({', '.join(padding)}) or "
                f"episodes of one size")
        return self.head.fit_finite(embeddings, labels, self.ways)  # NaN: a NaN state

    def support_loss(self, weights: Weights, x: Any, y: Any) -> tf.Tensor:
        """The head fitted and evaluated on the support set (an adapter's objective)."""
        with functional.example_mask(example_mask(y)):
            embeddings = self.embed(weights, x, training=self.support_training)
        return self.task_loss(y, self.head.logits(self.fit_head(embeddings, y),
                                                  embeddings))

    def adapt_and_measure(self, support_x: Any, support_y: Any, steps: Optional[int] = None,
                          weights: Optional[Weights] = None) -> Tuple[Solution, Dict[str, Any]]:
        adapted, figures = super().adapt_and_measure(support_x, support_y, steps, weights)
        with functional.example_mask(example_mask(support_y)):
            embeddings = self.embed(adapted, support_x, training=self.support_training)
        return Solution(adapted, self.fit_head(embeddings, support_y)), figures

    def predict(self, solution: Solution, x: Any) -> tf.Tensor:
        if not isinstance(solution, Solution):
            raise TypeError(f"{type(self).__name__}.predict needs the Solution that adapt() "
                            f"returns (weights and head state), got {type(solution).__name__}")
        embeddings = self.embed(solution.weights, x, training=self.query_training)
        return self.head.logits(solution.head, embeddings)
