"""Omniglot from the local zips and through TFDS (mocked), preprocessing, ready split."""

import io
import os
import zipfile

import gin
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from metalearn.tasks import FewShotClassification
from metalearn.tasks.datasets import MINIMAL_SPLIT, clear_caches, load_omniglot
from metalearn.tasks.datasets import omniglot
from metalearn.repository import ROOT

SMALL1 = "images_background_small1"
SMALL2 = "images_background_small2"


@pytest.fixture
def omniglot_dir(shared_data):
    return os.path.join(shared_data, "omniglot")


def test_small1_from_the_zip(omniglot_dir):
    data = load_omniglot(omniglot_dir, archives=(SMALL1,))
    assert data.images.shape == (2720, 28, 28, 1) and data.images.dtype == np.float32
    assert data.num_classes == 136 and np.all(np.bincount(data.labels) == 20)
    assert sorted(set(data.groups)) == list(MINIMAL_SPLIT["train"])
    assert data.class_names[0] == "Balinese/character01"
    assert 0.0 <= data.images.min() and data.images.max() <= 1.0
    # Inverted: strokes are 1 on a 0 background, so most of every image is dark.
    assert 0.02 < data.images.mean() < 0.25
    assert data.preprocessing["image_size"] == 28 and data.preprocessing["invert"]
    assert load_omniglot(omniglot_dir, archives=(SMALL1,)) is data  # cached in memory


def test_preprocessing_matches_a_direct_decode(omniglot_dir):
    data = load_omniglot(omniglot_dir, archives=(SMALL1,), image_size=None, invert=False)
    assert data.images.shape[1:] == (105, 105, 1)
    with zipfile.ZipFile(os.path.join(omniglot_dir, SMALL1 + ".zip")) as zf:
        names = sorted(n for n in zf.namelist()
                       if n.startswith(f"{SMALL1}/Greek/character03/") and n.endswith(".png"))
        raw = [tf.io.decode_png(zf.read(n), channels=1).numpy() / 255.0 for n in names]
    label = data.class_names.index("Greek/character03")
    ours = data.images[data.labels == label]
    # The same 20 drawings (any order), pixel for pixel.
    key = lambda im: im.tobytes()
    assert sorted(map(key, ours.astype(np.float32))) == \
        sorted(map(key, np.stack(raw).astype(np.float32)))
    small = omniglot.preprocess(np.stack(raw)[:2], image_size=28, invert=True).numpy()
    assert small.shape == (2, 28, 28, 1)
    white = omniglot.preprocess(np.full((1, 105, 105, 1), 255, np.uint8)).numpy()
    np.testing.assert_allclose(white, 0.0, atol=1e-6)


def test_ready_split_has_no_alphabet_in_common(omniglot_dir):
    data = load_omniglot(omniglot_dir)  # small1 + small2
    # Greek and Latin are in both archives: each character kept once.
    assert len(set(data.class_names)) == data.num_classes == 242
    sampler = FewShotClassification(data, ways=20, split_by="group", **MINIMAL_SPLIT,
                                     rotations=(0, 90, 180, 270), rotation_splits=("train",))
    alphabet = lambda name: name.split("/")[0]
    train = {alphabet(n) for n in sampler.class_names["train"]}
    test = {alphabet(n) for n in sampler.class_names["test"]}
    assert train == set(MINIMAL_SPLIT["train"]) and test == set(MINIMAL_SPLIT["test"])
    assert sampler.num_classes("train") == 4 * 136 and sampler.num_classes("test") == 106
    batch = sampler.sample(tf.constant([0, 0]), 2, "test")
    assert batch.support_x.shape == (2, 20, 28, 28, 1)
    assert sampler.preprocessing["image_size"] == 28


def test_npz_cache_round_trip(omniglot_dir, tmp_path):
    first = load_omniglot(omniglot_dir, archives=(SMALL1,), image_size=14,
                          cache_dir=str(tmp_path))
    assert len(list(tmp_path.glob("omniglot_*.npz"))) == 1
    clear_caches()
    second = load_omniglot(omniglot_dir, archives=(SMALL1,), image_size=14,
                           cache_dir=str(tmp_path))
    np.testing.assert_array_equal(first.images, second.images)
    np.testing.assert_array_equal(first.labels, second.labels)
    assert first.class_names == second.class_names and first.groups == second.groups


