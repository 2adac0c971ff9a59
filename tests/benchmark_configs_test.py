"""Every benchmark gin file builds, meta-trains and evaluates with its CPU smoke variant
(experiments/<benchmark>/smoke.gin) on a fixture in the real data's on-disk format."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from metalearn.tasks.datasets import cifar
from metalearn.training import build_experiment, evaluate, parse_config, train
from tests import benchmark_fixtures as fixtures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = ("mini_imagenet", "tiered_imagenet", "cifar_fs", "fc100", "cub")
CONFIGS = [(b, os.path.basename(f)) for b in BENCHMARKS
           for f in sorted(glob.glob(os.path.join(ROOT, "experiments", b, "*.gin")))
           if os.path.basename(f) not in ("base.gin", "smoke.gin")]


def test_every_benchmark_has_configs_and_a_smoke_variant():
    for benchmark in BENCHMARKS:
        folder = os.path.join(ROOT, "experiments", benchmark)
        assert os.path.isfile(os.path.join(folder, "smoke.gin")), benchmark
        assert {"maml_5way_1shot.gin", "protonets_5way_1shot.gin"} <= set(os.listdir(folder))
    for benchmark, name in CONFIGS:
        with open(os.path.join(ROOT, "experiments", benchmark, name)) as f:
            header = f.read().split("\ninclude", 1)[0]
        assert "Published figure" in header or "published figure" in header, (benchmark, name)
        assert "python -m metalearn.train" in header and "Not run here" in header


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("benchmarks")
    fixtures.write_mini_imagenet_csv(str(root / "mini_imagenet"), per_class=2, size=84)
    fixtures.write_tiered_imagenet(str(root / "tiered_imagenet"), per_class=2)
    fixtures.write_cub(str(root / "cub"), per_class=2)
    return {"mini_imagenet": f"load_mini_imagenet.path = '{root / 'mini_imagenet'}'",
            "tiered_imagenet": f"load_tiered_imagenet.path = '{root / 'tiered_imagenet'}'",
            "cub": f"load_cub.path = '{root / 'cub' / 'CUB_200_2011'}'",
            "cifar_fs": "load_cifar_fs.data_dir = '/nonexistent'",
            "fc100": "load_fc100.data_dir = '/nonexistent'"}


@pytest.fixture
def mocked_cifar100():
    cifar._CACHE.clear()
    served = {"train": fixtures.cifar100_examples("train", 1),
              "test": fixtures.cifar100_examples("test", 1)}

    def as_dataset(self, split, *args, **kwargs):
        return tf.data.Dataset.from_tensor_slices(served[str(split)])

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        yield
    cifar._CACHE.clear()


@pytest.mark.parametrize("data_set, name", CONFIGS, ids=[f"{b}/{n}" for b, n in CONFIGS])
def test_smoke_variant_trains_and_evaluates(data_set, name, data_dirs, mocked_cifar100,
                                            tmp_path):
    files = [os.path.join(ROOT, "experiments", data_set, name),
             os.path.join(ROOT, "experiments", data_set, "smoke.gin")]
    parse_config(files, [data_dirs[data_set]])
    experiment = build_experiment()
    metrics = train(experiment, str(tmp_path / "run"))
    assert metrics["step"] == 2 and np.isfinite(metrics["loss"])
    sampler = experiment.sampler
    expected = {"mini_imagenet": (64, 16, 20), "tiered_imagenet": (351, 97, 160),
                "cifar_fs": (64, 16, 20), "fc100": (60, 20, 20), "cub": (100, 50, 50)}
    assert tuple(sampler.num_classes(s) for s in ("train", "validation", "test")) == \
        expected[data_set]
    report = evaluate(experiment.learner, sampler)
    for by_metric in report["results"].values():
        assert 0.0 <= by_metric["accuracy"]["mean"] <= 1.0
    assert len(next(iter(report["per_task"].values()))["accuracy"]) == 4


META_DATASET = [os.path.basename(f) for f in sorted(glob.glob(
    os.path.join(ROOT, "experiments", "meta_dataset", "*.gin")))
    if os.path.basename(f) not in ("base.gin", "smoke.gin")]


def test_meta_dataset_has_its_configs_and_headers():
    assert {"protonets.gin", "protomaml.gin"} <= set(META_DATASET)
    for name in META_DATASET:
        with open(os.path.join(ROOT, "experiments", "meta_dataset", name)) as f:
            header = f.read().split("\ninclude", 1)[0]
        assert "Published figures" in header and "Not run here" in header, name
        assert "python -m metalearn.train" in header, name


@pytest.fixture(scope="module")
def meta_dataset_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("meta_dataset")
    fixtures.write_meta_dataset(str(root))
    return str(root)


@pytest.mark.parametrize("name", META_DATASET)
def test_meta_dataset_smoke_variant_trains_and_evaluates(name, meta_dataset_root, tmp_path):
    folder = os.path.join(ROOT, "experiments", "meta_dataset")
    parse_config([os.path.join(folder, name), os.path.join(folder, "smoke.gin")],
                 [f"MetaDataset.root = '{meta_dataset_root}'"])
    experiment = build_experiment()
    metrics = train(experiment, str(tmp_path / "run"))
    assert metrics["step"] == 2 and np.isfinite(metrics["loss"])
    sampler = experiment.sampler
    assert [sampler.num_classes(s) for s in ("train", "validation", "test")] == [28, 15, 10]
    report = evaluate(experiment.learner, sampler)
    for by_metric in report["results"].values():
        assert 0.0 <= by_metric["accuracy"]["mean"] <= 1.0
    assert len(next(iter(report["per_task"].values()))["accuracy"]) == 4
