"""Embedding learners: a meta-learned embedding and a closed-form head fitted per task.

The task's solution is the head's state (prototypes, a ridge solution) computed from the
support embeddings; it travels in the task's state, ``Adapted(weights, {"head": ...})``
(:class:`~metalearn.learners.Adapted`), beside the weights, never inside the weights
dict.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import gin
import keras
import tensorflow as tf

from metalearn import functional
from metalearn.adapters.base import Adapter, NoAdaptation
from metalearn.functional import Weights, softmax_cross_entropy
from metalearn.heads.base import Head
from metalearn.heads.prototypes import flat
from metalearn.learners.learner import Learner, MetricFn
from metalearn.learners.task import Adapted
from metalearn.tasks.episode import MaskedLabels, example_mask


HEAD = "head"
"""The key of :attr:`~metalearn.learners.Adapted.state` under which an embedding learner
keeps the head's fit for the task (e.g. prototypes ``[ways, features]``)."""


def check_ways(ways) -> int:
    if ways is gin.REQUIRED or ways is None or int(ways) < 2:
        raise ValueError(f"ways (classes per task) must be an int >= 2, got {ways!r}")
    return int(ways)


def padding_heads() -> List[str]:
    """The heads of :mod:`metalearn.heads` (each fits padded episodes)."""
    import metalearn.heads  # the package above this module's floor: only when asked
    return sorted(name for name in metalearn.heads.__all__
                  if isinstance(getattr(metalearn.heads, name), type)
                  and issubclass(getattr(metalearn.heads, name), Head)
                  and getattr(metalearn.heads, name) is not Head)


@gin.configurable
class EmbeddingLearner(Learner):
    """An embedding network and a :class:`~metalearn.heads.Head` fitted per task.

    :meth:`adapt` embeds the support set (after the adapter's inner loop on the
    embedding, :class:`NoAdaptation` by default) and fits the head:
    ``Adapted(weights, {"head": head_state})``; :meth:`predict` gives the head's logits of the
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

    def embed(self, weights: Weights, x: Any, training: bool = True) -> tf.Tensor:
        """Flattened embeddings ``[n, features]`` of ``x`` with the given weights."""
        return flat(self.forward(weights, x, training=training))

    def fit_head(self, embeddings: tf.Tensor, labels: Any) -> Any:
        """The head's state for one task's support ``embeddings`` and ``labels``.

        Raises:
          ValueError: for padded episodes (``MaskedLabels``) and a head that cannot fit
            on their real examples only (its ``capabilities.padding`` False).
        """
        if isinstance(labels, MaskedLabels) and not self.head.capabilities.padding:
            raise ValueError(
                f"{type(self.head).__name__} cannot fit padded episodes (MaskedLabels, from "
                f"a variable-way, variable-shot sampler such as MetaDataset): it would fit "
                f"the padding (its capabilities say padding=False). Use a head that "
                f"supports them (every head of metalearn.heads: {', '.join(padding_heads())}"
                f"), or episodes of one size")
        return self.head.fit_finite(embeddings, labels, self.ways)  # NaN: a NaN state

    def support_loss(self, weights: Weights, x: Any, y: Any) -> tf.Tensor:
        """The head fitted and evaluated on the support set (an adapter's objective)."""
        with functional.example_mask(example_mask(y)):
            embeddings = self.embed(weights, x, training=self.support_training)
        return self.task_loss(y, self.head.logits(self.fit_head(embeddings, y),
                                                  embeddings))

    def adapt_and_measure(self, support_x: Any, support_y: Any, steps: Optional[int] = None,
                          weights: Optional[Weights] = None
                          ) -> Tuple[Adapted, Dict[str, Any]]:
        adapted, figures = super().adapt_and_measure(support_x, support_y, steps, weights)
        with functional.example_mask(example_mask(support_y)):
            embeddings = self.embed(adapted.weights, support_x,
                                    training=self.support_training)
        state = {**adapted.state, HEAD: self.fit_head(embeddings, support_y)}
        return adapted._replace(state=state), figures

    def predict(self, adapted: Adapted, x: Any) -> tf.Tensor:
        """The head's logits of the query embeddings, with the head's fit in
        ``adapted.state["head"]`` (what :meth:`adapt` gives).

        Raises:
          TypeError: no head's fit (e.g. the model's weights alone).
        """
        adapted = Adapted.of(adapted, f"{type(self).__name__}.predict")
        if HEAD not in adapted.state:
            raise TypeError(f"{type(self).__name__}.predict needs what adapt() returns, "
                            f"the weights and the head's fit (Adapted.state[{HEAD!r}]); "
                            f"got a state of {sorted(adapted.state)}")
        embeddings = self.embed(adapted.weights, x, training=self.query_training)
        return self.head.logits(adapted.state[HEAD], embeddings)
