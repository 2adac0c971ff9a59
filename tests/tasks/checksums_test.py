"""Published checksums: files of a published name are checked before they are read."""

import gzip
import hashlib
import os
import struct
import zipfile

import numpy as np
import pytest
import tensorflow as tf

from metalearn.tasks.datasets import (ChecksumError, checksums, clear_caches, load_mnist,
                                      load_omniglot, verify_download)
from metalearn.tasks.datasets.checksums import PUBLISHED


@pytest.fixture(autouse=True)
def _fresh_caches():
    clear_caches()
    checksums._DIGESTS.clear()
    yield
    clear_caches()
    checksums._DIGESTS.clear()


def _omniglot_zip(folder, archive="images_background_small1"):
    os.makedirs(folder, exist_ok=True)
    png = tf.io.encode_png(tf.fill([105, 105, 1], tf.constant(255, tf.uint8))).numpy()
    with zipfile.ZipFile(os.path.join(folder, archive + ".zip"), "w") as zf:
        for i in range(2):
            zf.writestr(f"{archive}/Greek/character01/0101_{i + 1:02d}.png", png)
    return os.path.join(folder, archive + ".zip")


def test_the_table_names_each_figure_s_source():
    for name, entry in PUBLISHED.items():
        assert entry.url.split("?")[0].endswith("/" + name), name
        assert len(entry.sha256) == 64 and int(entry.sha256, 16) >= 0, name
        assert entry.size > 0 and "url_checksums" in entry.source, name
    assert {e.dataset for e in PUBLISHED.values()} == {"omniglot", "mnist", "cub"}


def test_an_omniglot_archive_of_another_size_is_refused_and_read_unchecked(tmp_path):
    file = _omniglot_zip(str(tmp_path))
    size = os.path.getsize(file)
    with pytest.raises(ChecksumError) as info:
        load_omniglot(str(tmp_path), archives=("images_background_small1",))
    message = str(info.value)
    assert f"Omniglot archive {file!r} is not the published file: {size} bytes" in message
    assert "1319022 bytes" in message and PUBLISHED[os.path.basename(file)].sha256 in message
    assert "url_checksums/omniglot.txt" in message
    assert "load_omniglot(verify_checksums=False)" in message
    assert "load_omniglot.verify_checksums = False" in message
    data = load_omniglot(str(tmp_path), archives=("images_background_small1",),
                         verify_checksums=False)
    assert data.class_names == ("Greek/character01",) and len(data.labels) == 2


def test_same_size_other_bytes_names_both_digests(tmp_path):
    file = tmp_path / "t10k-labels-idx1-ubyte.gz"
    entry = PUBLISHED[file.name]
    file.write_bytes(bytes(entry.size))
    with pytest.raises(ChecksumError) as info:
        verify_download(str(file))
    actual = hashlib.sha256(bytes(entry.size)).hexdigest()
    assert f"sha256 {actual}, the published file's is {entry.sha256}" in str(info.value)
    assert "verify_checksums" not in str(info.value)  # by hand: no loader to skip it


def test_unpublished_names_are_not_checked(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (3, 28, 28), dtype=np.uint8)
    labels = np.array([1, 2, 3], np.uint8)
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(  # uncompressed: no published figure
        (2051).to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in images.shape)
        + images.tobytes())
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(
        (2049).to_bytes(4, "big") + (3).to_bytes(4, "big") + labels.tobytes())
    np.testing.assert_array_equal(load_mnist(str(tmp_path)).labels, labels)
    assert verify_download(str(tmp_path / "t10k-labels-idx1-ubyte")) is None
    assert not checksums._DIGESTS  # nothing hashed
    # A published name of another data set is not this loader's to check.
    assert checksums.published(str(tmp_path / "images_background.zip"), "mnist") is None


def test_a_file_is_hashed_once_per_path_size_and_time(tmp_path, monkeypatch):
    file = tmp_path / "images_background_small1.zip"
    file.write_bytes(bytes(PUBLISHED[file.name].size))
    calls = []
    real = hashlib.sha256
    monkeypatch.setattr(checksums.hashlib, "sha256", lambda: calls.append(1) or real())
    for _ in range(3):
        with pytest.raises(ChecksumError):
            checksums.verify(str(file), "omniglot", "Omniglot archive", "load_omniglot")
    assert len(calls) == 1
    os.utime(file, ns=(0, 12345))  # touched: hashed again
    with pytest.raises(ChecksumError):
        checksums.verify(str(file), "omniglot", "Omniglot archive", "load_omniglot")
    assert len(calls) == 2


def test_unchecked_arrays_are_cached_apart_from_checked_ones(tmp_path):
    _omniglot_zip(str(tmp_path / "data"))
    load_omniglot(str(tmp_path / "data"), archives=("images_background_small1",),
                  cache_dir=str(tmp_path / "cache"), verify_checksums=False)
    clear_caches()
    with pytest.raises(ChecksumError):  # neither the memory nor the file cache serves it
        load_omniglot(str(tmp_path / "data"), archives=("images_background_small1",),
                      cache_dir=str(tmp_path / "cache"))


# --- the real files in ../shared/data ----------------------------------------------


def test_shared_omniglot_and_mnist_labels_are_the_published_files(shared_data):
    for file in ("omniglot/images_background_small1.zip",
                 "omniglot/images_background_small2.zip", "mnist/t10k-labels-idx1-ubyte.gz"):
        assert verify_download(os.path.join(shared_data, file)) is not None


def test_shared_mnist_test_images_differ_from_the_published_file_in_the_gzip_header(
        shared_data):
    """The shared ``t10k-images-idx3-ubyte.gz`` is refused: its gzip header (stored name
    ``t10k-images-idx3-ubyte``, time 2018-04-01) is not the published file's; with the
    header of the published files (name ``t10k-images.idx3-ubyte`` as in the labels
    file, a 1998 time) its bytes are the published file's. So its images are MNIST's,
    and the tests that read it pass ``verify_checksums=False``."""
    file = os.path.join(shared_data, "mnist", "t10k-images-idx3-ubyte.gz")
    with pytest.raises(ChecksumError, match="t10k-images-idx3-ubyte.gz' is not the published"):
        load_mnist(os.path.dirname(file))
    data = bytearray(open(file, "rb").read())
    assert data[10:33] == b"t10k-images-idx3-ubyte\0"
    data[10:32] = b"t10k-images.idx3-ubyte"
    data[4:8] = struct.pack("<I", 885827245)  # 1998-01-26 15:07:25 UTC
    assert hashlib.sha256(data).hexdigest() == PUBLISHED[os.path.basename(file)].sha256
    assert gzip.decompress(bytes(data)) == gzip.decompress(open(file, "rb").read())
