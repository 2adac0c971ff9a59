"""CUB-200-2011 (Wah et al., 2011) with the 100 / 50 / 50 class split of Chen et al. (2019).

Read from the published archive's folder (``CUB_200_2011.tgz`` extracted):
``images/<class>/<file>.jpg``, ``images.txt`` (``<image id> <path>``),
``image_class_labels.txt`` (``<image id> <class id>``), ``classes.txt`` (``<class id>
<class name>``, e.g. ``1 001.Black_footed_Albatross``), ids from 1.

The split is Chen et al.'s ("A Closer Look at Few-shot Classification",
``write_CUB_filelist.py``): with the classes in id order and ``i`` counted from 0,
class ``i`` is meta-training if ``i % 2 == 0``, validation if ``i % 4 == 1``, test if
``i % 4 == 3``. Images (of varying sizes) are resized to ``image_size`` (84 by
default, as in that paper's Conv-4 experiments).

The extracted folder is read, so no checksum is checked here: check the downloaded
archive with :func:`metalearn.tasks.datasets.checksums.verify_download` before
extracting it (its published size and SHA-256 are in ``checksums.PUBLISHED``).
"""

from __future__ import annotations

import os
from typing import Dict, List, Mapping, Optional, Tuple

import gin
import numpy as np

from metalearn.tasks.datasets import images as image_files
from metalearn.repository import data_path
from metalearn.tasks.datasets.base import (SPLIT_NAMES, CacheDir, LabelledImages,
                                           MemoryCache, cache_folder, cached_splits,
                                           check_split_sizes, require_file,
                                           source_fingerprint)
from metalearn.tasks.datasets.images import check_image_size

CHEN_SPLIT_SIZES = {"train": 100, "validation": 50, "test": 50}
INDEX_FILES = ("images.txt", "image_class_labels.txt", "classes.txt")
_CACHE = MemoryCache("cub")  # keyed on what the data were made from


def chen_split(index: int) -> str:
    """Chen et al.'s split of the ``index``-th class (from 0, in class-id order)."""
    return "train" if index % 2 == 0 else "validation" if index % 4 == 1 else "test"


def _read_index(file: str) -> List[Tuple[int, str]]:
    """``(id, value)`` rows of one of the archive's index files."""
    require_file(file, "CUB-200-2011 file", "; give the extracted CUB_200_2011 folder")
    rows = []
    with open(file) as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            parts = text.split(maxsplit=1)
            if len(parts) != 2 or not parts[0].isdigit():
                raise ValueError(f"CUB-200-2011 file {file!r}, line {line}: expected "
                                 f"'<id> <value>', got {text.strip()!r}")
            rows.append((int(parts[0]), parts[1].strip()))
    return rows


@gin.configurable
def load_cub(path: str = gin.REQUIRED, image_size: Optional[int] = 84,
             strict: bool = True, cache_dir: CacheDir = None
             ) -> Mapping[str, LabelledImages]:
    """CUB-200-2011's three class splits.

    Args:
      path: the extracted ``CUB_200_2011`` folder (or the folder holding it).
      image_size: side the images are resized to (84 in Chen et al.'s Conv-4 runs).
      strict: there must be the archive's 200 classes (100 / 50 / 50).
      cache_dir: where the decoded arrays are also kept (``.npz`` of plain arrays,
        never unpickled), so that later runs skip decoding: by default the
        per-user cache folder (``$METALEARN_CACHE_DIR``, else ``~/.cache/metalearn``);
        ``False`` keeps none (:func:`~metalearn.tasks.datasets.base.cache_folder`).

    Returns:
      ``{"train", "validation", "test"}`` to ``LabelledImages`` (uint8 ``[examples,
      size, size, 3]``, class names as in ``classes.txt``), ImageNet's normalisation
      statistics in ``preprocessing``.

    Raises:
      FileNotFoundError: the folder, an index file or an image is missing (named).
      ValueError: a malformed index line (file and line), an undecodable image (named),
        an image of an unknown class; ``path`` is a file (the archive, not extracted).
    """
    path = data_path(path)  # relative: the working directory, else the repository root
    if os.path.isdir(os.path.join(path, "CUB_200_2011")):
        path = os.path.join(path, "CUB_200_2011")
    if os.path.isfile(path):
        raise ValueError(f"CUB-200-2011: {path!r} is a file, not the extracted folder; "
                         "extract the archive (tar -xzf CUB_200_2011.tgz) and give the "
                         "CUB_200_2011 folder (metalearn.tasks.datasets.checksums."
                         "verify_download checks the archive against its published "
                         "SHA-256 first)")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"CUB-200-2011 folder {path!r} does not exist; give the "
                                "folder extracted from CUB_200_2011.tgz")
    image_size = check_image_size(image_size, "load_cub")
    key = (os.path.abspath(path), image_size)
    cache_dir = cache_folder(cache_dir)
    # What the arrays are made from: a cache (in memory or on disk) of other files is
    # never served.
    sources = source_fingerprint([os.path.join(path, f) for f in INDEX_FILES] +
                                 [os.path.join(path, "images")], exclude=cache_dir)
    if (key, sources) in _CACHE:
        return dict(_CACHE[key, sources])
    splits = cached_splits(cache_dir, "cub", key, lambda: _read_splits(path, image_size),
                           sources)
    check_split_sizes(splits, CHEN_SPLIT_SIZES if strict else {}, "CUB-200-2011",
                      f"{os.path.join(path, 'classes.txt')!r}")
    _CACHE[key, sources] = splits
    return dict(splits)


def _read_splits(path: str, image_size: int) -> Dict[str, LabelledImages]:
    images_txt, labels_txt, classes_txt = (os.path.join(path, f) for f in INDEX_FILES)
    files = dict(_read_index(images_txt))
    labels = {}
    for image_id, value in _read_index(labels_txt):
        if not value.isdigit():
            raise ValueError(f"CUB-200-2011 file {labels_txt!r}: image {image_id} has class "
                             f"{value!r}, not a class id")
        labels[image_id] = int(value)
    classes = sorted(_read_index(classes_txt))
    class_ids = [c for c, _ in classes]
    split_of = {c: chen_split(i) for i, c in enumerate(class_ids)}
    names = dict(classes)
    missing = sorted(set(files) - set(labels))
    if missing:
        raise ValueError(f"CUB-200-2011: image {missing[0]} of {images_txt!r} has no class "
                         f"in {labels_txt!r}")
    splits = {}
    for split in SPLIT_NAMES:
        members = [c for c in class_ids if split_of[c] == split]
        relabel = {c: i for i, c in enumerate(members)}
        chosen = sorted((relabel[labels[i]], files[i]) for i in files
                        if labels[i] in relabel)
        unknown = [i for i in files if labels[i] not in split_of]
        if unknown:
            raise ValueError(f"CUB-200-2011: image {unknown[0]} has class {labels[unknown[0]]}"
                             f", which {classes_txt!r} does not list")
        paths = [os.path.join(path, "images", f) for _, f in chosen]
        absent = next((p for p in paths if not os.path.isfile(p)), None)
        if absent is not None:
            raise FileNotFoundError(f"image file {absent!r} listed in {images_txt!r} not "
                                    "found")
        splits[split] = LabelledImages(
            image_files.read_image_files(paths, 3, image_size) if paths else
            np.zeros([0, image_size, image_size, 3], np.uint8),
            np.array([label for label, _ in chosen], np.int64),
            tuple(names[c] for c in members),
            preprocessing=image_files.preprocessing("cub", image_size, 3,
                                                    image_files.IMAGENET_STATS))
    return splits
