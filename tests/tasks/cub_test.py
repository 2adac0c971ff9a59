"""CUB-200-2011 from the archive's folder, with Chen et al.'s 100/50/50 split."""

import os

import numpy as np
import pytest

from metalearn.tasks.datasets import clear_caches, load_cub
from tests import benchmark_fixtures as fixtures


pytestmark = pytest.mark.usefixtures("fresh_data_caches")


def test_chen_s_split(tmp_path):
    base = fixtures.write_cub(str(tmp_path), per_class=2)
    splits = load_cub(str(tmp_path))  # the folder holding CUB_200_2011/ works too
    assert load_cub(base)["train"] is not None
    fixtures.check_splits(splits, {"train": 100, "validation": 50, "test": 50}, (84, 84, 3))
    names = fixtures.cub_class_names()
    assert splits["train"].class_names == tuple(names[0::2])
    assert splits["validation"].class_names == tuple(names[1::4])
    assert splits["test"].class_names == tuple(names[3::4])
    assert np.all(np.bincount(splits["test"].labels) == 2)
    fixtures.check_episodes(splits)


def test_bad_archive_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="CUB-200-2011 folder '/no/such'"):
        load_cub("/no/such")
    base = fixtures.write_cub(str(tmp_path), per_class=1)
    labels = os.path.join(base, "image_class_labels.txt")
    with open(labels, "a") as f:
        f.write("oops\n")
    with pytest.raises(ValueError, match=f"'{labels}', line 201: expected '<id> <value>'"):
        load_cub(base)
    with open(labels) as f:
        lines = f.read().splitlines()[:-1]
    with open(labels, "w") as f:
        f.write("\n".join(lines) + "\n")
    image = os.path.join(base, "images", "004.Bird_004", "Bird_004_0000_4.jpg")
    with open(image, "wb") as f:
        f.write(b"\xff\xd8\xff not a jpeg")
    with pytest.raises(ValueError, match=f"'{image}' is not a decodable image"):
        load_cub(base)
    os.remove(image)
    with pytest.raises(FileNotFoundError, match=f"image file '{image}' listed in"):
        load_cub(base)


def test_decoded_arrays_cache_round_trip(tmp_path):
    base = fixtures.write_cub(str(tmp_path / "data"), per_class=1)
    first = load_cub(base, image_size=16, cache_dir=str(tmp_path / "cache"))
    clear_caches()
    second = load_cub(base, image_size=16, cache_dir=str(tmp_path / "cache"))
    for split in first:
        np.testing.assert_array_equal(first[split].images, second[split].images)
        assert first[split].class_names == second[split].class_names