def _tfds_examples_from_zip(path, archive, keep):
    """What TFDS's omniglot builder yields for ``archive``, made from the published zip
    the builder downloads: 3-channel PNG decode, alphabet index among the sorted
    alphabets, 0-based character id, global character label from the file name."""
    examples = {"image": [], "alphabet": [], "alphabet_char_id": [], "label": []}
    with zipfile.ZipFile(os.path.join(path, archive + ".zip")) as zf:
        entries = [n for n in zf.namelist() if n.endswith(".png")]
        alphabets = sorted({n.split("/")[1] for n in entries})
        for name in sorted(entries, reverse=True):  # an order unlike the zip's
            _, alphabet, character, file = name.split("/")
            if f"{alphabet}/{character}" not in keep:
                continue
            examples["image"].append(tf.io.decode_png(zf.read(name), channels=3).numpy())
            examples["alphabet"].append(alphabets.index(alphabet))
            examples["alphabet_char_id"].append(int(character[len("character"):]) - 1)
            examples["label"].append(int(file.split("_")[0]) - 1)
    return alphabets, {k: np.stack(v) for k, v in examples.items()}


def test_tfds_path_gives_the_zip_path_images(omniglot_dir):
    keep = {"Greek/character03", "Korean/character11", "Latin/character01"}
    alphabets, examples = _tfds_examples_from_zip(omniglot_dir, SMALL1, keep)

    def as_dataset(self, split, *args, **kwargs):
        assert split == "small1", split
        self.info.features["alphabet"].names = alphabets + [
            f"unused{i}" for i in range(50 - len(alphabets))]
        return tf.data.Dataset.from_tensor_slices(examples)

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        online = load_omniglot(source="tfds", archives=(SMALL1,), data_dir="/nonexistent")
    local = load_omniglot(omniglot_dir, archives=(SMALL1,))
    assert sorted(online.class_names) == sorted(keep)
    assert online.groups == tuple(n.split("/")[0] for n in online.class_names)
    for label, name in enumerate(online.class_names):
        ours = online.images[online.labels == label]
        theirs = local.images[local.labels == local.class_names.index(name)]
        assert ours.shape == (20, 28, 28, 1)
        np.testing.assert_array_equal(ours, theirs)  # same images, same order


def test_wrong_path_and_archive_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="/no/such/folder"):
        load_omniglot("/no/such/folder")
    with pytest.raises(FileNotFoundError, match="images_background_small1.zip"):
        load_omniglot(str(tmp_path), archives=(SMALL1,))
    with pytest.raises(ValueError, match="unknown Omniglot archive 'images_small3'"):
        load_omniglot(str(tmp_path), archives=("images_small3",))
    with pytest.raises(ValueError, match="source must be 'zip' or 'tfds', got 'web'"):
        load_omniglot(str(tmp_path), source="web")


def test_more_ways_than_test_classes_is_named(omniglot_dir):
    sampler = FewShotClassification(load_omniglot(omniglot_dir), ways=107,
                                    split_by="group", **MINIMAL_SPLIT)
    with pytest.raises(ValueError, match="ways=107 is more than the 106 classes the "
                                         "'test' split has"):
        sampler.dataset(4, split="test")


@pytest.fixture
def clean_gin():
    yield
    gin.clear_config()


def test_minimal_experiment_trains_evaluates_and_restores(omniglot_dir, tmp_path, clean_gin):
    from metalearn import restore
    from metalearn.training import build_experiment, evaluate, parse_config, train

    root = ROOT
    workdir = str(tmp_path / "run")
    parse_config([os.path.join(root, "experiments/omniglot/minimal/maml_5way_1shot.gin")],
                 ["Loop.num_steps = 3", "Experiment.meta_batch_size = 2",
                  "Loop.log_every = 3", f"load_omniglot.path = '{omniglot_dir}'",
                  "Learner.model = @conv_net()", "conv_net.outputs = 5",
                  "conv_net.filters = 4", "conv_net.blocks = 2",
                  "Experiment.formulation = @Unrolled()",
                  "evaluate.num_tasks = 4", "evaluate.batch_size = 2",
                  "evaluate.inner_steps = (1, 2)"])
    metrics = train(build_experiment(), workdir)
    assert metrics["step"] == 3 and 0.0 <= metrics["accuracy"] <= 1.0
    experiment = restore(workdir, gin_params=["FewShotClassification.within_group = True"])
    assert experiment.sampler.preprocessing["image_size"] == 28
    assert experiment.sampler.preprocessing["invert"] is True
    report = evaluate(experiment.learner, experiment.sampler)
    assert sorted(report["results"]) == ["1", "2"]
    assert set(report["results"]["2"]) == {"loss", "accuracy"}
    # Research code: adapt the restored learner on images prepared like the run's.
    with zipfile.ZipFile(os.path.join(omniglot_dir, SMALL1 + ".zip")) as zf:
        names = sorted(n for n in zf.namelist() if n.endswith(".png"))[:5 * 20:20]
        raw = np.stack([tf.io.decode_png(zf.read(n), channels=1).numpy() for n in names])
    prep = experiment.sampler.preprocessing
    images = omniglot.preprocess(raw, prep["image_size"], prep["invert"])
    weights = experiment.learner.adapt(images, tf.range(5, dtype=tf.int32), steps=2)
    assert experiment.learner.predict(weights, images).shape == (5, 5)
