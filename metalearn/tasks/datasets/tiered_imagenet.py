"""tiered-ImageNet (Ren et al., 2018): 608 ImageNet classes in 34 super-categories.

The split is by category, so meta-test classes are semantically far from meta-training
ones: 20 categories (351 classes) for meta-training, 6 (97) for validation, 8 (160) for
test. Read from the common compressed caches that Ren et al.'s code writes and that are
shared as the data set's download: per split ``<split>_images_png.pkl`` (a list of
PNG-encoded images, each a uint8 array or bytes, 84x84 RGB) and ``<split>_labels.pkl``
(a dict with ``label_specific`` [images] class ids, ``label_general`` [images] category
ids, ``label_specific_str`` the class wnids, ``label_general_str`` the category names),
for ``<split>`` in ``train``, ``val``, ``test``. Both are pickles, written by Python 2:
they are read with :mod:`metalearn.tasks.datasets.plain_pickle`, which builds plain
data only and never runs code from the file. PNGs are decoded with
``tf.io.decode_png`` (RGB).

Or (``source="images"``) from the images layout that tiered-ImageNet's generation tools
write: ``<split>/<wnid>/<image files>`` for ``<split>`` in ``train``, ``val``, ``test``,
with Ren et al.'s split files ``<split>.csv`` beside them (rows ``wnid,category``, no
header) naming each class's super-category. Without the CSVs the classes load without
categories (``within_group`` is then unavailable and ``strict`` checks class counts only).

Returns ``{"train", "validation", "test"}`` to uint8 ``LabelledImages`` whose classes
are the wnids and whose ``groups`` are the categories (so ``FewShotClassification(...,
within_group=True)`` draws an episode's classes from one category).
"""

from __future__ import annotations

import concurrent.futures
import csv
import os
from typing import Dict, Mapping, Optional, Tuple

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
from metalearn.tasks.datasets.folder import list_image_folder

REN_SPLIT_SIZES = {"train": 351, "validation": 97, "test": 160}
"""Classes per split in Ren et al.'s split."""

REN_CATEGORY_SIZES = {"train": 20, "validation": 6, "test": 8}
"""Super-categories per split (34 in all)."""

FILE_SPLITS = {"train": "train", "validation": "val", "test": "test"}
IMAGE_SIZE = 84
_LABEL_KEYS = ("label_specific", "label_general", "label_specific_str", "label_general_str")
_CACHE = MemoryCache("tiered_imagenet")  # keyed on what the data were made from


def _file(path: str, name: str) -> str:
    file = os.path.join(path, name)
    require_file(file, "tiered-ImageNet file")
    return file


def _labels(file: str):
    labels = plain_pickle.load(file, "tiered-ImageNet labels file")
    if isinstance(labels, dict):
        labels = {k.decode("latin-1") if isinstance(k, bytes) else k: v
                  for k, v in labels.items()}
    if not isinstance(labels, dict) or not set(_LABEL_KEYS) <= set(labels):
        raise ValueError(f"tiered-ImageNet labels file {file!r} is not a dict with "
                         f"{', '.join(_LABEL_KEYS)}")
    specific = np.asarray(labels["label_specific"]).reshape(-1)
    general = np.asarray(labels["label_general"]).reshape(-1)
    names = [n.decode("latin-1") if isinstance(n, bytes) else str(n)
             for n in labels["label_specific_str"]]
    categories = [n.decode("latin-1") if isinstance(n, bytes) else str(n)
                  for n in labels["label_general_str"]]
    if specific.dtype.kind not in "iu" or general.dtype.kind not in "iu" or \
            specific.shape != general.shape:
        raise ValueError(f"tiered-ImageNet labels file {file!r}: label_specific and "
                         "label_general must be integer arrays of one length")
    if specific.size and (specific.min() < 0 or specific.max() >= len(names) or
                          general.min() < 0 or general.max() >= len(categories)):
        raise ValueError(f"tiered-ImageNet labels file {file!r}: a label outside the "
                         f"{len(names)} class names or {len(categories)} category names")
    category_of = np.full(len(names), -1, np.int64)
    for c, g in zip(specific, general):
        if category_of[c] not in (-1, g):
            raise ValueError(f"tiered-ImageNet labels file {file!r}: class {names[c]!r} is "
                             f"in two categories, {categories[category_of[c]]!r} and "
                             f"{categories[g]!r}")
        category_of[c] = g
    return specific, names, [categories[g] if g >= 0 else "" for g in category_of]


