"""Random synthetic task priors for prior-fitted (in-context) meta-training, beside the
Gaussian-process one (:mod:`metalearn.tasks.gaussian_process`): regression on random
small MLP functions, and random linear classification tasks. Each batch is a pure
function of its seed, like every sampler's."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import gin
import keras
import tensorflow as tf

from metalearn.tasks.base import TaskSampler
from metalearn.tasks.episode import Episode
from metalearn.tasks.sinusoid import check_points, check_range


def _count(name: str, value: int) -> int:
    if int(value) < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


@gin.configurable
class RandomMLPFunctions(TaskSampler):
    """Regress one random function per task: a small MLP with freshly drawn weights,
    ``y = W_out h_L / sqrt(width) * output_scale + noise * e``,
    ``h_l = activation(h_{l-1} W_l / sqrt(fan_in) + b_l)``, every ``W`` and ``b``
    standard normal per task, ``h_0 = x ~ U[x_range]^inputs``.

    Args:
      shots: support points per task.
      queries: query points per task; defaults to ``shots``.
      inputs, outputs: the functions' input and output sizes.
      hidden: the random MLP's hidden widths (``()``: a random linear function).
      activation: a Keras activation name.
      x_range: ``(low, high)`` of the inputs' uniform distribution.
      output_scale: the outputs' scale, > 0.
      noise: the observation noise's standard deviation, >= 0.
      dtype: dtype of the generated tensors.
    """

    def __init__(self, shots: int = 10, queries: Optional[int] = None, inputs: int = 1,
                 outputs: int = 1, hidden: Sequence[int] = (32, 32),
                 activation: str = "tanh", x_range: Tuple[float, float] = (-2.0, 2.0),
                 output_scale: float = 1.0, noise: float = 0.0, dtype: str = "float32"):
        self.shots, self.queries = check_points(shots, queries)
        self.inputs, self.outputs = _count("inputs", inputs), _count("outputs", outputs)
        self.hidden = tuple(_count("hidden", h) for h in hidden)
        self.activation = keras.activations.get(activation)
        self.x_range = check_range("x_range", x_range)
        if not float(output_scale) > 0 or float(noise) < 0:
            raise ValueError(f"output_scale must be > 0 and noise >= 0, got "
                             f"output_scale={output_scale}, noise={noise}")
        self.output_scale, self.noise = float(output_scale), float(noise)
        self.dtype = tf.as_dtype(dtype)

    def sample(self, seed: tf.Tensor, num_tasks: int, split: str = "train") -> Episode:
        sizes = (self.inputs, *self.hidden, self.outputs)
        seeds = tf.random.experimental.stateless_split(seed, 2 * len(sizes) + 1)
        points = self.shots + self.queries
        x = tf.random.stateless_uniform([num_tasks, points, self.inputs], seeds[0],
                                        self.x_range[0], self.x_range[1], dtype=self.dtype)
        h = x
        for layer, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            w = tf.random.stateless_normal([num_tasks, fan_in, fan_out], seeds[2 * layer + 1],
                                           dtype=self.dtype)
            h = h @ w / tf.sqrt(tf.cast(fan_in, self.dtype))
            if layer < len(sizes) - 2:
                b = tf.random.stateless_normal([num_tasks, 1, fan_out], seeds[2 * layer + 2],
                                               dtype=self.dtype)
                h = self.activation(h + b)
        y = self.output_scale * h + self.noise * tf.random.stateless_normal(
            tf.shape(h), seeds[-1], dtype=self.dtype)
        return Episode(x[:, :self.shots], y[:, :self.shots], x[:, self.shots:],
                       y[:, self.shots:])


@gin.configurable
class RandomLinearClassification(TaskSampler):
    """``ways``-way tasks whose classes are the cells of a random linear classifier:
    per task ``W [dim, ways]`` (entries ``N(0, 1 / dim)``) and ``b [ways]``
    (``N(0, bias_scale**2)``), the label of ``x`` is ``argmax(x W + b)``, exactly.

    Each class gets ``shots`` support and ``queries`` query points (ordered by class,
    labels ``0 .. ways - 1``): a point ``x ~ N(0, I)`` drawn for class ``k`` and not
    at least ``margin`` inside its cell is moved along the row ``k`` of ``W``'s
    pseudo-inverse (which raises the ``k``-th score alone) until it is exactly
    ``margin`` inside. Needs ``dim >= ways`` (then ``W`` has full column rank).

    Args:
      ways, shots, queries: classes, and support and query points per class.
      dim: the inputs' size.
      margin: how far inside its cell (in score) every point lies, >= 0.
      bias_scale: the biases' scale, >= 0 (0: every cell a cone at the origin).
      dtype: dtype of the inputs (the labels are int32).
    """

    def __init__(self, ways: int = 5, shots: int = 1, queries: int = 5, dim: int = 16,
                 margin: float = 0.1, bias_scale: float = 0.5, dtype: str = "float32"):
        self.ways, self.shots = _count("ways", ways), _count("shots", shots)
        self.queries, self.dim = _count("queries", queries), _count("dim", dim)
        if self.dim < self.ways:
            raise ValueError(f"RandomLinearClassification needs dim >= ways, got dim="
                             f"{dim}, ways={ways}")
        if float(margin) < 0 or float(bias_scale) < 0:
            raise ValueError(f"margin and bias_scale must be >= 0, got margin={margin}, "
                             f"bias_scale={bias_scale}")
        self.margin, self.bias_scale = float(margin), float(bias_scale)
        self.dtype = tf.as_dtype(dtype)

    def classifier(self, seed: tf.Tensor, num_tasks: int) -> Tuple[tf.Tensor, tf.Tensor]:
        """Each task's ``(W [tasks, dim, ways], b [tasks, ways])``, float64, of the
        batch drawn from ``seed``."""
        seeds = tf.random.experimental.stateless_split(seed, 3)
        w = tf.random.stateless_normal([num_tasks, self.dim, self.ways], seeds[0],
                                       dtype=tf.float64) / self.dim ** 0.5
        b = self.bias_scale * tf.random.stateless_normal([num_tasks, self.ways], seeds[1],
                                                         dtype=tf.float64)
        return w, b

    def sample(self, seed: tf.Tensor, num_tasks: int, split: str = "train") -> Episode:
        w, b = self.classifier(seed, num_tasks)
        per_class = self.shots + self.queries
        x = tf.random.stateless_normal(
            [num_tasks, self.ways * per_class, self.dim],
            tf.random.experimental.stateless_split(seed, 3)[2], dtype=tf.float64)
        labels = tf.repeat(tf.range(self.ways), per_class)           # class blocks
        scores = x @ w + b[:, None]                                   # [tasks, n, ways]
        own = tf.one_hot(labels, self.ways, dtype=tf.float64)[None]
        best_other = tf.reduce_max(scores - 1e30 * own, axis=-1)
        shift = tf.nn.relu(best_other - tf.reduce_sum(scores * own, -1) + self.margin)
        raise_k = tf.gather(tf.linalg.pinv(w), labels, axis=1)        # [tasks, n, dim]
        x = tf.cast(x + shift[..., None] * raise_k, self.dtype)
        labels = tf.tile(tf.reshape(labels, [1, self.ways, per_class]), [num_tasks, 1, 1])
        x = tf.reshape(x, [num_tasks, self.ways, per_class, self.dim])
        flat = lambda t, n: tf.reshape(t, [num_tasks, self.ways * n, *t.shape[3:]])  # noqa: E731
        return Episode(flat(x[:, :, :self.shots], self.shots),
                       flat(labels[:, :, :self.shots], self.shots),
                       flat(x[:, :, self.shots:], self.queries),
                       flat(labels[:, :, self.shots:], self.queries))
