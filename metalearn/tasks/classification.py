"""N-way K-shot classification episodes from any labelled image set.

An episode draws ``ways`` classes from one split's classes, then ``shots`` support and
``queries`` query examples of each (all distinct), and relabels the classes
``0 .. ways - 1`` in a random order. Everything is a pure function of the seed
(``tf.random.stateless_*``), so the same seed gives the same episodes on any machine,
and episodes are assembled inside ``tf.data`` from images held in memory.
"""

from __future__ import annotations

import collections
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import gin
import numpy as np
import tensorflow as tf

from metalearn.tasks.augmentation import ImageAugmentation
from metalearn.tasks.base import SPLITS, TaskSampler
from metalearn.tasks.datasets.base import LabelledImages, split_class_names
from metalearn.tasks.episode import Episode

SPLIT_BY = ("class", "group")
IntOrChoices = Union[int, Sequence[int]]


def _choices(name: str, value: IntOrChoices) -> Tuple[int, ...]:
    values = (value,) if np.isscalar(value) else tuple(value)
    if not values or any(int(v) != v or int(v) < 1 for v in values):
        raise ValueError(f"{name} must be a positive integer or a non-empty sequence of "
                         f"them, got {value!r}")
    return tuple(sorted(set(int(v) for v in values)))


class _Names:
    """Class names standing in for a data set not read yet (the class split only)."""

    def __init__(self, class_names: Tuple[str, ...]):
        self.class_names, self.groups = class_names, None


