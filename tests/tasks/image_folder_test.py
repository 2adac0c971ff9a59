"""load_image_folder: any folder with one sub-folder per class, split by lists or fractions."""

import os

import numpy as np
import pytest
import tensorflow as tf

from metalearn.tasks import FewShotClassification
from metalearn.tasks.datasets import load_image_folder


def write_folder(root, classes=6, per_class=4, size=(12, 10), fmt="png", seed=0):
    """``classes`` sub-folders ``class0 ..`` of ``per_class`` distinct RGB images; returns
    the pixels written, by class name."""
    rng = np.random.default_rng(seed)
    written = {}
    for c in range(classes):
        name = f"class{c}"
        os.makedirs(os.path.join(root, name), exist_ok=True)
        written[name] = []
        for i in range(per_class):
            image = rng.integers(0, 256, size + (3,), dtype=np.uint8)
            encode = tf.io.encode_png if fmt == "png" else tf.io.encode_jpeg
            with open(os.path.join(root, name, f"{i:03d}.{fmt}"), "wb") as f:
                f.write(encode(image).numpy())
            written[name].append(image)
    return written


pytestmark = pytest.mark.usefixtures("fresh_data_caches")


def test_classes_are_sub_folders_and_pixels_are_kept(tmp_path):
    written = write_folder(str(tmp_path), classes=3, per_class=2)
    (tmp_path / "class0" / "notes.txt").write_text("not an image")
    (tmp_path / ".hidden").mkdir()
    data = load_image_folder(str(tmp_path), image_size=None)
    assert data.class_names == ("class0", "class1", "class2")
    assert data.images.shape == (6, 12, 10, 3) and data.images.dtype == np.uint8
    np.testing.assert_array_equal(data.labels, [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(data.images[3], written["class1"][1])  # PNG: exact
    small = load_image_folder(str(tmp_path), image_size=8)
    assert small.images.shape == (6, 8, 8, 3)
    grey = load_image_folder(str(tmp_path), image_size=8, channels=1)
    assert grey.images.shape == (6, 8, 8, 1)


def test_split_by_lists_and_by_fractions_is_deterministic(tmp_path):
    write_folder(str(tmp_path), classes=10, per_class=3, fmt="jpg")
    names = [f"class{c}" for c in range(10)]
    splits = load_image_folder(str(tmp_path), image_size=8, train=names[:6],
                               test=names[7:])
    assert splits["train"].class_names == tuple(names[:6])
    assert splits["validation"].num_classes == 0 and splits["test"].num_classes == 3
    np.testing.assert_array_equal(np.unique(splits["test"].labels), [0, 1, 2])
    cut = load_image_folder(str(tmp_path), image_size=8, split_fractions=(0.6, 0.2, 0.2),
                            split_seed=3)
    again = load_image_folder(str(tmp_path), image_size=8, split_fractions=(0.6, 0.2, 0.2),
                              split_seed=3)
    other = load_image_folder(str(tmp_path), image_size=8, split_fractions=(0.6, 0.2, 0.2),
                              split_seed=4)
    assert [cut[s].num_classes for s in ("train", "validation", "test")] == [6, 2, 2]
    every = [n for s in cut.values() for n in s.class_names]
    assert sorted(every) == sorted(names)  # no class in two splits, none lost
    for split in cut:
        assert cut[split].class_names == again[split].class_names
        np.testing.assert_array_equal(cut[split].images, again[split].images)
    assert any(cut[s].class_names != other[s].class_names for s in cut)
    # episodes: labels 0..N-1, shapes, determinism by seed
    sampler = FewShotClassification(cut, ways=2, shots=1, queries=2)
    batch = sampler.sample(tf.constant([5, 0]), 3, "test")
    assert batch.support_x.shape == (3, 2, 8, 8, 3) and batch.query_y.shape == (3, 4)
    assert batch.support_x.dtype == tf.float32 and float(tf.reduce_max(batch.support_x)) <= 1
    np.testing.assert_array_equal(np.sort(batch.support_y.numpy(), axis=1), [[0, 1]] * 3)
    repeat = sampler.sample(tf.constant([5, 0]), 3, "test")
    np.testing.assert_array_equal(batch.query_x.numpy(), repeat.query_x.numpy())


def test_bad_folders_and_splits_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="image folder '/no/such/images'"):
        load_image_folder("/no/such/images")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no class sub-folders"):
        load_image_folder(str(tmp_path / "empty"))
    root = tmp_path / "images"
    write_folder(str(root), classes=2, per_class=2)
    (root / "class_none").mkdir()
    with pytest.raises(ValueError, match=f"class folder '{root / 'class_none'}' holds no "
                                         "image files"):
        load_image_folder(str(root))
    (root / "class_none").rmdir()
    with pytest.raises(ValueError, match=r"unknown class \['cat'\] in the 'train' split"):
        load_image_folder(str(root), train=["cat"])
    with pytest.raises(ValueError, match="'class0' is in both the 'train' and the 'test'"):
        load_image_folder(str(root), train=["class0"], test=["class0", "class1"])
    (root / "class1" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    with pytest.raises(ValueError, match=f"{root / 'class1' / 'broken.jpg'}' is not a "
                                         "decodable image"):
        load_image_folder(str(root))
    (root / "class1" / "broken.jpg").unlink()
    write_folder(str(root), classes=1, per_class=1, size=(5, 5), seed=1)  # class0/000 smaller
    with pytest.raises(ValueError, match="give image_size= to resize them all"):
        load_image_folder(str(root), image_size=None)
