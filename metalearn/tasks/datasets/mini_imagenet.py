"""mini-ImageNet (Vinyals et al., 2016) with Ravi & Larochelle's (2017) class split.

100 ImageNet classes of 600 images each, split 64 / 16 / 20 (meta-train / validation /
test). Two common layouts of the same data, both read without network (the images are
not on TFDS, and their historical download links are mostly dead):

* ``source="csv"``: Ravi & Larochelle's split files ``train.csv``, ``val.csv``,
  ``test.csv`` (rows ``filename,label``, e.g. ``n0153282900000005.jpg,n01532829``,
  under a ``filename,label`` header) beside an ``images/`` folder holding the files;
* ``source="pickle"``: the widely shared caches ``mini-imagenet-cache-train.pkl``,
  ``-val.pkl``, ``-test.pkl``, each a dict ``{"image_data": uint8 [N, 84, 84, 3],
  "class_dict": {wnid: [indices into image_data]}}``. They are read with
  :mod:`metalearn.tasks.datasets.plain_pickle`, which builds plain arrays, dicts, lists,
  numbers and strings only and never runs code named in the file.

Both give ``{"train", "validation", "test"}`` to uint8 ``LabelledImages`` (classes
sorted by wnid, examples in file order), with the normalisation statistics MetaOptNet and
RFS use in ``preprocessing``.
"""

from __future__ import annotations

import csv
import os
from typing import Dict, List, Mapping, Optional, Tuple

import gin
import numpy as np

from metalearn.tasks.datasets import images as image_files
from metalearn.tasks.datasets import plain_pickle
from metalearn.repository import data_path
from metalearn.tasks.datasets.base import (SPLIT_NAMES, CacheDir, LabelledImages,
                                           MemoryCache, cache_folder, cached_splits,
                                           check_split_sizes, require_file,
                                           source_fingerprint)
from metalearn.tasks.datasets.images import check_image_size

RAVI_SPLIT_SIZES = {"train": 64, "validation": 16, "test": 20}
"""Classes per split in Ravi & Larochelle's split."""

FILE_SPLITS = {"train": "train", "validation": "val", "test": "test"}
"""The name each split has in the published file names."""

IMAGE_SIZE = 84
_CACHE = MemoryCache("mini_imagenet")  # keyed on what the data were made from


def _read_split_csv(file: str) -> List[Tuple[str, str]]:
    """``(filename, label)`` rows of a split file; a bad row names the file and line."""
    require_file(file, "mini-ImageNet split file")
    rows = []
    with open(file, newline="") as f:
        for line, row in enumerate(csv.reader(f), start=1):
            if not row or (line == 1 and [c.strip() for c in row] == ["filename", "label"]):
                continue
            if len(row) != 2 or not row[0].strip() or not row[1].strip():
                raise ValueError(f"mini-ImageNet split file {file!r}, line {line}: expected "
                                 f"'filename,label', got {','.join(row)!r}")
            rows.append((row[0].strip(), row[1].strip()))
    if not rows:
        raise ValueError(f"mini-ImageNet split file {file!r} lists no images")
    return rows


def _from_csv(path: str, image_size: Optional[int]) -> Dict[str, LabelledImages]:
    folder = os.path.join(path, "images")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"mini-ImageNet images folder {folder!r} not found; the "
                                "CSV layout is images/ beside train.csv, val.csv, test.csv")
    rows_of = {}
    for split in SPLIT_NAMES:
        file = os.path.join(path, FILE_SPLITS[split] + ".csv")
        rows_of[split] = _read_split_csv(file)
    # before any image is decoded: each image in one class of one split
    check_split_sizes({}, {}, "mini-ImageNet", _files("csv", path), examples={
        split: [(f"image {os.path.normpath(name)!r}", label,
                 os.path.join(path, FILE_SPLITS[split] + ".csv")) for name, label in rows]
        for split, rows in rows_of.items()})
    splits = {}
    for split in SPLIT_NAMES:
        file = os.path.join(path, FILE_SPLITS[split] + ".csv")
        rows = rows_of[split]
        names = sorted({label for _, label in rows})
        index = {n: i for i, n in enumerate(names)}
        rows.sort(key=lambda r: (index[r[1]], r[0]))
        files = [os.path.join(folder, name) for name, _ in rows]
        missing = next((f for f in files if not os.path.isfile(f)), None)
        if missing is not None:
            raise FileNotFoundError(f"image file {missing!r} listed in {file!r} not found")
        labels = np.array([index[label] for _, label in rows], np.int64)
        splits[split] = LabelledImages(
            image_files.read_image_files(files, 3, image_size), labels, tuple(names),
            preprocessing=_preprocessing(image_size, "csv"))
    return splits


