"""The data loaders' caches are keyed on what they were made from: an image, a split file,
a pickle or an archive that changes rebuilds the cache, and a cache kept inside the data
folder is still served."""

import os

import numpy as np
import pytest
import tensorflow as tf

from metalearn.tasks.datasets import (clear_caches, cub, load_cub, load_mini_imagenet,
                                      load_omniglot, load_tiered_imagenet)
from tests import benchmark_fixtures as fixtures


# --- data caches: keyed on what they were made from --------------------------------


def _rewrite_jpeg(file, value):
    image = np.full(tf.io.decode_jpeg(open(file, "rb").read()).shape, value, np.uint8)
    with open(file, "wb") as f:
        f.write(tf.io.encode_jpeg(image, quality=95).numpy())


def test_cub_cache_is_rebuilt_when_an_image_changes(tmp_path, monkeypatch):
    base = fixtures.write_cub(str(tmp_path / "data"), per_class=1)
    cache = str(tmp_path / "cache")
    first = load_cub(base, image_size=16, cache_dir=cache)
    image = os.path.join(base, "images", sorted(os.listdir(os.path.join(base, "images")))[0])
    image = os.path.join(image, os.listdir(image)[0])
    _rewrite_jpeg(image, 7)
    again = load_cub(base, image_size=16, cache_dir=cache)  # the in-memory cache
    clear_caches()  # a new process: only the files
    fresh = load_cub(base, image_size=16, cache_dir=cache)
    for second in (again, fresh):
        assert not np.array_equal(first["train"].images[0], second["train"].images[0])
        assert np.abs(second["train"].images[0].astype(int) - 7).max() <= 2
    assert len(list((tmp_path / "cache").glob("cub_*.npz"))) == 3  # rewritten, not added


def test_mini_imagenet_cache_is_rebuilt_when_a_split_file_changes(tmp_path, monkeypatch):
    data = str(tmp_path / "data")
    fixtures.write_mini_imagenet_csv(data, per_class=2, size=16)
    cache = str(tmp_path / "cache")
    first = load_mini_imagenet(data, image_size=16, cache_dir=cache)
    lines = open(os.path.join(data, "test.csv")).read().splitlines()
    # an image of the first test class and one of the second trade classes: other data,
    # the same file size, and still each image in one class
    (a, label_a), (b, label_b) = lines[1].split(","), lines[3].split(",")
    assert label_a != label_b
    lines[1], lines[3] = f"{a},{label_b}", f"{b},{label_a}"
    with open(os.path.join(data, "test.csv"), "w") as f:
        f.write("\n".join(lines) + "\n")
    os.utime(os.path.join(data, "test.csv"), ns=(1, 1))  # and a new time
    clear_caches()
    second = load_mini_imagenet(data, image_size=16, cache_dir=cache)
    assert not np.array_equal(first["test"].images, second["test"].images)
    np.testing.assert_array_equal(first["train"].images, second["train"].images)


def test_tiered_imagenet_cache_is_rebuilt_when_the_pickles_change(tmp_path, monkeypatch):
    data = str(tmp_path / "data")
    fixtures.write_tiered_imagenet(data, per_class=2)
    cache = str(tmp_path / "cache")
    first = load_tiered_imagenet(data, cache_dir=cache, strict=False)
    other = str(tmp_path / "other")
    fixtures.write_tiered_imagenet(other, per_class=1)
    for name in os.listdir(other):
        os.replace(os.path.join(other, name), os.path.join(data, name))
    clear_caches()
    second = load_tiered_imagenet(data, cache_dir=cache, strict=False)
    assert len(second["train"].images) == len(first["train"].images) // 2


def test_omniglot_cache_is_rebuilt_when_an_archive_changes(tmp_path, monkeypatch):
    import zipfile
    folder = tmp_path / "omniglot"
    folder.mkdir()

    def archive(value):
        png = tf.io.encode_png(np.full([4, 4, 1], value, np.uint8)).numpy()
        with zipfile.ZipFile(folder / "images_background_small1.zip", "w") as zf:
            for k in range(2):
                zf.writestr(f"images_background_small1/Greek/character01/0101_0{k}.png", png)

    options = dict(archives=("images_background_small1",), image_size=None,
                   verify_checksums=False, cache_dir=str(tmp_path / "cache"))
    archive(0)
    first = load_omniglot(str(folder), **options)
    archive(255)
    os.utime(folder / "images_background_small1.zip", ns=(1, 1))
    clear_caches()
    second = load_omniglot(str(folder), **options)
    assert first.images.max() == 1.0 and second.images.max() == 0.0  # inverted


def test_a_cache_inside_the_data_folder_is_still_served(tmp_path, monkeypatch):
    base = fixtures.write_cub(str(tmp_path / "data"), per_class=1)
    cache = os.path.join(base, "images", ".cache")  # a hidden folder among the sources
    load_cub(base, image_size=16, cache_dir=cache)
    clear_caches()
    monkeypatch.setattr(cub.image_files, "read_image_files",
                        lambda *a, **k: pytest.fail("decoded again"))
    load_cub(base, image_size=16, cache_dir=cache)
