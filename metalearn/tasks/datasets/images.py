"""Decoding image files (JPEG, PNG, BMP, GIF) into uint8 arrays, each error naming its file.

What the folder, mini-ImageNet, tiered-ImageNet and CUB loaders share. Images are kept
as uint8 (a quarter of float32's memory: mini-ImageNet's 60,000 84x84 images are 1.3 GB);
the episode sampler converts and normalises each episode.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
from typing import Any, Dict, Optional, Sequence

import numpy as np
import tensorflow as tf

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")

# Per-channel mean and standard deviation (images in [0, 1]) that each benchmark's
# published code normalises with.
IMAGENET_STATS = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
MINI_IMAGENET_STATS = {  # MetaOptNet / RFS: statistics of mini-ImageNet's training images
    "mean": (120.39586422 / 255, 115.59361427 / 255, 104.54012653 / 255),
    "std": (70.68188272 / 255, 68.27635443 / 255, 72.54505529 / 255)}
CIFAR100_STATS = {  # MetaOptNet's CIFAR-FS and FC100 code
    "mean": (129.37731888 / 255, 124.10583864 / 255, 112.47758569 / 255),
    "std": (68.20947949 / 255, 65.43124043 / 255, 70.45866994 / 255)}


MAX_IMAGE_SIZE = 1024
"""The largest ``image_size`` (pixels per side) a loader accepts: few-shot benchmarks use
28 to 224; a side of 100,000 would ask for tens of gigabytes per image."""


def check_image_size(image_size: Any, what: str, optional: bool = False) -> Optional[int]:
    """``image_size`` as an ``int``, checked before anything is allocated: a whole number
    from 1 to :data:`MAX_IMAGE_SIZE` (or ``None`` when ``optional``: keep the sizes).

    Raises:
      ValueError: naming ``what`` (the loader or sampler), the value and the bound.
    """
    if image_size is None and optional:
        return None
    if isinstance(image_size, bool) or not isinstance(
            image_size, (int, float, np.integer, np.floating)) or int(image_size) != image_size \
            or not 1 <= int(image_size) <= MAX_IMAGE_SIZE:
        raise ValueError(f"{what}: image_size must be a whole number of pixels from 1 to "
                         f"{MAX_IMAGE_SIZE}{' or None' if optional else ''}, got "
                         f"{image_size!r} (few-shot benchmarks use 28 to 224)")
    return int(image_size)


def check_memory(count: int, image_size: int, channels: int, where: str,
                 bytes_per_value: int = 1) -> None:
    """Raises ``ValueError`` before ``count`` images of ``image_size`` pixels a side
    are allocated if they would need more than this machine's memory, naming ``where``
    and both figures (nothing is checked where the system does not say its memory)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return
    needed = int(count) * int(image_size) ** 2 * int(channels) * int(bytes_per_value)
    if memory > 0 and needed > memory:
        raise ValueError(f"{where}: {count} images of {image_size}x{image_size}x{channels} "
                         f"need {needed / 2**30:.1f} GiB, more than this machine's "
                         f"{memory / 2**30:.1f} GiB of memory; choose a smaller image_size")


def decode_image(data: bytes, where: str, channels: int = 3,
                 image_size: Optional[int] = None) -> np.ndarray:
    """Encoded image bytes as ``[H, W, channels]`` uint8, resized to ``image_size``
    (antialiased bilinear) when given; an undecodable image is a ``ValueError`` naming
    ``where`` (a file, or an entry of one).

    An image whose colour space the decoder cannot turn into ``channels`` directly (a
    CMYK or YCCK JPEG asked for 1 channel) is decoded in its own colour space (the
    decoder turns CMYK into RGB) and converted (:func:`convert_channels`)."""
    try:
        image = tf.io.decode_image(data, channels=channels, expand_animations=False)
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as error:
        try:
            image = convert_channels(tf.io.decode_image(data, channels=0,
                                                        expand_animations=False), channels)
        except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
            first = error.message.splitlines()[0] if error.message else str(error)
            first = re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:\w+\]", "", first)  # TF's op names
            raise ValueError(f"{where} is not a decodable image ({first})") from None
    if image_size is not None and tuple(image.shape[:2]) != (image_size, image_size):
        image = resize_uint8(image, image_size)
    return image.numpy()


