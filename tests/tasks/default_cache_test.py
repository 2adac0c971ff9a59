"""The loaders' default on-disk cache of decoded arrays: a per-user folder
(``METALEARN_CACHE_DIR``, else ``XDG_CACHE_HOME``, else ``~/.cache``) that a later process
reads instead of decoding, one mechanism for every loader that decodes, turned off by
``cache_dir=False`` or an empty ``METALEARN_CACHE_DIR``; a folder that cannot be written
or a file that cannot be read never fails a load. ``data_cache`` (tests/conftest.py) is
the test's own default folder: no test writes into the real home."""

import logging
import os
import zipfile
from typing import Mapping

import numpy as np
import pytest
import tensorflow as tf

from metalearn.tasks.datasets import (clear_caches, load_cub, load_image_folder,
                                      load_mini_imagenet, load_omniglot,
                                      load_tiered_imagenet, omniglot)
from metalearn.tasks.datasets import base
from metalearn.tasks.datasets.base import CACHE_DIR_ENV, cache_folder, default_cache_dir
from tests import benchmark_fixtures as fixtures

pytestmark = pytest.mark.usefixtures("fresh_data_caches")

SMALL1 = "images_background_small1"
OPTIONS = dict(archives=(SMALL1,), image_size=14, verify_checksums=False)


