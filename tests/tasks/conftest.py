"""Set-up shared by the data-set loaders' tests."""

import pytest

from metalearn.tasks.datasets import clear_caches


@pytest.fixture
def fresh_data_caches():
    """Every loader's in-memory cache empty before and after the test, as in a new
    process (a module asks for it with ``pytest.mark.usefixtures``)."""
    clear_caches()
    yield
    clear_caches()
