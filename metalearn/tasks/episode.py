"""What a task is: an episode of support and query examples."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf


class Episode(NamedTuple):
    """One task's support and query sets, or a batch of them with a leading task axis.

    A single episode holds ``support_x`` of shape ``[support, ...]`` and so on; a batch of
    episodes (what samplers yield and ``Learner.meta_loss`` takes) holds
    ``[tasks, support, ...]``. Being a ``NamedTuple`` it passes through ``tf.data``,
    ``tf.function``, ``tf.map_fn`` and ``tf.nest`` unchanged.
    """

    support_x: Any
    support_y: Any
    query_x: Any
    query_y: Any

    @property
    def num_tasks(self) -> int:
        """Size of the leading task axis of a batched episode (static)."""
        return int(tf.nest.flatten(self.support_x)[0].shape[0])

    def check_tasks(self) -> "Episode":
        """Raises ``ValueError`` unless every part of a batched episode has the same
        number of tasks (its leading axis); returns the episode."""
        shape = lambda t: tf.TensorShape(getattr(t, "shape", None))
        counts = {name: [shape(t)[0] if shape(t).rank else None
                         for t in tf.nest.flatten(getattr(self, name))]
                  for name in self._fields}
        sizes = {c for values in counts.values() for c in values if c is not None}
        if len(sizes) > 1:
            shown = ", ".join(f"{name} {values[0] if len(values) == 1 else values}"
                              for name, values in counts.items())
            raise ValueError(f"the episode batch's parts have different numbers of tasks "
                             f"(leading axis): {shown}; support and query sets must hold "
                             "the same tasks")
        return self

    def task(self, index: int) -> "Episode":
        """The ``index``-th task of a batched episode."""
        return tf.nest.map_structure(lambda t: t[index], self)


PADDING = -1
"""The label of a padded example in :class:`MaskedLabels` (never a class)."""


class MaskedLabels(NamedTuple):
    """The labels of a padded episode: what a variable-way, variable-shot sampler puts
    in ``support_y`` and ``query_y`` so that episodes of different sizes share one shape
    (one compiled step for the whole batch).

    Everything that reads labels honours it: task losses and metrics are means over the
    real examples only, logits of the classes a task does not have are left out of the
    softmax (:func:`restrict_to_classes`), every head of :mod:`metalearn.heads` fits on
    the real examples and the task's classes only, and batch moments (BatchNorm) are
    computed over the real examples only
    (:func:`metalearn.functional.example_mask`). A padded batch therefore gives each
    task's own values and meta-gradients, as if every episode ran alone at its size.

    Attributes:
      labels: ``[..., examples]`` int32 class labels, :data:`PADDING` where padded.
      mask: ``[..., examples]`` bool, ``True`` for real examples.
      classes: ``[..., max_ways]`` bool, ``True`` for the classes the task has (its
        labels ``0 .. ways - 1``); the same in the support and query labels.
    """

    labels: Any
    mask: Any
    classes: Any


def unmask(y: Any) -> Tuple[Any, Optional[tf.Tensor], Optional[tf.Tensor]]:
    """``(labels, mask, classes)`` of ``y``: for :class:`MaskedLabels` the labels with
    padding replaced by class 0 (so any loss accepts them; the mask removes them), else
    ``(y, None, None)``."""
    if isinstance(y, MaskedLabels):
        mask = tf.cast(y.mask, tf.bool)
        labels = tf.where(mask, y.labels, tf.zeros_like(y.labels))
        return labels, mask, tf.cast(y.classes, tf.bool)
    return y, None, None


def restrict_to_classes(logits: tf.Tensor, classes: tf.Tensor) -> tf.Tensor:
    """``logits [..., n, max_ways]`` with the classes a task does not have
    (``classes [..., max_ways]`` False) at the dtype's lowest value: out of every softmax
    (exactly zero probability and gradient), never an arg-max."""
    lowest = tf.constant(logits.dtype.min, logits.dtype)
    return tf.where(tf.expand_dims(classes, -2), logits, lowest)


def example_mask(y: Any) -> Optional[tf.Tensor]:
    """The ``[..., examples]`` bool mask of real examples of labels ``y``, or ``None``
    when ``y`` is not padded."""
    return unmask(y)[1]


def pad_episodes(episodes: Sequence[Episode], max_support: int, max_query: int,
                 max_ways: int) -> Episode:
    """Episodes of different sizes (no task axis, integer labels ``0 .. ways - 1``) as one
    batch of padded episodes: ``support_x [tasks, max_support, ...]`` with zeros after
    each episode's examples, and ``support_y``/``query_y`` as :class:`MaskedLabels`.

    Raises:
      ValueError: an episode is larger than the maxima, or has labels outside
        ``0 .. max_ways - 1``.
    """
    if not episodes:
        raise ValueError("pad_episodes needs at least one episode")
    parts = {"support_x": [], "support_y": [], "query_x": [], "query_y": []}
    for index, episode in enumerate(episodes):
        support_y = np.asarray(episode.support_y)
        query_y = np.asarray(episode.query_y)
        ways = int(max(support_y.max(initial=-1), query_y.max(initial=-1))) + 1
        if ways > max_ways or min(support_y.min(initial=0), query_y.min(initial=0)) < 0:
            raise ValueError(f"episode {index} has labels up to {ways - 1}; padded "
                             f"episodes need labels in 0 .. {max_ways - 1}")
        classes = np.arange(max_ways) < ways
        for name, x, y, size in (("support", episode.support_x, support_y, max_support),
                                 ("query", episode.query_x, query_y, max_query)):
            x = np.asarray(x)
            if len(y) > size:
                raise ValueError(f"episode {index} has {len(y)} {name} examples, more "
                                 f"than max_{name}={size}")
            pad = size - len(y)
            parts[f"{name}_x"].append(np.concatenate(
                [x, np.zeros((pad,) + x.shape[1:], x.dtype)]))
            parts[f"{name}_y"].append(MaskedLabels(
                np.concatenate([y, np.full([pad], PADDING)]).astype(np.int32),
                np.arange(size) < len(y), classes))
    stacked = {name: tf.nest.map_structure(lambda *t: tf.constant(np.stack(t)), *values)
               for name, values in parts.items()}
    return Episode(**stacked)
