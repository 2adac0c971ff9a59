"""Closed-form task solvers on an embedding ("heads")."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from metalearn.adapters.base import Capabilities, Piece


def solve_flat(matrix: tf.Tensor, b: tf.Tensor, adjoint: bool = False) -> tf.Tensor:
    """``matrix^-1 b`` (``matrix^-T b`` with ``adjoint``) for ``b`` ``[..., n, ways]``
    flattened row by row."""
    flat = tf.reshape(b, tf.concat([tf.shape(b)[:-2], [-1, 1]], 0))
    return tf.reshape(tf.linalg.solve(matrix, flat, adjoint=adjoint), tf.shape(b))


class Head(Piece):
    """Solves one task on embeddings: :meth:`fit` maps the support embeddings and
    labels to the task's state (prototypes, a ridge solution, SVM weights), and
    :meth:`logits` classifies query embeddings with it. Both are differentiable, so the
    meta-gradient reaches the embedding through the support set and the queries.

    A head may meta-learn variables (a learned scale, a regulariser): list them in
    :meth:`own_meta_variables`. The state is per task and never meta-learned.

    A head that fits padded episodes (labels given as
    :class:`~metalearn.tasks.episode.MaskedLabels`, e.g. Meta-Dataset's variable-way,
    variable-shot episodes) on their real examples only sets :attr:`supports_padding`;
    the learner refuses padded episodes for the others rather than fit the padding.
    """

    supports_padding: bool = False
    """Whether :meth:`fit` honours :class:`~metalearn.tasks.episode.MaskedLabels`."""

    def own_capabilities(self) -> Capabilities:
        return Capabilities(task_axis=False)

    def build(self, dtype: tf.DType) -> None:
        """Creates the head's meta-learned variables in ``dtype`` (the embedding's);
        called once by the learner."""

    def fit(self, embeddings: tf.Tensor, labels: tf.Tensor, ways: int) -> Any:
        """The task's state from ``[n, features]`` support embeddings and ``n`` labels
        (:class:`~metalearn.tasks.episode.MaskedLabels` if :attr:`supports_padding`)."""
        raise NotImplementedError

    def logits(self, state: Any, embeddings: tf.Tensor) -> tf.Tensor:
        """``[n, ways]`` logits of ``[n, features]`` query embeddings."""
        raise NotImplementedError
