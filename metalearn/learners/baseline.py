"""Pre-training baselines: a backbone trained as a classifier over all training classes,
then evaluated per episode by a head fitted on its features.

One learner covers the family: Chen et al. 2019's Baseline (a linear classifier in
pre-training, a new linear classifier fitted per episode) and Baseline++ (cosine
classifiers in both), RFS (Tian et al. 2020: a linear classifier, then logistic
regression on normalised features) and the first stage of Meta-Baseline (Chen et al.
2021, "Classifier-Baseline": evaluated by cosine nearest centroid; its second stage is
an :class:`EmbeddingLearner` with a cosine :class:`PrototypeHead` started from the
pre-trained backbone, see :class:`metalearn.training.WarmStart`).
"""

from __future__ import annotations

import math
from typing import Any, List, Mapping, Optional, Union

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn import functional
from metalearn.pieces import POSITIVE, Piece, check_range
from metalearn.functional import Weights
from metalearn.heads.base import Head
from metalearn.heads.linear import check_classifier, classifier_logits
from metalearn.heads.prototypes import PrototypeHead, flat
from metalearn.learners.embedding import HEAD, EmbeddingLearner
from metalearn.learners.learner import MetricFn
from metalearn.learners.task import Adapted


def is_whole_class(support_x: Any) -> bool:
    """Whether a task's support set is empty (statically): a whole-class batch, whose
    query examples carry the training classes' own labels (``WholeClassBatches``)."""
    first = tf.nest.flatten(support_x)[0]
    return first.shape.rank is not None and first.shape[0] == 0


class WholeClassClassifier(Piece):
    """The pre-training classifier over all training classes on the flat embedding:
    ``x @ kernel + bias`` (``"linear"``) or ``scale * cos(x, kernel[:, k])``
    (``"cosine"``, Baseline++; the scale meta-learned when ``learn_scale``). Its
    variables are meta-variables of the learner (trained by the outer step, i.e. by
    plain supervised steps on whole-class batches)."""

    def __init__(self, classes: int, kind: str = "linear", scale: float = 10.0,
                 learn_scale: bool = True, name: Optional[str] = None):
        super().__init__(name=name)
        if isinstance(classes, bool) or classes is gin.REQUIRED or int(classes) != classes \
                or int(classes) < 2:
            raise ValueError(f"ClassifierBaseline.classes (training classes) must be a whole "
                             f"number >= 2, got {classes!r}")
        scale = check_range("ClassifierBaseline", "scale", scale, POSITIVE)
        self.classes = int(classes)
        self.kind = check_classifier(kind, "ClassifierBaseline.classifier")
        self.initial_scale, self.learn_scale = float(scale), bool(learn_scale)
        self._variables: List[keras.Variable] = []

    def build(self, features: int, dtype: tf.DType) -> None:
        if self._variables:
            return
        dtype = tf.as_dtype(dtype).name
        kernel = keras.Variable(keras.initializers.GlorotUniform()((features, self.classes),
                                                                    dtype=dtype),
                                dtype=dtype, name="classifier_kernel")
        self.kernel = kernel
        if self.kind == "linear":
            self.bias = keras.Variable(np.zeros([self.classes]), dtype=dtype,
                                       name="classifier_bias")
            self._variables = [kernel, self.bias]
        else:
            self.scale = keras.Variable(self.initial_scale, dtype=dtype,
                                        trainable=self.learn_scale, name="classifier_scale")
            self._variables = [kernel] + ([self.scale] if self.learn_scale else [])

    def own_meta_variables(self):
        return list(self._variables)

    def logits(self, embeddings: tf.Tensor) -> tf.Tensor:
        dtype = embeddings.dtype
        kernel = tf.cast(self.kernel, dtype)
        if self.kind == "linear":
            return classifier_logits("linear", kernel, tf.cast(self.bias, dtype), None,
                                     embeddings)
        return classifier_logits("cosine", kernel, None, tf.cast(self.scale, dtype),
                                 embeddings)


