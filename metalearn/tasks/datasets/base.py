"""A labelled data set held in memory: what every classification loader returns."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from metalearn import atomic


class MemoryCache(dict):
    """A loader's in-process cache of decoded data (a dict keyed on what the data were
    made from), registered so that :func:`clear_caches` empties every loader's at once."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        _MEMORY_CACHES.append(self)

    def __repr__(self) -> str:
        return f"MemoryCache({self.name!r}, {len(self)} entries)"


_MEMORY_CACHES: list = []


def clear_caches() -> None:
    """Empties every loader's in-process cache of decoded data, so that the next load
    reads (and checks) the files again, as a new process would. The on-disk caches
    (``cache_dir``) are kept: they are keyed on the files' fingerprints and rebuilt
    when a file changes."""
    for cache in _MEMORY_CACHES:
        cache.clear()


def folder_contents(folder: str):
    """What ``folder`` holds (sorted names), or ``"no such folder"``: for errors."""
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else "no such folder"


def require_file(file: str, what: str, hint: str = "") -> None:
    """Raises ``FileNotFoundError`` naming ``what``, the file and what its folder holds,
    unless ``file`` exists."""
    if not os.path.isfile(file):
        folder = os.path.dirname(file)
        raise FileNotFoundError(f"{what} {file!r} not found (folder {folder!r} holds "
                                f"{folder_contents(folder)}){hint}")


@dataclasses.dataclass(frozen=True)
class LabelledImages:
    """Decoded examples with integer class labels, ready for episode samplers.

    Attributes:
      images: ``[examples, height, width, channels]`` array (uint8 or float32).
      labels: ``[examples]`` integer class ids in ``0 .. len(class_names) - 1``.
      class_names: a name per class id (e.g. ``"Greek/character03"`` or ``"7"``).
      groups: optional ``[classes]`` group name per class (Omniglot's alphabet), for
        splits by group.
      preprocessing: how the images were made from the raw data (e.g. ``{"image_size":
        28, "invert": True}``), so that a trained run can prepare new images the same way.
    """

    images: np.ndarray
    labels: np.ndarray
    class_names: Sequence[str]
    groups: Optional[Sequence[str]] = None
    preprocessing: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if len(self.images) != len(self.labels):
            raise ValueError(f"{len(self.images)} images but {len(self.labels)} labels")
        if self.images.ndim != 4:
            raise ValueError("images must be [examples, height, width, channels], got "
                             f"shape {self.images.shape}")
        if len(self.labels) and (self.labels.min() < 0 or
                                 self.labels.max() >= len(self.class_names)):
            raise ValueError(f"labels must lie in [0, {len(self.class_names)}), got "
                             f"[{self.labels.min()}, {self.labels.max()}]")
        if self.groups is not None and len(self.groups) != len(self.class_names):
            raise ValueError(f"{len(self.groups)} groups for {len(self.class_names)} classes")

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


SPLIT_NAMES = ("train", "validation", "test")


