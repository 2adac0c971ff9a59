"""Test set-up: quiet TensorFlow, and the shared data folder beside the project."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

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


@pytest.fixture
def shared_data() -> str:
    if not os.path.isdir(SHARED_DATA):
        pytest.fail(f"the shared data folder {SHARED_DATA} is missing")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _clear_gin():
    """Gin bindings are global: no test sees another's."""
    import gin
    gin.clear_config()
    yield
    gin.clear_config()