def write_omniglot(folder, characters=2, drawers=2) -> str:
    """``images_background_small1.zip`` in the published layout:
    ``images_background_small1/<Alphabet>/characterNN/NNNN_NN.png``, 105x105 black and
    white PNGs (not the published file: loaded with ``verify_checksums=False``)."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    with zipfile.ZipFile(os.path.join(folder, SMALL1 + ".zip"), "w") as zf:
        for c in range(1, characters + 1):
            for d in range(1, drawers + 1):
                image = np.where(rng.random([105, 105, 1]) < 0.1, 0, 255).astype(np.uint8)
                zf.writestr(f"{SMALL1}/Greek/character{c:02d}/{c:04d}_{d:02d}.png",
                            tf.io.encode_png(image).numpy())
    return str(folder)


@pytest.fixture
def decoded(monkeypatch):
    """The PNG entries ``load_omniglot`` decodes, in order (a spy)."""
    entries = []
    real = omniglot._decode_png

    def spy(zf, file, entry):
        entries.append(entry)
        return real(zf, file, entry)

    monkeypatch.setattr(omniglot, "_decode_png", spy)
    return entries


def _same(first, second):
    np.testing.assert_array_equal(first.images, second.images)
    np.testing.assert_array_equal(first.labels, second.labels)
    assert first.images.dtype == second.images.dtype
    assert first.class_names == second.class_names and first.groups == second.groups
    assert dict(first.preprocessing) == dict(second.preprocessing)


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_second_load_reads_the_default_cache_instead_of_decoding(tmp_path, data_cache,
                                                                   decoded):
    path = write_omniglot(tmp_path / "omniglot")
    first = load_omniglot(path, **OPTIONS)
    assert len(decoded) == 4
    kept = os.listdir(data_cache)
    assert len(kept) == 1 and kept[0].startswith("omniglot_") and kept[0].endswith(".npz")
    clear_caches()  # a new process: only the files
    second = load_omniglot(path, **OPTIONS)
    assert len(decoded) == 4  # not decoded again
    _same(first, second)
    assert second.preprocessing["range"] == (0.0, 1.0)


def test_the_default_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == str(tmp_path / "mine")  # first
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(CACHE_DIR_ENV, "~/data_cache")
    assert default_cache_dir() == str(tmp_path / "home" / "data_cache")
    monkeypatch.delenv(CACHE_DIR_ENV)
    assert default_cache_dir() == str(tmp_path / "xdg" / "metalearn")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # ignored, as XDG says
    assert default_cache_dir() == str(tmp_path / "home" / ".cache" / "metalearn")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == str(tmp_path / "home" / ".cache" / "metalearn")
    assert cache_folder(None) == cache_folder(True) == default_cache_dir()
    monkeypatch.setenv(CACHE_DIR_ENV, "")  # set but empty: off
    assert default_cache_dir() is None and cache_folder(None) is None
    assert cache_folder(False) is None and cache_folder("") is None
    assert cache_folder(tmp_path / "given") == str(tmp_path / "given")
    with pytest.raises(TypeError, match="cache_dir must be a folder"):
        cache_folder(3)


def test_a_load_keeps_its_arrays_where_the_environment_says(tmp_path, monkeypatch,
                                                            data_cache, decoded):
    path = write_omniglot(tmp_path / "omniglot")
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "elsewhere"))
    load_omniglot(path, **OPTIONS)
    assert [p.name[:9] for p in (tmp_path / "elsewhere").iterdir()] == ["omniglot_"]
    monkeypatch.delenv(CACHE_DIR_ENV)  # then ~/.cache/metalearn, here a home of the test's
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    clear_caches()
    load_omniglot(path, **OPTIONS)
    assert len(decoded) == 8  # another folder: decoded again
    assert len(list((tmp_path / "home" / ".cache" / "metalearn").glob("omniglot_*"))) == 1
    assert not os.path.exists(data_cache)


@pytest.mark.parametrize("off", [{"cache_dir": False}, {"cache_dir": ""}, "environment"])
def test_the_cache_can_be_turned_off(tmp_path, monkeypatch, data_cache, decoded, off):
    path = write_omniglot(tmp_path / "omniglot")
    if off == "environment":
        monkeypatch.setenv(CACHE_DIR_ENV, "")
        off = {}
    first = load_omniglot(path, **OPTIONS, **off)
    clear_caches()
    second = load_omniglot(path, **OPTIONS, **off)
    assert len(decoded) == 8  # decoded by each "process"
    _same(first, second)
    assert not os.path.exists(data_cache)
    assert sorted(os.listdir(tmp_path)) == ["omniglot"]  # nothing written anywhere here


def test_a_cache_folder_that_cannot_be_made_is_logged_and_the_data_load(
        tmp_path, monkeypatch, caplog, decoded):
    path = write_omniglot(tmp_path / "omniglot")
    blocker = tmp_path / "a_file"
    blocker.write_text("a file where the cache folder's parent should be")
    monkeypatch.setenv(CACHE_DIR_ENV, str(blocker / "cache"))
    data = load_omniglot(path, **OPTIONS)
    warned = _warnings(caplog)
    assert any(str(blocker / "cache") in m and "used all the same" in m and
               CACHE_DIR_ENV in m for m in warned), warned
    clear_caches()
    again = load_omniglot(path, **OPTIONS)  # again: decoded, logged, loaded
    assert len(decoded) == 8
    _same(data, again)
    _same(data, load_omniglot(path, **OPTIONS, cache_dir=False))


def test_a_read_only_cache_folder_is_read_and_never_fails_a_load(tmp_path, monkeypatch,
                                                                data_cache, caplog, decoded):
    path = write_omniglot(tmp_path / "omniglot")
    first = load_omniglot(path, **OPTIONS)
    os.chmod(data_cache, 0o555)
    if os.geteuid() == 0:  # root writes there all the same: refused as a user would be
        from metalearn import atomic
        real = atomic.tempfile.mkstemp

        def mkstemp(*args, dir=None, **kwargs):
            if str(dir).startswith(data_cache):
                raise PermissionError(13, "Permission denied", dir)
            return real(*args, dir=dir, **kwargs)

        monkeypatch.setattr(atomic.tempfile, "mkstemp", mkstemp)
    try:
        clear_caches()
        _same(first, load_omniglot(path, **OPTIONS))  # read
        assert len(decoded) == 4
        small = load_omniglot(path, **dict(OPTIONS, image_size=7))  # not kept: logged
        assert small.images.shape[1:] == (7, 7, 1) and len(decoded) == 8
        warned = _warnings(caplog)
        assert any(data_cache in m and "Permission denied" in m for m in warned), warned
        assert len(os.listdir(data_cache)) == 1
    finally:
        os.chmod(data_cache, 0o755)


def test_a_cache_file_that_cannot_be_opened_is_logged_and_the_data_decoded(
        tmp_path, monkeypatch, data_cache, caplog, decoded):
    path = write_omniglot(tmp_path / "omniglot")
    first = load_omniglot(path, **OPTIONS)
    real_open = open

    def no_permission(file, *args, **kwargs):
        if str(file).startswith(data_cache):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(base, "open", no_permission, raising=False)  # base's reads only
    clear_caches()
    second = load_omniglot(path, **OPTIONS)
    assert len(decoded) == 8
    _same(first, second)
    warned = _warnings(caplog)
    assert any(data_cache in m and "cannot be read" in m and "Permission denied" in m
               for m in warned), warned


def test_a_damaged_file_in_the_default_folder_is_named(tmp_path, data_cache, decoded):
    path = write_omniglot(tmp_path / "omniglot")
    load_omniglot(path, **OPTIONS)
    (file,) = [os.path.join(data_cache, n) for n in os.listdir(data_cache)]
    with open(file, "r+b") as f:
        f.truncate(100)
    clear_caches()
    with pytest.raises(ValueError, match="is damaged or not a cache of plain arrays") as info:
        load_omniglot(path, **OPTIONS)
    assert file in str(info.value) and "delete it" in str(info.value)


def _image_folder(root):
    rng = np.random.default_rng(0)
    for c in range(3):
        os.makedirs(os.path.join(root, f"class{c}"))
        for i in range(2):
            with open(os.path.join(root, f"class{c}", f"{i:03d}.png"), "wb") as f:
                f.write(tf.io.encode_png(rng.integers(0, 256, (6, 6, 3), np.uint8)).numpy())
    return root


LOADERS = {  # name: (write the data under a folder, giving the path; load from the path)
    "omniglot": (lambda root: write_omniglot(root),
                 lambda path: load_omniglot(path, **OPTIONS)),
    "cub": (lambda root: fixtures.write_cub(root, per_class=1),
            lambda path: load_cub(path, image_size=16)),
    "mini_imagenet": (lambda root: fixtures.write_mini_imagenet_csv(root, 1, 16) and root,
                      lambda path: load_mini_imagenet(path, image_size=16)),
    "tiered_imagenet": (lambda root: fixtures.write_tiered_imagenet(root, 1) and root,
                        lambda path: load_tiered_imagenet(path, image_size=16, strict=False)),
    "image_folder": (_image_folder, lambda path: load_image_folder(path, image_size=4)),
}


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_every_loader_that_decodes_keeps_its_arrays_in_the_default_folder(
        tmp_path, data_cache, name):
    write, load = LOADERS[name]
    path = write(str(tmp_path / "data"))
    first = load(path)
    kept = {n: os.stat(os.path.join(data_cache, n)) for n in os.listdir(data_cache)}
    assert kept and all(n.startswith(name + "_") and n.endswith(".npz") for n in kept), kept
    clear_caches()
    second = load(path)
    for n, status in kept.items():  # served, not written again
        again = os.stat(os.path.join(data_cache, n))
        assert (again.st_ino, again.st_mtime_ns) == (status.st_ino, status.st_mtime_ns), n
    first, second = ((d if isinstance(d, Mapping) else {"all": d}) for d in (first, second))
    assert sorted(first) == sorted(second)
    for split in first:
        _same(first[split], second[split])


def test_image_folder_statistics_are_the_call_s_own(tmp_path):
    path = _image_folder(str(tmp_path / "images"))
    stats = load_image_folder(path, image_size=4, mean=(0.5,) * 3, std=(0.2,) * 3)
    assert stats.preprocessing["mean"] == (0.5,) * 3
    plain = load_image_folder(path, image_size=4)  # the same decoded arrays, no statistics
    assert "mean" not in plain.preprocessing and plain.images is stats.images