def split_class_names(names: Sequence[str], train: Optional[Sequence[str]] = None,
                      validation: Optional[Sequence[str]] = None,
                      test: Optional[Sequence[str]] = None,
                      fractions: Optional[Sequence[float]] = None,
                      seed: Optional[int] = 0,
                      where: str = "the data set", *, sizes: Optional[Sequence[int]] = None,
                      kind: str = "class", keep_order: bool = False
                      ) -> Dict[str, Tuple[str, ...]]:
    """Class names per split, given by lists or cut by fractions or sizes (deterministic):
    the one class split, of the image loaders and of :class:`FewShotClassification`.

    Args:
      names: every class name of the data (or group name: ``kind="group"``).
      train, validation, test: the names in each split; names given nowhere are left
        out. A name in two splits or unknown to ``names`` is an error.
      fractions: ``(train, validation, test)`` fractions instead (default ``(0.7, 0.1,
        0.2)``): the sorted names are shuffled with ``seed`` (NumPy's PCG64, the same on
        every machine) and cut.
      seed: the shuffle's seed; ``None`` cuts the names unshuffled, in their order
        (sorted, or as given with ``keep_order``): ranges of classes.
      where: what the names come from, for error messages (a folder, a file).
      sizes: ``(train, validation)`` counts instead of fractions (the test split gets
        the rest).
      kind: what a name is, for error messages (``"class"``, ``"group"``).
      keep_order: shuffle ``names`` in their own order instead of sorted (duplicates
        kept).

    Returns:
      ``{"train": names, "validation": names, "test": names}`` (given order kept; cut
      splits in shuffled order).
    """
    known = set(names)
    given = {"train": train, "validation": validation, "test": test}
    if any(v is not None for v in given.values()):
        if fractions is not None or sizes is not None:
            raise ValueError(f"give the split either as {kind} lists or as "
                             f"{'fractions' if sizes is None else 'sizes'}, not both")
        owner: Dict[str, str] = {}
        result = {}
        for split, members in given.items():
            members = tuple(members or ())
            unknown = sorted(set(members) - known)
            if unknown:
                raise ValueError(f"unknown {kind} {unknown[:10]} in the {split!r} split; "
                                 f"{where} has {sorted(known)[:20]}"
                                 f"{' ...' if len(known) > 20 else ''}")
            for name in members:
                if name in owner:
                    raise ValueError(f"{kind} {name!r} is in both the {owner[name]!r} and "
                                     f"the {split!r} split")
                owner[name] = split
            result[split] = members
        return result
    ordered = list(names) if keep_order else sorted(known)
    if sizes is not None:
        if fractions is not None:
            raise ValueError("give the split either as fractions or as sizes, not both")
        sizes = tuple(int(n) for n in sizes)
        if len(sizes) != 2 or min(sizes) < 0 or sum(sizes) > len(ordered):
            raise ValueError("split_sizes must be (train, validation) counts summing to at "
                             f"most the {len(ordered)} {kind}s, got {sizes!r}")
        cuts = np.cumsum(sizes)
    else:
        fractions = tuple(float(f) for f in (fractions or (0.7, 0.1, 0.2)))
        if len(fractions) != 3 or min(fractions) < 0 or not 0.999 <= sum(fractions) <= 1.001:
            raise ValueError("split_fractions must be 3 non-negative numbers summing to 1, "
                             f"got {fractions!r}")
        cuts = np.round(np.cumsum(fractions) * len(ordered)).astype(int)
    shuffled = ordered if seed is None else \
        [ordered[i] for i in np.random.default_rng(int(seed)).permutation(len(ordered))]
    return {"train": tuple(shuffled[:cuts[0]]),
            "validation": tuple(shuffled[cuts[0]:cuts[1]]),
            "test": tuple(shuffled[cuts[1]:])}


def select_classes(data: LabelledImages, names: Sequence[str]) -> LabelledImages:
    """The examples of the classes ``names`` only, relabelled ``0 .. len(names) - 1`` in
    the order given (groups and preprocessing kept)."""
    index = {name: i for i, name in enumerate(data.class_names)}
    missing = [n for n in names if n not in index]
    if missing:
        raise ValueError(f"unknown classes {missing[:10]}")
    new_label = np.full([data.num_classes], -1, np.int64)
    for i, name in enumerate(names):
        new_label[index[name]] = i
    mapped = new_label[np.asarray(data.labels)]
    keep = np.flatnonzero(mapped >= 0)
    groups = None if data.groups is None else tuple(data.groups[index[n]] for n in names)
    return LabelledImages(data.images[keep], mapped[keep], tuple(names), groups,
                          preprocessing=dict(data.preprocessing))


Example = Tuple[str, str, str]
"""An example as :func:`check_split_sizes` checks it: ``(what it is, its class, the
file that puts it there)``, e.g. ``("image 'n0153282900000005.jpg'", "n01532829",
"/data/mini/train.csv")``."""


def check_split_sizes(splits: Mapping[str, LabelledImages], expected: Mapping[str, int],
                      what: str, files: str,
                      examples: Optional[Mapping[str, Sequence[Example]]] = None) -> None:
    """The loaders' one validation of splits: each split's class count is the canonical
    one (a truncated or mismatched split file), no class is in two splits, and, given
    ``examples`` (per split, each example as an :data:`Example`), no example is in two
    classes or two splits (a test image also listed for training, two classes of the
    same images). Errors name ``files`` (and the files of both places an example is).

    Raises:
      ValueError: any of these.
    """
    for split, count in expected.items():
        found = splits[split].num_classes
        if found != count:
            raise ValueError(f"{what}: the {split!r} split has {found} classes, the "
                             f"canonical split has {count} ({files}); pass strict=False "
                             "to load another split anyway")
    owner: Dict[str, str] = {}
    for split, data in splits.items():
        for name in data.class_names:
            if name in owner:
                raise ValueError(f"{what}: class {name!r} is in both the {owner[name]!r} "
                                 f"and the {split!r} split ({files})")
            owner[name] = split
    if examples is not None:
        _check_examples_unique(examples, what)


