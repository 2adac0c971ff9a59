"""Test set-up: quiet TensorFlow, and the shared data folder beside the project."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402

SHARED_DATA = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                           "data"))


@pytest.fixture
def shared_data() -> str:
    if not os.path.isdir(SHARED_DATA):
        pytest.fail(f"the shared data folder {SHARED_DATA} is missing")
    return SHARED_DATA
