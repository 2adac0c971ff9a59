"""What a task is: an episode of support and query examples."""

from __future__ import annotations

from typing import Any, NamedTuple

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
