"""The ridge-regression head of R2-D2 (Bertinetto et al., 2019)."""

from __future__ import annotations

import math
from typing import Any, List, Optional, Tuple

import gin
import keras
import tensorflow as tf

from metalearn.heads.base import Head, support_targets
from metalearn.pieces import POSITIVE, Capabilities, Range, check_range

FINITE = Range()


@gin.configurable
class RidgeHead(Head):
    """Ridge regression from the support embeddings to one-hot labels, solved in closed
    form inside the graph: ``W = argmin ||E W - Y||^2 + lambda ||W||^2``, logits
    ``scale * (E' W) + bias`` (R2-D2, Bertinetto et al., 2019).

    With ``n`` support examples and ``d`` features the solve is ``n x n`` through the
    Woodbury identity, ``W = E^T (E E^T + lambda I_n)^-1 Y``, when ``n <= d`` (the
    few-shot case), else ``d x d``, ``W = (E^T E + lambda I_d)^-1 E^T Y``: the same
    solution. Differentiated exactly by automatic differentiation through the solve. On a
    padded episode the padded rows are zero (:func:`~metalearn.heads.base.support_targets`)
    and an absent class's column of ``W`` is zero.
    ``lambda`` (through its logarithm, so it stays positive), ``scale`` and ``bias`` are
    meta-learned scalars unless ``learn=False``. The state of a task is ``W``,
    ``[features, ways]``.

    Args:
      regularization: ``lambda``'s initial value (> 0).
      scale, bias: the logits' initial scale and offset (finite).
      learn: meta-learn ``lambda``, ``scale`` and ``bias``.
    """

    def own_capabilities(self) -> Capabilities:
        return Capabilities(task_axis=False, padding=True)

    def __init__(self, regularization: float = 1.0, scale: float = 1.0, bias: float = 0.0,
                 learn: bool = True, name: Optional[str] = None):
        super().__init__(name=name)
        owner = type(self).__name__
        regularization = check_range(owner, "regularization", regularization, POSITIVE)
        self.initial = (math.log(regularization), check_range(owner, "scale", scale, FINITE),
                        check_range(owner, "bias", bias, FINITE))
        self.learn = bool(learn)
        self._variables: List[keras.Variable] = []

    def build(self, dtype: tf.DType) -> None:
        if not self._variables:
            self._variables = [keras.Variable(value, dtype=tf.as_dtype(dtype).name,
                                              trainable=self.learn, name=name)
                               for value, name in zip(self.initial,
                                                      ("log_lambda", "scale", "bias"))]

    def own_meta_variables(self):
        return list(self._variables) if self.learn else []

    def _parameters(self, dtype: tf.DType) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        if not self._variables:
            self.build(dtype)
        log_lambda, scale, bias = (tf.cast(v, dtype) for v in self._variables)
        return tf.exp(log_lambda), scale, bias

    def fit(self, embeddings: tf.Tensor, labels: tf.Tensor, ways: int) -> tf.Tensor:
        lam, _, _ = self._parameters(embeddings.dtype)
        # padded rows zero: the same solution as without them; an absent class's targets
        # are all zero, so its column is zero and the others are unchanged
        embeddings, targets, _, _ = support_targets(embeddings, labels, ways)  # [n, ways]
        n, d = embeddings.shape[0], embeddings.shape[1]
        if n is None or d is None or n <= d:  # Woodbury: an n x n system
            gram = tf.matmul(embeddings, embeddings, transpose_b=True)    # [n, n]
            eye = tf.eye(tf.shape(gram)[0], dtype=embeddings.dtype)
            return tf.matmul(embeddings, tf.linalg.solve(gram + lam * eye, targets),
                             transpose_a=True)                             # [d, ways]
        gram = tf.matmul(embeddings, embeddings, transpose_a=True)        # [d, d]
        eye = tf.eye(d, dtype=embeddings.dtype)
        return tf.linalg.solve(gram + lam * eye,
                               tf.matmul(embeddings, targets, transpose_a=True))

    def logits(self, state: Any, embeddings: tf.Tensor) -> tf.Tensor:
        _, scale, bias = self._parameters(embeddings.dtype)
        return scale * tf.matmul(embeddings, tf.cast(state, embeddings.dtype)) + bias