def _decode_pngs(encoded, file: str, image_size: Optional[int]) -> np.ndarray:
    if not isinstance(encoded, list):
        raise ValueError(f"tiered-ImageNet images file {file!r} is not a list of PNG "
                         f"images (found {type(encoded).__name__})")

    def one(i):
        item = encoded[i]
        data = item.tobytes() if isinstance(item, np.ndarray) else item
        if not isinstance(data, bytes):
            raise ValueError(f"image {i} of tiered-ImageNet images file {file!r} is a "
                             f"{type(item).__name__}, not PNG bytes")
        return image_files.decode_image(data, f"image {i} of tiered-ImageNet images file "
                                        f"{file!r}", 3, image_size)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        decoded = list(pool.map(one, range(len(encoded))))
    return image_files.stack_images(decoded, [f"image {i} of {file}"
                                              for i in range(len(decoded))])


@gin.configurable
def load_tiered_imagenet(path: str = gin.REQUIRED, image_size: Optional[int] = IMAGE_SIZE,
                         strict: bool = True, cache_dir: CacheDir = None,
                         source: str = "auto") -> Mapping[str, LabelledImages]:
    """tiered-ImageNet's three class splits, classes grouped by category.

    Args:
      path: the folder holding ``{train,val,test}_images_png.pkl`` and
        ``{train,val,test}_labels.pkl``, or the ``{train,val,test}/<wnid>/`` image
        folders (with Ren et al.'s ``{train,val,test}.csv``).
      image_size: side the images are resized to (84, their size in the caches);
        ``None`` keeps them.
      strict: the class and category counts must be Ren et al.'s (351 / 97 / 160
        classes, 20 / 6 / 8 categories); ``False`` loads any split.
      cache_dir: where the decoded arrays are also kept (``.npz`` of plain arrays,
        never unpickled; about 10 GB for the whole data set), so that later runs skip
        decoding: by default the per-user cache folder (``$METALEARN_CACHE_DIR``, else
        ``~/.cache/metalearn``); ``False`` keeps none
        (:func:`~metalearn.tasks.datasets.base.cache_folder`).
      source: ``"pickle"`` (the caches), ``"images"`` (the image folders), or
        ``"auto"``: the caches if ``train_labels.pkl`` is there, else the folders.

    Returns:
      ``{"train", "validation", "test"}`` to ``LabelledImages`` (uint8 ``[examples,
      84, 84, 3]``, class names = wnids, groups = categories).

    Raises:
      FileNotFoundError: a missing folder or file (named).
      ValueError: a damaged or unsafe file (named), labels that do not fit the images,
        other class counts with ``strict``.
    """
    path = data_path(path)  # relative: the working directory, else the repository root
    if source not in ("auto", "pickle", "images"):
        raise ValueError(f"source must be 'auto', 'pickle' or 'images', got {source!r}")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tiered-ImageNet folder {path!r} does not exist; give the "
                                "folder with {train,val,test}_images_png.pkl and "
                                "{train,val,test}_labels.pkl, or with the image folders "
                                "train/, val/, test/")
    if source == "auto":
        source = ("pickle" if os.path.isfile(os.path.join(path, "train_labels.pkl"))
                  else "images")
    image_size = check_image_size(image_size, "load_tiered_imagenet", optional=True)
    key = (os.path.abspath(path), image_size)  # the caches' key since before the folders
    if source == "images":
        key += ("images",)
    cache_dir = cache_folder(cache_dir)
    # What the arrays are made from: a cache (in memory or on disk) of other files is
    # never served.
    names = [f"{FILE_SPLITS[s]}{end}" for s in SPLIT_NAMES for end in
             (("_images_png.pkl", "_labels.pkl") if source == "pickle" else ("", ".csv"))]
    sources = source_fingerprint([os.path.join(path, n) for n in names], exclude=cache_dir)
    if (key, sources) in _CACHE:
        return dict(_CACHE[key, sources])
    reader = _read_splits if source == "pickle" else _read_image_folders
    splits = cached_splits(cache_dir, "tiered_imagenet", key,
                           lambda: reader(path, image_size), sources)
    if strict:
        _check_ren_split(splits, path, source)
    _CACHE[key, sources] = splits
    return dict(splits)


