"""CIFAR-FS (Bertinetto et al., 2019) and FC100 (Oreshkin et al., 2018) from CIFAR-100.

Both use all 600 32x32 images of each CIFAR-100 class (TFDS's ``train`` and ``test``
splits together) and split the 100 classes:

* CIFAR-FS: 64 / 16 / 20 classes, drawn at random by Bertinetto et al. (R2-D2); the
  published class lists are :data:`CIFAR_FS_SPLIT`.
* FC100: by superclass, 12 / 4 / 4 superclasses (60 / 20 / 20 classes), so test classes
  are far from training ones (TADAM); the published superclass lists are
  :data:`FC100_SPLIT`.

Read through tensorflow-datasets' ``cifar100`` builder, which downloads the data once
(network needed) into ``data_dir``; an already prepared ``data_dir`` needs none.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

import gin
import numpy as np

from metalearn.tasks.datasets import images as image_files
from metalearn.tasks.datasets.base import (CacheDir, LabelledImages, MemoryCache,
                                           cache_folder, cached_splits, check_split_sizes)

CIFAR100_LABELS = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle",
    "bottle", "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle",
    "caterpillar", "cattle", "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch",
    "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant", "flatfish", "forest",
    "fox", "girl", "hamster", "house", "kangaroo", "keyboard", "lamp", "lawn_mower",
    "leopard", "lion", "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain",
    "mouse", "mushroom", "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear",
    "pickup_truck", "pine_tree", "plain", "plate", "poppy", "porcupine", "possum", "rabbit",
    "raccoon", "ray", "road", "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk",
    "skyscraper", "snail", "snake", "spider", "squirrel", "streetcar", "sunflower",
    "sweet_pepper", "table", "tank", "telephone", "television", "tiger", "tractor", "train",
    "trout", "tulip", "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm")
"""CIFAR-100's fine label names, in label order (``fine_label_names.txt``)."""

CIFAR100_SUPERCLASSES = (
    "aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables",
    "household_electrical_devices", "household_furniture", "insects", "large_carnivores",
    "large_man-made_outdoor_things", "large_natural_outdoor_scenes",
    "large_omnivores_and_herbivores", "medium_mammals", "non-insect_invertebrates",
    "people", "reptiles", "small_mammals", "trees", "vehicles_1", "vehicles_2")
"""CIFAR-100's coarse label names, in label order (``coarse_label_names.txt``)."""

CIFAR_FS_SPLIT = {
    "train": (
        "dolphin", "seal", "aquarium_fish", "ray", "trout", "orchid", "sunflower", "tulip",
        "bottle", "bowl", "can", "cup", "plate", "apple", "mushroom", "orange", "pear",
        "clock", "keyboard", "chair", "couch", "bee", "caterpillar", "cockroach", "bear",
        "lion", "tiger", "wolf", "bridge", "castle", "house", "road", "skyscraper", "cloud",
        "forest", "mountain", "elephant", "kangaroo", "porcupine", "possum", "raccoon",
        "skunk", "lobster", "spider", "boy", "girl", "dinosaur", "lizard", "snake", "turtle",
        "hamster", "mouse", "rabbit", "shrew", "squirrel", "oak_tree", "palm_tree",
        "pine_tree", "willow_tree", "bus", "train", "lawn_mower", "streetcar", "tank"),
    "validation": (
        "beaver", "otter", "flatfish", "shark", "lamp", "television", "beetle", "butterfly",
        "sea", "camel", "cattle", "crab", "crocodile", "maple_tree", "motorcycle",
        "tractor"),
    "test": (
        "whale", "poppy", "rose", "sweet_pepper", "telephone", "bed", "table", "wardrobe",
        "leopard", "plain", "chimpanzee", "fox", "snail", "worm", "baby", "man", "woman",
        "bicycle", "pickup_truck", "rocket"),
}
"""Bertinetto et al.'s CIFAR-FS class split (the R2-D2 repository's split files)."""

FC100_SPLIT = {
    "train": ("fish", "flowers", "food_containers", "fruit_and_vegetables",
              "household_electrical_devices", "household_furniture",
              "large_man-made_outdoor_things", "large_natural_outdoor_scenes", "reptiles",
              "trees", "vehicles_1", "vehicles_2"),
    "validation": ("large_carnivores", "large_omnivores_and_herbivores",
                   "non-insect_invertebrates", "small_mammals"),
    "test": ("aquatic_mammals", "insects", "medium_mammals", "people"),
}
"""Oreshkin et al.'s FC100 superclass split (superclasses 1-6, 9, 10, 15, 17-19 / 8, 11,
13, 16 / 0, 7, 12, 14)."""

_CACHE = MemoryCache("cifar")  # keyed on what the data were made from


