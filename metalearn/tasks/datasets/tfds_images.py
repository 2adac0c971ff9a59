"""Any TFDS image-classification data set as few-shot data: a builder's examples by name
and split, grouped by class, with a class split.

``TFDSImages("oxford_flowers102", split="train+validation+test", image_size=84,
split_fractions=(0.6, 0.2, 0.2))`` reads every example of the TFDS split(s) through
tensorflow-datasets (which downloads and prepares the data once, network needed, into
``data_dir``), keeps the image and label features it is told, and returns what every
loader of this package returns: a ``{"train", "validation", "test"}`` mapping of
:class:`LabelledImages` whose classes never overlap, or one :class:`LabelledImages` of
every class when no class split is given (:class:`metalearn.tasks.FewShotClassification`
then splits it).

The class split is made from the label feature's class names (its ``ClassLabel``), not
from the examples read, so it is known (and checked) before any example is read and is
the same on every machine: class lists (by name or by id), fractions of the classes cut
after a shuffle drawn from ``split_seed``, or counts of classes (``split_sizes``), cut in
label order when ``split_seed=None`` (ranges of class ids). Classes with fewer than
``min_examples`` examples in the split read are then left out of their part.

Everything a bad argument can be named from the builder's metadata alone (the builder,
the feature keys and kinds, the image size, the TFDS split where the data are prepared,
the class split) is checked when the object is made, before anything is downloaded or
decoded. Images are decoded, converted and resized inside ``tf.data`` and written into
one preallocated uint8 array (a copy of each image at its final size, no more), then
arranged split by split, class by class, in place; the result is kept in memory for the
rest of the process (``clear_caches``) and on disk (``cache_dir``: the per-user cache
folder by default).
"""

from __future__ import annotations

import difflib
import re
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union

import gin
import numpy as np
import tensorflow as tf
from absl import logging

from metalearn.tasks.datasets import images as image_files
from metalearn.tasks.datasets.base import (SPLIT_NAMES, CacheDir, LabelledImages,
                                           MemoryCache, cache_folder, cached_splits,
                                           split_class_names)

_CACHE = MemoryCache("tfds")  # keyed on the builder's name and version and every option

ClassRef = Union[str, int]


def _tfds():
    import tensorflow_datasets as tfds  # only this loader and the TFDS paths need it
    return tfds


def split_names_of(split: str) -> Tuple[str, ...]:
    """The TFDS split names a split spec reads, e.g. ``("train", "test")`` for
    ``"train[:50%]+test"`` (``"all"`` for every split).

    Raises:
      ValueError: ``split`` is not a TFDS split spec (TFDS's own parser says so).
    """
    if not isinstance(split, str) or not split.strip():
        raise ValueError(f"split must be a TFDS split such as 'train' or 'train+test', "
                         f"got {split!r}")
    try:
        _tfds().core.ReadInstruction.from_spec(split)
    except (ValueError, NotImplementedError) as error:
        raise ValueError(f"split={split!r} is not a TFDS split spec ({error})".split("\n")[0]
                         + "; e.g. 'train', 'train+test', 'train[:80%]'") from None
    return tuple(re.sub(r"\[.*\]$", "", part.strip()) for part in split.split("+"))


def permute_rows(array: np.ndarray, order: np.ndarray) -> None:
    """Reorders ``array``'s rows in place so that row ``i`` becomes the old row
    ``order[i]`` (``order`` a permutation), one spare row at a time: no second copy of
    the array, as ``array[order]`` would make."""
    order = np.asarray(order)
    done = np.zeros(len(order), bool)
    for start in np.flatnonzero(order != np.arange(len(order))):
        if done[start]:
            continue
        spare = array[start].copy()
        i = start
        while True:
            done[i] = True
            j = order[i]
            if j == start:
                array[i] = spare
                break
            array[i] = array[j]
            i = j


