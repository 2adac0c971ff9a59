"""Every benchmark gin file builds, meta-trains and evaluates with the smoke budget
(experiments/budgets/smoke.gin, given after it) on a fixture in the real data's on-disk
format."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from metalearn.tasks.datasets import clear_caches
from metalearn.training import build_experiment, evaluate, parse_config, train
from tests import benchmark_fixtures as fixtures

# Its tests share a module-scoped fixture: one worker runs them (tests/conftest.py).
pytestmark = pytest.mark.xdist_group(__name__)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = ("mini_imagenet", "tiered_imagenet", "cifar_fs", "fc100", "cub")
CONFIGS = [(b, os.path.basename(f)) for b in BENCHMARKS
           for f in sorted(glob.glob(os.path.join(ROOT, "experiments", b, "*.gin")))
           ]
SMOKE = os.path.join(ROOT, "experiments", "budgets", "smoke.gin")


def test_every_benchmark_has_configs_and_a_setup():
    for benchmark in BENCHMARKS:
        folder = os.path.join(ROOT, "experiments", benchmark)
        assert os.path.isfile(os.path.join(ROOT, "experiments", "setups", f"{benchmark}.gin"))
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


@pytest.fixture(scope="module", autouse=True)
def _loaders_caches():
    """The loaders' in-process caches, emptied before and after the module. Between
    its tests they are kept (but around CIFAR's, :func:`mocked_cifar100`): each
    benchmark's first file reads and checks the fixture's files, the benchmark's other
    files load the same decoded data from memory (the caches are keyed on the folder,
    the image size and the files' fingerprints), as several runs in one process would;
    tiered-ImageNet's ~600 classes cost seconds per read."""
    clear_caches()
    yield
    clear_caches()


@pytest.fixture
def mocked_cifar100(data_set):
    """CIFAR-100 served by a mock of TensorFlow Datasets; the caches emptied before and
    after each CIFAR-backed file (cifar_fs, fc100), so that it loads the mock's data and
    no other test sees them."""
    cifar = data_set in ("cifar_fs", "fc100")
    if cifar:
        clear_caches()
    served = {"train": fixtures.cifar100_examples("train", 1),
              "test": fixtures.cifar100_examples("test", 1)}

    def as_dataset(self, split, *args, **kwargs):
        return tf.data.Dataset.from_tensor_slices(served[str(split)])

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        yield
    if cifar:
        clear_caches()


# Every file is built (gin bindings, loader, learner, sampler's class split); each
# algorithm family and each benchmark's loader is also meta-trained and evaluated once,
# on the benchmark below (training all 37 files took ~12 of the suite's CPU minutes and
# tests nothing the pairs do not: a family's files differ only in their data set's
# setup, which the build checks).
TRAINED = {"maml": "cub", "protonets": "tiered_imagenet", "metaoptnet": "cifar_fs",
           "r2d2": "fc100", "protonets_resnet12": "fc100",
           "metaoptnet_rr_resnet12": "mini_imagenet", "rfs": "tiered_imagenet",
           "meta_baseline": "cifar_fs"}
TRAINED_LOADERS = {"mini_imagenet": "maml"}  # the benchmark's own loader once more
EXPECTED_CLASSES = {"mini_imagenet": (64, 16, 20), "tiered_imagenet": (351, 97, 160),
                    "cifar_fs": (64, 16, 20), "fc100": (60, 20, 20), "cub": (100, 50, 50)}


def _family(name: str) -> str:
    return name[:-len("_5way_1shot.gin")]


def _trained(data_set: str, name: str) -> bool:
    family = _family(name)
    return TRAINED.get(family) == data_set or TRAINED_LOADERS.get(data_set) == family


def test_every_family_and_loader_is_trained_once():
    families = {_family(n) for _, n in CONFIGS}
    assert families == set(TRAINED), "a new algorithm family needs a TRAINED benchmark"
    trained = [(b, n) for b, n in CONFIGS if _trained(b, n)]
    assert {b for b, _ in trained} == set(BENCHMARKS)
    assert {_family(n) for _, n in trained} == families


@pytest.mark.parametrize("data_set, name", CONFIGS, ids=[f"{b}/{n}" for b, n in CONFIGS])
def test_smoke_variant_builds_and_trains(data_set, name, data_dirs, mocked_cifar100,
                                         tmp_path):
    files = [os.path.join(ROOT, "experiments", data_set, name), SMOKE]
    parse_config(files, [data_dirs[data_set]])
    experiment = build_experiment()
    sampler = experiment.sampler
    assert tuple(sampler.num_classes(s) for s in ("train", "validation", "test")) == \
        EXPECTED_CLASSES[data_set]
    if not _trained(data_set, name):
        return
    metrics = train(experiment, str(tmp_path / "run"))
    assert metrics["step"] == 2 and np.isfinite(metrics["loss"])
    report = evaluate(experiment.learner, sampler)
    for by_metric in report["results"].values():
        assert 0.0 <= by_metric["accuracy"]["mean"] <= 1.0
    assert len(next(iter(report["per_task"].values()))["accuracy"]) == 4


META_DATASET = [os.path.basename(f) for f in sorted(glob.glob(
    os.path.join(ROOT, "experiments", "meta_dataset", "*.gin")))]


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
    parse_config([os.path.join(folder, name), SMOKE],
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
