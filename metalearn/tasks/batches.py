"""Plain supervised mini-batches of a labelled data set, served as tasks.

For learners whose "adaptation" needs no task structure, such as a hypernetwork that
generates weights from each input: a task is a random batch of examples (its query
set), with an optional support batch of other examples. This is not the N-way K-shot
episode sampler (labels here are the data set's own class ids, every class at once).
"""

from __future__ import annotations

from typing import Callable, Dict, Sequence, Union

import gin
import numpy as np
import tensorflow as tf

from metalearn.tasks.base import SPLITS, TaskSampler
from metalearn.tasks.datasets.base import LabelledImages
from metalearn.tasks.episode import Episode


@gin.configurable
class SupervisedBatches(TaskSampler):
    """Tasks that are random batches of a ``LabelledImages`` data set.

    Each task draws ``support + batch_size`` distinct examples uniformly from its split
    (independently per task and step, a pure function of the seed, so a stream of
    tasks samples with replacement across steps rather than in epochs).

    Args:
      data: the labelled examples, e.g. ``load_mnist(...)``, or a function returning
        them (``@load_mnist`` in gin), called when tasks are first drawn so that
        building an experiment does not load the data.
      batch_size: query examples per task.
      support: support examples per task (0: an empty support set).
      flatten: flatten each image to a vector (``[784]`` for MNIST).
      scale: images are cast to ``dtype`` and multiplied by this (``1/255`` maps uint8
        to [0, 1]).
      dtype: dtype of the images served.
      fractions: ``(train, validation, test)`` shares of the examples (a fixed random
        partition); ``(1, 0, 0)`` serves every example for training.
    """

    def __init__(self, data: Union[LabelledImages, Callable[[], LabelledImages]] = gin.REQUIRED,
                 batch_size: int = 1,
                 support: int = 0, flatten: bool = False, scale: float = 1 / 255,
                 dtype: str = "float32",
                 fractions: Sequence[float] = (1.0, 0.0, 0.0)):
        if not (isinstance(data, LabelledImages) or callable(data)):
            raise TypeError("data must be LabelledImages or a function returning them, "
                            f"got {type(data).__name__}")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if int(support) < 0:
            raise ValueError(f"support must be >= 0, got {support}")
        fractions = tuple(float(f) for f in fractions)
        if len(fractions) != len(SPLITS) or min(fractions) < 0 or sum(fractions) > 1 + 1e-9:
            raise ValueError(f"fractions must be {len(SPLITS)} shares of {SPLITS}, each "
                             f">= 0, summing to at most 1; got {fractions}")
        self._data = data
        self.batch_size = int(batch_size)
        self.support = int(support)
        self.flatten = bool(flatten)
        self.scale = float(scale)
        self.dtype = tf.as_dtype(dtype)
        self.fractions = fractions
        self._indices: Dict[str, np.ndarray] = {}

    @property
    def data(self) -> LabelledImages:
        """The labelled examples (loaded on first use when given as a function)."""
        if not isinstance(self._data, LabelledImages):
            data = self._data()
            if not isinstance(data, LabelledImages):
                raise TypeError(f"data function {self._data!r} returned "
                                f"{type(data).__name__}, expected LabelledImages")
            self._data = data
        return self._data

    @property
    def indices(self) -> Dict[str, np.ndarray]:
        """Example indices of each split: a fixed random partition by ``fractions``."""
        if not self._indices:
            order = np.random.default_rng(0).permutation(len(self.data.labels))
            bounds = np.round(np.cumsum((0.0,) + self.fractions) * len(order)).astype(int)
            self._indices = {split: np.sort(order[bounds[i]:bounds[i + 1]])
                             for i, split in enumerate(SPLITS)}
        return self._indices

    def sample(self, seed: tf.Tensor, num_tasks: int, split: str = "train") -> Episode:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        available = self.indices[split]
        per_task = self.support + self.batch_size
        if len(available) < per_task:
            raise ValueError(
                f"split {split!r} has {len(available)} examples (fractions "
                f"{self.fractions}), fewer than the {per_task} a task needs")
        noise = tf.random.stateless_uniform([num_tasks, len(available)], seed)
        picks = tf.argsort(noise, axis=-1)[:, :per_task]         # distinct within a task
        index = tf.gather(tf.constant(available, tf.int64), picks)  # [tasks, per_task]
        images = tf.cast(tf.gather(tf.constant(self.data.images), index), self.dtype)
        images = images * tf.constant(self.scale, self.dtype)    # [tasks, per_task, h, w, c]
        if self.flatten:
            images = tf.reshape(images, [num_tasks, per_task, -1])
        labels = tf.cast(tf.gather(tf.constant(self.data.labels), index), tf.int32)
        return Episode(images[:, :self.support], labels[:, :self.support],
                       images[:, self.support:], labels[:, self.support:])