@gin.configurable
class FewShotClassification(TaskSampler):
    """N-way K-shot episodes, with meta-train / validation / test class sets that never
    overlap.

    Classes are split either by class or by group (Omniglot's alphabets: no alphabet in
    two splits), given explicitly by name or drawn by ``split_fractions`` from
    ``split_seed``. Rotations by multiples of 90 degrees make new classes *within* a
    split (a character and its rotations always share a split).

    Each batch holds ``support_x [tasks, ways * shots, H, W, C]`` (float32; uint8
    images are scaled to [0, 1]),
    ``support_y [tasks, ways * shots]`` (int32, labels ``0 .. ways - 1``, class-major),
    and ``query_x``/``query_y`` likewise with ``queries`` per class.

    Args:
      dataset: the labelled images (e.g. ``load_omniglot()``), or a
        ``{split: LabelledImages}`` mapping whose class sets are already separate
        (each split's classes then come from its own data), or a function returning
        either (``@load_omniglot`` in gin): it is then called when first needed, so
        building an experiment does not load its data.
      ways: classes per episode (N), or a sequence of choices: each batch then draws
        one (the same for all its tasks, so a batch keeps one shape).
      shots: support examples per class (K), or a sequence of choices, as ``ways``.
      queries: query examples per class; defaults to ``shots`` (the MAML paper's
        Omniglot protocol).
      train_shots: support examples per class in meta-training (``"train"`` split)
        episodes, or choices, when they differ from the ``shots`` that validation and
        test episodes use (Reptile's 1-shot Omniglot trains on 10 shots); defaults to
        ``shots``.
      split_by: ``"class"`` or ``"group"`` (needs ``dataset.groups``).
      train, validation, test: names of the classes (or groups) in each split. If any
        is given, names given nowhere are left out; otherwise the names are shuffled with
        ``split_seed`` and cut by ``split_fractions``.
      split_fractions: ``(train, validation, test)`` fractions of the names.
      split_sizes: ``(train, validation)`` counts instead (the test split gets the rest),
        e.g. MAML's 1200 training characters.
      split_seed: seed of the shuffle that ``split_fractions`` cuts.
      rotations: rotations in degrees (multiples of 90) that make new classes, e.g.
        ``(0, 90, 180, 270)``; ``(0,)`` for none.
      rotation_splits: the splits that get the rotated classes.
      within_group: draw all of an episode's classes from one group (e.g. 5-way
        within one alphabet).
      max_shift: data augmentation: every image of an episode is translated by a random
        whole number of pixels from ``-max_shift`` to ``max_shift``, rows and columns
        drawn independently per image from the episode's seed (so still reproducible),
        the uncovered border filled with zeros (the background after Omniglot's
        inversion). ``0`` (default) leaves images as they are.
      augment: data augmentation for natural images, e.g. ``ImageAugmentation()``
        (random resized crop, flip, colour jitter): applied to every image of an
        episode of ``augment_splits``, each image drawn from the episode's seed (so,
        like ``max_shift``, reproducible and resumed exactly). ``None`` (default): none.
      augment_splits: the splits whose episodes are augmented (``max_shift`` and
        ``augment``; default meta-training only).
      normalize: subtract the data set's per-channel mean and divide by its standard
        deviation (the ``mean`` and ``std`` in the loader's ``preprocessing``, images in
        [0, 1]), in every split, after augmentation: the standard normalisation of each
        benchmark. ``preprocessing`` then records them, for images of one's own.
    """

    def __init__(self, dataset: Union[LabelledImages, Mapping[str, LabelledImages]] = gin.REQUIRED,
                 ways: IntOrChoices = 5, shots: IntOrChoices = 1,
                 queries: Optional[int] = None, split_by: str = "class",
                 train: Optional[Sequence[str]] = None,
                 validation: Optional[Sequence[str]] = None,
                 test: Optional[Sequence[str]] = None,
                 split_fractions: Sequence[float] = (0.7, 0.1, 0.2),
                 split_sizes: Optional[Sequence[int]] = None, split_seed: int = 0,
                 rotations: Sequence[int] = (0,),
                 rotation_splits: Sequence[str] = SPLITS,
                 within_group: bool = False,
                 train_shots: Optional[IntOrChoices] = None, max_shift: int = 0,
                 augment: Optional[ImageAugmentation] = None,
                 augment_splits: Sequence[str] = ("train",), normalize: bool = False):
        self.ways = _choices("ways", ways)
        self.shots = _choices("shots", shots)
        self.train_shots = self.shots if train_shots is None else _choices("train_shots",
                                                                          train_shots)
        if queries is not None and int(queries) < 1:
            raise ValueError(f"queries must be >= 1, got {queries}")
        if (len(self.shots) > 1 or len(self.train_shots) > 1) and queries is None:
            raise ValueError("with a choice of shots, give queries explicitly")
        self.queries = self.shots[0] if queries is None else int(queries)
        if split_by not in SPLIT_BY:
            raise ValueError(f"split_by must be one of {SPLIT_BY}, got {split_by!r}")
        self.split_by = split_by
        rotations = tuple(int(r) for r in rotations)
        if not rotations or any(r % 90 for r in rotations) or len(set(r % 360 for r in
                                                                      rotations)) != len(rotations):
            raise ValueError("rotations must be distinct multiples of 90 degrees, got "
                             f"{rotations!r}")
        self.rotations = rotations
        for split in rotation_splits:
            if split not in SPLITS:
                raise ValueError(f"rotation_splits must be among {SPLITS}, got {split!r}")
        self.rotation_splits = tuple(rotation_splits)
        self.within_group = bool(within_group)
        if int(max_shift) < 0:
            raise ValueError(f"max_shift must be >= 0 pixels, got {max_shift}")
        self.max_shift = int(max_shift)
        for split in augment_splits:
            if split not in SPLITS:
                raise ValueError(f"augment_splits must be among {SPLITS}, got {split!r}")
        self.augment_splits = tuple(augment_splits)
        if augment is not None and not callable(augment):
            raise TypeError(f"augment must be an ImageAugmentation (or a function of "
                            f"(images, seed)), got {augment!r}")
        self.augment = augment
        self.normalize = bool(normalize)
        self._mean = self._std = None

        if not (isinstance(dataset, (LabelledImages, Mapping)) or callable(dataset)):
            raise TypeError("dataset must be a LabelledImages, a {split: LabelledImages} "
                            f"mapping or a function returning one, got {dataset!r}")
        self._dataset = dataset
        self._given = {"train": train, "validation": validation, "test": test}
        self._split_fractions = split_fractions
        self._split_sizes = split_sizes
        self._split_seed = int(split_seed)
        self._splits: Optional[Dict[str, Dict[str, Any]]] = None
        if not callable(dataset) or isinstance(dataset, (LabelledImages, Mapping)):
            self._prepare()

    def _prepare(self) -> Dict[str, Dict[str, Any]]:
        """Loads the data (once) and builds the class splits."""
        if self._splits is not None:
            return self._splits
        dataset = self._dataset
        if not isinstance(dataset, (LabelledImages, Mapping)):
            with tf.init_scope():  # eagerly, even when first needed inside tf.data
                dataset = dataset()  # a loader given by reference (``@load_omniglot``)
        if isinstance(dataset, LabelledImages):
            data = {s: dataset for s in SPLITS}
            names = self._split_names(dataset, self._given, self._split_fractions,
                                      self._split_sizes, self._split_seed)
        elif isinstance(dataset, Mapping):
            unknown = set(dataset) - set(SPLITS)
            if unknown:
                raise ValueError(f"dataset splits must be among {SPLITS}, got {sorted(unknown)}")
            data = dict(dataset)
            names = {s: None for s in data}  # every class of that split's data
        else:
            raise TypeError("the dataset function must return a LabelledImages or a "
                            f"{{split: LabelledImages}} mapping, got {type(dataset).__name__}")
        first = next(iter(data.values()))
        self.image_shape = tuple(int(d) for d in first.images.shape[1:])
        if self.rotations != (0,) and self.image_shape[0] != self.image_shape[1]:
            raise ValueError(f"rotations need square images, got {self.image_shape}")
        if self.max_shift >= min(self.image_shape[:2]):
            raise ValueError(f"max_shift={self.max_shift} pixels must be smaller than "
                             f"the images' height and width, {self.image_shape[:2]}")
        self._preprocessing: Dict[str, Any] = dict(first.preprocessing)
        self._preprocessing.update(image_shape=self.image_shape, dtype="float32",
                                   rotations=self.rotations,
                                   rotation_splits=self.rotation_splits)
        if first.images.dtype == np.uint8:
            self._preprocessing.update(scale=1 / 255)
        if self.normalize:
            stats = first.preprocessing
            if stats.get("mean") is None or stats.get("std") is None:
                raise ValueError("normalize=True needs the data set's per-channel mean and "
                                 "std in its preprocessing (the benchmark loaders record "
                                 "them; load_image_folder(mean=..., std=...))")
            self._mean = np.asarray(stats["mean"], np.float32)
            self._std = np.asarray(stats["std"], np.float32)
            if self._mean.shape not in ((), (self.image_shape[-1],)) or \
                    self._std.shape != self._mean.shape or np.any(self._std <= 0):
                raise ValueError(f"mean {stats['mean']} and std {stats['std']} must have "
                                 f"one value per channel ({self.image_shape[-1]}), std > 0")
            self._preprocessing.update(normalize=True, mean=tuple(self._mean.tolist()),
                                       std=tuple(self._std.tolist()))
        splits = {s: self._build_split(s, data[s], names[s]) for s in data}
        self._splits = splits
        for split in splits:
            self._check_feasible(split)
        return splits

    @property
    def preprocessing(self) -> Dict[str, Any]:
        """How the images were prepared (size, inversion, ...) and their shape: what
        images of one's own need before :meth:`Learner.adapt` on a trained run."""
        self._prepare()
        return dict(self._preprocessing)

    @property
    def class_names(self) -> Dict[str, Tuple[str, ...]]:
        """The class names of each split (rotated classes named ``.../rot90`` ...)."""
        return {s: tuple(v["names"]) for s, v in self._prepare().items()}

    def pool(self, split: str) -> Dict[str, np.ndarray]:
        """``split``'s pool of classes as episodes draw from it, one entry per class and
        rotation (a rotated class is a class of its own): ``pool_class [entries]`` (the
        entry's class, ``0 ..`` in the split's order), ``pool_rotation [entries]`` (its
        quarter turns), and per class ``counts`` (examples) and ``offsets`` (the first
        example's index among the split's stored examples, which :meth:`examples` reads;
        a class's examples are stored together). The data are loaded first if need be."""
        info = self._prepare()[split]
        return {key: info[key] for key in ("pool_class", "pool_rotation", "counts", "offsets")}

    # --- construction ------------------------------------------------------------

    def _split_names(self, dataset, given, fractions, sizes, seed):
        if self.split_by == "group":
            if dataset.groups is None:
                raise ValueError("split_by='group' needs a data set with groups "
                                 "(e.g. Omniglot's alphabets); this one has none")
            universe = sorted(set(dataset.groups))
        else:
            universe = list(dataset.class_names)
        if any(v is not None for v in given.values()):
            fractions = sizes = None  # the names given decide
        elif sizes is not None:
            fractions = None
        return split_class_names(universe, **given, fractions=fractions, seed=seed,
                                 sizes=sizes, kind=self.split_by, keep_order=True)

    def _build_split(self, split, dataset: LabelledImages, names) -> Dict[str, Any]:
        if tuple(dataset.images.shape[1:]) != self.image_shape:
            raise ValueError(f"split {split!r} has images of shape {dataset.images.shape[1:]}"
                             f", others {self.image_shape}")
        if names is None:
            classes = list(range(dataset.num_classes))
        elif self.split_by == "group":
            wanted = set(names)
            classes = [c for c, g in enumerate(dataset.groups) if g in wanted]
        else:
            index = {n: c for c, n in enumerate(dataset.class_names)}
            classes = [index[n] for n in names]
        classes = sorted(classes)
        by_class = collections.defaultdict(list)
        for i, label in enumerate(np.asarray(dataset.labels)):
            by_class[int(label)].append(i)
        classes = [c for c in classes if by_class[c]]
        rotations = self.rotations if split in self.rotation_splits else (0,)
        counts = np.array([len(by_class[c]) for c in classes], np.int32)
        order = np.concatenate([by_class[c] for c in classes]) if classes else np.zeros([0], int)
        # Stored class by class; data already so (TFDSImages') are kept as a view.
        contiguous = len(order) > 0 and bool(np.all(np.diff(order) == 1))
        stored = (dataset.images[order[0]:order[-1] + 1] if contiguous else
                  dataset.images[order] if classes else dataset.images[:0])
        offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
        groups = dataset.groups if dataset.groups is not None else [""] * dataset.num_classes
        group_names = sorted(set(groups[c] for c in classes))
        group_ids = np.array([group_names.index(groups[c]) for c in classes], np.int32)
        # A pool entry is (class, rotation): rotated characters are new classes.
        pool_class = np.repeat(np.arange(len(classes), dtype=np.int32), len(rotations))
        pool_rotation = np.tile(np.array([r // 90 % 4 for r in rotations], np.int32),
                                len(classes))
        pool_names = [dataset.class_names[classes[c]] + (f"/rot{rotations[i % len(rotations)]}"
                                                         if rotations != (0,) else "")
                      for i, c in enumerate(pool_class)]
        return {
            "names": pool_names, "groups": [groups[classes[c]] for c in pool_class],
            "images": stored,
            "counts": counts, "offsets": offsets, "pool_class": pool_class,
            "pool_rotation": pool_rotation, "pool_group": group_ids[pool_class],
            "num_groups": len(group_names), "min_count": int(counts.min()) if classes else 0,
        }

    def _check_feasible(self, split: str) -> None:
        info = self._splits[split]
        if not info["names"]:
            return  # an empty split raises when sampled from
        shots = max(self._shots_of(split))
        needed = shots + self.queries
        if info["min_count"] < needed:
            small = [info["names"][i] for i in np.flatnonzero(info["pool_class"] ==
                                                              np.argmin(info["counts"]))][:1]
            raise ValueError(f"{shots} shots + {self.queries} queries need "
                             f"{needed} examples per class, but class {small[0]!r} of the "
                             f"{split!r} split has {info['min_count']}")

    def _pool_size(self, split: str) -> int:
        info = self._prepare()[split]
        if self.within_group:
            sizes = np.bincount(info["pool_group"], minlength=info["num_groups"])
            return int(sizes.max()) if sizes.size else 0
        return len(info["names"])

    def num_classes(self, split: str = "train") -> int:
        """Classes (rotated ones included) that episodes of ``split`` draw from."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        info = self._prepare().get(split)
        return len(info["names"]) if info else 0

    def check_split(self, split: str) -> None:
        """See :meth:`TaskSampler.check_split`: the split's name, its classes (the data
        loaded first) and ``ways`` against them."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if self._splits is None:
            self._check_ways_before_loading(split)
        splits = self._prepare()
        if split not in splits or not splits[split]["names"]:
            raise ValueError(f"the {split!r} split has no classes; give it some (e.g. "
                             f"FewShotClassification.{split} = [...])")
        available = self._pool_size(split)
        if max(self.ways) > available:
            where = "in its largest group" if self.within_group else "in all"
            raise ValueError(f"ways={max(self.ways)} is more than the {available} classes "
                             f"the {split!r} split has {where}")

    def _check_ways_before_loading(self, split: str) -> None:
        """``ways`` against the classes of ``split`` where a data function given by
        reference says its class names before reading (``TFDSImages.class_names``), so
        that too few classes are named before a long load; the check after loading
        (:meth:`check_split`) stays the one that counts classes with examples."""
        known = getattr(self._dataset, "class_names", None)
        if known is None or self.within_group or \
                isinstance(self._dataset, (LabelledImages, Mapping)):
            return
        if isinstance(known, Mapping):
            names = known.get(split, ())
        elif self.split_by == "class":
            names = self._split_names(_Names(tuple(known)), self._given,
                                      self._split_fractions, self._split_sizes,
                                      self._split_seed)[split]
        else:
            return
        classes = len(names) * (len(self.rotations) if split in self.rotation_splits
                                else 1)
        if classes and max(self.ways) > classes:
            raise ValueError(f"ways={max(self.ways)} is more than the {classes} classes "
                             f"the {split!r} split has in all (of {self._dataset!r}, "
                             "before reading it)")

    # --- sampling ----------------------------------------------------------------

    def dataset(self, num_tasks: int, seed: int = 0, split: str = "train", **kwargs
                ) -> tf.data.Dataset:
        """See :meth:`TaskSampler.dataset`; loads the data and checks the split first, so
        that errors surface here rather than inside ``tf.data``."""
        self.check_split(split)
        return super().dataset(num_tasks, seed=seed, split=split, **kwargs)

    def sample(self, seed: tf.Tensor, num_tasks: int, split: str = "train") -> Episode:
        self.check_split(split)
        seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 3)
        ways = self._draw(seeds[0], self.ways, 0)
        shots = self._draw(seeds[0], self._shots_of(split), 1)
        return self._sample(seeds[1], seeds[2], int(num_tasks), split, ways, shots)

    def _shots_of(self, split: str) -> Sequence[int]:
        return self.train_shots if split == "train" else self.shots

    @staticmethod
    def _draw(seed, choices, salt):
        if len(choices) == 1:
            return choices[0]
        index = tf.random.stateless_uniform(
            [], tf.random.experimental.stateless_fold_in(seed, salt), maxval=len(choices),
            dtype=tf.int32)
        return tf.gather(tf.constant(choices, tf.int32), index)

    def _sample(self, class_seed, example_seed, num_tasks, split, ways, shots) -> Episode:
        info = self._splits[split]
        # Stored as given (uint8 stays uint8: a quarter of the memory), converted per
        # episode: uint8 to [0, 1] floats.
        pool_class = tf.constant(info["pool_class"])
        pool_size = len(info["names"])
        # Classes: the top-`ways` of uniform scores is a uniformly random ordered subset,
        # so label j (0 .. ways-1) goes to a random class.
        scores = tf.random.stateless_uniform([num_tasks, pool_size], class_seed)
        if self.within_group:
            group_seed = tf.random.experimental.stateless_fold_in(class_seed, 1)
            sizes = np.bincount(info["pool_group"], minlength=info["num_groups"])
            eligible = tf.constant(np.flatnonzero(sizes >= max(self.ways)), tf.int32)
            pick = tf.random.stateless_uniform([num_tasks], group_seed,
                                               maxval=tf.size(eligible), dtype=tf.int32)
            group = tf.gather(eligible, pick)                          # [tasks]
            same = tf.equal(tf.constant(info["pool_group"])[None, :], group[:, None])
            scores = tf.where(same, scores, -1.0)
        chosen = tf.math.top_k(scores, k=ways).indices                # [tasks, ways]
        classes = tf.gather(pool_class, chosen)
        rotation = tf.gather(tf.constant(info["pool_rotation"]), chosen)
        # Examples: `shots + queries` distinct ones per class (top-k of uniform scores,
        # positions past the class's count masked out).
        per_class = shots + self.queries
        counts = tf.gather(tf.constant(info["counts"]), classes)       # [tasks, ways]
        max_count = int(info["counts"].max())
        position = tf.range(max_count)[None, None, :]
        draws = tf.random.stateless_uniform([num_tasks, ways, max_count], example_seed)
        draws = tf.where(position < counts[..., None], draws, -1.0)
        within = tf.math.top_k(draws, k=per_class).indices             # [tasks, ways, K+Q]
        index = tf.gather(tf.constant(info["offsets"]), classes)[..., None] + within
        x = self.examples(split, index, rotation[..., None], example_seed)
        # x: [tasks, ways, K+Q, H, W, C]
        labels = tf.broadcast_to(tf.range(ways, dtype=tf.int32)[None, :, None],
                                 tf.shape(index))
        def flatten(t, start, size):
            part = t[:, :, start:start + size]
            return tf.reshape(part, tf.concat([[num_tasks, -1], tf.shape(t)[3:]], 0))

        support_x, query_x = flatten(x, 0, shots), flatten(x, shots, self.queries)
        support_y, query_y = flatten(labels, 0, shots), flatten(labels, shots, self.queries)
        if isinstance(ways, int) and isinstance(shots, int):  # static shapes when fixed
            support_x = tf.ensure_shape(support_x, (num_tasks, ways * shots) + self.image_shape)
            query_x = tf.ensure_shape(query_x, (num_tasks, ways * self.queries) + self.image_shape)
            support_y = tf.ensure_shape(support_y, (num_tasks, ways * shots))
            query_y = tf.ensure_shape(query_y, (num_tasks, ways * self.queries))
        return Episode(support_x, support_y, query_x, query_y)


    def examples(self, split: str, index: tf.Tensor, quarter_turns: tf.Tensor,
                 seed: tf.Tensor) -> tf.Tensor:
        """The images ``[..., H, W, C]`` (float32) of ``split``'s stored examples
        ``index [...]``, as episodes serve them: scaled to [0, 1] from uint8, rotated
        by ``quarter_turns`` (broadcast to ``index``; where the split has rotations),
        shifted and augmented from ``seed`` (in ``augment_splits``), normalised. What
        the episode sampler and whole-class batches (``WholeClassBatches``) both serve."""
        stored = self._prepare()[split]["images"]                     # [examples, H, W, C]
        x = _gather_images(stored, index)                              # [..., H, W, C]
        x = tf.cast(x, tf.float32) / 255.0 if stored.dtype == np.uint8 else tf.cast(
            x, tf.float32)
        if self.rotations != (0,) and split in self.rotation_splits:
            x = _rotate(x, tf.broadcast_to(quarter_turns, tf.shape(index)))
        if self.max_shift and split in self.augment_splits:
            x = _shift(x, self.max_shift, tf.random.experimental.stateless_fold_in(seed, 1))
        if self.augment is not None and split in self.augment_splits:
            shape = tf.shape(x)
            flat = tf.reshape(x, tf.concat([[-1], shape[-3:]], 0))   # [images, H, W, C]
            flat = self.augment(flat, tf.random.experimental.stateless_fold_in(seed, 2))
            x = tf.reshape(flat, shape)
        if self.normalize:
            x = (x - self._mean) / self._std
        return x


