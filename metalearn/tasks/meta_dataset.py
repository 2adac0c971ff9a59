"""Meta-Dataset's variable-way, variable-shot episodes (Triantafillou et al., 2020),
padded to one shape so a batch of them runs in one compiled step.

Each episode comes from one source, drawn uniformly from the split's sources. Its
classes are drawn from that source's split: ILSVRC's through its WordNet DAG (an inner
node whose leaves number ``min_ways`` to 392, uniformly; its leaves, at most
``max_ways`` of them), Omniglot's within one alphabet (ways uniform in ``[min_ways,
min(max_ways, classes of the alphabet)]``), any other source's uniformly (ways uniform
in ``[min_ways, min(max_ways, classes)]``). Then, as in the paper (Sec. 3.2 and its
appendix):

- queries per class ``q = min(max_query, min over the episode's classes of
  floor(images / 2))``;
- support set size ``min(sum_c floor(beta * min(max_support_per_class, images_c - q) +
  1), max_support_set_size)``, ``beta ~ U(0, 1)``;
- shots of class ``c``: ``min(floor(p_c * (size - ways)) + 1, images_c - q)`` with
  ``p_c`` proportional to ``images_c * exp(U(log 0.5, log 2))``.

Every draw is a function of the episode's seed (NumPy's PCG64 seeded from the stream's
stateless seed), so a stream is the same on any machine and resumes exactly. Records
are read from disk and decoded per episode
(:meth:`~metalearn.tasks.datasets.meta_dataset.RecordReader.decode`), where each image's
file and record are known: one that does not decode is named by both.

Episodes are padded to ``max_support_set_size`` support and ``max_ways * max_query``
query examples; their labels are :class:`~metalearn.tasks.episode.MaskedLabels`, which
the learners honour (losses and metrics over the real examples, the task's absent
classes out of the softmax, prototypes and BatchNorm moments over the real examples).
"""

from __future__ import annotations

import math
import os
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import gin
import numpy as np
import tensorflow as tf

from metalearn.repository import data_path
from metalearn.tasks.base import SPLITS, TaskSampler
from metalearn.tasks.datasets.base import folder_contents, require_file
from metalearn.tasks.datasets.images import check_image_size, check_memory
from metalearn.tasks.datasets.meta_dataset import (RecordReader, SourceSpec,
                                                   load_meta_dataset_source)
from metalearn.tasks.episode import PADDING, Episode, MaskedLabels

MD_V1 = {  # Triantafillou et al. (2020): train on 8 sources, test on all 10
    "train": ("ilsvrc_2012", "omniglot", "aircraft", "cu_birds", "dtd", "quickdraw",
              "fungi", "vgg_flower"),
    "validation": ("ilsvrc_2012", "omniglot", "aircraft", "cu_birds", "dtd", "quickdraw",
                   "fungi", "vgg_flower"),
    "test": ("ilsvrc_2012", "omniglot", "aircraft", "cu_birds", "dtd", "quickdraw",
             "fungi", "vgg_flower", "traffic_sign", "mscoco"),
}
MD_V2 = {  # Dumoulin et al. (2021), VTAB+MD: ILSVRC train-only (ilsvrc_2012_v2), no VGG Flower
    "train": ("ilsvrc_2012_v2", "omniglot", "aircraft", "cu_birds", "dtd", "quickdraw",
              "fungi"),
    "validation": ("omniglot", "aircraft", "cu_birds", "dtd", "quickdraw", "fungi",
                   "mscoco"),
    "test": ("omniglot", "aircraft", "cu_birds", "dtd", "quickdraw", "fungi",
             "traffic_sign", "mscoco"),
}
PROTOCOLS = {"v1": MD_V1, "v2": MD_V2}
MAX_SPANNING_LEAVES = 392  # ILSVRC inner nodes spanning more leaves are never drawn


