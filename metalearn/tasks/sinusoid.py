"""Sinusoid regression tasks, as in the MAML paper (Finn et al., 2017, section 5.1)."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import gin
import tensorflow as tf

from metalearn.tasks.base import TaskSampler
from metalearn.tasks.episode import Episode


def check_range(name: str, value: Tuple[float, float]) -> Tuple[float, float]:
    low, high = (float(v) for v in value)
    if not low <= high:
        raise ValueError(f"{name} must be a (low, high) pair with low <= high, got {value!r}")
    return low, high


def check_points(shots: int, queries: Optional[int]) -> Tuple[int, int]:
    """``(shots, queries)`` of a regression sampler, queries defaulting to shots; raises
    ``ValueError`` naming a count below 1."""
    if int(shots) < 1:
        raise ValueError(f"shots must be >= 1, got {shots}")
    if queries is not None and int(queries) < 1:
        raise ValueError(f"queries must be >= 1, got {queries}")
    return int(shots), int(shots) if queries is None else int(queries)


@gin.configurable
class Sinusoid(TaskSampler):
    """Regress ``y = amplitude * sin(x - phase)`` from ``shots`` points.

    Defaults are the MAML paper's: amplitude ~ U[0.1, 5.0], phase ~ U[0, pi],
    x ~ U[-5, 5], K = 10 support points, and as many query points.

    Args:
      shots: support points per task (K).
      queries: query points per task; defaults to ``shots``.
      amplitude, phase, x_range: ``(low, high)`` of the uniform distributions.
      dtype: dtype of the generated tensors.
    """

    def __init__(self, shots: int = 10, queries: Optional[int] = None,
                 amplitude: Tuple[float, float] = (0.1, 5.0),
                 phase: Tuple[float, float] = (0.0, math.pi),
                 x_range: Tuple[float, float] = (-5.0, 5.0),
                 dtype: str = "float32"):
        self.shots, self.queries = check_points(shots, queries)
        self.amplitude = check_range("amplitude", amplitude)
        self.phase = check_range("phase", phase)
        self.x_range = check_range("x_range", x_range)
        self.dtype = tf.as_dtype(dtype)

    def sample(self, seed: tf.Tensor, num_tasks: int, split: str = "train") -> Episode:
        seeds = tf.random.experimental.stateless_split(seed, 3)
        uniform = lambda s, shape, bounds: tf.random.stateless_uniform(
            shape, s, minval=bounds[0], maxval=bounds[1], dtype=self.dtype)
        amplitude = uniform(seeds[0], [num_tasks, 1, 1], self.amplitude)
        phase = uniform(seeds[1], [num_tasks, 1, 1], self.phase)
        x = uniform(seeds[2], [num_tasks, self.shots + self.queries, 1], self.x_range)
        y = amplitude * tf.sin(x - phase)  # [tasks, shots + queries, 1]
        return Episode(x[:, :self.shots], y[:, :self.shots],
                       x[:, self.shots:], y[:, self.shots:])
