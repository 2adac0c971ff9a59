"""Closed-form task solvers on an embedding ("heads")."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import tensorflow as tf

from metalearn.pieces import Capabilities, Piece
from metalearn.tasks.episode import unmask


def solve_flat(matrix: tf.Tensor, b: tf.Tensor, adjoint: bool = False) -> tf.Tensor:
    """``matrix^-1 b`` (``matrix^-T b`` with ``adjoint``) for ``b`` ``[..., n, ways]``
    flattened row by row."""
    flat = tf.reshape(b, tf.concat([tf.shape(b)[:-2], [-1, 1]], 0))
    return tf.reshape(tf.linalg.solve(matrix, flat, adjoint=adjoint), tf.shape(b))


def support_targets(embeddings: tf.Tensor, labels: Any, ways: int
                    ) -> Tuple[tf.Tensor, tf.Tensor, Optional[tf.Tensor], Optional[tf.Tensor]]:
    """``(embeddings, targets, mask, classes)`` of one task's support set: the one-hot
    ``targets`` ``[n, ways]`` of its labels and, for
    :class:`~metalearn.tasks.episode.MaskedLabels`, the padded rows of ``embeddings``
    ``[n, features]`` and of ``targets`` zeroed (so no padding value, however large,
    reaches a fit, and no gradient reaches it from one), the real examples ``mask``
    ``[n]`` and the task's ``classes`` ``[ways]`` (bool; both ``None`` for plain labels)."""
    labels, mask, classes = unmask(labels)
    targets = tf.one_hot(tf.cast(tf.reshape(labels, [-1]), tf.int32), ways,
                         dtype=embeddings.dtype)                           # [n, ways]
    if mask is None:
        return embeddings, targets, None, None
    mask, classes = tf.reshape(mask, [-1]), tf.reshape(classes, [-1])
    keep = mask[:, None]
    return (tf.where(keep, embeddings, tf.zeros_like(embeddings)),
            tf.where(keep, targets, tf.zeros_like(targets)), mask, classes)


class Head(Piece):
    """Solves one task on embeddings: :meth:`fit` maps the support embeddings and
    labels to the task's state (prototypes, a ridge solution, SVM weights), and
    :meth:`logits` classifies query embeddings with it. Both are differentiable, so the
    meta-gradient reaches the embedding through the support set and the queries.

    A head may meta-learn variables (a learned scale, a regulariser): list them in
    :meth:`own_meta_variables`. The state is per task and never meta-learned.

    A head that fits padded episodes (labels given as
    :class:`~metalearn.tasks.episode.MaskedLabels`, e.g. Meta-Dataset's variable-way,
    variable-shot episodes) on their real examples and the task's classes only sets
    :attr:`supports_padding`; the learner refuses padded episodes for the others rather
    than fit the padding. Every head of :mod:`metalearn.heads` does (most through
    :func:`support_targets`); a head written elsewhere is refused until it says so.
    """

    supports_padding: bool = False
    """Whether :meth:`fit` honours :class:`~metalearn.tasks.episode.MaskedLabels`: the
    padded examples contribute nothing to the fit, and the classes the task does not
    have are out of it, so the state's logits of the task's classes are those of the
    episode fitted alone at its real size (up to a shift common to a query's logits,
    for a head with a free intercept)."""

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
