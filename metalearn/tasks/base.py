"""The task-sampler interface: pure, seeded sampling of episode batches fed by tf.data."""

from __future__ import annotations

import abc
from typing import Any, Optional, Sequence

import tensorflow as tf

from metalearn.tasks.episode import Episode

SPLITS = ("train", "validation", "test")
"""The splits a task sampler draws from, in this order (a split's index seeds its stream)."""


def split_seed(seed: int, split: str) -> tf.Tensor:
    """The stateless seed pair of a (run seed, split) stream; splits never share episodes."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return tf.constant([int(seed), SPLITS.index(split)], dtype=tf.int64)


class Collection(abc.ABC):
    """What turns a sampled batch of episodes into the batch the meta-step takes, with
    the learner's current weights, outside the compiled step: the hook through which
    the training loop and :func:`metalearn.evaluate` obtain every batch of a sampler
    whose data cannot be made inside the step (:meth:`TaskSampler.collection`; a
    Python environment's :class:`metalearn.rl.gym.GymCollection` collects its
    trajectories with a Gymnasium simulator). A pure function of the episodes (their
    seeds) and the weights, so that a resumed run collects what an uninterrupted one
    would."""

    @abc.abstractmethod
    def __call__(self, episodes: Episode, steps: Optional[int] = None) -> Episode:
        """The batch the step takes for ``episodes`` (leading task axis) when it adapts
        with ``steps`` inner steps (``None``: the learner's adapter's own)."""

    @property
    def depends_on_steps(self) -> bool:
        """Whether the batch depends on ``steps`` (collected with the weights after each
        inner step: ``True``, the default); ``False`` where one batch serves every
        number of steps (RL²'s trials, whose adaptation is a hidden state), so that
        :func:`metalearn.evaluate` collects each batch once for all its counts."""
        return True

    def close(self) -> None:
        """Releases what the collection holds (simulators, processes)."""


class TaskSampler(abc.ABC):
    """Samples batches of episodes as a pure function of a seed.

    Subclasses implement :meth:`sample`; :meth:`dataset` turns it into an endless
    ``tf.data`` stream whose ``step``-th element depends only on ``(seed, split, step)``,
    so a stream resumed at step ``s`` continues exactly where an uninterrupted one would
    be, on any machine. :meth:`collection` says whether a sampled batch is what the
    meta-step takes.
    """

    def collection(self, learner: Any) -> Optional[Collection]:
        """How the meta-step's batches are made from this sampler's episodes for
        ``learner``: ``None`` (the default) when a sampled batch is what the step takes
        (its examples, or the seeds of rollouts sampled inside the step); otherwise a
        :class:`Collection` that the training loop and :func:`metalearn.evaluate` call
        on every batch before the step (a Python environment collects trajectories with
        the learner's current weights). The caller closes it when done."""
        del learner
        return None

    @abc.abstractmethod
    def sample(self, seed: tf.Tensor, num_tasks: int, split: str = "train") -> Episode:
        """A batch of ``num_tasks`` episodes, leading task axis, from a ``[2]`` int seed."""

    def check_split(self, split: str) -> None:
        """Raises what :meth:`dataset` would for ``split`` (a name this sampler does not
        know, a split without classes, more ways than it has), without building the
        stream: the checks before training call it for the evaluation split. The
        default checks nothing; samplers whose splits can be wrong override it and
        call it from :meth:`dataset`."""
        del split

    def sample_at(self, base_seed: tf.Tensor, index: tf.Tensor, num_tasks: int,
                  split: str) -> Episode:
        """The ``index``-th batch of the ``(seed, split)`` stream whose seed pair is
        ``base_seed``: :meth:`sample` from ``fold_in(base_seed, index)``. A sampler that
        walks through its data in epochs (``WholeClassBatches``) overrides this to see
        the batch's position in the stream."""
        return self.sample(tf.random.experimental.stateless_fold_in(base_seed, index),
                           num_tasks, split)

    def dataset(self, num_tasks: int, seed: int = 0, split: str = "train",
                start_step: int = 0, num_steps: Optional[int] = None,
                streams: Sequence[int] = (0,), num_streams: int = 1) -> tf.data.Dataset:
        """An endless (or ``num_steps`` long) dataset of episode batches.

        Args:
          num_tasks: tasks per element (the meta-batch, or one replica's share of it).
          seed: the run's seed.
          split: ``"train"``, ``"validation"`` or ``"test"``.
          start_step: the first step (to resume a run).
          num_steps: number of steps, or ``None`` for an endless stream.
          streams, num_streams: the stream indices this dataset serves among
            ``num_streams`` disjoint streams (one per replica). Stream ``r`` at step
            ``s`` is drawn from seed ``(seed, split, s * num_streams + r)``; the dataset
            yields, for each step in turn, one element per stream in ``streams``, so a
            worker with several local replicas hands consecutive elements to them.
        """
        if int(num_tasks) < 1:
            raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
        streams = [int(r) for r in streams]
        if not streams or any(not 0 <= r < num_streams for r in streams):
            raise ValueError(f"streams must be non-empty indices in [0, {num_streams}), "
                             f"got {streams}")
        base = split_seed(seed, split)
        local = tf.constant(streams, tf.int64)
        per_step = len(streams)
        end = 2**62 if num_steps is None else (start_step + num_steps) * per_step
        elements = tf.data.Dataset.range(start_step * per_step, end)

        def make(element):
            step, position = element // per_step, element % per_step
            index = step * num_streams + tf.gather(local, position)
            return self.sample_at(base, index, int(num_tasks), split)

        return elements.map(make, num_parallel_calls=tf.data.AUTOTUNE,
                            deterministic=True).prefetch(tf.data.AUTOTUNE)