def _read_splits(path: str, image_size: Optional[int]) -> Dict[str, LabelledImages]:
    splits = {}
    for split in SPLIT_NAMES:
        name = FILE_SPLITS[split]
        labels_file = _file(path, f"{name}_labels.pkl")
        images_file = _file(path, f"{name}_images_png.pkl")
        specific, names, categories = _labels(labels_file)
        encoded = plain_pickle.load(images_file, "tiered-ImageNet images file")
        if isinstance(encoded, list) and len(encoded) != len(specific):
            raise ValueError(f"tiered-ImageNet images file {images_file!r} holds "
                             f"{len(encoded)} images but {labels_file!r} "
                             f"{len(specific)} labels")
        images = _decode_pngs(encoded, images_file, image_size)
        # Classes sorted by wnid, examples in file order within each.
        order = sorted(range(len(names)), key=lambda c: names[c])
        relabel = np.empty(len(names), np.int64)
        relabel[order] = np.arange(len(names))
        labels = relabel[specific]
        by_class = np.argsort(labels, kind="stable")
        splits[split] = LabelledImages(
            images[by_class], labels[by_class], tuple(names[c] for c in order),
            tuple(categories[c] for c in order),
            preprocessing=image_files.preprocessing(
                "tiered_imagenet", image_size or IMAGE_SIZE, 3,
                image_files.MINI_IMAGENET_STATS))
    return splits


def _read_categories(file: str, classes) -> Optional[Tuple[str, ...]]:
    """The category of each class from Ren et al.'s split file (rows ``wnid,category``),
    ``None`` without the file; a class the file does not list, or a bad row, is an error
    naming the file."""
    if not os.path.isfile(file):
        return None
    category = {}
    with open(file, newline="") as f:
        for line, row in enumerate(csv.reader(f), start=1):
            row = [c.strip() for c in row]
            if not row or (line == 1 and row[0].lower() in ("wnid", "class", "synset")):
                continue
            if len(row) < 2 or not row[0] or not row[1]:
                raise ValueError(f"tiered-ImageNet split file {file!r}, line {line}: "
                                 f"expected 'wnid,category', got {','.join(row)!r}")
            category[row[0]] = row[1]
    missing = [c for c in classes if c not in category]
    if missing:
        raise ValueError(f"tiered-ImageNet split file {file!r} does not list the class "
                         f"folder(s) {missing[:5]} ({len(missing)} in all); it must name "
                         "every class folder's category")
    return tuple(category[c] for c in classes)


def _read_image_folders(path: str, image_size: Optional[int]) -> Dict[str, LabelledImages]:
    splits = {}
    for split in SPLIT_NAMES:
        name = FILE_SPLITS[split]
        folder = os.path.join(path, name)
        if not os.path.isdir(folder):
            raise FileNotFoundError(
                f"tiered-ImageNet image folder {folder!r} not found; the images layout is "
                f"train/, val/, test/ (one sub-folder of images per wnid) in {path!r}, which "
                f"holds {sorted(os.listdir(path))[:10]}")
        listing = list_image_folder(folder)
        files = [f for class_files in listing.values() for f in class_files]
        labels = np.repeat(np.arange(len(listing)), [len(v) for v in listing.values()])
        splits[split] = LabelledImages(
            image_files.read_image_files(files, 3, image_size), labels, tuple(listing),
            _read_categories(os.path.join(path, f"{name}.csv"), tuple(listing)),
            preprocessing=image_files.preprocessing(
                "tiered_imagenet", image_size or IMAGE_SIZE, 3,
                image_files.MINI_IMAGENET_STATS, source="images"))
    return splits


def _check_ren_split(splits: Mapping[str, LabelledImages], path: str,
                     source: str = "pickle") -> None:
    """Ren et al.'s class and category counts, no category in two splits."""
    files = (f"{{train,val,test}}_labels.pkl in {path!r}" if source == "pickle"
             else f"the folders train/, val/, test/ in {path!r}")
    check_split_sizes(splits, REN_SPLIT_SIZES, "tiered-ImageNet", files)
    if any(data.groups is None for data in splits.values()):
        return  # image folders without Ren et al.'s CSVs: no categories to check
    for split, count in REN_CATEGORY_SIZES.items():
        found = len(set(splits[split].groups))
        if found != count:
            raise ValueError(f"tiered-ImageNet: the {split!r} split has {found} "
                             f"categories, Ren et al.'s has {count} ({files}); pass "
                             "strict=False to load another split anyway")
    owner = {}
    for split, data in splits.items():
        for category in set(data.groups):
            if owner.setdefault(category, split) != split:
                raise ValueError(f"tiered-ImageNet: category {category!r} is in both "
                                 f"the {owner[category]!r} and the {split!r} split "
                                 f"({files})")
