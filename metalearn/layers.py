"""Plain Keras layers the backbones need and Keras lacks: :class:`DropBlock`.

Layers here are ordinary ``keras.layers.Layer`` subclasses: they run unchanged under
:func:`metalearn.functional.call` (``stateless_call``), inside inner loops, under XLA and
``tf.distribute``, and each has a rule for the task-batched formulation
(:mod:`metalearn.functional.batched`), registered beside it.
"""

from __future__ import annotations

import random
from typing import Any, Dict, Optional

import keras
import tensorflow as tf

from metalearn.functional import batched

__all__ = ["DropBlock"]


class DropBlock(keras.layers.Layer):
    """DropBlock (Ghiasi et al., 2018): drops contiguous ``block_size x block_size``
    squares of a feature map (each channel its own), and rescales what is kept.

    With keep probability ``keep`` on an ``h x w`` map, block centres are drawn with
    rate ``gamma = (1 - keep) / block_size^2 * h w / ((h - block_size + 1)
    (w - block_size + 1))`` on the positions where a whole block fits, each grown to a
    square of zeros, and the output is ``x * mask * size(mask) / sum(mask)``.
    ``block_size=1`` is (inverted) dropout. Identity at inference and when ``rate=0``.

    **Schedule.** ``keep`` falls linearly from 1 to ``1 - rate`` over ``schedule_steps``
    steps, then stays (MetaOptNet's ResNet-12; ``schedule_steps=0``: ``1 - rate`` from
    the start).

    **Randomness, deterministic.** The mask is a stateless function of ``(seed, step)``
    (``tf.random.stateless_uniform``), never of the weights, so a loss through it is a
    smooth function of the weights that finite differences can check. ``step`` is the
    layer's ``iterations`` counter, which each training call advances when the layer is
    run as plain Keras (``model.fit``, ``model(x, training=True)``), like PyTorch's
    ``num_batches_tracked``. Under :func:`metalearn.functional.call` nothing is
    assigned, so a :class:`~metalearn.Learner` gives the layer its ``meta_step``
    (:meth:`bind`, as it gives every inner-loop piece): the schedule then runs over
    meta-steps, a new mask is drawn every meta-step, and within one meta-step every
    call (each task, inner step, support and query pass) sees the same mask for the
    same example position. That is what makes the task-batched formulation equal the
    per-task one exactly.

    Args:
      rate: ``1 - keep`` after the schedule (MetaOptNet: 0.1), in ``[0, 1)``.
      block_size: side of a dropped square (clipped to the feature map's sides).
      schedule_steps: steps of the linear ramp of ``keep`` from 1 to ``1 - rate``.
      seed: the mask stream's seed; ``None`` draws one from Python's ``random`` (seeded
        by ``keras.utils.set_random_seed``).

    Raises:
      ValueError: ``rate``, ``block_size`` or ``schedule_steps`` out of range.
    """

    def __init__(self, rate: float = 0.1, block_size: int = 5, schedule_steps: int = 0,
                 seed: Optional[int] = None, **kwargs: Any):
        super().__init__(**kwargs)
        if not 0.0 <= float(rate) < 1.0:
            raise ValueError(f"DropBlock rate must be in [0, 1), got {rate!r}")
        if int(block_size) < 1:
            raise ValueError(f"DropBlock block_size must be >= 1, got {block_size!r}")
        if int(schedule_steps) < 0:
            raise ValueError(f"DropBlock schedule_steps must be >= 0, got {schedule_steps!r}")
        self.rate = float(rate)
        self.block_size = int(block_size)
        self.schedule_steps = int(schedule_steps)
        self.seed = int(random.randint(1, 2 ** 31 - 1) if seed is None else seed)
        self.supports_masking = True
        self.iterations = self.add_weight(shape=(), dtype="int64", trainable=False,
                                          initializer="zeros", name="iterations")
        # The learner's meta-step, when bound: held outside Keras' tracking, so the
        # model's variables (and checkpoints) are the same bound or not.
        object.__setattr__(self, "_meta_step", None)

    # --- the learner's counter ----------------------------------------------------

    @property
    def meta_step(self) -> Optional[tf.Variable]:
        """The counter the schedule and mask read (``None``: :attr:`iterations`)."""
        return self._meta_step

    def bind(self, meta_step: tf.Variable) -> None:
        """Reads ``meta_step`` (the learner's outer-step counter) instead of
        :attr:`iterations` from now on."""
        object.__setattr__(self, "_meta_step", meta_step)

    def _step(self) -> tf.Tensor:
        step = self.iterations if self._meta_step is None else self._meta_step
        return tf.cast(tf.convert_to_tensor(step), tf.int64)

    # --- the mask -------------------------------------------------------------------

    def keep_probability(self, step: Any = None) -> tf.Tensor:
        """``keep`` at ``step`` (default: the current counter), a float32 scalar."""
        step = self._step() if step is None else tf.convert_to_tensor(step, tf.int64)
        if self.schedule_steps == 0:
            return tf.constant(1.0 - self.rate, tf.float32)
        progress = tf.minimum(tf.cast(step, tf.float32) / self.schedule_steps, 1.0)
        return 1.0 - self.rate * progress

    def scaled_mask(self, shape: tf.TensorShape, dtype: tf.DType,
                    batch: Optional[tf.Tensor] = None) -> tf.Tensor:
        """The mask times its rescaling for inputs of ``shape`` ``[n, h, w, c]`` (``h``,
        ``w``, ``c`` known; ``batch``: ``n`` as a tensor when it is not)."""
        _, height, width, channels = shape
        if None in (height, width, channels):
            raise ValueError(f"DropBlock {self.name!r} needs known height, width and "
                             f"channels, got shape {shape}")
        batch = shape[0] if batch is None else batch
        block = min(self.block_size, height, width)
        valid_h, valid_w = height - block + 1, width - block + 1
        gamma = (1.0 - self.keep_probability()) / (block * block) * \
            (height * width) / (valid_h * valid_w)
        seed = tf.stack([tf.constant(self.seed, tf.int64), self._step()])
        draws = tf.random.stateless_uniform(tf.stack([batch, valid_h, valid_w, channels]),
                                            seed, dtype=tf.float32)
        dropped = tf.cast(draws < gamma, tf.float32)  # block corners where a block fits
        if block > 1:  # each corner grown to the block below and right of it
            before, after = block // 2, (block - 1) // 2  # max_pool2d's SAME: the reverse
            dropped = tf.pad(dropped, [[0, 0], [before, after], [before, after], [0, 0]])
            dropped = tf.nn.max_pool2d(dropped, block, 1, "SAME")
        mask = 1.0 - dropped
        kept = tf.maximum(tf.reduce_sum(mask), 1.0)
        return tf.cast(mask * (tf.cast(tf.size(mask), tf.float32) / kept), dtype)

    def call(self, inputs: tf.Tensor, training: Optional[bool] = None) -> tf.Tensor:
        if not training or self.rate == 0.0:
            return inputs
        if inputs.shape.rank != 4:
            raise ValueError(f"DropBlock {self.name!r} needs [batch, height, width, "
                             f"channels] inputs, got shape {inputs.shape}")
        outputs = inputs * self.scaled_mask(inputs.shape, inputs.dtype, tf.shape(inputs)[0])
        if self._meta_step is None:
            self.iterations.assign_add(1)  # dropped by stateless_call: nothing assigned
        return outputs

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> Dict[str, Any]:
        return {**super().get_config(), "rate": self.rate, "block_size": self.block_size,
                "schedule_steps": self.schedule_steps, "seed": self.seed}


@batched.register(DropBlock)
def _drop_block(layer: DropBlock, weights: Dict[str, tf.Tensor], x: tf.Tensor,
                training: bool) -> tf.Tensor:
    """One task's mask, shared by every task: what the per-task formulation draws."""
    if not training or layer.rate == 0.0:
        return x
    return x * layer.scaled_mask(x.shape[1:], x.dtype, tf.shape(x)[1])[None]
