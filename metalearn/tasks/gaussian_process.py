"""Gaussian-process regression tasks: a task prior for neural processes and MAML alike
(the 1-d GP curves of Garnelo et al., 2018 and Kim et al., 2019)."""

from __future__ import annotations

from typing import Optional, Tuple

import gin
import tensorflow as tf

from metalearn import ranges
from metalearn.tasks.base import TaskSampler
from metalearn.tasks.episode import Episode
from metalearn.tasks.sinusoid import check_points, check_range


def rbf_kernel(x: tf.Tensor, length_scale: tf.Tensor, variance: tf.Tensor) -> tf.Tensor:
    """``variance * exp(-|x_i - x_j|^2 / (2 length_scale^2))`` for ``x [tasks, n, d]``
    and per-task ``length_scale``, ``variance [tasks]``: ``[tasks, n, n]``."""
    differences = x[:, :, None, :] - x[:, None, :, :]
    squared = tf.reduce_sum(tf.square(differences), -1)
    return variance[:, None, None] * tf.exp(-0.5 * squared / tf.square(length_scale)[:, None, None])


@gin.configurable
class GaussianProcess(TaskSampler):
    """Regress one draw ``f ~ GP(0, k)`` of a zero-mean Gaussian process with an RBF
    kernel whose length scale and variance are drawn per task, observed with Gaussian
    noise: ``y = f(x) + noise * e``.

    The defaults are the attentive NP paper's 1-d curves (Kim et al., 2019): length
    scale ~ U[0.1, 0.6], variance ~ U[0.1, 1.0], x ~ U[-2, 2], noise 0.02. The function
    values are drawn in float64 (Cholesky factor of the kernel matrix plus
    ``noise**2 + jitter`` on its diagonal) and cast to ``dtype``. Like every sampler,
    a batch is a pure function of its seed.

    Args:
      shots: support points per task.
      queries: query points per task; defaults to ``shots``.
      length_scale, variance, x_range: ``(low, high)`` of the uniform distributions.
      noise: the observation noise's standard deviation, >= 0.
      jitter: added to the diagonal for a stable Cholesky factor, > 0.
      dtype: dtype of the generated tensors.
    """

    def __init__(self, shots: int = 10, queries: Optional[int] = None,
                 length_scale: Tuple[float, float] = (0.1, 0.6),
                 variance: Tuple[float, float] = (0.1, 1.0),
                 x_range: Tuple[float, float] = (-2.0, 2.0), noise: float = 0.02,
                 jitter: float = 1e-6, dtype: str = "float32"):
        self.shots, self.queries = check_points(shots, queries)
        self.length_scale = check_range("length_scale", length_scale)
        self.variance = check_range("variance", variance)
        self.x_range = check_range("x_range", x_range)
        for name, value in (("length_scale", self.length_scale),
                            ("variance", self.variance)):
            ranges.check_range("GaussianProcess", f"{name}'s low end", value[0],
                               ranges.POSITIVE)
        self.noise = ranges.check_range("GaussianProcess", "noise", noise,
                                        ranges.NON_NEGATIVE)
        self.jitter = ranges.check_range("GaussianProcess", "jitter", jitter,
                                         ranges.POSITIVE)
        self.dtype = tf.as_dtype(dtype)

    def sample(self, seed: tf.Tensor, num_tasks: int, split: str = "train") -> Episode:
        seeds = tf.random.experimental.stateless_split(seed, 4)
        uniform = lambda s, shape, bounds: tf.random.stateless_uniform(
            shape, s, minval=bounds[0], maxval=bounds[1], dtype=tf.float64)
        points = self.shots + self.queries
        length_scale = uniform(seeds[0], [num_tasks], self.length_scale)
        variance = uniform(seeds[1], [num_tasks], self.variance)
        x = uniform(seeds[2], [num_tasks, points, 1], self.x_range)
        kernel = rbf_kernel(x, length_scale, variance) + \
            (self.noise ** 2 + self.jitter) * tf.eye(points, dtype=tf.float64)
        normal = tf.random.stateless_normal([num_tasks, points, 1], seeds[3], dtype=tf.float64)
        y = tf.linalg.cholesky(kernel) @ normal  # [tasks, points, 1]
        x, y = tf.cast(x, self.dtype), tf.cast(y, self.dtype)
        return Episode(x[:, :self.shots], y[:, :self.shots], x[:, self.shots:],
                       y[:, self.shots:])
