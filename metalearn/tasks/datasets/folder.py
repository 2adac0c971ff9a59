"""Any image folder with one sub-folder per class: few-shot learning on one's own images.

    my_images/
      cat/  001.jpg  002.jpg ...
      dog/  a.png    b.png   ...
      ...

Classes are the sub-folders (sorted by name), examples the image files in each (sorted
by name; JPEG, PNG, BMP or GIF, by extension; hidden files and other files are skipped;
an image name that is a dangling symbolic link is an error).
The class split is given by class lists or fractions, and is deterministic.
"""

from __future__ import annotations

import os
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

import gin
import numpy as np

from metalearn.tasks.datasets import images as image_files
from metalearn.repository import data_path
from metalearn.tasks.datasets.base import (CacheDir, LabelledImages, MemoryCache,
                                           cache_folder, cached_splits, select_classes,
                                           source_fingerprint, split_class_names)

_CACHE = MemoryCache("folder")  # keyed on what the data were made from


def list_image_folder(path: str, extensions: Sequence[str] = image_files.IMAGE_EXTENSIONS
                      ) -> Dict[str, Tuple[str, ...]]:
    """``{class name: sorted image files}`` of a folder with one sub-folder per class.

    Raises:
      FileNotFoundError: ``path`` is no folder; an image file is a dangling symbolic
        link (named, with its target).
      ValueError: no class sub-folders, or a class folder without images.
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"image folder {path!r} does not exist; give a folder with "
                                "one sub-folder of images per class")
    classes = sorted(e.name for e in os.scandir(path)
                     if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise ValueError(f"image folder {path!r} has no class sub-folders (it holds "
                         f"{sorted(os.listdir(path))[:10]}); put each class's images in a "
                         "sub-folder named after the class")
    found = {}
    for name in classes:
        folder = os.path.join(path, name)
        named = sorted(f for f in os.listdir(folder) if image_files.is_image_file(f, extensions))
        dangling = [f for f in named if not os.path.exists(os.path.join(folder, f))]
        if dangling:  # an image the user put there and lost: never skipped silently
            link = os.path.join(folder, dangling[0])
            raise FileNotFoundError(
                f"image file {link!r} is a dangling symbolic link (to "
                f"{os.readlink(link)!r}, which does not exist)"
                f"{f'; so are {dangling[1:10]}' if len(dangling) > 1 else ''}: restore "
                "its target or remove the link")
        files = [f for f in named if os.path.isfile(os.path.join(folder, f))]
        if not files:
            raise ValueError(f"class folder {folder!r} holds no image files (extensions "
                             f"{tuple(extensions)}); remove it or add images")
        found[name] = tuple(os.path.join(folder, f) for f in files)
    return found


@gin.configurable
def load_image_folder(path: str = gin.REQUIRED, image_size: Optional[int] = 84,
                      channels: int = 3, train: Optional[Sequence[str]] = None,
                      validation: Optional[Sequence[str]] = None,
                      test: Optional[Sequence[str]] = None,
                      split_fractions: Optional[Sequence[float]] = None,
                      split_seed: int = 0,
                      extensions: Sequence[str] = image_files.IMAGE_EXTENSIONS,
                      mean: Optional[Sequence[float]] = None,
                      std: Optional[Sequence[float]] = None, cache_dir: CacheDir = None
                      ) -> Union[LabelledImages, Mapping[str, LabelledImages]]:
    """The images of a folder with one sub-folder per class.

    Args:
      path: the folder.
      image_size: every image is resized to ``image_size x image_size`` (antialiased);
        ``None`` keeps the sizes, which must then all be equal.
      channels: 3 (RGB) or 1 (grey); images of other channel counts are converted.
      train, validation, test: class (sub-folder) names of each split; classes named
        nowhere are left out.
      split_fractions: ``(train, validation, test)`` fractions instead: the sorted class
        names are shuffled with ``split_seed`` and cut (the same split on every machine).
      split_seed: seed of that shuffle.
      extensions: the file extensions read as images.
      mean, std: per-channel statistics (images in [0, 1]) that the sampler's
        ``normalize`` uses; ``None`` (default) leaves them out.
      cache_dir: where the decoded arrays are also kept (``.npz`` of plain arrays,
        never unpickled), so that later runs skip decoding: by default the
        per-user cache folder (``$METALEARN_CACHE_DIR``, else ``~/.cache/metalearn``);
        ``False`` keeps none (:func:`~metalearn.tasks.datasets.base.cache_folder`).

    Returns:
      Without a split: one ``LabelledImages`` of every class (``FewShotClassification``
      can then split it). With class lists or fractions: ``{"train", "validation",
      "test"}`` to ``LabelledImages`` whose classes never overlap, each labelled from 0.
      Images are uint8 ``[examples, size, size, channels]``.

    Raises:
      FileNotFoundError: ``path`` does not exist.
      ValueError: no class folders, an empty class folder, an undecodable image (named),
        images of different sizes with ``image_size=None``, an unknown class or one in
        two splits.
    """
    path = data_path(path)  # relative: the working directory, else the repository root
    if int(channels) not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    image_size = image_files.check_image_size(image_size, "load_image_folder",
                                              optional=True)
    if (mean is None) != (std is None):
        raise ValueError("give both mean and std (per channel, images in [0, 1]), or neither")
    listing = list_image_folder(path, extensions)
    files = [f for class_files in listing.values() for f in class_files]
    # Cached in memory and on disk by what the files are (name, size, modification
    # time), so an edited folder is read again.
    sources = source_fingerprint(files)
    key = (image_size, int(channels), sources)
    data = _CACHE.get(key)
    if data is None:
        def build():
            labels = np.repeat(np.arange(len(listing)), [len(v) for v in listing.values()])
            return {"all": LabelledImages(
                image_files.read_image_files(files, int(channels), image_size), labels,
                tuple(listing), preprocessing=image_files.preprocessing(
                    "image_folder", image_size, int(channels)))}

        data = cached_splits(cache_folder(cache_dir), "image_folder",
                             (os.path.abspath(path), image_size, int(channels),
                              tuple(extensions)), build, sources, ("all",))["all"]
        _CACHE[key] = data
    if mean is not None or std is not None:
        data = LabelledImages(data.images, data.labels, data.class_names, data.groups,
                              image_files.preprocessing("image_folder", image_size,
                                                        int(channels),
                                                        {"mean": mean, "std": std}))
    if all(v is None for v in (train, validation, test, split_fractions)):
        return data
    names = split_class_names(data.class_names, train, validation, test, split_fractions,
                              split_seed, where=f"image folder {path!r}")
    return {split: select_classes(data, members) for split, members in names.items()}
