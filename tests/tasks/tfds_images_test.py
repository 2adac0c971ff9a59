"""Any TFDS image-classification data set as few-shot data (TFDSImages), offline: real
builders (cifar100, omniglot, oxford_flowers102) under ``tfds.testing.mock_data``, their
own features and class labels, examples served by the mock or by the test."""

import os
import re

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from metalearn.tasks import FewShotClassification
from metalearn.tasks.datasets import TFDSImages, load_cifar_fs, split_class_names
from metalearn.tasks.datasets import cifar
from metalearn.tasks.datasets.images import resize_uint8
from metalearn.tasks.datasets.tfds_images import permute_rows, split_names_of
from tests import benchmark_fixtures as fixtures

pytestmark = pytest.mark.usefixtures("fresh_data_caches")


def serving(served, asked):
    """An ``as_dataset_fn`` for ``tfds.testing.mock_data`` that serves ``served[split]``
    (a dict of arrays; ``a+b`` is both, in order) and records the splits asked for."""
    def as_dataset(self, split, *args, **kwargs):
        asked.append((self.name, str(split)))
        parts = [served[s] for s in str(split).split("+")]
        return tf.data.Dataset.from_tensor_slices(
            {k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
    return as_dataset


def omniglot_examples(characters: int = 6, drawers: int = 3):
    """What TFDS's omniglot builder yields: 105x105x3 uint8 drawings (grey as RGB),
    ``label`` (the character), ``alphabet`` and ``alphabet_char_id``, shuffled."""
    rng = np.random.default_rng(3)
    rows = [(c, d) for c in range(characters) for d in range(drawers)]
    order = rng.permutation(len(rows))
    grey = rng.integers(0, 256, (len(rows), 105, 105, 1), dtype=np.uint8)
    return {"image": np.repeat(grey[order], 3, axis=-1),
            "label": np.array([rows[k][0] for k in order], np.int64),
            "alphabet": np.zeros(len(rows), np.int64),
            "alphabet_char_id": np.array([rows[k][0] for k in order], np.int64)}


def test_cifar100_read_as_cifar_fs_gives_load_cifar_fs_arrays():
    """The CIFAR-FS class lists, given as class ids to TFDSImages over TFDS's
    train+test splits, are load_cifar_fs's splits, pixel for pixel."""
    served = {"train": fixtures.cifar100_examples("train", 3),
              "test": fixtures.cifar100_examples("test", 1)}
    asked = []
    ids = {s: [cifar.CIFAR100_LABELS.index(n) for n in names]
           for s, names in cifar.CIFAR_FS_SPLIT.items()}
    with tfds.testing.mock_data(as_dataset_fn=serving(served, asked)):
        ours = TFDSImages("cifar100", split="train+test", data_dir="/nonexistent", **ids)()
        theirs = load_cifar_fs(data_dir="/nonexistent")
    assert ("cifar100", "train+test") in asked
    fixtures.check_splits(ours, {"train": 64, "validation": 16, "test": 20}, (32, 32, 3))
    for split in ("train", "validation", "test"):
        np.testing.assert_array_equal(ours[split].images, theirs[split].images)
        np.testing.assert_array_equal(ours[split].labels, theirs[split].labels)
        assert ours[split].class_names == tuple(str(i) for i in ids[split])
    assert ours["test"].preprocessing["tfds_split"] == "train+test"
    fixtures.check_episodes(ours, ways=5, shots=2, queries=2)


def test_class_ranges_and_sizes_in_label_order():
    served = {"train": fixtures.cifar100_examples("train", 2)}
    with tfds.testing.mock_data(as_dataset_fn=serving(served, [])):
        data = TFDSImages("cifar100", split_sizes=(64, 16), split_seed=None,
                          data_dir="/nonexistent")
        assert data.class_names == {"train": tuple(map(str, range(64))),
                                    "validation": tuple(map(str, range(64, 80))),
                                    "test": tuple(map(str, range(80, 100)))}
        splits = data()
    for split, first in (("train", 0), ("validation", 64), ("test", 80)):
        part = splits[split]
        assert part.images.shape == (2 * part.num_classes, 32, 32, 3)
        # class-major: the two images of the part's class 0 are those of label `first`
        want = served["train"]["image"][served["train"]["label"] == first]
        np.testing.assert_array_equal(part.images[part.labels == 0], want)


def test_omniglot_grey_resized_split_by_name():
    served = {"train": omniglot_examples()}
    with tfds.testing.mock_data(as_dataset_fn=serving(served, [])):
        splits = TFDSImages("omniglot", image_size=28, channels=1,
                            train=["0", "1", "2"], validation=["3"], test=[4, 5],
                            data_dir="/nonexistent")()
    assert {s: d.class_names for s, d in splits.items()} == {
        "train": ("0", "1", "2"), "validation": ("3",), "test": ("4", "5")}
    test = splits["test"]
    assert test.images.shape == (6, 28, 28, 1) and test.images.dtype == np.uint8
    raw = served["train"]["image"][served["train"]["label"] == 5][..., :1]
    np.testing.assert_array_equal(test.images[test.labels == 1],
                                  resize_uint8(raw, 28).numpy())
    assert test.preprocessing["image_size"] == 28 and test.preprocessing["channels"] == 1
    episodes = FewShotClassification(splits, ways=2, shots=1, queries=2).sample(
        tf.constant([0, 0], tf.int64), 3, "test")
    assert episodes.support_x.shape == (3, 2, 28, 28, 1)
    assert episodes.query_y.numpy().tolist() == [[0, 0, 1, 1]] * 3


def test_flowers_of_varying_sizes_from_tfds_mock_data():
    """TFDS's own random examples (oxford_flowers102: images of random sizes, random
    labels of its 102 named classes): resized, split by seeded fractions of the class
    names (the same split as split_class_names'), episodes from the object itself."""
    with tfds.testing.mock_data(num_examples=300):
        data = TFDSImages("oxford_flowers102", image_size=12, split_fractions=(0.5, 0.2, 0.3),
                          split_seed=4, min_examples=3, data_dir="/nonexistent")
        names = tuple(tfds.builder("oxford_flowers102").info.features["label"].names)
        assert names[0] == "pink primrose"
        assert data.class_names == split_class_names(names, fractions=(0.5, 0.2, 0.3),
                                                     seed=4, keep_order=True)
        other = TFDSImages("oxford_flowers102", image_size=12, split_fractions=(0.5, 0.2, 0.3),
                           split_seed=5, data_dir="/nonexistent")
        assert other.class_names["test"] != data.class_names["test"]
        sampler = FewShotClassification(data, ways=4, shots=1, queries=2)
        episodes = sampler.sample(tf.constant([1, 2], tf.int64), 2, "validation")
        splits = data()
    assert episodes.support_x.shape == (2, 4, 12, 12, 3)
    assert episodes.query_y.numpy().tolist() == [[0, 0, 1, 1, 2, 2, 3, 3]] * 2
    kept = [n for d in splits.values() for n in d.class_names]
    assert len(kept) == len(set(kept)) > 10
    for split, part in splits.items():
        assert set(part.class_names) <= set(data.class_names[split])
        assert np.bincount(part.labels).min() >= 3  # classes under min_examples left out
        assert part.images.shape[1:] == (12, 12, 3)
    assert sum(len(p.labels) for p in splits.values()) < 300


def test_cached_in_memory_and_on_disk(tmp_path):
    served = {"train": omniglot_examples(characters=3, drawers=2)}
    asked = []
    with tfds.testing.mock_data(as_dataset_fn=serving(served, asked)):
        make = lambda: TFDSImages("omniglot", image_size=8, cache_dir=str(tmp_path),
                                  data_dir="/nonexistent")
        first = make()()
        assert make()() is first and len(asked) == 1  # the process's cache
        assert len(list(tmp_path.glob("tfds_omniglot_*_all.npz"))) == 1
        from metalearn.tasks.datasets import clear_caches
        clear_caches()
        again = make()()  # a new process: from cache_dir, no TFDS read
    assert len(asked) == 1
    assert first.class_names == again.class_names == ("0", "1", "2")
    np.testing.assert_array_equal(first.images, again.images)
    np.testing.assert_array_equal(first.labels, [0, 0, 1, 1, 2, 2])


def test_kept_in_the_default_cache_folder_unless_turned_off(data_cache):
    from metalearn.tasks.datasets import clear_caches
    served = {"train": omniglot_examples(characters=3, drawers=2)}
    asked = []
    with tfds.testing.mock_data(as_dataset_fn=serving(served, asked)):
        make = lambda **more: TFDSImages("omniglot", image_size=8,
                                         data_dir="/nonexistent", **more)
        first = make()()
        assert [n[:14] for n in os.listdir(data_cache)] == ["tfds_omniglot_"]
        clear_caches()
        again = make()()  # a new process: from the per-user folder, no TFDS read
        assert len(asked) == 1
        clear_caches()
        make(cache_dir=False)()
        assert len(asked) == 2
    np.testing.assert_array_equal(first.images, again.images)
    with pytest.raises(TypeError, match="cache_dir must be a folder"):
        make(cache_dir=1)


def test_examples_of_unknown_count_read_as_those_of_a_known_one():
    """A dataset whose cardinality TFDS does not know (no preallocated array) gives
    the same arrays."""
    served = {"train": omniglot_examples(characters=4, drawers=2)}
    known = serving(served, [])

    def unknown(self, split, *args, **kwargs):
        dataset = known(self, split)
        return dataset.filter(lambda example: True)  # cardinality unknown

    read = {}
    for name, as_dataset in (("known", known), ("unknown", unknown)):
        with tfds.testing.mock_data(as_dataset_fn=as_dataset):
            read[name] = TFDSImages("omniglot", image_size=8, data_dir="/nonexistent",
                                    min_examples=1 + (name == "unknown"))()
    np.testing.assert_array_equal(read["known"].images, read["unknown"].images)
    np.testing.assert_array_equal(read["known"].labels, [0, 0, 1, 1, 2, 2, 3, 3])


def test_too_few_classes_for_the_ways_named_before_reading():
    asked = []
    with tfds.testing.mock_data(as_dataset_fn=serving({}, asked)):
        data = TFDSImages("cifar100", train=list(range(10)), test=[10, 11],
                          data_dir="/nonexistent")
        sampler = FewShotClassification(data, ways=3)
        with pytest.raises(ValueError, match="ways=3 is more than the 2 classes the "
                           "'test' split has in all"):
            sampler.dataset(2, split="test")
        unsplit = FewShotClassification(TFDSImages("mnist", data_dir="/nonexistent"),
                                        ways=5, split_fractions=(0.8, 0.0, 0.2))
        with pytest.raises(ValueError, match="ways=5 is more than the 2 classes"):
            unsplit.sample(tf.constant([0, 0], tf.int64), 1, "test")
    assert asked == []


def test_split_specs_and_in_place_permutation():
    assert split_names_of("train[:50%]+test") == ("train", "test")
    with pytest.raises(ValueError, match=re.escape("split='train[' is not a TFDS split spec")):
        split_names_of("train[")
    array = np.arange(60, dtype=np.uint8).reshape(20, 3)
    order = np.random.default_rng(0).permutation(20)
    expected = array[order]
    data = array.ctypes.data
    permute_rows(array, order)
    np.testing.assert_array_equal(array, expected)
    assert array.ctypes.data == data  # the same memory


def test_flowers_experiment_reads_its_episodes_from_tfds(tmp_path):
    """experiments/oxford_flowers102/protonets_5way_1shot.gin with budgets/smoke.gin
    (built in tests/training/train_test.py) gives its sampler's episodes from served
    examples of TFDS's oxford_flowers102 (3 of 20x20 pixels for each of its 102 classes,
    one in each TFDS split), resized to the smoke budget's 16 pixels, the model's input."""
    import gin

    from metalearn.training import build_experiment, parse_config
    rng = np.random.default_rng(0)
    served = {split: {"image": rng.integers(0, 256, (102, 20, 20, 3), dtype=np.uint8),
                      "label": np.arange(102)} for split in ("train", "validation", "test")}
    asked = []
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    files = [os.path.join(root, "experiments", "oxford_flowers102",
                          "protonets_5way_1shot.gin"),
             os.path.join(root, "experiments", "budgets", "smoke.gin")]
    try:
        with tfds.testing.mock_data(as_dataset_fn=serving(served, asked)):
            parse_config(files, ["TFDSImages.data_dir = '/nonexistent'"])
            experiment = build_experiment()
            assert asked == []  # built without reading
            sampler = experiment.sampler
            batch = next(iter(sampler.dataset(2, seed=0, split="train")))
            assert [sampler.num_classes(s) for s in ("train", "validation", "test")] == \
                [61, 21, 20]
    finally:
        gin.clear_config()
    assert asked == [("oxford_flowers102", "train+validation+test")]
    assert batch.support_x.shape == (2, 5, 16, 16, 3)
    assert experiment.learner.model.input_shape == (None, 16, 16, 3)
    assert batch.query_y.numpy().tolist() == [[0, 1, 2, 3, 4]] * 2