def _check_examples_unique(examples: Mapping[str, Sequence[Example]], what: str) -> None:
    seen: Dict[str, Tuple[str, str, str]] = {}
    for split, members in examples.items():
        for example, name, source in members:
            place = (split, name, source)
            if example not in seen:
                seen[example] = place
                continue
            first = seen[example]
            describe = lambda p: f"class {p[1]!r} of the {p[0]!r} split ({p[2]!r})"
            if first[:2] == place[:2]:
                raise ValueError(f"{what}: {example} is listed twice in {describe(place)}")
            raise ValueError(
                f"{what}: {example} is in both {describe(first)} and {describe(place)}; "
                "an example belongs to one class of one split (a test example seen in "
                "training, or two classes of the same examples, would silently inflate "
                "accuracy): fix the split files")


def source_fingerprint(sources: Sequence[str], exclude: Optional[str] = None) -> str:
    """What data were made from, as a digest: the path, size and modification time of
    every file of ``sources`` (files, and folders walked through; hidden files skipped;
    a missing source recorded as missing), sorted. Part of every data cache's key, in
    memory and on disk, so that a cache is never served after its data files change.
    Costs a ``stat`` per file, no reading.

    Args:
      sources: the files and folders a loader reads.
      exclude: a folder left out of the walk (the cache's own, if inside a source).
    """
    import hashlib
    skip = os.path.abspath(os.path.expanduser(exclude)) if exclude else None
    entries = []

    def add(file: str) -> None:
        status = os.stat(file)
        entries.append(f"{file}\0{status.st_size}\0{status.st_mtime_ns}")

    for source in sorted(os.path.abspath(s) for s in sources):
        if os.path.isfile(source):
            add(source)
        elif os.path.isdir(source):
            for folder, subfolders, names in os.walk(source):
                subfolders[:] = sorted(d for d in subfolders if not d.startswith(".") and
                                       os.path.join(folder, d) != skip)
                for file in sorted(n for n in names if not n.startswith(".")):
                    add(os.path.join(folder, file))
        else:
            entries.append(f"{source}\0missing")
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


CACHE_DIR_ENV = "METALEARN_CACHE_DIR"
"""The environment variable naming the folder of the loaders' on-disk cache of decoded
arrays (:func:`default_cache_dir`); set but empty, it turns that cache off."""

CacheDir = Union[str, "os.PathLike[str]", bool, None]
"""A loader's ``cache_dir`` argument: ``None`` (or ``True``) for the default folder, a
folder, or ``False`` (or ``""``) for no disk cache (:func:`cache_folder`)."""


