"""MNIST loader: the local IDX files, the TFDS path (mocked, no network), clear errors."""

import gzip
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from metalearn.tasks.datasets import LabelledImages, load_mnist

TEST_LABEL_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_local_test_split_shapes_and_label_counts(shared_data):
    data = load_mnist(os.path.join(shared_data, "mnist"), split="test")
    assert isinstance(data, LabelledImages)
    assert data.images.shape == (10000, 28, 28, 1) and data.images.dtype == np.uint8
    assert data.labels.shape == (10000,) and data.labels.dtype == np.int64
    assert np.bincount(data.labels).tolist() == TEST_LABEL_COUNTS
    assert list(data.class_names) == [str(d) for d in range(10)]
    assert data.images.max() == 255 and data.images.min() == 0
    # Digits are drawn near the centre: the border is (almost) empty, the middle is not.
    assert data.images[:, :2].mean() < 1 and data.images[:, 10:18, 10:18].mean() > 50


def _write_idx(folder, prefix, images, labels, compress=True):
    opener, ext = (gzip.open, ".gz") if compress else (open, "")
    with opener(os.path.join(folder, f"{prefix}-images-idx3-ubyte{ext}"), "wb") as f:
        f.write((2051).to_bytes(4, "big") + b"".join(
            int(d).to_bytes(4, "big") for d in images.shape) + images.tobytes())
    with opener(os.path.join(folder, f"{prefix}-labels-idx1-ubyte{ext}"), "wb") as f:
        f.write((2049).to_bytes(4, "big") + len(labels).to_bytes(4, "big") + labels.tobytes())


@pytest.mark.parametrize("compress", [True, False])
def test_train_split_read_when_present(tmp_path, compress):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5], np.uint8)
    _write_idx(str(tmp_path), "train", images, labels, compress)
    data = load_mnist(str(tmp_path), split="train")
    np.testing.assert_array_equal(data.images[..., 0], images)
    np.testing.assert_array_equal(data.labels, labels)


def test_missing_files_name_the_path(tmp_path, shared_data):
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte.gz") as error:
        load_mnist(os.path.join(shared_data, "mnist"), split="train")  # only t10k there
    assert "t10k-images-idx3-ubyte.gz" in str(error.value)  # what the folder holds
    missing = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_mnist(missing)


def test_bad_split_and_bad_file(tmp_path):
    with pytest.raises(ValueError, match="split must be one of .* got 'validation'"):
        load_mnist(str(tmp_path), split="validation")
    _write_idx(str(tmp_path), "t10k", np.zeros((2, 28, 28), np.uint8), np.zeros(2, np.uint8))
    os.replace(tmp_path / "t10k-labels-idx1-ubyte.gz", tmp_path / "t10k-images-idx3-ubyte.gz")
    _write_idx(str(tmp_path), "x", np.zeros((2, 28, 28), np.uint8), np.zeros(2, np.uint8))
    os.replace(tmp_path / "x-labels-idx1-ubyte.gz", tmp_path / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(ValueError, match="magic number 2049, expected 2051"):
        load_mnist(str(tmp_path))


def test_online_path_through_tfds_without_network():
    with tfds.testing.mock_data(num_examples=7, policy=tfds.testing.MockPolicy.USE_CODE):
        data = load_mnist(path=None, split="train")
    assert data.images.shape == (7, 28, 28, 1) and data.images.dtype == np.uint8
    assert data.labels.shape == (7,) and data.labels.max() < 10
    assert data.num_classes == 10
