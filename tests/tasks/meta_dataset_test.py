"""Meta-Dataset: the converted records (dataset_spec.json + <class id>.tfrecords, written
by tests/benchmark_fixtures.py in the exact format) and the variable-way, variable-shot
episodes, padded to one shape."""

import json
import os
import shutil
import struct

import numpy as np
import pytest
import tensorflow as tf

from metalearn.tasks import MetaDataset
from metalearn.tasks.datasets import load_meta_dataset_source
from tests import benchmark_fixtures as fixtures

# Its tests share a module-scoped fixture: one worker runs them (tests/conftest.py).
pytestmark = pytest.mark.xdist_group(__name__)

SOURCES = ("ilsvrc_2012", "omniglot", "aircraft")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("meta_dataset")
    fixtures.write_meta_dataset(str(folder))
    return str(folder)


def sampler(root, **kwargs):
    options = dict(train_sources=SOURCES, validation_sources=SOURCES, test_sources=SOURCES,
                   min_ways=3, max_ways=5, max_query=2, max_support_set_size=12,
                   image_size=8)
    options.update(kwargs)
    return MetaDataset(root, **options)


def test_specs_give_the_canonical_class_splits(root):
    expected = fixtures.write_meta_dataset(os.path.join(root, "again"))
    for name, counts in expected.items():
        spec = load_meta_dataset_source(os.path.join(root, name))
        assert {s: len(ids) for s, ids in spec.splits.items()} == counts, name
        every = [c for ids in spec.splits.values() for c in ids]
        assert sorted(every) == list(range(len(spec.class_names))), "a class in two splits"
    omniglot = load_meta_dataset_source(os.path.join(root, "omniglot"))
    assert omniglot.superclass_names == {"train": ["Alphabet_0", "Alphabet_1"],
                                         "validation": ["Alphabet_2"], "test": ["Alphabet_3"]}
    ilsvrc = load_meta_dataset_source(os.path.join(root, "ilsvrc_2012"))
    assert sorted(len(n) for n in ilsvrc.nodes["train"]) == [5, 6, 11]  # inner nodes' leaves
    assert set(ilsvrc.nodes["test"][0]) == set(ilsvrc.splits["test"])


