"""Image augmentation for the natural-image benchmarks, stateless and seeded.

The standard training augmentation of the mini-ImageNet / tiered-ImageNet / CIFAR-FS /
FC100 / CUB literature (e.g. Chen et al. 2019, RFS, MetaOptNet): a random resized crop,
a horizontal flip and colour jitter (brightness, contrast, saturation). Every draw is a
``tf.random.stateless_*`` function of a seed, and the episode sampler derives that seed
from the episode's own (``FewShotClassification(augment=...)``), so an augmented stream
is the same on every machine and resumes exactly (as ``max_shift`` does). Runs inside
``tf.data`` on whole batches of images.
"""

from __future__ import annotations

import math
from typing import Sequence

import gin
import tensorflow as tf


def _check_range(name: str, value: Sequence[float], low: float, high: float):
    value = tuple(float(v) for v in value)
    if len(value) != 2 or not low <= value[0] <= value[1] <= high:
        raise ValueError(f"{name} must be (min, max) with {low} <= min <= max <= {high}, "
                         f"got {value!r}")
    return value


@gin.configurable
class ImageAugmentation:
    """Random resized crop, horizontal flip and colour jitter, each image drawn
    independently from a seed.

    Args:
      crop_scale: the crop's area as a fraction of the image's, drawn uniformly
        (torchvision's ``RandomResizedCrop``: ``(0.08, 1.0)``); ``None`` for no crop.
      crop_ratio: the crop's width / height, drawn log-uniformly. A crop that would not
        fit is shrunk to fit (instead of torchvision's ten retries), and placed uniformly.
        The crop is resized back to the image's size (bilinear).
      flip: mirror left-right with probability 1/2.
      brightness, contrast, saturation: colour jitter strengths (torchvision's
        ``ColorJitter``): each factor is drawn from ``[1 - s, 1 + s]``; brightness scales
        the pixels, contrast blends with the image's mean grey level, saturation with
        its grey image (no-op on 1 channel). Applied in that order, then clipped to
        [0, 1]. ``0`` turns one off.
    """

    def __init__(self, crop_scale: Sequence[float] = (0.08, 1.0),
                 crop_ratio: Sequence[float] = (3 / 4, 4 / 3), flip: bool = True,
                 brightness: float = 0.4, contrast: float = 0.4, saturation: float = 0.4):
        self.crop_scale = None if crop_scale is None else _check_range(
            "crop_scale", crop_scale, 1e-6, 1.0)
        self.crop_ratio = _check_range("crop_ratio", crop_ratio, 1e-3, 1e3)
        self.flip = bool(flip)
        for name, value in (("brightness", brightness), ("contrast", contrast),
                            ("saturation", saturation)):
            if not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        self.brightness, self.contrast = float(brightness), float(contrast)
        self.saturation = float(saturation)

    def __call__(self, images: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        """Augments ``images [n, H, W, C]`` (floats in [0, 1]) from a ``[2]`` seed."""
        n = tf.shape(images)[0]
        seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 5)
        if self.crop_scale is not None:
            images = self._crop(images, n, seeds[0])
        if self.flip:
            mirror = tf.random.stateless_uniform([n], seeds[1]) < 0.5
            images = tf.where(mirror[:, None, None, None], tf.reverse(images, axis=[2]),
                              images)
        factor = lambda s, k: tf.random.stateless_uniform(  # noqa: E731
            [n, 1, 1, 1], seeds[k], minval=1.0 - s, maxval=1.0 + s)
        if self.brightness:
            images = images * factor(self.brightness, 2)
        if self.contrast:
            mean = tf.reduce_mean(_grey(images), axis=[1, 2, 3], keepdims=True)
            images = mean + factor(self.contrast, 3) * (images - mean)
        if self.saturation and images.shape[-1] == 3:
            grey = _grey(images)
            images = grey + factor(self.saturation, 4) * (images - grey)
        return tf.clip_by_value(images, 0.0, 1.0)

    def _crop(self, images, n, seed):
        seeds = tf.random.experimental.stateless_split(seed, 4)
        area = tf.random.stateless_uniform([n], seeds[0], *self.crop_scale)
        log_ratio = tf.random.stateless_uniform(
            [n], seeds[1], math.log(self.crop_ratio[0]), math.log(self.crop_ratio[1]))
        ratio = tf.exp(log_ratio)
        # Relative height and width of the crop (of the image's height and width).
        height = tf.minimum(tf.sqrt(area / ratio), 1.0)
        width = tf.minimum(tf.sqrt(area * ratio), 1.0)
        top = tf.random.stateless_uniform([n], seeds[2]) * (1.0 - height)
        left = tf.random.stateless_uniform([n], seeds[3]) * (1.0 - width)
        boxes = tf.stack([top, left, top + height, left + width], axis=1)
        size = tf.shape(images)[1:3]
        return tf.image.crop_and_resize(images, boxes, tf.range(n), size, method="bilinear")


def _grey(images: tf.Tensor) -> tf.Tensor:
    if images.shape[-1] != 3:
        return images
    weights = tf.constant([0.299, 0.587, 0.114], images.dtype)
    return tf.reduce_sum(images * weights, axis=-1, keepdims=True)
