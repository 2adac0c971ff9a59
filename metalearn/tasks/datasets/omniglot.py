"""Omniglot (Lake et al., 2015): from the published zips, or through TFDS when online.

Two ways in, one result (a :class:`LabelledImages` with a class per character, named
``"<Alphabet>/characterNN"``, grouped by alphabet):

* :func:`load_omniglot` with ``source="zip"`` reads the dataset's published archives
  (``images_background.zip``, ``images_evaluation.zip``,
  ``images_background_small1.zip``, ``images_background_small2.zip``) from a local
  folder with ``zipfile`` and ``tf.io.decode_png``; no network is needed.
* ``source="tfds"`` goes through tensorflow-datasets' ``omniglot`` builder (splits
  ``train`` = background, ``test`` = evaluation, ``small1``, ``small2``), which
  downloads the same archives.

Each archive of a published name is checked against its published size and SHA-256
before it is read (:mod:`metalearn.tasks.datasets.checksums`; ``verify_checksums=False``
reads it unchecked).

The MAML paper's preprocessing is applied to both: resize to 28x28 (antialiased) and
invert so that strokes are 1 and the background 0. Rotations by multiples of 90 degrees
as new classes belong to the class split, so they are an option of the episode sampler
(:class:`metalearn.tasks.FewShotClassification`), which keeps a character and its
rotations in the same split.

Decoded arrays are cached in memory per (source, path, archives, preprocessing), and on
disk as ``.npz`` files of plain arrays in ``cache_dir``: by default the per-user cache
folder (:func:`metalearn.tasks.datasets.base.default_cache_dir`), so that a later run
skips decoding the zips.
"""

from __future__ import annotations

import hashlib
import os
import re
import zipfile
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gin
import numpy as np
import tensorflow as tf

from metalearn.tasks.datasets import checksums
from metalearn.repository import data_path
from metalearn.tasks.datasets.base import (CacheDir, LabelledImages, MemoryCache,
                                           cache_folder, cached_splits, source_fingerprint)
from metalearn.tasks.datasets.images import check_image_size

ARCHIVES = ("images_background", "images_evaluation", "images_background_small1",
            "images_background_small2")
"""The published archives, each ``<name>.zip`` holding ``<name>/<Alphabet>/characterNN/``."""

TFDS_SPLITS = {"images_background": "train", "images_evaluation": "test",
               "images_background_small1": "small1", "images_background_small2": "small2"}
"""The TFDS ``omniglot`` split that holds each archive."""

MINIMAL_SPLIT = {
    "train": ("Balinese", "Early_Aramaic", "Greek", "Korean", "Latin"),
    "test": ("Japanese_(katakana)", "Sanskrit", "Tagalog"),
}
"""Alphabets of the ready split of the minimal data: meta-train on ``small1``, meta-test
on the ``small2`` alphabets that ``small1`` lacks (no alphabet shared)."""

ORIGINAL_SIZE = 105
_PNG = re.compile(r"^([^/]+)/([^/]+)/(character\d+)/(\d+)_(\d+)\.png$")
_CACHE = MemoryCache("omniglot")  # keyed on what the data were made from


def preprocess(images: Any, image_size: Optional[int] = 28, invert: bool = True) -> tf.Tensor:
    """The MAML paper's Omniglot preprocessing of raw images.

    Args:
      images: ``[examples, height, width, channels]`` (or one ``[height, width,
        channels]`` image), uint8 in [0, 255] or float in [0, 1], white background.
        Colour images are reduced to their first channel.
      image_size: side of the square output (antialiased Lanczos resize), or ``None``
        to keep the size.
      invert: map strokes to 1 and background to 0.

    Returns:
      float32 images ``[..., image_size, image_size, 1]`` in [0, 1].
    """
    images = tf.convert_to_tensor(images)
    if images.dtype == tf.uint8:
        images = tf.cast(images, tf.float32) / 255.0
    images = tf.cast(images, tf.float32)[..., :1]
    if image_size is not None:
        image_size = check_image_size(image_size, "Omniglot preprocess")
        images = tf.clip_by_value(tf.image.resize(images, (int(image_size),) * 2,
                                                  method="lanczos3", antialias=True),
                                  0.0, 1.0)
    return 1.0 - images if invert else images


