"""Decoding the images of a data folder (metalearn.tasks.datasets.images): CMYK JPEGs are
decoded, an absurd image size is refused by every loader before any allocation, and
images that would not fit in memory are refused first."""

import io
import os

import numpy as np
import pytest
import tensorflow as tf

from metalearn.tasks import MetaDataset
from metalearn.tasks.datasets import (load_cub, load_image_folder, load_mini_imagenet,
                                      load_omniglot, load_tiered_imagenet)
from metalearn.tasks.datasets import images as image_files


# --- decoders ----------------------------------------------------------------------


def _cmyk_jpeg(path, cmyk) -> None:
    from PIL import Image  # matplotlib's dependency: in the test extras
    buffer = io.BytesIO()
    Image.fromarray(cmyk, "CMYK").save(buffer, "JPEG", quality=95)
    with open(path, "wb") as f:
        f.write(buffer.getvalue())


@pytest.mark.parametrize("channels", [1, 3])
def test_a_cmyk_jpeg_is_decoded(tmp_path, channels):
    cmyk = np.zeros([8, 8, 4], np.uint8)
    cmyk[..., 0], cmyk[..., 3] = 200, 30  # cyan: red low, green and blue high
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        _cmyk_jpeg(tmp_path / name / "0.jpg", cmyk)
        tf.io.write_file(str(tmp_path / name / "1.png"),
                         tf.io.encode_png(np.full([8, 8, 3], 128, np.uint8)))
    data = load_image_folder(str(tmp_path), image_size=8, channels=channels)
    rgb = np.array([48, 225, 225])  # Pillow's own conversion: (49, 225, 225)
    expected = rgb if channels == 3 else [round(rgb @ [0.2989, 0.587, 0.114])]
    np.testing.assert_allclose(data.images[0].reshape(-1, channels).mean(0), expected,
                               atol=3)


@pytest.mark.parametrize("load", [
    lambda p: load_image_folder(str(p), image_size=100_000),
    lambda p: load_cub(str(p), image_size=100_000),
    lambda p: load_mini_imagenet(str(p), image_size=100_000),
    lambda p: load_tiered_imagenet(str(p), image_size=100_000),
    lambda p: load_omniglot(str(p), image_size=100_000),
    lambda p: MetaDataset(str(p), image_size=100_000),
    lambda p: load_image_folder(str(p), image_size=2.5),
], ids=["image_folder", "cub", "mini_imagenet", "tiered_imagenet", "omniglot",
        "meta_dataset", "fractional"])
def test_an_absurd_image_size_is_refused_before_any_allocation(tmp_path, load):
    (tmp_path / "cat").mkdir()
    tf.io.write_file(str(tmp_path / "cat" / "0.png"),
                     tf.io.encode_png(np.zeros([4, 4, 3], np.uint8)))
    (tmp_path / "CUB_200_2011").mkdir()
    with pytest.raises(ValueError, match=f"image_size must be a whole number of pixels "
                       f"from 1 to {image_files.MAX_IMAGE_SIZE}"):
        load(tmp_path)


def test_images_that_would_not_fit_in_memory_are_refused_first(tmp_path, monkeypatch):
    (tmp_path / "cat").mkdir()
    tf.io.write_file(str(tmp_path / "cat" / "0.png"),
                     tf.io.encode_png(np.zeros([4, 4, 3], np.uint8)))
    monkeypatch.setattr(os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096,
                                                     "SC_PHYS_PAGES": 100}[name])
    with pytest.raises(ValueError, match=r"1 images of 512x512x3 need 0\.0 GiB, more than "
                       r"this machine's 0\.0 GiB"):
        load_image_folder(str(tmp_path), image_size=512)