def test_episode_composition_follows_the_protocol(root):
    md = sampler(root)
    for split in ("train", "validation", "test"):
        for seed in range(30):
            name, classes, shots, queries = md.describe(np.random.default_rng(seed), split)
            spec = md.source(name)
            assert set(classes) <= set(spec.splits[split])
            assert 3 <= len(classes) <= 5 and len(set(classes)) == len(classes)
            images = np.array([spec.images_per_class[c] for c in classes])
            assert queries == min(2, (images // 2).min())
            assert (shots >= 1).all() and (shots + queries <= images).all()
            assert shots.sum() <= 12
            if name == "omniglot":  # one alphabet per episode
                assert any(set(classes) <= set(a) for a in spec.superclasses[split])
            if name == "ilsvrc_2012":  # the leaves below one node of the DAG
                assert any(set(classes) <= set(n) for n in spec.nodes[split])


def test_padded_episodes_shapes_labels_and_determinism(root):
    md = sampler(root)
    for split in ("train", "validation", "test"):
        batch = md.sample(tf.constant([3, 1], tf.int64), 3, split)
        assert batch.support_x.shape == (3, 12, 8, 8, 3)
        assert batch.query_x.shape == (3, 10, 8, 8, 3)
        support, query = batch.support_y, batch.query_y
        for t in range(3):
            ways = int(support.classes[t].numpy().sum())
            assert 3 <= ways <= 5
            labels = support.labels[t].numpy()[support.mask[t].numpy()]
            np.testing.assert_array_equal(np.unique(labels), np.arange(ways))
            q = query.labels[t].numpy()[query.mask[t].numpy()]
            np.testing.assert_array_equal(np.bincount(q), [np.bincount(q)[0]] * ways)
            pad = ~support.mask[t].numpy()
            assert (support.labels[t].numpy()[pad] == -1).all()
            assert not batch.support_x[t].numpy()[pad].any()          # zeros where padded
            real = batch.support_x[t].numpy()[~pad]
            assert -1.0 <= real.min() < real.max() <= 1.0
    again = md.sample(tf.constant([3, 1], tf.int64), 3, split)
    np.testing.assert_array_equal(batch.support_x.numpy(), again.support_x.numpy())
    other = md.sample(tf.constant([4, 1], tf.int64), 3, split)
    assert not np.array_equal(batch.support_y.labels.numpy(), other.support_y.labels.numpy())


def test_stream_resumes_exactly(root):
    md = sampler(root)
    full = list(md.dataset(1, seed=5, num_steps=3))
    resumed = list(md.dataset(1, seed=5, start_step=2, num_steps=1))
    np.testing.assert_array_equal(full[2].query_x.numpy(), resumed[0].query_x.numpy())
    np.testing.assert_array_equal(full[2].support_y.labels.numpy(),
                                  resumed[0].support_y.labels.numpy())


def test_protocols_and_options_are_checked(root):
    assert MetaDataset(root).sources["test"][-2:] == ("traffic_sign", "mscoco")
    assert "vgg_flower" not in MetaDataset(root, protocol="v2").sources["train"]
    with pytest.raises(ValueError, match="protocol must be one of"):
        MetaDataset(root, protocol="v3")
    with pytest.raises(ValueError, match="max_support_set_size \\(4\\) must be >= max_ways"):
        sampler(root, max_support_set_size=4)
    with pytest.raises(ValueError, match="superclass 'Alphabet_0' has fewer than "
                                         "min_ways=6"):
        sampler(root, min_ways=6, max_ways=6).dataset(1)
    with pytest.raises(FileNotFoundError, match="source folder .*ilsvrc_2012"):
        MetaDataset(root).dataset(1)  # v1 sources not converted: quickdraw, ...


def _copy(root, tmp_path, name="aircraft"):
    folder = tmp_path / "records"
    shutil.copytree(os.path.join(root, name), folder / name)
    return str(folder), folder / name


def _draw_all(root):
    md = sampler(root, train_sources=("aircraft",))
    sample = tf.function(lambda seed: md.sample(seed, 2, "train"))
    for seed in range(6):  # every class of the split is read at least once
        sample(tf.constant([seed, 0], tf.int64))


def test_missing_class_file_is_named(root, tmp_path):
    folder, source = _copy(root, tmp_path)
    os.remove(source / "2.tfrecords")
    with pytest.raises(FileNotFoundError, match="class file of class 2 .*2.tfrecords' not "
                                                "found"):
        sampler(folder, train_sources=("aircraft",)).dataset(1)


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:-7], "is damaged: record 2 at byte .* past the end of the file"),
    (lambda b: b[:12] + b"\xff" * struct.unpack("<Q", b[:8])[0] +
     b[12 + struct.unpack("<Q", b[:8])[0]:], "is damaged: record 0 is not a tf.train.Example"),
])
def test_damaged_class_file_is_named(root, tmp_path, damage, message):
    folder, source = _copy(root, tmp_path)
    data = (source / "0.tfrecords").read_bytes()
    (source / "0.tfrecords").write_bytes(damage(data))
    with pytest.raises(Exception, match="0.tfrecords' " + message):
        _draw_all(folder)


def test_wrong_record_count_is_named(root, tmp_path):
    folder, source = _copy(root, tmp_path)
    spec = json.loads((source / "dataset_spec.json").read_text())
    spec["images_per_class"]["1"] += 1
    (source / "dataset_spec.json").write_text(json.dumps(spec))
    with pytest.raises(Exception, match="1.tfrecords' holds 4 records; dataset_spec.json "
                                        "says class 1 has 5 images"):
        _draw_all(folder)


def test_missing_or_damaged_spec_is_named(root, tmp_path):
    folder, source = _copy(root, tmp_path)
    (source / "dataset_spec.json").write_text("{not json")
    with pytest.raises(ValueError, match="dataset_spec.json' is damaged: not JSON"):
        load_meta_dataset_source(str(source))
    os.remove(source / "dataset_spec.json")
    with pytest.raises(FileNotFoundError, match="Meta-Dataset spec .*dataset_spec.json' "
                                                "not found"):
        load_meta_dataset_source(str(source))