def _from_pickles(path: str, image_size: Optional[int]) -> Dict[str, LabelledImages]:
    splits = {}
    for split in SPLIT_NAMES:
        file = os.path.join(path, f"mini-imagenet-cache-{FILE_SPLITS[split]}.pkl")
        require_file(file, "mini-ImageNet cache file")
        cache = plain_pickle.load(file, "mini-ImageNet cache file")
        if not isinstance(cache, dict) or not {"image_data", "class_dict"} <= set(cache):
            raise ValueError(f"mini-ImageNet cache file {file!r} is not a dict with "
                             "'image_data' and 'class_dict'")
        data, classes = cache["image_data"], cache["class_dict"]
        if not isinstance(data, np.ndarray) or data.ndim != 4 or data.shape[-1] != 3 \
                or data.dtype != np.uint8:
            raise ValueError(f"mini-ImageNet cache file {file!r}: 'image_data' must be uint8 "
                             "[images, height, width, 3], got "
                             f"{getattr(data, 'dtype', type(data).__name__)} "
                             f"{getattr(data, 'shape', '')}")
        if not isinstance(classes, dict) or not classes:
            raise ValueError(f"mini-ImageNet cache file {file!r}: 'class_dict' must map "
                             "class names to lists of indices")
        names = sorted(str(n) for n in classes)
        by_name = {str(n): v for n, v in classes.items()}
        order, labels, examples = [], [], []
        for label, name in enumerate(names):
            indices = np.asarray(by_name[name]).reshape(-1)
            if indices.dtype.kind not in "iu" or indices.size == 0 or \
                    indices.min() < 0 or indices.max() >= len(data):
                raise ValueError(f"mini-ImageNet cache file {file!r}: class {name!r} lists "
                                 f"indices outside the {len(data)} images")
            order.append(indices.astype(np.int64))
            labels.append(np.full(indices.size, label, np.int64))
            examples += [(f"image {int(i)} of {file!r}", name, file) for i in indices]
        # each image in one class (the indices are into this file's images only)
        check_split_sizes({}, {}, "mini-ImageNet", _files("pickle", path),
                          examples={split: examples})
        images = data[np.concatenate(order)]
        if image_size is not None and images.shape[1:3] != (image_size, image_size):
            images = _resize(images, image_size)
        splits[split] = LabelledImages(images, np.concatenate(labels), tuple(names),
                                       preprocessing=_preprocessing(image_size, "pickle"))
    return splits


def _files(source: str, path: str) -> str:
    """The files of a layout, for errors."""
    files = ("train.csv, val.csv, test.csv" if source == "csv"
             else "mini-imagenet-cache-{train,val,test}.pkl")
    return f"{files} in {path!r}"


def _resize(images: np.ndarray, size: int) -> np.ndarray:
    import tensorflow as tf
    out = [tf.cast(tf.clip_by_value(tf.round(tf.image.resize(
        images[i:i + 1024], (size, size), antialias=True)), 0, 255), tf.uint8).numpy()
        for i in range(0, len(images), 1024)]
    return np.concatenate(out)


def _preprocessing(image_size, source):
    return image_files.preprocessing("mini_imagenet", image_size or IMAGE_SIZE, 3,
                                     image_files.MINI_IMAGENET_STATS, source=source)


@gin.configurable
def load_mini_imagenet(path: str = gin.REQUIRED, source: str = "auto",
                       image_size: Optional[int] = IMAGE_SIZE, strict: bool = True,
                       cache_dir: CacheDir = None) -> Mapping[str, LabelledImages]:
    """mini-ImageNet's three class splits.

    Args:
      path: the folder holding ``images/`` and the split CSVs, or the
        ``mini-imagenet-cache-*.pkl`` files.
      source: ``"csv"``, ``"pickle"``, or ``"auto"`` (CSVs if ``train.csv`` is there,
        else the caches).
      image_size: side the images are resized to (84 in every paper); ``None`` keeps
        the files' sizes (which must then agree).
      strict: the class counts must be Ravi & Larochelle's 64 / 16 / 20 (a truncated or
        foreign split file is an error); ``False`` loads any split.
      cache_dir: where the decoded arrays are also kept (``.npz`` of plain arrays,
        never unpickled; about 1.3 GB for the whole data set), so that later runs skip
        decoding: by default the per-user cache folder (``$METALEARN_CACHE_DIR``, else
        ``~/.cache/metalearn``); ``False`` keeps none
        (:func:`~metalearn.tasks.datasets.base.cache_folder`).

    Returns:
      ``{"train", "validation", "test"}`` to ``LabelledImages`` (uint8 ``[examples,
      size, size, 3]``), no class in two splits, no image in two classes or splits.

    Raises:
      FileNotFoundError: a missing folder, split file, cache file or image (named).
      ValueError: a damaged or unsafe file (named), a split of other class counts, an
        image listed in two splits or two classes (a test image in ``train.csv``, two
        classes of the same cache indices: the image and both files named).
    """
    path = data_path(path)  # relative: the working directory, else the repository root
    if source not in ("auto", "csv", "pickle"):
        raise ValueError(f"source must be 'auto', 'csv' or 'pickle', got {source!r}")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"mini-ImageNet folder {path!r} does not exist; give the "
                                "folder with images/ and train.csv, val.csv, test.csv, or "
                                "with mini-imagenet-cache-{train,val,test}.pkl")
    if source == "auto":
        source = "csv" if os.path.isfile(os.path.join(path, "train.csv")) else "pickle"
    image_size = check_image_size(image_size, "load_mini_imagenet", optional=True)
    key = (os.path.abspath(path), source, image_size)
    cache_dir = cache_folder(cache_dir)
    # What the arrays are made from: a cache (in memory or on disk) of other files is
    # never served.
    names = ([f"{FILE_SPLITS[s]}.csv" for s in SPLIT_NAMES] + ["images"] if source == "csv"
             else [f"mini-imagenet-cache-{FILE_SPLITS[s]}.pkl" for s in SPLIT_NAMES])
    sources = source_fingerprint([os.path.join(path, n) for n in names], exclude=cache_dir)
    if (key, sources) not in _CACHE:
        reader = _from_csv if source == "csv" else _from_pickles
        splits = cached_splits(cache_dir, "mini_imagenet", key,
                               lambda: reader(path, image_size), sources)
        check_split_sizes(splits, RAVI_SPLIT_SIZES if strict else {}, "mini-ImageNet",
                          _files(source, path))
        _CACHE[key, sources] = splits
    return dict(_CACHE[key, sources])