@gin.configurable
class ClassifierBaseline(EmbeddingLearner):
    """An embedding pre-trained as a classifier over all training classes, evaluated on
    episodes by a head fitted to each support set.

    Trained on whole-class batches (``WholeClassBatches``: an empty support set and
    query labels ``0 .. classes - 1``): the query loss is the softmax cross-entropy of
    the whole-class classifier on the embedding, so the "meta-step" of the training loop
    is a plain supervised step (any Keras optimizer, schedules, checkpoints and resume
    as for meta-training). In training mode the step also updates BatchNorm's moving
    statistics (:func:`metalearn.functional.call_and_update`), so the backbone can be
    evaluated with ``training=False``, as the papers do (``query_training=False``, the
    default here: the support and query sets of an episode are then embedded with the
    moving statistics). Like a Keras model called with ``training=True``, measuring the
    whole-class loss (:meth:`meta_metrics` on a whole-class batch) moves them too.

    On an episode (support set not empty) it is an :class:`EmbeddingLearner`: the head
    is fitted on the support embeddings and classifies the queries; the whole-class
    classifier is not used. Heads: ``LinearProbeHead()`` (Baseline),
    ``LinearProbeHead("cosine")`` (Baseline++), ``LogisticRegressionHead()`` (RFS),
    ``PrototypeHead("cosine")`` (Classifier-Baseline, the default). A head without
    meta-learned variables can be swapped at evaluation
    (``--gin_param='ClassifierBaseline.head=@LogisticRegressionHead()'``): the
    checkpoint holds the same variables.

    Args:
      model: the backbone, a built Keras model (its output flattened is the embedding).
      classes: the training classes (``WholeClassBatches.num_classes("train")``).
      head: the per-episode head.
      ways: classes per evaluation episode.
      classifier: the pre-training classifier, ``"linear"`` or ``"cosine"``.
      scale, learn_scale: the cosine classifier's (initial) scale, and whether it is
        learned.
      update_batch_norm: update the moving statistics in pre-training steps.
      query_training: embed the queries of an episode in training mode (default: with
        the moving statistics).
      support_training: the same for the support set; defaults to ``query_training``.
      loss, metrics, drop_head, **kwargs: as for :class:`EmbeddingLearner`.

    Note: the moving statistics are assigned while the step's loss is computed, before
    the non-finite guard decides on the update, so a skipped step still moves them.
    """

    def __init__(self, model: keras.Model, classes: int = gin.REQUIRED,
                 head: Optional[Head] = None, ways: int = gin.REQUIRED,
                 classifier: str = "linear", scale: float = 10.0, learn_scale: bool = True,
                 update_batch_norm: bool = True,
                 loss: Optional[Union[str, MetricFn]] = None,
                 metrics: Optional[Mapping[str, Union[str, MetricFn]]] = None,
                 drop_head: Optional[str] = None, query_training: bool = False,
                 support_training: Optional[bool] = None, **kwargs: Any):
        classifier_piece = WholeClassClassifier(classes, classifier, scale, learn_scale)
        super().__init__(model, head=PrototypeHead("cosine", 10.0) if head is None else head,
                         ways=ways, loss=loss, metrics=metrics, drop_head=drop_head,
                         query_training=query_training,
                         support_training=query_training if support_training is None
                         else support_training, **kwargs)
        learned = [v.path for v in self.head.meta_variables]
        if learned:
            raise ValueError(
                f"ClassifierBaseline's head {type(self.head).__name__} meta-learns "
                f"{learned}, which whole-class pre-training never trains: give a head "
                "fitted per episode only (e.g. learn_scale=False), or meta-train that head "
                "with an EmbeddingLearner started from the pre-training "
                "(Experiment.warm_start = @WarmStart())")
        output = self.model.compute_output_shape(self.model.input_shape)
        features = math.prod(int(d) for d in output[1:])
        classifier_piece.build(features, tf.as_dtype(self.model.trainable_variables[0].dtype))
        classifier_piece.bind(self.meta_step)
        self.classifier = classifier_piece
        self.update_batch_norm = bool(update_batch_norm)

    def whole_class_logits(self, weights: Weights, x: Any, training: bool = True,
                           update: bool = False) -> tf.Tensor:
        """``[n, classes]`` logits of the whole-class classifier (``update``: assign
        the moving statistics the training-mode call computes)."""
        call = functional.call_and_update if update else functional.call
        embeddings = flat(functional.full_precision(
            call(self.model, weights, x, training=training), self._metric_dtype))
        return self.classifier.logits(embeddings)

    def adapt_and_measure(self, support_x: Any, support_y: Any, steps: Optional[int] = None,
                          weights: Optional[Weights] = None):
        """On an episode, the head fitted on the support embeddings; on a whole-class
        batch (an empty support set) the weights as they are, no adaptation, and no head
        (``Adapted(weights, {})``: :meth:`predict` then uses the whole-class
        classifier)."""
        if not is_whole_class(support_x):
            return super().adapt_and_measure(support_x, support_y, steps, weights)
        weights = self.initial_weights() if weights is None else weights
        return Adapted(weights, {}), {}

    def predict(self, adapted: Adapted, x: Any) -> tf.Tensor:
        """The head's logits; for a whole-class batch's ``Adapted`` (no head's fit in
        its state) the whole-class classifier's, in training mode, the moving
        statistics updated when ``update_batch_norm`` (a whole-class batch is a
        supervised training step)."""
        if isinstance(adapted, Adapted) and HEAD not in adapted.state:
            return self.whole_class_logits(adapted.weights, x, training=True,
                                           update=self.update_batch_norm)
        return super().predict(adapted, x)