def _check_archives(archives: Sequence[str]) -> Tuple[str, ...]:
    archives = (archives,) if isinstance(archives, str) else tuple(archives)
    if not archives:
        raise ValueError("archives must name at least one of " f"{ARCHIVES}")
    for name in archives:
        if name not in ARCHIVES:
            raise ValueError(f"unknown Omniglot archive {name!r}; expected one of {ARCHIVES}")
    return archives


def _assemble(records: List[Tuple[str, str, np.ndarray]], preprocessing: Dict[str, Any],
              image_size: Optional[int], invert: bool) -> LabelledImages:
    """``records``: (alphabet, character, raw image [H, W, 1] uint8), any order.

    Classes are ordered by name and the drawings of a character by a digest of their
    pixels: TFDS keeps no drawer id, and this order makes both sources give identical
    arrays (so the same seed gives the same episodes from either).
    """
    seen: Dict[str, int] = {}
    kept = [(f"{alphabet}/{character}", hashlib.sha1(image.tobytes()).hexdigest(), alphabet,
             image) for alphabet, character, image in records]
    kept.sort(key=lambda r: r[:2])
    names, groups, labels, raw = [], [], [], []
    for name, _, alphabet, image in kept:
        if name not in seen:
            seen[name] = len(names)
            names.append(name)
            groups.append(alphabet)
        labels.append(seen[name])
        raw.append(image)
    if not raw:
        raise ValueError("no Omniglot images found")
    images = tf.data.Dataset.from_tensor_slices(np.stack(raw)).batch(512).map(
        lambda x: preprocess(x, image_size, invert), num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True)
    array = np.concatenate([b.numpy() for b in images])
    return LabelledImages(array, np.asarray(labels, np.int32), tuple(names), tuple(groups),
                          preprocessing=preprocessing)


def _decode_png(zf: zipfile.ZipFile, file: str, entry: str) -> np.ndarray:
    """One PNG of an archive as ``[H, W, 1]`` uint8; a damaged entry names the file."""
    try:
        data = zf.read(entry)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as error:
        raise ValueError(f"Omniglot archive {file!r} is damaged: entry {entry!r} cannot "
                         f"be read ({error}); download it again") from error
    try:
        return tf.io.decode_png(data, channels=1).numpy()
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as error:
        raise ValueError(f"{entry!r} in {file!r} is not a decodable PNG image "
                         f"({error.message.splitlines()[0] if error.message else error})"
                         ) from error


def _read_zips(path: str, archives: Sequence[str], verify_checksums: bool = True):
    if not os.path.isdir(path):
        raise FileNotFoundError(f"Omniglot folder {path!r} does not exist; give the folder "
                                f"holding {', '.join(a + '.zip' for a in archives)}")
    records, seen = [], set()
    for archive in archives:
        file = os.path.join(path, archive + ".zip")
        if not os.path.isfile(file):
            raise FileNotFoundError(f"Omniglot archive {file!r} not found (folder {path!r} "
                                    f"holds {sorted(os.listdir(path))})")
        if verify_checksums:
            checksums.verify(file, "omniglot", "Omniglot archive", "load_omniglot")
        here = set()
        try:
            zf = zipfile.ZipFile(file)
        except (zipfile.BadZipFile, OSError) as error:
            raise ValueError(f"Omniglot archive {file!r} is not a readable zip file "
                             f"({error}); download it again") from error
        with zf:
            entries = sorted(zf.namelist())
            if not any(_PNG.match(entry) for entry in entries):
                pngs = [e for e in entries if e.lower().endswith(".png")]
                shown = (pngs or entries)[:3]
                raise ValueError(
                    f"Omniglot archive {file!r} has none of the expected entries "
                    f"'{archive}/<Alphabet>/characterNN/NNNN_NN.png'; it holds "
                    f"{len(entries)} entries ({len(pngs)} PNG), e.g. {shown}: use the "
                    "published archive (github.com/brendenlake/omniglot), not a repacked one")
            for entry in entries:
                match = _PNG.match(entry)
                if not match:
                    continue
                _, alphabet, character, _, _ = match.groups()
                name = f"{alphabet}/{character}"
                if name in seen:  # the same character from an earlier archive
                    continue
                here.add(name)
                records.append((alphabet, character, _decode_png(zf, file, entry)))
        seen |= here
    return records


