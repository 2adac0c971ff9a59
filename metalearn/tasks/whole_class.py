"""Whole-class mini-batches for pre-training: every example of the training classes,
in epochs, with the training classes' own labels.

Pre-training baselines (Chen et al. 2019's Baseline and Baseline++, RFS, Meta-Baseline's
first stage) train the backbone with a classifier over *all* training classes on plain
mini-batches, then solve each test episode on its features. :class:`WholeClassBatches`
serves those mini-batches from a :class:`FewShotClassification` sampler's training split
(its classes, rotations as classes, augmentation and normalisation) and passes every
other split through to that sampler unchanged, so a pre-training run is evaluated on
exactly the test episodes a meta-learner with the same sampler and seed sees.
"""

from __future__ import annotations

from typing import Tuple

import gin
import numpy as np
import tensorflow as tf

from metalearn.tasks.base import TaskSampler
from metalearn.tasks.classification import FewShotClassification
from metalearn.tasks.episode import Episode

_EPOCH_SALT = 2**62 + 1  # beyond any batch index (streams end before 2**62)


@gin.configurable
class WholeClassBatches(TaskSampler):
    """Mini-batches of the training split's examples labelled by class, in epochs.

    A training "task" is one mini-batch: ``Episode(support_x [0, ...], support_y [0],
    query_x [batch_size, H, W, C], query_y [batch_size])`` with labels
    ``0 .. num_classes("train") - 1`` (the training split's classes in the sampler's
    order, each rotation its own class); an empty support set is how a learner
    (:class:`~metalearn.learners.ClassifierBaseline`) tells a whole-class batch from an
    episode. Batches walk through the ``examples_per_epoch`` examples in a fresh order
    each epoch (a random permutation drawn from ``(seed, epoch)``; batch ``i`` of the
    stream holds positions ``i * B .. (i + 1) * B - 1`` of the concatenated epochs), so
    the stream is a pure function of the seed and the step, resumes exactly, and under
    several replicas each replica gets its own slice of the same epochs. Augmentation
    (``max_shift``, ``augment``) is the episode sampler's, from each batch's seed.

    Splits other than ``"train"`` are the wrapped sampler's episodes, unchanged.

    Args:
      episodes: the episode sampler whose training split is served (and whose other
        splits pass through).
      batch_size: examples per mini-batch (per task: a meta-batch of ``T`` tasks is
        ``T`` consecutive mini-batches).
    """

    def __init__(self, episodes: FewShotClassification = gin.REQUIRED, batch_size: int = 128):
        if not isinstance(episodes, FewShotClassification):
            raise TypeError("WholeClassBatches.episodes must be a FewShotClassification "
                            f"sampler, got {episodes!r}")
        if isinstance(batch_size, bool) or int(batch_size) != batch_size or int(batch_size) < 1:
            raise ValueError(f"WholeClassBatches.batch_size must be a whole number >= 1, "
                             f"got {batch_size!r}")
        self.episodes = episodes
        self.batch_size = int(batch_size)

    # --- what the training split holds ---------------------------------------------

    def _entries(self):
        info = self.episodes.pool("train")
        counts = info["counts"][info["pool_class"]].astype(np.int64)  # per class, rotation
        return info, counts, np.cumsum(counts)

    @property
    def examples_per_epoch(self) -> int:
        """Examples of the training split (each rotation counted)."""
        return int(self._entries()[2][-1]) if self.num_classes("train") else 0

    def num_classes(self, split: str = "train") -> int:
        """The classes of ``split``: the training classes (rotations included) that
        whole-class labels index, or the wrapped sampler's."""
        return self.episodes.num_classes(split)

    def classes_per_batch(self, split: str) -> Tuple[Tuple[int, ...], str]:
        """The number of classes a model's output must have on ``split``'s batches, and
        why (what :func:`metalearn.runs.validation.check_outputs` compares)."""
        if split == "train":
            count = self.num_classes("train")
            return (count,), (f"the {count} training classes WholeClassBatches labels "
                              "(rotations included)")
        ways = self.episodes.ways
        return ways, f"FewShotClassification.ways={ways[0] if len(ways) == 1 else ways}"

    # --- the streams ---------------------------------------------------------------

    def check_split(self, split: str) -> None:
        """See :meth:`TaskSampler.check_split`: ``"train"`` has classes; other splits,
        the wrapped sampler's check."""
        if split != "train":
            return self.episodes.check_split(split)
        if not self.num_classes("train"):
            raise ValueError("the 'train' split has no classes; give it some (e.g. "
                             "FewShotClassification.train = [...])")

    def dataset(self, num_tasks: int, seed: int = 0, split: str = "train", **kwargs
                ) -> tf.data.Dataset:
        """See :meth:`TaskSampler.dataset`. ``"train"``: whole-class batches (the data
        loaded and checked first); other splits: the wrapped sampler's episodes."""
        if split != "train":
            return self.episodes.dataset(num_tasks, seed=seed, split=split, **kwargs)
        self.check_split(split)
        per_step = int(num_tasks) * self.batch_size
        if per_step > self.examples_per_epoch:
            raise ValueError(f"{num_tasks} task(s) x WholeClassBatches.batch_size="
                             f"{self.batch_size} examples per step is more than the "
                             f"{self.examples_per_epoch} training examples")
        return super().dataset(num_tasks, seed=seed, split=split, **kwargs)

    def sample(self, seed: tf.Tensor, num_tasks: int, split: str = "train") -> Episode:
        """One batch drawn at random (not in epoch order: the streams use
        :meth:`sample_at`); other splits: the wrapped sampler's episodes."""
        if split != "train":
            return self.episodes.sample(seed, num_tasks, split)
        _, _, ends = self._entries()
        picks = tf.argsort(tf.random.stateless_uniform([int(ends[-1])], seed))
        return self._batch(picks[:num_tasks * self.batch_size], num_tasks, seed)

    def sample_at(self, base_seed: tf.Tensor, index: tf.Tensor, num_tasks: int,
                  split: str) -> Episode:
        if split != "train":
            return self.episodes.sample_at(base_seed, index, num_tasks, split)
        total = self.examples_per_epoch
        size = num_tasks * self.batch_size
        positions = tf.cast(index, tf.int64) * size + tf.range(size, dtype=tf.int64)
        epoch, offset = positions // total, positions % total
        permutation_seed = tf.random.experimental.stateless_fold_in(base_seed, _EPOCH_SALT)

        def order(e):  # the epoch's permutation of 0 .. total - 1
            key = tf.random.experimental.stateless_fold_in(permutation_seed, e)
            return tf.argsort(tf.random.stateless_uniform([total], key))

        # A batch spans at most two epochs (size <= total, checked in dataset()).
        first, second = order(epoch[0]), order(epoch[0] + 1)
        picks = tf.where(tf.equal(epoch, epoch[0]), tf.gather(first, offset),
                         tf.gather(second, offset))
        return self._batch(picks, num_tasks,
                           tf.random.experimental.stateless_fold_in(base_seed, index))

    def _batch(self, picks: tf.Tensor, num_tasks: int, seed: tf.Tensor) -> Episode:
        """The examples ``picks`` (positions in the training split, each rotation's
        examples after the previous entry's) as ``num_tasks`` whole-class batches."""
        info, counts, ends = self._entries()
        picks = tf.cast(picks, tf.int64)
        entry = tf.searchsorted(tf.constant(ends), picks, side="right")  # class, rotation
        within = picks - tf.gather(tf.constant(ends - counts), entry)
        pool_class = tf.gather(tf.constant(info["pool_class"]), entry)
        stored = tf.cast(tf.gather(tf.constant(info["offsets"]), pool_class), tf.int64) + within
        turns = tf.gather(tf.constant(info["pool_rotation"]), entry)
        images = self.episodes.examples("train", stored, turns, seed)       # [T * B, H, W, C]
        shape = (num_tasks, self.batch_size) + self.episodes.image_shape
        images = tf.ensure_shape(tf.reshape(images, shape), shape)
        labels = tf.reshape(tf.cast(entry, tf.int32), [num_tasks, self.batch_size])
        return Episode(images[:, :0], labels[:, :0], images, labels)


__all__ = ["WholeClassBatches"]
