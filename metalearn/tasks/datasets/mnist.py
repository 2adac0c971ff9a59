"""MNIST (LeCun et al., 1998) from local IDX files, or through TFDS when online.

The four ``.gz`` files are checked against their published sizes and SHA-256 before
they are read (:mod:`metalearn.tasks.datasets.checksums`); uncompressed IDX files are
not (no figure is published for them).
"""

from __future__ import annotations

import gzip
import os
import zlib
from typing import Optional

import gin
import numpy as np

from metalearn.tasks.datasets import checksums
from metalearn.repository import data_path
from metalearn.tasks.datasets.base import LabelledImages

MNIST_SPLITS = ("train", "test")
_FILE_PREFIX = {"train": "train", "test": "t10k"}
_IMAGES_MAGIC, _LABELS_MAGIC = 2051, 2049  # IDX magic numbers: ubyte, 3 and 1 dimensions


def mnist_files(path: str, split: str):
    """``(images, labels)`` file paths of a split inside ``path``, in the original names
    (``t10k-images-idx3-ubyte.gz``, ...); uncompressed copies are accepted too."""
    prefix = _FILE_PREFIX[split]
    found = []
    for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
        names = [f"{prefix}-{kind}.gz", f"{prefix}-{kind}"]
        candidates = [os.path.join(path, name) for name in names]
        existing = next((c for c in candidates if os.path.isfile(c)), None)
        if existing is None:
            present = sorted(os.listdir(path)) if os.path.isdir(path) else "no such folder"
            raise FileNotFoundError(
                f"MNIST {split!r} split: none of {candidates} exists (folder {path!r} "
                f"holds {present}); download the IDX files from the MNIST site, or call "
                "load_mnist(path=None) to load through TFDS with network access")
        found.append(existing)
    return tuple(found)


def _read_idx(filename: str, magic: int) -> np.ndarray:
    opener = gzip.open if filename.endswith(".gz") else open
    try:
        with opener(filename, "rb") as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as error:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{filename!r} cannot be read as "
                         f"{'gzip-compressed ' if filename.endswith('.gz') else ''}IDX data "
                         f"({type(error).__name__}: {error}); download it again") from error
    if len(data) < 4:
        raise ValueError(f"{filename!r} is truncated: {len(data)} bytes, no IDX header")
    header_magic = int.from_bytes(data[0:4], "big")
    if header_magic != magic:
        raise ValueError(f"{filename!r} is not an IDX file of the expected kind: magic "
                         f"number {header_magic}, expected {magic}")
    dims = data[3]
    if len(data) < 4 + 4 * dims:
        raise ValueError(f"{filename!r} is truncated inside its IDX header "
                         f"({len(data)} bytes)")
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims))
    values = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims)
    if values.size != int(np.prod(shape)):
        raise ValueError(f"{filename!r} is truncated: header says {shape} "
                         f"({int(np.prod(shape))} values), found {values.size}")
    return values.reshape(shape)


def _load_tfds(split: str, data_dir: Optional[str]) -> LabelledImages:
    import tensorflow_datasets as tfds  # only on the online path
    dataset = tfds.load("mnist", split=split, as_supervised=True, data_dir=data_dir)
    batches = list(tfds.as_numpy(dataset.batch(10_000)))
    if not batches:
        raise ValueError(f"tfds.load('mnist', split={split!r}) returned no examples")
    images = np.concatenate([b[0] for b in batches]).astype(np.uint8)  # [examples, 28, 28, 1]
    labels = np.concatenate([b[1] for b in batches]).astype(np.int64)
    return LabelledImages(images, labels, class_names=[str(d) for d in range(10)])


@gin.configurable
def load_mnist(path: Optional[str] = None, split: str = "test",
               data_dir: Optional[str] = None, verify_checksums: bool = True
               ) -> LabelledImages:
    """The MNIST digits of one split as ``LabelledImages``.

    Args:
      path: a folder holding the IDX files of the split (``t10k-images-idx3-ubyte.gz``
        and ``t10k-labels-idx1-ubyte.gz`` for ``"test"``, ``train-*`` for ``"train"``),
        e.g. ``../shared/data/mnist``. ``None`` loads through
        ``tfds.load("mnist")``, which downloads once (network needed) into ``data_dir``.
      split: ``"train"`` (60,000 images) or ``"test"`` (10,000 images).
      data_dir: TFDS's data folder on the online path (TFDS's default when ``None``).
      verify_checksums: check each ``.gz`` file's size and SHA-256 against the
        published figures (:data:`checksums.PUBLISHED`, hashed once per file and
        process) before reading it; uncompressed IDX files are never checked (nothing
        publishes their figures). ``False`` reads the files unchecked.

    Returns:
      ``images`` ``[examples, 28, 28, 1]`` uint8 in 0..255, ``labels`` ``[examples]``
      int64 digits, ``class_names`` ``"0"`` .. ``"9"``.

    Raises:
      ValueError: an unknown split, or a file that is not the expected IDX data.
      checksums.ChecksumError: a ``.gz`` file (a ``ValueError``) that is not the
        published file (size or SHA-256), unless ``verify_checksums=False``.
      FileNotFoundError: ``path`` lacks the split's files (the message names them).
    """
    path = data_path(path)  # relative: the working directory, else the repository root
    if split not in MNIST_SPLITS:
        raise ValueError(f"MNIST split must be one of {MNIST_SPLITS}, got {split!r}")
    if path is None:
        return _load_tfds(split, data_dir)
    images_file, labels_file = mnist_files(path, split)
    if verify_checksums:
        for file in (images_file, labels_file):
            checksums.verify(file, "mnist", "MNIST file", "load_mnist")
    images = _read_idx(images_file, _IMAGES_MAGIC)     # [examples, 28, 28]
    labels = _read_idx(labels_file, _LABELS_MAGIC)     # [examples]
    if len(images) != len(labels):
        raise ValueError(f"{images_file!r} holds {len(images)} images but {labels_file!r} "
                         f"{len(labels)} labels")
    return LabelledImages(images[..., None], labels.astype(np.int64),
                          class_names=[str(d) for d in range(10)])
