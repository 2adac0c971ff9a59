"""MNIST loader: the local IDX files, the TFDS path (mocked, no network), clear errors."""

import gzip
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from metalearn.tasks import SupervisedBatches
from metalearn.tasks.datasets import ChecksumError, LabelledImages, load_mnist

TEST_LABEL_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
# The shared t10k-images-idx3-ubyte.gz has another gzip header than the published file
# (tests/tasks/checksums_test.py shows its bytes are otherwise the published ones): read it
# unchecked.
SHARED_UNCHECKED = dict(verify_checksums=False)


def test_local_test_split_shapes_and_label_counts(shared_data):
    data = load_mnist(os.path.join(shared_data, "mnist"), split="test", **SHARED_UNCHECKED)
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
    if compress:  # the published names, other bytes: refused unless unchecked
        with pytest.raises(ChecksumError, match="train-images-idx3-ubyte.gz' is not the pub"):
            load_mnist(str(tmp_path), split="train")
    data = load_mnist(str(tmp_path), split="train", verify_checksums=not compress)
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
        load_mnist(str(tmp_path), verify_checksums=False)


def test_online_path_through_tfds_without_network():
    with tfds.testing.mock_data(num_examples=7, policy=tfds.testing.MockPolicy.USE_CODE):
        data = load_mnist(path=None, split="train")
    assert data.images.shape == (7, 28, 28, 1) and data.images.dtype == np.uint8
    assert data.labels.shape == (7,) and data.labels.max() < 10
    assert data.num_classes == 10


# --- SupervisedBatches: tasks that are batches of a labelled data set -------------------

def _tiny_data(n=40):
    images = np.arange(n, dtype=np.uint8)[:, None, None, None] * np.ones((1, 2, 3, 1), np.uint8)
    return LabelledImages(images, np.arange(n) % 10, [str(d) for d in range(10)])


def test_supervised_batches_shapes_values_and_labels():
    data = _tiny_data()
    sampler = SupervisedBatches(data, batch_size=5, support=3, flatten=True, scale=0.5)
    episodes = sampler.sample(tf.constant([0, 1]), num_tasks=4)
    assert episodes.support_x.shape == (4, 3, 6) and episodes.query_x.shape == (4, 5, 6)
    assert episodes.support_y.shape == (4, 3) and episodes.query_y.dtype == tf.int32
    for x, y in ((episodes.support_x, episodes.support_y), (episodes.query_x, episodes.query_y)):
        index = (x.numpy()[..., 0] / 0.5).astype(int)              # example ids
        np.testing.assert_array_equal(y.numpy(), data.labels[index])
        assert np.all(x.numpy() == x.numpy()[..., :1])
    ids = np.concatenate([episodes.support_x[..., 0], episodes.query_x[..., 0]], axis=1)
    assert all(len(set(row)) == 8 for row in ids.tolist())       # distinct within a task
    again = sampler.sample(tf.constant([0, 1]), num_tasks=4)
    np.testing.assert_array_equal(again.query_x, episodes.query_x)
    other = sampler.sample(tf.constant([0, 2]), num_tasks=4)
    assert not np.array_equal(other.query_x, episodes.query_x)


def test_supervised_batches_splits_are_disjoint():
    sampler = SupervisedBatches(_tiny_data(), batch_size=2, fractions=(0.5, 0.25, 0.25))
    parts = [set(sampler.indices[s].tolist()) for s in ("train", "validation", "test")]
    assert [len(p) for p in parts] == [20, 10, 10] and not (parts[0] & parts[1] | parts[0] & parts[2])
    seen = set()
    for step, batch in enumerate(sampler.dataset(3, split="validation", num_steps=5)):
        seen |= set((batch.query_x.numpy()[..., 0, 0, 0] * 255).round().astype(int).ravel())
    assert seen <= parts[1]


def test_supervised_batches_errors():
    with pytest.raises(ValueError, match="fractions must be .* got \\(0.8, 0.3, 0.0\\)"):
        SupervisedBatches(_tiny_data(), fractions=(0.8, 0.3, 0.0))
    with pytest.raises(ValueError, match="split 'test' has 0 examples"):
        SupervisedBatches(_tiny_data()).sample(tf.constant([0, 0]), 1, split="test")
    with pytest.raises(TypeError, match="data must be LabelledImages"):
        SupervisedBatches(np.zeros((3, 28, 28, 1)))
    with pytest.raises(TypeError, match="returned int, expected LabelledImages"):
        SupervisedBatches(lambda: 3).sample(tf.constant([0, 0]), 1)


def test_supervised_batches_of_mnist(shared_data):
    data = load_mnist(os.path.join(shared_data, "mnist"), **SHARED_UNCHECKED)
    batch = SupervisedBatches(data, batch_size=1, flatten=True).sample(tf.constant([0, 0]), 1)
    assert batch.query_x.shape == (1, 1, 784) and batch.support_x.shape == (1, 0, 784)
    assert 0.0 <= float(tf.reduce_min(batch.query_x)) < float(tf.reduce_max(batch.query_x)) <= 1


def test_supervised_batches_load_lazily():
    calls = []

    def load():
        calls.append(1)
        return _tiny_data()

    sampler = SupervisedBatches(load, batch_size=2)
    assert not calls
    sampler.sample(tf.constant([0, 0]), 1)
    sampler.sample(tf.constant([0, 1]), 1)
    assert len(calls) == 1
