"""Small float64 tasks and losses for gradient checks of inner loops."""

from __future__ import annotations

from typing import Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.adapters import GradientDescent, GradientStep, Mask
from metalearn.functional import softmax_cross_entropy
from metalearn.tasks import Episode, TaskSampler


def mse(y, p):
    """Mean squared error, a scalar."""
    return tf.reduce_mean(tf.square(y - p))


def softmax_xent(y, logits):
    """Mean softmax cross-entropy of integer labels, a scalar."""
    return tf.reduce_mean(softmax_cross_entropy(y, logits))


def regression_episodes(tasks: int = 3, shots: int = 4, dim: int = 2, seed: int = 0
                        ) -> Episode:
    """Random float64 regression tasks ``[tasks, shots, dim] -> [tasks, shots, 1]``."""
    keys = tf.random.experimental.stateless_split([seed, 1], 4)
    normal = lambda k, shape: tf.random.stateless_normal(shape, k, dtype=tf.float64)
    return Episode(normal(keys[0], [tasks, shots, dim]), normal(keys[1], [tasks, shots, 1]),
                   normal(keys[2], [tasks, shots, dim]), normal(keys[3], [tasks, shots, 1]))


def image_episodes(tasks: int = 2, ways: int = 3, size: int = 8, seed: int = 0) -> Episode:
    """Random float64 ``size x size`` one-shot image tasks, labels ``0 .. ways - 1``."""
    keys = tf.random.experimental.stateless_split([seed, 2], 2)
    labels = tf.tile(tf.range(ways)[None], [tasks, 1])
    images = lambda k: tf.random.stateless_normal([tasks, ways, size, size, 1], k,
                                                  dtype=tf.float64)
    return Episode(images(keys[0]), labels, images(keys[1]), labels)


def small_learner(kind: str, steps: int = 2, first_order: bool = False,
                  adapt: Optional[Sequence[str]] = None, wrappers=()):
    """A float64 MAML learner (inner rate 0.3): ``"mlp"`` (2-5-4-1 tanh regression, MSE)
    or ``"conv"`` (a 2-block conv net with BatchNorm on 8x8 images, 3 ways); ``adapt``:
    ANIL-style path patterns (a ``Mask``)."""
    keras.utils.set_random_seed(0)
    if kind == "mlp":
        model = models.mlp((2,), hidden=(5, 4), outputs=1, activation="tanh", dtype="float64")
        loss = mse
    else:
        model = models.conv_net((8, 8, 1), outputs=3, filters=3, blocks=2, dtype="float64")
        loss = softmax_xent
    if adapt is None:
        adapter = GradientDescent(steps=steps, learning_rate=0.3, first_order=first_order,
                                  wrappers=wrappers)
    else:
        adapter = GradientDescent(steps=steps, first_order=first_order, wrappers=wrappers,
                                  update=[Mask(adapt), GradientStep(0.3)])
    return metalearn.Learner(model, adapter=adapter, loss=loss)


def assert_sampler_is_seeded_and_stateless(sampler: TaskSampler, num_tasks: int = 4
                                           ) -> Episode:
    """Checks that ``sampler``'s batches are a pure function of their seed: the same seed
    gives the same batch, another seed another one, and its ``dataset`` resumed at a
    step (``start_step``) gives the stream's batches from there.

    Returns:
      The batch of ``num_tasks`` episodes from seed ``[3, 0]``, for further checks.

    Raises:
      AssertionError: naming what differs.
    """
    seed = tf.constant([3, 0], tf.int64)
    one, again = sampler.sample(seed, num_tasks), sampler.sample(seed, num_tasks)
    other = sampler.sample(tf.constant([4, 0], tf.int64), num_tasks)
    for name, a, b in zip(("support_x", "support_y", "query_x", "query_y"), one, again):
        np.testing.assert_array_equal(a, b, err_msg=f"{name} differs for one seed")
    assert not np.array_equal(one.support_x, other.support_x), "two seeds, one batch"
    stream = [e.query_x.numpy() for e in sampler.dataset(2, seed=1, num_steps=3)]
    resumed = [e.query_x.numpy() for e in sampler.dataset(2, seed=1, start_step=1,
                                                          num_steps=2)]
    np.testing.assert_array_equal(stream[1:], resumed, err_msg="a resumed stream differs")
    return one