@gin.configurable
class TFDSImages:
    """A TFDS image-classification data set as labelled images for few-shot episodes.

    Made cheaply (the builder's metadata only, everything checked); calling it reads the
    data (once per process: the result is cached) and returns a ``{"train",
    "validation", "test"}`` mapping of :class:`LabelledImages` (with a class split), or
    one :class:`LabelledImages` of every class (without). Give the object itself to
    :class:`metalearn.tasks.FewShotClassification` (``FewShotClassification.dataset =
    @TFDSImages()`` in gin) to read the data when the first episode is drawn; the sampler
    checks ``ways`` against :attr:`class_names` before reading.

    Args:
      name: the TFDS builder, as ``tfds.builder`` takes it (``"oxford_flowers102"``,
        ``"cifar100"``, ``"omniglot"``, ``"name/config:version"``).
      split: the TFDS split spec to read, e.g. ``"train"``, ``"train+test"`` (all of
        CIFAR-100's 600 images per class), ``"train[:80%]"``. Few-shot data split
        *classes*: one usually reads every TFDS split and splits the classes.
      image_key: the image feature (a ``tfds.features.Image`` of uint8).
      label_key: the label feature (a ``tfds.features.ClassLabel``); its class names
        name the classes.
      image_size: every image resized to ``image_size x image_size`` (antialiased
        bilinear); ``None`` keeps the builder's size, which must then be fixed.
      channels: 1 (grey) or 3 (RGB); ``None`` keeps the builder's channels.
      train, validation, test: the classes of each part, by class name or by class id
        (``0 ..`` in the label feature's order); classes named nowhere are left out.
      split_fractions: ``(train, validation, test)`` fractions of the classes instead:
        the class names, in label order, are shuffled with ``split_seed`` (NumPy's
        PCG64, the same on every machine) and cut.
      split_sizes: ``(train, validation)`` counts of classes instead (the test part gets
        the rest), shuffled and cut as ``split_fractions``.
      split_seed: the shuffle's seed; ``None`` cuts the classes in label order (with
        ``split_sizes=(64, 16)``: ids 0-63, 64-79, 80 on).
      min_examples: classes with fewer examples in ``split`` are left out of their part
        (after the class split, which never depends on the examples read).
      mean, std: per-channel statistics (images in [0, 1]) for the sampler's
        ``normalize``; ``None`` (default) leaves them out.
      data_dir: TFDS's data folder (TFDS's default when ``None``).
      download: let TFDS download and prepare the data when they are not in
        ``data_dir`` (network needed); ``False`` makes that an error.
      cache_dir: where the decoded arrays are also kept (``.npz`` of plain arrays,
        never unpickled), so that later runs skip decoding: by default the
        per-user cache folder (``$METALEARN_CACHE_DIR``, else ``~/.cache/metalearn``);
        ``False`` keeps none (:func:`~metalearn.tasks.datasets.base.cache_folder`).

    Raises:
      ValueError: an unknown builder (close names listed); a feature key the builder
        lacks (its features listed), or of the wrong kind (an image that is not a uint8
        ``Image``, a label that is not a ``ClassLabel``); images of varying sizes
        without ``image_size``; a TFDS split the prepared data lack (its splits
        listed); an unknown class, class id or a class in two parts.
      FileNotFoundError: (when called) the data are not prepared and
        ``download=False``.
    """

    def __init__(self, name: str = gin.REQUIRED, split: str = "train",
                 image_key: str = "image", label_key: str = "label",
                 image_size: Optional[int] = None, channels: Optional[int] = None,
                 train: Optional[Sequence[ClassRef]] = None,
                 validation: Optional[Sequence[ClassRef]] = None,
                 test: Optional[Sequence[ClassRef]] = None,
                 split_fractions: Optional[Sequence[float]] = None,
                 split_sizes: Optional[Sequence[int]] = None,
                 split_seed: Optional[int] = 0, min_examples: int = 1,
                 mean: Optional[Sequence[float]] = None,
                 std: Optional[Sequence[float]] = None,
                 data_dir: Optional[str] = None, download: bool = True,
                 cache_dir: CacheDir = None):
        tfds = _tfds()
        if not isinstance(name, str) or not name:
            raise ValueError(f"TFDSImages: name must be a TFDS builder name such as "
                             f"'oxford_flowers102', got {name!r}")
        self.name, self.split = name, split
        self.image_key, self.label_key = image_key, label_key
        self.data_dir, self.download, self.cache_dir = data_dir, bool(download), cache_dir
        cache_folder(cache_dir)  # a wrong kind of cache_dir named now; the folder is
        # found when the data are read (METALEARN_CACHE_DIR as it is then)
        self.builder = self._builder(tfds)
        features = self.builder.info.features
        image = self._feature(features, image_key, "image_key", tfds.features.Image,
                              "an image (tfds.features.Image)")
        label = self._feature(features, label_key, "label_key", tfds.features.ClassLabel,
                              "a class label (tfds.features.ClassLabel)")
        if np.dtype(image.np_dtype) != np.uint8:
            raise ValueError(f"TFDS {name!r}: image feature {image_key!r} holds "
                             f"{np.dtype(image.np_dtype).name} images; TFDSImages reads "
                             "uint8 images")
        height, width, have = image.shape
        self.image_size = image_files.check_image_size(image_size, "TFDSImages",
                                                       optional=True)
        if self.image_size is None and (height is None or width is None):
            raise ValueError(f"TFDS {name!r}: image feature {image_key!r} has images of "
                             f"varying sizes (shape {image.shape}); give image_size= to "
                             "resize them all to one size (e.g. 84)")
        if channels is None and have is None:
            raise ValueError(f"TFDS {name!r}: image feature {image_key!r} has a varying "
                             "number of channels; give channels=1 or 3")
        if channels is not None and (isinstance(channels, bool) or channels not in (1, 3)):
            raise ValueError(f"TFDSImages: channels must be 1, 3 or None, got {channels!r}")
        self.channels = int(have if channels is None else channels)
        self._image_channels = have
        self.image_shape = ((self.image_size,) * 2 if self.image_size else
                            (int(height), int(width))) + (self.channels,)
        self._read_splits = split_names_of(split)
        self._check_tfds_split()
        if isinstance(min_examples, bool) or int(min_examples) != min_examples or \
                int(min_examples) < 1:
            raise ValueError(f"TFDSImages: min_examples must be a whole number >= 1, got "
                             f"{min_examples!r}")
        self.min_examples = int(min_examples)
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std (per channel, images in [0, 1]), or "
                             "neither")
        stats = None if mean is None else {"mean": mean, "std": std}
        self.preprocessing = image_files.preprocessing(
            name, self.image_shape[0], self.channels, stats, source="tfds",
            tfds_version=str(self.builder.info.version), tfds_split=split)
        names = tuple(label.names)
        given = {"train": train, "validation": validation, "test": test}
        self._all_names = names
        if all(v is None for v in (train, validation, test, split_fractions, split_sizes)):
            self._parts: Optional[Dict[str, Tuple[str, ...]]] = None
        else:
            given = {s: None if v is None else self._resolve(s, v, names)
                     for s, v in given.items()}
            if any(v is not None for v in given.values()) and \
                    (split_fractions is not None or split_sizes is not None):
                raise ValueError("TFDSImages: give the class split either as class lists "
                                 "(train, validation, test) or as split_fractions or "
                                 "split_sizes, not both")
            self._parts = split_class_names(names, **given, fractions=split_fractions,
                                            seed=split_seed, where=f"TFDS {name!r}",
                                            sizes=split_sizes, keep_order=True)
        self._key = (self.builder.info.full_name, str(data_dir), split, image_key,
                     label_key, self.image_size, self.channels,
                     None if self._parts is None else tuple(sorted(self._parts.items())),
                     self.min_examples, repr(stats))

    # --- checks, from the metadata alone ------------------------------------------

    def _builder(self, tfds):
        try:
            return tfds.builder(self.name, data_dir=self.data_dir)
        except tfds.core.registered.DatasetNotFoundError:
            known = tfds.list_builders(with_community_datasets=False)
            close = difflib.get_close_matches(self.name.split("/")[0].split(":")[0], known,
                                              n=5, cutoff=0.6)
            raise ValueError(f"no TFDS builder named {self.name!r} (TFDSImages name); "
                             f"close names: {close or 'none'}; tfds.list_builders() lists "
                             f"the {len(known)} builders") from None

    def _feature(self, features, key: str, param: str, kind, what: str):
        if key not in features:
            raise ValueError(f"TFDS {self.name!r} has no feature {key!r} ({param}); its "
                             f"features are {sorted(features.keys())}")
        feature = features[key]
        if not isinstance(feature, kind):
            fitting = sorted(k for k in features.keys() if isinstance(features[k], kind))
            raise ValueError(f"TFDS {self.name!r}: feature {key!r} ({param}) is "
                             f"{type(feature).__name__}, not {what}; its features of that "
                             f"kind are {fitting}")
        return feature

    def _check_tfds_split(self) -> None:
        """The TFDS splits read exist, where the metadata say which there are (prepared
        data; before preparation TFDS may not know them yet)."""
        known = sorted(self.builder.info.splits.keys())
        unknown = [s for s in self._read_splits if s != "all" and s not in known]
        if known and unknown:
            raise ValueError(f"TFDS {self.name!r} has no split {unknown[0]!r} (split="
                             f"{self.split!r}); its splits are {known}")

    def _resolve(self, part: str, members: Sequence[ClassRef], names: Sequence[str]
                 ) -> Tuple[str, ...]:
        """Class names of a part given by names or ids."""
        if isinstance(members, (str, int)):
            members = (members,)
        resolved = []
        for member in members:
            if isinstance(member, (int, np.integer)) and not isinstance(member, bool):
                if not 0 <= int(member) < len(names):
                    raise ValueError(f"class id {int(member)} in the {part!r} split is "
                                     f"not one of the {len(names)} classes of TFDS "
                                     f"{self.name!r} (ids 0 to {len(names) - 1} of "
                                     f"{self.label_key!r})")
                resolved.append(names[int(member)])
            else:
                resolved.append(str(member))
        return tuple(resolved)

    @property
    def class_names(self) -> Union[Tuple[str, ...], Dict[str, Tuple[str, ...]]]:
        """The class names of each part (``{"train": ..., ...}``) with a class split,
        else every class name; known before reading. Classes with fewer than
        ``min_examples`` examples are left out when the data are read."""
        return self._all_names if self._parts is None else dict(self._parts)

    def __repr__(self) -> str:
        return f"TFDSImages({self.name!r}, split={self.split!r})"

    # --- reading ------------------------------------------------------------------

    def __call__(self) -> Union[LabelledImages, Mapping[str, LabelledImages]]:
        """The data: ``{"train", "validation", "test"}`` to uint8 :class:`LabelledImages`
        (class-major, labels ``0 ..`` in each part's class order) with a class split,
        else one :class:`LabelledImages` of every class (in label order)."""
        data = _CACHE.get(self._key)
        if data is None:
            parts = SPLIT_NAMES if self._parts is not None else ("all",)
            data = cached_splits(cache_folder(self.cache_dir),
                                 "tfds_" + re.sub(r"\W", "_", self.name), self._key,
                                 self._build, split_names=parts)
            _CACHE[self._key] = data
        return dict(data) if self._parts is not None else data["all"]

    def _build(self) -> Dict[str, LabelledImages]:
        if not self.builder.is_prepared():
            if not self.download:
                raise FileNotFoundError(
                    f"TFDS {self.name!r} is not prepared in {self.builder.data_dir!r}; "
                    "give the data_dir that holds it, or download=True to let TFDS "
                    "download and prepare it (network needed)")
            self.builder.download_and_prepare()
            self._check_tfds_split()  # the splits are known now
        images, labels = self._read()
        return self._arrange(images, labels)

    def _read(self) -> Tuple[np.ndarray, np.ndarray]:
        """Every example of the split, in TFDS's order: images at their final size,
        written into one preallocated array where TFDS says how many there are."""
        tfds = _tfds()
        dataset = self.builder.as_dataset(
            split=self.split, shuffle_files=False,
            decoders=tfds.decode.PartialDecoding({self.image_key: True,
                                                  self.label_key: True}))
        size, channels, have = self.image_size, self.channels, self._image_channels
        image_key, label_key = self.image_key, self.label_key

        def prepare(example):
            image = example[image_key]
            if channels != have:
                image = image_files.convert_channels(image, channels)
            if size is not None:
                image = tf.cond(tf.reduce_all(tf.shape(image)[:2] == size),
                                lambda: image,
                                lambda: image_files.resize_uint8(image, size))
            image = tf.ensure_shape(image, self.image_shape)
            return image, tf.cast(example[label_key], tf.int64)

        count = int(dataset.cardinality())
        batches = dataset.map(prepare, num_parallel_calls=tf.data.AUTOTUNE,
                              deterministic=True).batch(256).prefetch(2)
        where = f"TFDS {self.name!r} split {self.split!r}"
        if count >= 0:
            image_files.check_memory(count, self.image_shape[0], self.channels, where)
            images = np.empty((count,) + self.image_shape, np.uint8)
        chunks, labels, stored = [], [], 0  # stored: rows written into `images`
        for x, y in batches.as_numpy_iterator():
            if count >= 0 and not chunks and stored + len(x) <= count:
                images[stored:stored + len(x)] = x
                stored += len(x)
            else:
                chunks.append(x)
            labels.append(y)
        if not labels:
            raise ValueError(f"{where} holds no examples")
        if count < 0 or chunks or stored != count:  # TFDS did not say, or said wrong
            images = np.concatenate(([images[:stored]] if stored else []) + chunks)
        return images, np.concatenate(labels)

    def _arrange(self, images: np.ndarray, labels: np.ndarray) -> Dict[str, LabelledImages]:
        """The parts as views of one array ordered part by part, class by class (rows
        moved in place)."""
        names = self._all_names
        if labels.min() < 0 or labels.max() >= len(names):
            raise ValueError(f"TFDS {self.name!r}: labels {labels.min()}..{labels.max()} "
                             f"of {self.label_key!r} outside its {len(names)} classes")
        counts = np.bincount(labels, minlength=len(names))
        by_class = np.argsort(labels, kind="stable")  # TFDS's order within a class
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        index = {n: i for i, n in enumerate(names)}
        parts = self._parts if self._parts is not None else {"all": names}
        kept, pieces, left_out = {}, [], []
        for part, members in parts.items():
            ids = [index[n] for n in members]
            kept[part] = [c for c in ids if counts[c] >= self.min_examples]
            left_out += [names[c] for c in ids if 0 < counts[c] < self.min_examples]
            pieces += [by_class[starts[c]:starts[c] + counts[c]] for c in kept[part]]
        if left_out:
            logging.info("TFDS %r: %d classes with fewer than %d examples left out, e.g. "
                         "%s", self.name, len(left_out), self.min_examples, left_out[:5])
        order = np.concatenate(pieces) if pieces else np.zeros([0], np.int64)
        used = len(order)
        rest = np.setdiff1d(np.arange(len(labels)), order, assume_unique=True)
        permute_rows(images, np.concatenate([order, rest]))
        if used < len(images) and images.flags.owndata:
            images.resize((used,) + images.shape[1:], refcheck=False)  # in place
        result, at = {}, 0
        for part, ids in kept.items():
            count = int(counts[ids].sum()) if ids else 0
            result[part] = LabelledImages(
                images[at:at + count], np.repeat(np.arange(len(ids)), counts[ids]),
                tuple(names[c] for c in ids), preprocessing=dict(self.preprocessing))
            at += count
        return result
