"""CIFAR-FS and FC100 from TFDS's cifar100 (mocked with TFDS's own testing utilities)."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from metalearn.tasks.datasets import clear_caches, cifar, load_cifar_fs, load_fc100
from tests import benchmark_fixtures as fixtures


@pytest.fixture
def mocked_cifar100():
    """TFDS's cifar100 as ``tfds.testing.mock_data`` serves it: 3 training and 1 test
    image per class (TFDS: 500 and 100)."""
    clear_caches()
    served = {"train": fixtures.cifar100_examples("train", 3),
              "test": fixtures.cifar100_examples("test", 1)}
    asked = []

    def as_dataset(self, split, *args, **kwargs):
        assert self.name == "cifar100", self.name
        asked.append(str(split))
        return tf.data.Dataset.from_tensor_slices(served[str(split)])

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        yield served, asked
    clear_caches()


def test_published_class_lists_partition_cifar100():
    for split_lists, sizes in ((cifar.CIFAR_FS_SPLIT, (64, 16, 20)),
                               (cifar.FC100_SPLIT, (12, 4, 4))):
        every = [n for names in split_lists.values() for n in names]
        assert tuple(len(split_lists[s]) for s in ("train", "validation", "test")) == sizes
        assert len(set(every)) == len(every)
    assert sorted(n for v in cifar.CIFAR_FS_SPLIT.values() for n in v) == \
        sorted(cifar.CIFAR100_LABELS)
    assert sorted(n for v in cifar.FC100_SPLIT.values() for n in v) == \
        sorted(cifar.CIFAR100_SUPERCLASSES)
    assert list(cifar.CIFAR100_LABELS) == sorted(cifar.CIFAR100_LABELS)  # TFDS label order


def test_cifar_fs(mocked_cifar100):
    served, asked = mocked_cifar100
    splits = load_cifar_fs(data_dir="/nonexistent")
    assert sorted(asked) == ["test", "train"]  # all 600 images of a class: both splits
    fixtures.check_splits(splits, {"train": 64, "validation": 16, "test": 20}, (32, 32, 3))
    for split, names in cifar.CIFAR_FS_SPLIT.items():
        assert splits[split].class_names == names
        assert np.all(np.bincount(splits[split].labels) == 4)
    # the right pixels under the right name
    test = splits["test"]
    label = cifar.CIFAR100_LABELS.index("rocket")
    ours = test.images[test.labels == test.class_names.index("rocket")]
    theirs = np.concatenate([served[s]["image"][served[s]["label"] == label]
                             for s in ("train", "test")])
    assert sorted(map(bytes, ours)) == sorted(map(bytes, theirs))
    assert test.groups[test.class_names.index("rocket")] == "vehicles_2"
    fixtures.check_episodes(splits, ways=5, shots=1, queries=2)


def test_fc100_splits_by_superclass(mocked_cifar100):
    splits = load_fc100(data_dir="/nonexistent")
    fixtures.check_splits(splits, {"train": 60, "validation": 20, "test": 20}, (32, 32, 3))
    for split, supers in cifar.FC100_SPLIT.items():
        assert set(splits[split].groups) == set(supers)
        for name, group in zip(splits[split].class_names, splits[split].groups):
            assert name in fixtures.CIFAR100_SUPERCLASS_MEMBERS[group]
    assert splits["test"].preprocessing["mean"][0] == pytest.approx(129.37731888 / 255)
    fixtures.check_episodes(splits)


def test_one_default_cache_serves_cifar_fs_and_fc100(mocked_cifar100, data_cache):
    served, asked = mocked_cifar100
    first = load_cifar_fs(data_dir="/nonexistent")
    assert len(asked) == 2
    assert [n[:9] for n in os.listdir(data_cache)] == ["cifar100_"]  # the per-user folder
    clear_caches()  # a new process: the decoded arrays from the cache, not from TFDS
    again = load_cifar_fs(data_dir="/nonexistent")
    fc100 = load_fc100(data_dir="/nonexistent")
    assert len(asked) == 2
    for split in first:
        np.testing.assert_array_equal(first[split].images, again[split].images)
        np.testing.assert_array_equal(first[split].labels, again[split].labels)
        assert first[split].groups == again[split].groups
    fixtures.check_splits(fc100, {"train": 60, "validation": 20, "test": 20}, (32, 32, 3))
    clear_caches()
    load_cifar_fs(data_dir="/nonexistent", cache_dir=False)  # turned off: TFDS read
    assert len(asked) == 4