def _read_tfds(archives: Sequence[str], data_dir: Optional[str], download: bool):
    import tensorflow_datasets as tfds  # imported here: only this path needs it

    builder = tfds.builder("omniglot", data_dir=data_dir)
    if download:
        builder.download_and_prepare()
    records, seen = [], set()
    for archive in archives:
        here = set()
        examples = builder.as_dataset(split=TFDS_SPLITS[archive])
        alphabet_names = builder.info.features["alphabet"].names
        for example in tfds.as_numpy(examples):
            alphabet = alphabet_names[int(example["alphabet"])]
            character = f"character{int(example['alphabet_char_id']) + 1:02d}"
            name = f"{alphabet}/{character}"
            if name in seen:
                continue
            here.add(name)
            records.append((alphabet, character, example["image"][..., :1]))
        seen |= here
    return records


@gin.configurable
def load_omniglot(path: Optional[str] = None,
                  archives: Sequence[str] = ("images_background_small1",
                                             "images_background_small2"),
                  source: str = "zip", image_size: Optional[int] = 28, invert: bool = True,
                  cache_dir: CacheDir = None, data_dir: Optional[str] = None,
                  download: bool = True, verify_checksums: bool = True) -> LabelledImages:
    """Omniglot characters as labelled images, one class per character.

    Args:
      path: folder holding the published zips (``source="zip"``).
      archives: which archives (by name without ``.zip``, see :data:`ARCHIVES`); a
        character present in several (``small1``/``small2`` share Greek and Latin) is
        taken from the first that has it.
      source: ``"zip"`` (local archives, no network) or ``"tfds"`` (tensorflow-datasets'
        ``omniglot`` builder, which downloads when needed).
      image_size: output side (MAML: 28), or ``None`` for the original 105.
      invert: strokes 1, background 0 (MAML's convention).
      cache_dir: where the decoded arrays are also kept (``.npz`` of plain arrays,
        never unpickled), so that later runs skip decoding: by default the
        per-user cache folder (``$METALEARN_CACHE_DIR``, else ``~/.cache/metalearn``);
        ``False`` keeps none (:func:`~metalearn.tasks.datasets.base.cache_folder`).
      data_dir, download: TFDS's data folder, and whether to download and prepare.
      verify_checksums: check each archive's size and SHA-256 against the published
        figures (:data:`checksums.PUBLISHED`, hashed once per file and process) before
        reading it; ``False`` reads archives unchecked (a repacked or patched copy).
        Arrays decoded from unchecked archives are cached apart from checked ones.

    Returns:
      ``LabelledImages`` with float32 images ``[examples, size, size, 1]`` in [0, 1],
      class names ``"<Alphabet>/characterNN"``, groups = alphabets, and the
      preprocessing in ``.preprocessing``.

    Raises:
      FileNotFoundError: ``path`` or an archive in it does not exist.
      ValueError: an unknown archive, source or image size.
      checksums.ChecksumError: an archive (a ``ValueError``) that is not the published
        file (size or SHA-256), unless ``verify_checksums=False``.
    """
    path = data_path(path)  # relative: the working directory, else the repository root
    archives = _check_archives(archives)
    if source not in ("zip", "tfds"):
        raise ValueError(f"source must be 'zip' or 'tfds', got {source!r}")
    if source == "zip" and path is None:
        raise ValueError("load_omniglot(source='zip') needs path=<folder with the zips>")
    image_size = check_image_size(image_size, "load_omniglot", optional=True)
    preprocessing = {"dataset": "omniglot", "image_size": image_size or ORIGINAL_SIZE,
                     "invert": bool(invert), "channels": 1, "range": (0.0, 1.0)}
    where = os.path.abspath(path) if source == "zip" else str(data_dir)
    key = (source, where, archives, image_size, bool(invert))
    if source == "zip" and not verify_checksums:
        key += ("unverified",)  # never served to a checked load
    cache_dir = cache_folder(cache_dir)
    # What the arrays are made from (the archives' sizes and times): a cache, in memory
    # or on disk, of other files is never served. TFDS's data are versioned by TFDS.
    sources = source_fingerprint([os.path.join(where, a + ".zip") for a in archives]
                                 if source == "zip" else [], exclude=cache_dir)
    if (key, sources) in _CACHE:
        return _CACHE[key, sources]

    def build():
        records = (_read_zips(path, archives, verify_checksums) if source == "zip"
                   else _read_tfds(archives, data_dir, download))
        return {"all": _assemble(records, preprocessing, image_size, invert)}

    data = cached_splits(cache_dir, "omniglot", key, build, sources, ("all",))["all"]
    _CACHE[key, sources] = data
    return data
