"""Shipped configs work from any working directory: their data paths resolve against
the repository root, and gin's includes found through its search path log no error."""

import gzip
import logging
import os
import struct

import gin
import numpy as np
import pytest

import metalearn  # noqa: F401  (registers the configurables)
from metalearn import _compat, repository as paths
from metalearn.tasks.datasets import load_mnist
from metalearn.training import parse_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_mnist_test_split(folder, examples: int = 6) -> None:
    """IDX files of MNIST's test split (random digits, the published layout)."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, [examples, 28, 28], dtype=np.uint8)
    labels = np.arange(examples, dtype=np.uint8) % 10
    with gzip.open(os.path.join(folder, "t10k-images-idx3-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">IIII", 2051, examples, 28, 28) + images.tobytes())
    with gzip.open(os.path.join(folder, "t10k-labels-idx1-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">II", 2049, examples) + labels.tobytes())


def test_data_path_resolves_relative_paths_against_the_repository(tmp_path, monkeypatch):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (tmp_path / "shared" / "data" / "x").mkdir(parents=True)
    (tmp_path / "a" / "cwd" / "mine").mkdir(parents=True)  # no ../shared from there
    monkeypatch.setattr(paths, "ROOT", str(checkout))
    monkeypatch.chdir(tmp_path / "a" / "cwd")
    assert paths.data_path("../shared/data/x") == str(tmp_path / "shared" / "data" / "x")
    assert paths.data_path("mine") == "mine"  # found from the working directory
    assert paths.data_path("nowhere") == "nowhere"  # the loader's error names it
    assert paths.data_path(str(tmp_path)) == str(tmp_path)
    assert paths.data_path(None) is None


def test_shipped_config_reads_its_data_from_another_directory(tmp_path, monkeypatch):
    """experiments/mnist/hypernetwork.gin names '../shared/data/mnist' (beside the
    checkout): from another working directory the loader finds it there."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    write_mnist_test_split(tmp_path / "shared" / "data" / "mnist")
    monkeypatch.setattr(paths, "ROOT", str(checkout))
    (tmp_path / "a" / "elsewhere").mkdir(parents=True)  # no ../shared from there
    monkeypatch.chdir(tmp_path / "a" / "elsewhere")
    parse_config([os.path.join(ROOT, "experiments", "mnist", "hypernetwork.gin")])
    assert gin.query_parameter("load_mnist.path") == "../shared/data/mnist"
    data = load_mnist()  # the config's bindings
    assert data.images.shape == (6, 28, 28, 1)


def test_shipped_omniglot_config_reads_the_shared_data_from_another_directory(
        shared_data, tmp_path, monkeypatch):
    """The real case, where the shared data lies beside the checkout."""
    from metalearn.tasks.datasets import load_omniglot
    monkeypatch.chdir(tmp_path)
    parse_config([os.path.join(ROOT, "experiments", "omniglot", "minimal",
                               "maml_5way_1shot.gin")])
    assert gin.query_parameter("load_omniglot.path") == "../shared/data/omniglot"
    assert load_omniglot(archives=("images_background_small1",)).num_classes > 0


@pytest.fixture
def search_path(tmp_path):
    """A folder of gin files on gin's search path (removed afterwards)."""
    folder = tmp_path / "configs"
    (folder / "zz_included").mkdir(parents=True)
    gin.add_config_file_search_path(str(folder))
    yield folder
    _compat.gin_location_prefixes().remove(str(folder))


def test_an_include_found_on_the_search_path_logs_no_error(search_path, tmp_path,
                                                           monkeypatch, caplog):
    (search_path / "zz_included" / "steps.gin").write_text("Loop.num_steps = 7\n")
    main = search_path / "main.gin"
    main.write_text("include 'experiments/sinusoid/maml.gin'\n"
                    "include 'zz_included/steps.gin'\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    with caplog.at_level(logging.INFO):
        parse_config([str(main)])
    assert gin.query_parameter("Loop.num_steps") == 7
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_missing_include_still_fails_naming_it(search_path, tmp_path, monkeypatch):
    main = search_path / "main.gin"
    main.write_text("include 'zz_included/missing.gin'\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(IOError, match="zz_included/missing.gin"):
        parse_config([str(main)])
