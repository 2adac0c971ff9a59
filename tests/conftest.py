"""Test set-up: quiet TensorFlow, the shared data folder beside the project, and the
loaders' on-disk data cache kept out of the real home."""

import gc
import logging
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

# The loaders keep decoded arrays in a per-user cache folder by default
# (metalearn.tasks.datasets.base.default_cache_dir): no test writes into the real home.
# This folder serves what runs before a test's own (module-scoped fixtures, the processes
# they start); each test gets a fresh one inside it (data_cache below). Set before
# anything is imported, whatever the environment said.
DATA_CACHE_ENV = "METALEARN_CACHE_DIR"
_SESSION_DATA_CACHE = tempfile.mkdtemp(prefix="metalearn_test_cache_")
os.environ[DATA_CACHE_ENV] = _SESSION_DATA_CACHE

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# Fake multi-device set-up (as haiku and big_vision do): four logical CPUs, so that
# MirroredStrategy is tested on one CPU. Must happen before TensorFlow initialises.
LOGICAL_CPUS = 4
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * LOGICAL_CPUS)

SHARED_DATA = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                           "data"))


def pytest_configure(config):
    """Under ``-n 2`` xdist's default "load" scheduling deals tests out one by one, so
    the tests of one module land on both workers and each worker builds the module's
    scoped fixtures (a trained run, killed and resumed processes) again. "loadgroup"
    keeps the tests marked ``xdist_group`` on one worker (a module with such a fixture
    marks itself, ``tests/suite_test.py`` checks) and deals out the rest as "load" does."""
    config.addinivalue_line("markers", "xdist_group(name): run these tests on one worker")
    if getattr(config.option, "dist", None) == "load":  # the controller
        config.option.dist = "loadgroup"
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "loadgroup" in workerinput:  # a worker: it parsed
        config.option.loadgroup = workerinput["loadgroup"]  # `-n 2` as "load" itself


def pytest_collection_finish(session):
    """Everything imported so far (TensorFlow, Keras, metalearn, the test modules) out
    of the garbage collector's sight: it is alive for the whole session, and each full
    collection walked it again (about 2 % of a test worker's CPU)."""
    gc.freeze()


def pytest_unconfigure(config):
    from tests import forked
    forked.close_servers()
    shutil.rmtree(_SESSION_DATA_CACHE, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Tells each xdist worker what the controller chose (it names the tests by group)."""
    node.workerinput["loadgroup"] = node.config.option.dist == "loadgroup"


@pytest.fixture
def shared_data() -> str:
    if not os.path.isdir(SHARED_DATA):
        pytest.fail(f"the shared data folder {SHARED_DATA} is missing")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def data_cache(monkeypatch) -> str:
    """The folder of the loaders' default on-disk data cache in this test (and the
    processes it starts): a fresh one, not made yet, removed after the test."""
    folder = tempfile.mkdtemp(prefix="test_", dir=_SESSION_DATA_CACHE)
    os.rmdir(folder)  # a loader makes it when it first keeps something
    monkeypatch.setenv(DATA_CACHE_ENV, folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _clear_gin():
    """Gin bindings are global: no test sees another's."""
    import gin
    gin.clear_config()
    yield
    gin.clear_config()


def _logging_state():
    return {name: (logger.level, logger.disabled)
            for name, logger in (("root", logging.getLogger()),
                                 ("absl", logging.getLogger("absl")))}


@pytest.fixture(autouse=True)
def _logging_kept():
    """A test leaves the root and absl loggers' levels as it found them: one that did
    (an export through ``tf.saved_model.save``) silenced the INFO lines that later tests
    on its worker read with ``caplog``, failing them by the order xdist dealt."""
    before = _logging_state()
    yield
    after = _logging_state()
    if after != before:
        for name, (level, disabled) in before.items():
            logger = logging.getLogger(None if name == "root" else name)
            logger.setLevel(level)
            logger.disabled = disabled
        pytest.fail(f"the test changed the loggers' (level, disabled): {before} -> {after}")
