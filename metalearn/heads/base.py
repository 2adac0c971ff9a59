"""Closed-form task solvers on an embedding ("heads")."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np
import tensorflow as tf

from metalearn.pieces import Capabilities, Piece
from metalearn.tasks.episode import unmask


def solve_flat(matrix: tf.Tensor, b: tf.Tensor, adjoint: bool = False) -> tf.Tensor:
    """``matrix^-1 b`` (``matrix^-T b`` with ``adjoint``) for ``b`` ``[..., n, ways]``
    flattened row by row."""
    flat = tf.reshape(b, tf.concat([tf.shape(b)[:-2], [-1, 1]], 0))
    return tf.reshape(tf.linalg.solve(matrix, flat, adjoint=adjoint), tf.shape(b))


def solve_semidefinite_flat(matrix: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """``(matrix + delta I)^-1 b`` for a symmetric positive semidefinite ``matrix`` and
    ``b`` ``[..., n, ways]`` flattened row by row, ``delta`` the matrix's rounding error
    (``size * eps`` times its largest diagonal entry): ``matrix^-1 b`` to working
    precision when the matrix is invertible, and finite when it is not (a kernel of
    identical support rows makes a head's system singular, and a plain solve raises
    "Input matrix is not invertible", which no policy can skip)."""
    size = tf.shape(matrix)[-1]
    eps = np.finfo(matrix.dtype.as_numpy_dtype).eps
    scale = tf.reduce_max(tf.abs(tf.linalg.diag_part(matrix)), -1)[..., None, None]
    delta = tf.cast(size, matrix.dtype) * eps * tf.maximum(scale, 1)
    shifted = matrix + delta * tf.eye(size, dtype=matrix.dtype)
    return solve_flat(shifted, b)


class LabelOutsideClassesError(ValueError):
    """A support label is not one of the task's classes ``0 .. ways - 1``."""


def _outside_message(ways: int) -> str:
    # no apostrophe: TensorFlow escapes it in an assertion's message
    return (f"a support label is outside the {ways} classes of the task (labels 0 .. "
            f"{ways - 1}; a head would drop its example silently):")


def class_labels(labels: Any, ways: int
                 ) -> Tuple[tf.Tensor, Optional[tf.Tensor], Optional[tf.Tensor], tf.Tensor]:
    """``(labels, mask, classes, outside)`` of one task's support labels: the one place
    a head turns labels into classes, and the one check that each is a class of the
    task. ``labels`` ``[n]`` int32 (a padded example's: 0), ``mask`` and ``classes`` as
    :func:`~metalearn.tasks.episode.unmask` gives them, ``outside`` ``[n]`` (bool) the
    labels outside ``0 .. ways - 1`` (all False unless compiled by XLA, see below).

    Raises:
      LabelOutsideClassesError: (labels known when called: eagerly) a label outside the
        task's classes; the message names the label, its example and the number of
        classes.
      tf.errors.InvalidArgumentError: the same inside a ``tf.function`` (an assertion
        that runs with the step, its message naming the same). XLA drops assertions:
        there a head makes the rows of such labels NaN (:func:`support_targets`,
        :func:`~metalearn.heads.prototypes.class_prototypes`), a non-finite step for
        ``Loop.on_non_finite`` rather than a silently dropped example.
    """
    labels, mask, classes = unmask(labels)
    labels = tf.cast(tf.reshape(labels, [-1]), tf.int32)
    outside = tf.logical_or(labels < 0, labels >= ways)
    known = tf.get_static_value(labels)
    if known is not None:
        bad = np.flatnonzero((known < 0) | (known >= ways))
        if bad.size:
            raise LabelOutsideClassesError(
                f"{_outside_message(ways)} label {int(known[bad[0]])} of support example "
                f"{int(bad[0])}" + (f" (and {bad.size - 1} more)" if bad.size > 1 else "")
                + f"; the support labels: {known.tolist()}")
        return labels, mask, classes, outside
    first = tf.argmax(tf.cast(outside, tf.int32))
    check = tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(outside)),
        [_outside_message(ways), "label", labels[first], "of support example", first,
         "; the support labels:", labels], summarize=64)
    with tf.control_dependencies([check]):
        return tf.identity(labels), mask, classes, outside