MAX_CONSTANT_BYTES = 1 << 30
"""Image pools up to this size are graph constants; larger ones (tiered-ImageNet's 9.5 GB
of training images) are gathered by NumPy, since a graph cannot hold a constant over
2 GB."""


def _gather_images(images: np.ndarray, index: tf.Tensor) -> tf.Tensor:
    """``images[index]`` for an in-memory pool, as a graph constant when it is small
    enough, else by ``tf.numpy_function`` (the same values, no copy of the pool)."""
    if images.nbytes <= MAX_CONSTANT_BYTES:
        return tf.gather(tf.constant(images), index)
    gathered = tf.numpy_function(lambda i: images[i], [index], tf.as_dtype(images.dtype),
                                 stateful=False)
    return tf.ensure_shape(gathered, index.shape.concatenate(images.shape[1:]))


def _rotate(x: tf.Tensor, quarter_turns: tf.Tensor) -> tf.Tensor:
    """Rotates each image of ``x [..., H, W, C]`` (H == W) counter-clockwise by
    ``quarter_turns [...]`` times 90 degrees."""
    flat = tf.reshape(x, tf.concat([[-1], tf.shape(x)[-3:]], 0))
    turns = tf.reshape(quarter_turns, [-1])
    options = tf.stack([tf.image.rot90(flat, k) for k in range(4)], axis=1)  # [n, 4, H, W, C]
    rotated = tf.gather(options, turns, batch_dims=1)
    return tf.reshape(rotated, tf.shape(x))


