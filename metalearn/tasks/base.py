"""The task-sampler interface: pure, seeded sampling of episode batches fed by tf.data."""

from __future__ import annotations

import abc
from typing import Optional

import tensorflow as tf

from metalearn.tasks.episode import Episode

SPLITS = ("train", "validation", "test")


def split_seed(seed: int, split: str) -> tf.Tensor:
    """The stateless seed pair of a (run seed, split) stream; splits never share episodes."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return tf.constant([int(seed), SPLITS.index(split)], dtype=tf.int64)


class TaskSampler(abc.ABC):
    """Samples batches of episodes as a pure function of a seed.

    Subclasses implement :meth:`sample`; :meth:`dataset` turns it into an endless
    ``tf.data`` stream whose ``step``-th element depends only on ``(seed, split, step)``,
    so a stream resumed at step ``s`` continues exactly where an uninterrupted one would
    be, on any machine.
    """

    @abc.abstractmethod
    def sample(self, seed: tf.Tensor, num_tasks: int, split: str = "train") -> Episode:
        """A batch of ``num_tasks`` episodes, leading task axis, from a ``[2]`` int seed."""

    def dataset(self, num_tasks: int, seed: int = 0, split: str = "train",
                start_step: int = 0, num_steps: Optional[int] = None,
                stream: int = 0, num_streams: int = 1) -> tf.data.Dataset:
        """An endless (or ``num_steps`` long) dataset of episode batches.

        Args:
          num_tasks: tasks per element (the meta-batch, or one replica's share of it).
          seed: the run's seed.
          split: ``"train"``, ``"validation"`` or ``"test"``.
          start_step: index of the first element (to resume a run).
          num_steps: number of elements, or ``None`` for an endless stream.
          stream, num_streams: this stream's index among ``num_streams`` disjoint
            streams (one per replica or worker); element ``step`` of stream ``r`` is
            drawn from seed ``(seed, split, step * num_streams + r)``.
        """
        if num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
        if not 0 <= stream < num_streams:
            raise ValueError(f"stream must be in [0, {num_streams}), got {stream}")
        base = split_seed(seed, split)
        end = 2**62 if num_steps is None else start_step + num_steps
        steps = tf.data.Dataset.range(start_step, end)

        def make(step):
            index = step * num_streams + stream
            return self.sample(tf.random.experimental.stateless_fold_in(base, index),
                               num_tasks, split)

        return steps.map(make, num_parallel_calls=tf.data.AUTOTUNE,
                         deterministic=True).prefetch(tf.data.AUTOTUNE)