@gin.configurable
class MetaDataset(TaskSampler):
    """Meta-Dataset episodes from the converted records (one folder per source under
    ``root``, each with ``dataset_spec.json`` and ``<class id>.tfrecords``).

    Each batch holds ``support_x [tasks, max_support_set_size, image_size, image_size,
    3]`` and ``query_x [tasks, max_ways * max_query, ...]`` (float32 in ``[-1, 1]``, as
    Meta-Dataset's decoder; zeros where padded) and ``support_y``/``query_y`` as
    :class:`~metalearn.tasks.episode.MaskedLabels` (labels ``0 .. ways - 1``, class-major,
    in a random class order).

    Args:
      root: the folder holding the converted sources.
      protocol: ``"v1"`` (MD-v1: train on ILSVRC, Omniglot, Aircraft, Birds, Textures,
        QuickDraw, Fungi, VGG Flower; test on those and Traffic Signs, MSCOCO) or
        ``"v2"`` (MD-v2: ``ilsvrc_2012_v2`` for training only, no VGG Flower).
      train_sources, validation_sources, test_sources: the sources of a split instead
        of the protocol's (e.g. ``test_sources=("omniglot",)`` to evaluate one source:
        Meta-Dataset reports each test source separately).
      min_ways, max_ways: the range of ways (5 and 50 in the paper).
      max_query: queries per class at most (10).
      max_support_set_size: support examples per episode at most (500).
      max_support_per_class: a class's contribution to the support set size at most (100).
      min_log_weight, max_log_weight: range of the log-weights that skew the shots per
        class (``log 0.5``, ``log 2``).
      image_size: images are resized to it (84; 126 for the best published settings).
      use_dag_hierarchy, use_bilevel_hierarchy: draw ILSVRC's classes through its DAG,
        Omniglot's within an alphabet (the paper's protocol), where the spec has them.
    """

    def __init__(self, root: str = gin.REQUIRED, protocol: str = "v1",
                 train_sources: Optional[Sequence[str]] = None,
                 validation_sources: Optional[Sequence[str]] = None,
                 test_sources: Optional[Sequence[str]] = None,
                 min_ways: int = 5, max_ways: int = 50, max_query: int = 10,
                 max_support_set_size: int = 500, max_support_per_class: int = 100,
                 min_log_weight: float = math.log(0.5), max_log_weight: float = math.log(2),
                 image_size: int = 84, use_dag_hierarchy: bool = True,
                 use_bilevel_hierarchy: bool = True):
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {tuple(PROTOCOLS)}, got {protocol!r}")
        given = {"train": train_sources, "validation": validation_sources,
                 "test": test_sources}
        self.sources = {s: tuple(given[s]) if given[s] is not None else PROTOCOLS[protocol][s]
                        for s in SPLITS}
        for name, value, low in (("min_ways", min_ways, 2), ("max_query", max_query, 1),
                                 ("max_support_per_class", max_support_per_class, 1)):
            if int(value) != value or int(value) < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if int(max_ways) < int(min_ways):
            raise ValueError(f"max_ways ({max_ways}) must be >= min_ways ({min_ways})")
        if int(max_support_set_size) < int(max_ways):
            raise ValueError(f"max_support_set_size ({max_support_set_size}) must be >= "
                             f"max_ways ({max_ways}): every class needs a support example")
        if not float(min_log_weight) <= float(max_log_weight):
            raise ValueError(f"min_log_weight ({min_log_weight}) must be <= max_log_weight "
                             f"({max_log_weight})")
        self.root = str(data_path(root))  # relative: see metalearn.repository.data_path
        self.min_ways, self.max_ways = int(min_ways), int(max_ways)
        self.max_query = int(max_query)
        self.max_support_set_size = int(max_support_set_size)
        self.max_support_per_class = int(max_support_per_class)
        self.log_weights = (float(min_log_weight), float(max_log_weight))
        self.image_size = check_image_size(image_size, "MetaDataset")
        self.use_dag_hierarchy = bool(use_dag_hierarchy)
        self.use_bilevel_hierarchy = bool(use_bilevel_hierarchy)
        self.max_query_set_size = self.max_ways * self.max_query
        self.ways = tuple(range(self.min_ways, self.max_ways + 1))  # what a model must output
        self._specs: Dict[str, SourceSpec] = {}
        self._readers: Dict[str, RecordReader] = {}
        self._pools: Dict[Tuple[str, str], List[Tuple[int, ...]]] = {}

    # --- sources and their class pools ------------------------------------------

    def source(self, name: str) -> SourceSpec:
        """The spec of source ``name`` (read once)."""
        if name not in self._specs:
            folder = os.path.join(self.root, name)
            if not os.path.isdir(folder):
                raise FileNotFoundError(
                    f"Meta-Dataset source folder {folder!r} not found (root {self.root!r} "
                    f"holds {folder_contents(self.root)}); convert it with Meta-Dataset's "
                    "dataset_conversion, or choose the sources (MetaDataset.train_sources...)")
            self._specs[name] = load_meta_dataset_source(folder)
            self._readers[name] = RecordReader(self._specs[name])
        return self._specs[name]

    def classes(self, split: str = "train") -> Dict[str, Tuple[int, ...]]:
        """``{source: class ids}`` of ``split``, over its sources."""
        return {name: self.source(name).splits[split] for name in self._split(split)}

    def num_classes(self, split: str = "train") -> int:
        """Classes that episodes of ``split`` draw from, over all its sources."""
        return sum(len(ids) for ids in self.classes(split).values())

    def _split(self, split: str) -> Tuple[str, ...]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return self.sources[split]

    def _pool(self, name: str, split: str) -> List[Tuple[int, ...]]:
        """The class sets an episode of ``name``'s ``split`` draws its classes from: the
        DAG's eligible nodes, the alphabets, or one set of all the split's classes."""
        key = (name, split)
        if key in self._pools:
            return self._pools[key]
        spec = self.source(name)
        ids = spec.splits[split]
        where = f"the {split!r} split of Meta-Dataset source {name!r} ({spec.path})"
        if not ids:
            raise ValueError(f"{where} has no classes; leave the source out of the split "
                             f"(MetaDataset.{split}_sources)")
        if self.use_dag_hierarchy and spec.nodes is not None:
            pool = [n for n in spec.nodes[split]
                    if self.min_ways <= len(n) <= MAX_SPANNING_LEAVES]
            if not pool:
                raise ValueError(f"{where}: no node of its DAG spans {self.min_ways} to "
                                 f"{MAX_SPANNING_LEAVES} classes (min_ways={self.min_ways})")
        elif self.use_bilevel_hierarchy and spec.superclasses is not None:
            pool = list(spec.superclasses[split])
            small = [spec.superclass_names[split][i] for i, members in enumerate(pool)
                     if len(members) < self.min_ways]
            if small:
                raise ValueError(f"{where}: superclass {small[0]!r} has fewer than "
                                 f"min_ways={self.min_ways} classes")
        else:
            if len(ids) < self.min_ways:
                raise ValueError(f"{where} has {len(ids)} classes, fewer than "
                                 f"min_ways={self.min_ways}")
            pool = [ids]
        for class_id in ids:  # found missing here, not inside tf.data
            require_file(spec.class_file(class_id), f"Meta-Dataset class file of class "
                         f"{class_id} ({spec.class_names[class_id]!r})")
        few = [c for members in pool for c in members if spec.images_per_class[c] < 2]
        if few:
            raise ValueError(f"{where}: class {few[0]} ({spec.class_names[few[0]]!r}) has "
                             f"{spec.images_per_class[few[0]]} image; episodes need >= 2 "
                             "per class (one support, one query)")
        self._pools[key] = pool
        return pool

    def check_split(self, split: str) -> None:
        """See :meth:`TaskSampler.check_split`: the split's sources, each read."""
        names = self._split(split)
        if not names:
            raise ValueError(f"the {split!r} split has no sources (MetaDataset.{split}_sources)")
        for name in names:
            self._pool(name, split)

    # --- one episode's composition -------------------------------------------------

    def describe(self, rng: np.random.Generator, split: str
                 ) -> Tuple[str, np.ndarray, np.ndarray, int]:
        """``(source, class ids [ways], shots [ways], queries per class)`` of one episode,
        drawn with ``rng`` by the paper's rules."""
        names = self._split(split)
        name = names[int(rng.integers(len(names)))]
        spec = self.source(name)
        pool = self._pool(name, split)
        members = np.asarray(pool[int(rng.integers(len(pool)))])
        hierarchical = self.use_dag_hierarchy and spec.nodes is not None
        if hierarchical:
            ways = min(len(members), self.max_ways)
        else:
            ways = int(rng.integers(self.min_ways, min(self.max_ways, len(members)) + 1))
        classes = rng.choice(members, ways, replace=False)  # a random order: labels 0..
        images = np.asarray([spec.images_per_class[c] for c in classes])
        queries = int(min(self.max_query, (images // 2).min()))
        remaining = images - queries
        beta = rng.uniform()
        size = int(min(np.floor(beta * np.minimum(self.max_support_per_class, remaining)
                                + 1).sum(), self.max_support_set_size))
        weights = images * np.exp(rng.uniform(*self.log_weights, size=ways))
        shots = np.minimum(np.floor(weights / weights.sum() * (size - ways)).astype(int) + 1,
                           remaining)
        return name, classes.astype(np.int64), shots.astype(np.int64), queries

    def _episodes(self, seed: np.ndarray, num_tasks: int, split: bytes):
        """NumPy side of :meth:`sample`: the decoded images (float32 in ``[-1, 1]``,
        zeros where padded) and labels of ``num_tasks`` episodes, padded. Decoding
        here, where each image's file and record are known, lets an undecodable one be
        named (:meth:`RecordReader.decode`)."""
        split = split.decode() if isinstance(split, bytes) else str(split)
        support, query = self.max_support_set_size, self.max_query_set_size
        size = self.image_size
        decoded = np.zeros([num_tasks, support + query, size, size, 3], np.float32)
        labels = np.full([num_tasks, support + query], PADDING, np.int32)
        present = np.zeros([num_tasks, self.max_ways], bool)
        for task in range(int(num_tasks)):
            rng = np.random.default_rng(
                [int(s) for s in np.asarray(seed, np.int64).view(np.uint64)] + [task])
            name, classes, shots, queries = self.describe(rng, split)
            reader = self._readers[name]
            spec = self.source(name)
            s = q = 0
            for label, (class_id, k) in enumerate(zip(classes, shots)):
                chosen = rng.choice(spec.images_per_class[class_id], k + queries,
                                    replace=False)
                images = reader.decode(class_id, chosen, size)
                decoded[task, s:s + k] = images[:k]
                labels[task, s:s + k] = label
                decoded[task, support + q:support + q + queries] = images[k:]
                labels[task, support + q:support + q + queries] = label
                s, q = s + k, q + queries
            present[task, :len(classes)] = True
        return decoded, labels, present

    # --- the stream ----------------------------------------------------------------

    def dataset(self, num_tasks: int, seed: int = 0, split: str = "train", **kwargs
                ) -> tf.data.Dataset:
        """See :meth:`TaskSampler.dataset`; reads the specs and checks the split first,
        so that errors surface here rather than inside ``tf.data``."""
        self.check_split(split)
        return super().dataset(num_tasks, seed=seed, split=split, **kwargs)

    def sample(self, seed: tf.Tensor, num_tasks: int, split: str = "train") -> Episode:
        self.check_split(split)
        num_tasks = int(num_tasks)
        support, query = self.max_support_set_size, self.max_query_set_size
        size = self.image_size
        check_memory(num_tasks * (support + query), size, 3, f"MetaDataset episodes "
                     f"({num_tasks} tasks of {support} + {query} examples)", 4)
        images, labels, present = tf.numpy_function(
            self._episodes, [tf.cast(seed, tf.int64), num_tasks, split],
            [tf.float32, tf.int32, tf.bool], stateful=False)
        images = tf.ensure_shape(images, [num_tasks, support + query, size, size, 3])
        labels = tf.ensure_shape(labels, [num_tasks, support + query])
        present = tf.ensure_shape(present, [num_tasks, self.max_ways])
        mask = labels != PADDING

        def part(t, start, size):
            return t[:, start:start + size]

        return Episode(part(images, 0, support),
                       MaskedLabels(part(labels, 0, support), part(mask, 0, support), present),
                       part(images, support, query),
                       MaskedLabels(part(labels, support, query), part(mask, support, query),
                                    present))
