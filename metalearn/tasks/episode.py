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

    Regression episodes pad real targets the same way: ``labels`` then holds the
    targets (``[..., examples, ...]``, e.g. ``[n, 1]``, anything where padded) and a
    task has no classes (``classes`` is not read: :func:`unmask` gives ``None``).

    Attributes:
      labels: ``[..., examples]`` int32 class labels, :data:`PADDING` where padded; or
        real targets ``[..., examples, ...]``.
      mask: ``[..., examples]`` bool, ``True`` for real examples.
      classes: ``[..., max_ways]`` bool, ``True`` for the classes the task has (its
        labels ``0 .. ways - 1``); the same in the support and query labels. For real
        targets ``[..., 0]`` (what :func:`pad_episodes` gives), never read.
    """

    labels: Any
    mask: Any
    classes: Any


def unmask(y: Any) -> Tuple[Any, Optional[tf.Tensor], Optional[tf.Tensor]]:
    """``(labels, mask, classes)`` of ``y``: for :class:`MaskedLabels` the labels with
    padding replaced by class 0 (real targets by 0; so any loss accepts them; the mask
    ``[..., examples]`` removes them) and the task's classes (``None`` for real
    targets: regression has none), else ``(y, None, None)``."""
    if isinstance(y, MaskedLabels):
        mask = tf.cast(y.mask, tf.bool)
        labels = tf.convert_to_tensor(y.labels)
        # the mask over the examples' axis, whatever trails it (targets [..., n, 1])
        extra = labels.shape.rank - mask.shape.rank \
            if labels.shape.rank is not None and mask.shape.rank is not None else 0
        wide = tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([extra], tf.int32)], 0)) \
            if extra > 0 else mask
        labels = tf.where(wide, labels, tf.zeros_like(labels))
        if labels.dtype.is_floating:
            return labels, mask, None
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
                 max_ways: int = 0) -> Episode:
    """Episodes of different sizes (no task axis) as one batch of padded episodes:
    ``support_x [tasks, max_support, ...]`` with zeros after each episode's examples,
    and ``support_y``/``query_y`` as :class:`MaskedLabels`.

    Integer labels (classification) must be ``0 .. ways - 1``, ``ways <= max_ways``;
    they are padded with :data:`PADDING`. Real targets (regression, ``[examples, ...]``
    such as ``[n, 1]``) are padded with zeros and keep their dtype; they have no classes
    (``classes [tasks, 0]``, ``max_ways`` unused).

    Raises:
      ValueError: an episode is larger than the maxima, has labels outside
        ``0 .. max_ways - 1``, or has integer labels where another has real targets.
    """
    if not episodes:
        raise ValueError("pad_episodes needs at least one episode")
    real = [np.asarray(e.support_y).dtype.kind == "f" for e in episodes]
    if any(real) and not all(real):
        raise ValueError(f"pad_episodes got real targets in episodes "
                         f"{[i for i, r in enumerate(real) if r]} and integer labels in "
                         f"{[i for i, r in enumerate(real) if not r]}: one kind per batch")
    parts = {"support_x": [], "support_y": [], "query_x": [], "query_y": []}
    for index, episode in enumerate(episodes):
        support_y = np.asarray(episode.support_y)
        query_y = np.asarray(episode.query_y)
        if real[index]:
            classes = np.zeros([0], bool)
        else:
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
            labels = np.concatenate([y, np.zeros((pad,) + y.shape[1:], y.dtype)]) \
                if real[index] else \
                np.concatenate([y, np.full([pad], PADDING)]).astype(np.int32)
            parts[f"{name}_y"].append(MaskedLabels(labels, np.arange(size) < len(y),
                                                   classes))
    stacked = {name: tf.nest.map_structure(lambda *t: tf.constant(np.stack(t)), *values)
               for name, values in parts.items()}
    return Episode(**stacked)