def support_targets(embeddings: tf.Tensor, labels: Any, ways: int
                    ) -> Tuple[tf.Tensor, tf.Tensor, Optional[tf.Tensor], Optional[tf.Tensor]]:
    """``(embeddings, targets, mask, classes)`` of one task's support set: the one-hot
    ``targets`` ``[n, ways]`` of its labels and, for
    :class:`~metalearn.tasks.episode.MaskedLabels`, the padded rows of ``embeddings``
    ``[n, features]`` and of ``targets`` zeroed (so no padding value, however large,
    reaches a fit, and no gradient reaches it from one), the real examples ``mask``
    ``[n]`` and the task's ``classes`` ``[ways]`` (bool; both ``None`` for plain labels).
    Labels outside the task's classes raise (:func:`class_labels`)."""
    labels, mask, classes, outside = class_labels(labels, ways)
    targets = tf.one_hot(labels, ways, dtype=embeddings.dtype)           # [n, ways]
    targets = targets + tf.where(outside, tf.constant(np.nan, targets.dtype),
                                 tf.zeros([], targets.dtype))[:, None]  # XLA: see there
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
    variable-shot episodes) on their real examples and the task's classes only says so
    in :meth:`own_capabilities` (``Capabilities(padding=True)``: the padded examples
    contribute nothing to the fit, and the classes the task does not have are out of it,
    so the state's logits of the task's classes are those of the episode fitted alone at
    its real size, up to a shift common to a query's logits for a head with a free
    intercept); the learner refuses padded episodes for the others rather than fit the
    padding. Every head of :mod:`metalearn.heads` does (most through
    :func:`support_targets`); a head written elsewhere is refused until it says so.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "supports_padding" in cls.__dict__:
            raise TypeError(f"{cls.__name__} defines 'supports_padding', which metalearn "
                            "0.3 asks of a head's capabilities: define own_capabilities() "
                            "returning Capabilities(task_axis=False, padding=True) instead "
                            "(CHANGELOG.md, 'Migration')")

    def own_capabilities(self) -> Capabilities:
        return Capabilities(task_axis=False, padding=False)

    @property
    def supports_padding(self) -> bool:
        """Whether the head fits padded episodes (``capabilities.padding``)."""
        return self.capabilities.padding

    def build(self, dtype: tf.DType) -> None:
        """Creates the head's meta-learned variables in ``dtype`` (the embedding's);
        called once by the learner."""

    def fit(self, embeddings: tf.Tensor, labels: tf.Tensor, ways: int) -> Any:
        """The task's state from ``[n, features]`` support embeddings and ``n`` labels
        (:class:`~metalearn.tasks.episode.MaskedLabels` if ``capabilities.padding``)."""
        raise NotImplementedError

    def logits(self, state: Any, embeddings: tf.Tensor) -> tf.Tensor:
        """``[n, ways]`` logits of ``[n, features]`` query embeddings."""
        raise NotImplementedError

    def fit_finite(self, embeddings: tf.Tensor, labels: Any, ways: int) -> Any:
        """:meth:`fit`, with a non-finite support embedding (of a real example) made a
        non-finite state: the fit sees the embeddings with every NaN or infinity
        replaced by 0 (a solver given NaN raises a raw TensorFlow error, "eigen
        decomposition was not successful", "matrix is not invertible", which no
        policy can skip) and every floating tensor of the state is then NaN, so the
        task's loss is: a non-finite step for ``Loop.on_non_finite`` (``"skip"``:
        :class:`~metalearn.outer.SkipNonFinite` skips it). What the learner calls
        (``EmbeddingLearner.fit_head``); the same state as :meth:`fit` otherwise."""
        finite = tf.math.is_finite(embeddings)
        mask = unmask(labels)[1]
        if mask is not None:  # padded rows: zeroed by support_targets, never fitted
            finite = tf.logical_or(finite, tf.logical_not(tf.reshape(mask, [-1, 1])))
        all_finite = tf.reduce_all(finite)
        state = self.fit(tf.where(finite, embeddings, tf.zeros_like(embeddings)), labels,
                         ways)

        def poisoned(value):
            value = tf.convert_to_tensor(value)
            if not value.dtype.is_floating:
                return value
            return tf.where(all_finite, value, tf.constant(np.nan, value.dtype))

        return tf.nest.map_structure(poisoned, state)