def _shift(x: tf.Tensor, max_shift: int, seed: tf.Tensor) -> tf.Tensor:
    """Translates each image of ``x [..., H, W, C]`` by random whole pixels in
    ``[-max_shift, max_shift]`` (rows and columns independently), filling with zeros."""
    shape = tf.shape(x)
    flat = tf.reshape(x, tf.concat([[-1], shape[-3:]], 0))
    height, width = shape[-3], shape[-2]
    pad = [[0, 0], [max_shift, max_shift], [max_shift, max_shift], [0, 0]]
    padded = tf.pad(flat, pad)                       # [n, H + 2s, W + 2s, C]
    offsets = tf.random.stateless_uniform([tf.shape(flat)[0], 2], seed,
                                          maxval=2 * max_shift + 1, dtype=tf.int32)
    rows = offsets[:, :1] + tf.range(height)[None]   # [n, H]
    cols = offsets[:, 1:] + tf.range(width)[None]    # [n, W]
    cropped = tf.gather(padded, rows, axis=1, batch_dims=1)
    cropped = tf.gather(cropped, cols, axis=2, batch_dims=1)
    return tf.reshape(cropped, shape)


@gin.configurable
def rotate(images: Any, degrees: int) -> tf.Tensor:
    """Rotates ``[..., H, W, C]`` images counter-clockwise by ``degrees`` (a multiple of
    90), as the sampler makes rotated classes."""
    if int(degrees) % 90:
        raise ValueError(f"degrees must be a multiple of 90, got {degrees}")
    return tf.image.rot90(tf.convert_to_tensor(images), int(degrees) // 90 % 4)