def resize_uint8(image: tf.Tensor, image_size: int) -> tf.Tensor:
    """A uint8 ``[H, W, C]`` image (or a batch of them) resized to ``image_size x
    image_size`` (antialiased bilinear, rounded back to uint8): every loader's resize."""
    image = tf.image.resize(image, (image_size, image_size), method="bilinear",
                            antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)


def convert_channels(image: tf.Tensor, channels: int) -> tf.Tensor:
    """A decoded uint8 ``[H, W, c]`` image (c of 1 to 4: grey, grey + alpha, RGB, RGBA)
    as ``channels`` (1: grey by ITU-R 601 luma, 3: RGB); alpha is dropped."""
    have = int(image.shape[-1])
    if have in (2, 4):
        image, have = image[..., :have - 1], have - 1
    if channels == have or channels == 0:
        return image
    if channels == 3 and have == 1:
        return tf.image.grayscale_to_rgb(image)
    if channels == 1 and have == 3:
        grey = tf.image.rgb_to_grayscale(tf.cast(image, tf.float32))
        return tf.cast(tf.clip_by_value(tf.round(grey), 0, 255), tf.uint8)
    raise ValueError(f"cannot convert an image of {have} channels to {channels}")


def read_image_file(file: str, channels: int = 3,
                    image_size: Optional[int] = None) -> np.ndarray:
    """One image file as ``[H, W, channels]`` uint8; a missing, unreadable or
    undecodable file is an error naming it."""
    try:
        with open(file, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"image file {file!r} not found") from None
    except OSError as error:
        raise ValueError(f"image file {file!r} cannot be read ({error})") from error
    return decode_image(data, f"image file {file!r}", channels, image_size)


def read_image_files(files: Sequence[str], channels: int = 3,
                     image_size: Optional[int] = None, threads: int = 8) -> np.ndarray:
    """Many image files, in order, as one ``[files, H, W, channels]`` uint8 array (decoded
    in threads: TensorFlow's decoders release the GIL). Images of different sizes need
    ``image_size``."""
    if image_size is not None and files:
        check_memory(len(files), image_size, channels, f"{len(files)} image files such as "
                     f"{files[0]!r}")
    with concurrent.futures.ThreadPoolExecutor(max(1, int(threads))) as pool:
        images = list(pool.map(lambda f: read_image_file(f, channels, image_size), files))
    return stack_images(images, files)


def stack_images(images: Sequence[np.ndarray], names: Sequence[str]) -> np.ndarray:
    """``[n, H, W, C]`` from equally sized images; one of another size is named."""
    if not images:
        raise ValueError("no images")
    shape = images[0].shape
    for image, name in zip(images, names):
        if image.shape != shape:
            raise ValueError(f"{name!r} is {image.shape[1]}x{image.shape[0]} pixels, "
                             f"{names[0]!r} {shape[1]}x{shape[0]}; give image_size= to "
                             "resize them all to one size")
    return np.stack(images)


def preprocessing(dataset: str, image_size: Optional[int], channels: int,
                  stats: Optional[Dict[str, Any]] = None, **more) -> Dict[str, Any]:
    """The ``LabelledImages.preprocessing`` record of an RGB benchmark: uint8 in
    [0, 255], and the mean and std the sampler normalises with (images in [0, 1])."""
    record: Dict[str, Any] = {"dataset": dataset, "image_size": image_size,
                              "channels": channels, "range": (0, 255)}
    if stats is not None:
        record.update(mean=tuple(stats["mean"]), std=tuple(stats["std"]))
    record.update(more)
    return record


def is_image_file(name: str, extensions: Sequence[str] = IMAGE_EXTENSIONS) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in extensions