def _cifar100(data_dir: Optional[str], download: bool,
              cache_dir: CacheDir = None) -> LabelledImages:
    """Every CIFAR-100 image (TFDS ``train`` then ``test``, in TFDS's order), labelled by
    its fine class (:data:`CIFAR100_LABELS`), each class's group its superclass (``""``
    for a class without images); kept in memory and in ``cache_dir``."""
    key = (str(data_dir), bool(download))
    if key in _CACHE:
        return _CACHE[key]

    def build():
        import tensorflow_datasets as tfds  # only this loader needs it
        images, fine, coarse = [], [], []
        for split in ("train", "test"):
            dataset = tfds.load("cifar100", split=split, data_dir=data_dir,
                                download=download)
            for batch in tfds.as_numpy(dataset.batch(10_000)):
                images.append(batch["image"])
                fine.append(batch["label"])
                coarse.append(batch["coarse_label"])
        if not images:
            raise ValueError("tfds.load('cifar100') returned no examples")
        fine, coarse = np.concatenate(fine).astype(np.int64), np.concatenate(coarse)
        superclass = dict(zip(fine.tolist(), coarse.tolist()))
        groups = tuple(CIFAR100_SUPERCLASSES[superclass[i]] if i in superclass else ""
                       for i in range(len(CIFAR100_LABELS)))
        return {"all": LabelledImages(np.concatenate(images).astype(np.uint8), fine,
                                      CIFAR100_LABELS, groups)}

    # TFDS's data are versioned by TFDS: the folder is the key
    data = cached_splits(cache_folder(cache_dir), "cifar100", ("tfds", str(data_dir)),
                         build, split_names=("all",))["all"]
    _CACHE[key] = data
    return data


def _splits(data: LabelledImages, class_names: Mapping[str, Sequence[str]], name: str
            ) -> Dict[str, LabelledImages]:
    fine = data.labels
    splits = {}
    for split, names in class_names.items():
        ids = [CIFAR100_LABELS.index(n) for n in names]
        relabel = np.full(len(CIFAR100_LABELS), -1, np.int64)
        relabel[ids] = np.arange(len(ids))
        keep = np.flatnonzero(relabel[fine] >= 0)
        keep = keep[np.argsort(relabel[fine[keep]], kind="stable")]  # class-major
        splits[split] = LabelledImages(
            data.images[keep], relabel[fine[keep]], tuple(names),
            tuple(data.groups[i] for i in ids),
            preprocessing=image_files.preprocessing(name, 32, 3, image_files.CIFAR100_STATS))
    return splits


@gin.configurable
def load_cifar_fs(data_dir: Optional[str] = None, download: bool = True,
                  cache_dir: CacheDir = None) -> Mapping[str, LabelledImages]:
    """CIFAR-FS: ``{"train", "validation", "test"}`` with 64 / 16 / 20 CIFAR-100 classes
    of 600 uint8 ``[32, 32, 3]`` images each (groups: the superclasses).

    Args:
      data_dir: TFDS's data folder (TFDS's default when ``None``).
      download: let TFDS download and prepare ``cifar100`` when it is not there.
      cache_dir: where the decoded arrays are also kept (``.npz`` of plain arrays,
        never unpickled), so that later runs skip decoding: by default the
        per-user cache folder (``$METALEARN_CACHE_DIR``, else ``~/.cache/metalearn``);
        ``False`` keeps none (:func:`~metalearn.tasks.datasets.base.cache_folder`).
        One cache of CIFAR-100 serves both CIFAR-FS and FC100.
    """
    splits = _splits(_cifar100(data_dir, download, cache_dir), CIFAR_FS_SPLIT, "cifar_fs")
    check_split_sizes(splits, {"train": 64, "validation": 16, "test": 20}, "CIFAR-FS",
                      "TFDS cifar100")
    return splits


@gin.configurable
def load_fc100(data_dir: Optional[str] = None, download: bool = True,
               cache_dir: CacheDir = None) -> Mapping[str, LabelledImages]:
    """FC100: ``{"train", "validation", "test"}`` with the classes of 12 / 4 / 4
    CIFAR-100 superclasses (60 / 20 / 20 classes, 600 uint8 ``[32, 32, 3]`` images each;
    groups: the superclasses).

    Args:
      data_dir, download, cache_dir: as for :func:`load_cifar_fs`.
    """
    data = _cifar100(data_dir, download, cache_dir)
    members: Dict[str, list] = {}
    for f in sorted(set(data.labels.tolist())):
        members.setdefault(data.groups[f], []).append(CIFAR100_LABELS[f])
    class_names = {split: tuple(n for s in supers for n in members.get(s, ()))
                   for split, supers in FC100_SPLIT.items()}
    splits = _splits(data, class_names, "fc100")
    check_split_sizes(splits, {"train": 60, "validation": 20, "test": 20}, "FC100",
                      "TFDS cifar100")
    return splits