def default_cache_dir() -> Optional[str]:
    """The per-user folder where the loaders keep decoded arrays unless told otherwise:
    ``$METALEARN_CACHE_DIR`` if set (set but empty: ``None``, no disk cache), else
    ``$XDG_CACHE_HOME/metalearn`` (an absolute ``XDG_CACHE_HOME``), else
    ``~/.cache/metalearn``; ``None`` too when there is no home folder to put it in.
    Read at every load, so a change of the variable applies to the next load.

    Returns:
      An absolute folder (not necessarily existing yet), or ``None``.
    """
    value = os.environ.get(CACHE_DIR_ENV)
    if value is not None:
        return os.path.abspath(os.path.expanduser(value)) if value else None
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset, empty or relative: ignored (XDG's rule)
        home = os.path.expanduser("~")
        if not os.path.isabs(home):  # no HOME and no password entry
            return None
        base = os.path.join(home, ".cache")
    return os.path.join(base, "metalearn")


def cache_folder(cache_dir: CacheDir = None) -> Optional[str]:
    """The folder a loader's ``cache_dir`` argument names, as an absolute path, or
    ``None`` for no disk cache.

    Args:
      cache_dir: ``None`` or ``True``: :func:`default_cache_dir`; ``False`` or ``""``:
        no disk cache; a folder (``~`` expanded).

    Raises:
      TypeError: ``cache_dir`` is none of these.
    """
    if cache_dir is None or cache_dir is True:
        return default_cache_dir()
    if cache_dir is False:
        return None
    folder = os.fspath(cache_dir) if isinstance(cache_dir, (str, os.PathLike)) else None
    if not isinstance(folder, str):
        raise TypeError(f"cache_dir must be a folder, None, True or False, got {cache_dir!r}")
    return os.path.abspath(os.path.expanduser(folder)) if folder else None


def write_cache(file: str, name: str, **arrays: np.ndarray) -> bool:
    """Keeps ``arrays`` in the cache file ``file`` (one ``.npz`` of plain arrays,
    written atomically: :func:`metalearn.atomic.write`), its folder made if missing.

    A cache is only a shortcut: one that cannot be written (a full disk, no permission,
    a read-only folder) is logged as a warning naming ``file`` and the reason, and the
    data already built are used all the same; nothing is lost to it.

    Returns:
      Whether the cache was written.
    """
    import io
    from absl import logging
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    try:
        os.makedirs(os.path.dirname(file) or ".", exist_ok=True)
        atomic.write(file, buffer.getvalue())
    except OSError as error:
        logging.warning("%s cache not kept (the data are used all the same): %s; set %s "
                        "to a writable folder, or to an empty value for no disk cache",
                        name, error, CACHE_DIR_ENV)
        return False
    logging.info("%s: decoded arrays kept in %s (%.1f MB) for later runs", name, file,
                 buffer.tell() / 1e6)
    return True


def _read_cache_file(file: str, name: str, sources: str) -> Optional[LabelledImages]:
    """One split from a cache file; ``None`` if the file cannot be opened (logged) or
    was made from other data files than ``sources``.

    Raises:
      ValueError: the file is damaged or not a cache of plain arrays (named).
    """
    import json
    import zipfile
    from absl import logging
    try:
        handle = open(file, "rb")
    except OSError as error:  # no permission: a cache is only a shortcut
        logging.warning("%s cache %s cannot be read (%s): decoding the data instead",
                        name, file, error)
        return None
    try:
        with handle, np.load(handle, allow_pickle=False) as saved:
            groups = saved["groups"].tolist()
            data = LabelledImages(
                saved["images"], saved["labels"], tuple(saved["class_names"].tolist()),
                tuple(groups) if saved["has_groups"] else None,
                preprocessing={k: tuple(v) if isinstance(v, list) else v for k, v
                               in json.loads(str(saved["preprocessing"])).items()})
            made_from = str(saved["sources"]) if "sources" in saved else None
    except (ValueError, OSError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"{name} cache file {file!r} is damaged or not a cache of "
                         f"plain arrays ({type(error).__name__}: {error}); delete it to "
                         "rebuild it from the data") from error
    if made_from != sources:  # read first: a damaged cache is named all the same
        logging.info("%s cache %s was made from other data files than those there now: "
                     "rebuilding it", name, file)
        return None
    return data


def cached_splits(cache_dir: Optional[str], name: str, key: Any, build,
                  sources: str = "", split_names: Sequence[str] = SPLIT_NAMES
                  ) -> Dict[str, LabelledImages]:
    """``build()``'s ``{split: LabelledImages}``, kept in ``cache_dir`` as one ``.npz`` of
    plain arrays per split (read back with ``allow_pickle=False``: a cache never runs
    code), named by a digest of ``key`` (the loader's parameters); ``cache_dir=None``
    always builds. The one on-disk cache of every loader that decodes: a loader turns
    its ``cache_dir`` argument into the folder with :func:`cache_folder` (the per-user
    default unless told otherwise).

    A file that cannot be opened is logged and the data are decoded; one that cannot be
    written is logged (:func:`write_cache`) and the data are used all the same.

    Args:
      cache_dir: the folder (:func:`cache_folder`), or ``None`` for no disk cache.
      name: the loader's name, the files' prefix and the errors' subject.
      key: what, besides the files, the arrays are made from (the loader's parameters).
      build: makes the ``{split: LabelledImages}`` when there is no cache to serve.
      sources: :func:`source_fingerprint` of the files the data are made from; a cache
        made from other files (changed since) is rebuilt, never served.
      split_names: the keys of ``build()``'s mapping, a file each (``("all",)`` for a
        loader of one ``LabelledImages``).

    Raises:
      ValueError: a cache file is damaged or not a cache of plain arrays (named: delete
        it to rebuild it).
    """
    import hashlib
    import json
    if cache_dir is None:
        return build()
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    files = {s: os.path.join(cache_dir, f"{name}_{digest}_{s}.npz") for s in split_names}
    if all(os.path.isfile(f) for f in files.values()):
        splits: Optional[Dict[str, LabelledImages]] = {}
        for split, file in files.items():
            data = _read_cache_file(file, name, sources)
            if data is None:
                splits = None
                break
            splits[split] = data
        if splits is not None:
            return splits
    splits = build()
    for split, data in splits.items():
        kept = write_cache(files[split], name, images=data.images, labels=data.labels,
                           class_names=np.asarray(data.class_names, dtype=str),
                           groups=np.asarray(data.groups or [""] * data.num_classes,
                                             dtype=str),
                           has_groups=np.asarray(data.groups is not None),
                           preprocessing=np.asarray(json.dumps(dict(data.preprocessing))),
                           sources=np.asarray(sources))
        if not kept:  # the other files would fail alike: one warning
            break
    return splits
