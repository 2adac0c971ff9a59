"""Data folders the loaders refuse, naming what is wrong: a dangling symlink in an
image-folder class, and mini-ImageNet splits that share an image or classes that share
image indices (the loaders' one validation of splits)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf


# --- a dangling symlink in an image-folder class ----------------------------------


def _image_folder(root, classes=3, per_class=3):
    rng = np.random.default_rng(0)
    for c in range(classes):
        os.makedirs(os.path.join(root, f"class{c}"))
        for i in range(per_class):
            with open(os.path.join(root, f"class{c}", f"{i:03d}.png"), "wb") as f:
                f.write(tf.io.encode_png(rng.integers(0, 256, (6, 6, 3), np.uint8)).numpy())


def test_a_dangling_symlink_in_an_image_folder_class_is_named(tmp_path):
    from metalearn.tasks.datasets import clear_caches, load_image_folder
    root = str(tmp_path / "images")
    _image_folder(root)
    link = os.path.join(root, "class1", "003.png")
    os.symlink(os.path.join(str(tmp_path), "moved_away.png"), link)
    clear_caches()
    with pytest.raises(FileNotFoundError, match="dangling symbolic link") as info:
        load_image_folder(root, image_size=6, split_fractions=(0.34, 0.33, 0.33))
    assert link in str(info.value) and "moved_away.png" in str(info.value)


# --- mini-ImageNet splits that share images ----------------------------------


@pytest.fixture
def _fresh_mini_imagenet():
    from metalearn.tasks.datasets import clear_caches
    clear_caches()
    yield
    clear_caches()


def test_a_mini_imagenet_test_image_also_listed_in_train_csv_is_refused(
        tmp_path, _fresh_mini_imagenet):
    from metalearn.tasks.datasets import load_mini_imagenet
    from tests import benchmark_fixtures as fixtures
    classes = fixtures.write_mini_imagenet_csv(str(tmp_path), per_class=2, size=8)
    leaked = f"{classes['test'][0]}00000001.jpg"  # a test image, labelled a train class
    with open(tmp_path / "train.csv", "a") as f:
        f.write(f"{leaked},{classes['train'][0]}\n")
    with pytest.raises(ValueError, match="is in both") as info:
        load_mini_imagenet(str(tmp_path), image_size=8, cache_dir=str(tmp_path / "cache"))
    message = str(info.value)
    assert leaked in message and "train.csv" in message and "test.csv" in message, message
    assert not list((tmp_path / "cache").glob("*.npz"))  # nothing cached from it


def test_two_mini_imagenet_classes_holding_the_same_images_are_refused(
        tmp_path, _fresh_mini_imagenet):
    import pickle
    from metalearn.tasks.datasets import load_mini_imagenet
    from tests import benchmark_fixtures as fixtures
    classes = fixtures.write_mini_imagenet_pickles(str(tmp_path), per_class=2)
    file = tmp_path / "mini-imagenet-cache-val.pkl"
    with open(file, "rb") as f:
        cache = pickle.load(f)
    first, second = classes["validation"][0], classes["validation"][3]
    cache["class_dict"][second] = list(cache["class_dict"][first])
    with open(file, "wb") as f:
        pickle.dump(cache, f, protocol=4)
    with pytest.raises(ValueError, match="both") as info:
        load_mini_imagenet(str(tmp_path), image_size=84)
    message = str(info.value)
    assert first in message and second in message and str(file) in message, message
