"""Meta-Dataset's converted records (Triantafillou et al., 2020), read from disk.

Meta-Dataset's conversion scripts write one folder per source (``ilsvrc_2012``,
``omniglot``, ``aircraft``, ...) holding ``dataset_spec.json`` and one
``<class id>.tfrecords`` file per class, each record a ``tf.train.Example`` with an
encoded ``image`` (bytes) and its ``label`` (int64, the class id). The spec is one of
three kinds (its ``__class__``):

- ``DatasetSpecification``: ``classes_per_split`` (``TRAIN``/``VALID``/``TEST`` counts;
  class ids are contiguous in that order) and ``images_per_class``;
- ``BiLevelDatasetSpecification`` (Omniglot): ``superclasses_per_split`` and
  ``classes_per_superclass``; superclasses are contiguous by split and classes by
  superclass, so no superclass (alphabet) is in two splits;
- ``HierarchicalDatasetSpecification`` (ILSVRC): ``split_subgraphs`` (the WordNet DAG of
  each split, its leaves the split's classes), ``images_per_class`` by split and WordNet
  id, and ``class_names`` from class id to WordNet id.

Nothing is held in memory but the spec and, per class file read so far, the byte offset
of each record (found by walking the records' length headers once): an episode reads
only its own records (:class:`RecordReader`), so the 210 GiB of the full benchmark
stream from disk, and any example is reachable from a seed without a shuffle buffer.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import threading
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from metalearn.tasks.datasets.base import require_file

SPEC_FILE = "dataset_spec.json"
SPLIT_KEYS = {"train": "TRAIN", "validation": "VALID", "test": "TEST"}
SPEC_KINDS = ("DatasetSpecification", "BiLevelDatasetSpecification",
              "HierarchicalDatasetSpecification")


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """One Meta-Dataset source as its ``dataset_spec.json`` describes it.

    Attributes:
      name: the source's name (``"omniglot"``).
      path: its folder.
      kind: the spec's ``__class__``.
      class_names: a name per class id (the WordNet id for ILSVRC).
      images_per_class: the number of records of each class id.
      splits: ``{"train" | "validation" | "test": class ids}``.
      superclasses: bi-level specs: ``{split: [class ids of each superclass]}``.
      superclass_names: bi-level specs: ``{split: [superclass names]}``.
      nodes: hierarchical specs: ``{split: [class ids spanned by each inner node of the
        split's DAG]}`` (the leaves below it), sorted by WordNet id.
      file_pattern: the class file name with ``{}`` for the class id.
    """

    name: str
    path: str
    kind: str
    class_names: Tuple[str, ...]
    images_per_class: Tuple[int, ...]
    splits: Mapping[str, Tuple[int, ...]]
    superclasses: Optional[Mapping[str, List[Tuple[int, ...]]]] = None
    superclass_names: Optional[Mapping[str, List[str]]] = None
    nodes: Optional[Mapping[str, List[Tuple[int, ...]]]] = None
    file_pattern: str = "{}.tfrecords"

    def class_file(self, class_id: int) -> str:
        """The records file of ``class_id``."""
        return os.path.join(self.path, self.file_pattern.format(int(class_id)))


def _by_id(mapping: Mapping[str, object], what: str, file: str) -> List[object]:
    """``{"0": v0, "1": v1, ...}`` as ``[v0, v1, ...]``; ids must be 0 .. n-1."""
    try:
        items = sorted((int(k), v) for k, v in mapping.items())
    except (AttributeError, ValueError) as error:
        raise ValueError(f"{file}: {what} must map class ids to values ({error})") from None
    if [k for k, _ in items] != list(range(len(items))):
        raise ValueError(f"{file}: {what} has ids {[k for k, _ in items][:10]}...; expected "
                         f"0 .. {len(items) - 1}")
    return [v for _, v in items]


def _split_counts(spec: Mapping, key: str, file: str) -> Dict[str, int]:
    counts = spec.get(key)
    if not isinstance(counts, Mapping) or set(counts) != set(SPLIT_KEYS.values()):
        raise ValueError(f"{file}: {key!r} must give TRAIN, VALID and TEST counts, got "
                         f"{counts!r}")
    return {split: int(counts[k]) for split, k in SPLIT_KEYS.items()}


def _contiguous(counts: Mapping[str, int]) -> Dict[str, range]:
    """Ids of each split, contiguous in TRAIN, VALID, TEST order (Meta-Dataset's rule)."""
    out, start = {}, 0
    for split in SPLIT_KEYS:
        out[split] = range(start, start + counts[split])
        start += counts[split]
    return out


def _spanned_leaves(nodes: Sequence[Mapping], file: str, split: str
                    ) -> Tuple[List[str], Dict[str, frozenset]]:
    """The leaves of a split's DAG and, for every inner node, the leaves below it."""
    children = {}
    for node in nodes:
        try:
            children[node["wn_id"]] = list(node.get("children_ids", []))
        except (KeyError, TypeError):
            raise ValueError(f"{file}: split_subgraphs[{SPLIT_KEYS[split]!r}] has a node "
                             f"without a wn_id: {node!r}") from None
    leaves = sorted(n for n, c in children.items() if not c)
    below: Dict[str, frozenset] = {}

    def span(node: str, path: Tuple[str, ...] = ()) -> frozenset:
        if node in below:
            return below[node]
        if node not in children:
            raise ValueError(f"{file}: node {path[-1]!r} of split "
                             f"{SPLIT_KEYS[split]!r} has child {node!r}, which is not in "
                             "the split's subgraph")
        if node in path:
            raise ValueError(f"{file}: the {SPLIT_KEYS[split]!r} subgraph has a cycle "
                             f"through {node!r}")
        found = frozenset([node]) if not children[node] else frozenset().union(
            *(span(c, path + (node,)) for c in children[node]))
        below[node] = found
        return found

    for node in children:
        span(node)
    return leaves, {n: below[n] for n in sorted(children) if children[n]}


def load_meta_dataset_source(path: str) -> SourceSpec:
    """Reads ``path/dataset_spec.json`` of one converted Meta-Dataset source.

    Raises:
      FileNotFoundError: no ``dataset_spec.json`` (naming the folder's contents).
      ValueError: the spec is not JSON, not one of Meta-Dataset's three kinds, or
        inconsistent (naming the file and the field).
    """
    file = os.path.join(path, SPEC_FILE)
    require_file(file, "Meta-Dataset spec", " (convert the source with Meta-Dataset's "
                 "dataset_conversion/convert_datasets_to_records.py)")
    try:
        with open(file) as f:
            spec = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"Meta-Dataset spec {file!r} is damaged: not JSON ({error})") from None
    kind = spec.get("__class__") if isinstance(spec, dict) else None
    if kind not in SPEC_KINDS:
        raise ValueError(f"Meta-Dataset spec {file!r} has __class__ {kind!r}; expected one "
                         f"of {SPEC_KINDS}")
    pattern = spec.get("file_pattern", "{}.tfrecords")
    if pattern != "{}.tfrecords":
        raise ValueError(f"{file}: file_pattern {pattern!r} is not supported (one "
                         "'{}.tfrecords' file per class, as Meta-Dataset's reader expects)")
    name = str(spec.get("name", os.path.basename(os.path.normpath(path))))
    try:
        class_names = tuple(str(n) for n in _by_id(spec["class_names"], "class_names", file))
        if kind == "HierarchicalDatasetSpecification":
            return _hierarchical(spec, name, path, file, class_names)
        counts = [int(n) for n in _by_id(spec["images_per_class"], "images_per_class", file)]
    except KeyError as error:
        raise ValueError(f"Meta-Dataset spec {file!r} has no field {error}") from None
    if len(counts) != len(class_names):
        raise ValueError(f"{file}: {len(counts)} images_per_class entries for "
                         f"{len(class_names)} class_names")
    if kind == "DatasetSpecification":
        per_split = _split_counts(spec, "classes_per_split", file)
        splits = {s: tuple(r) for s, r in _contiguous(per_split).items()}
        superclasses = superclass_names = None
    else:
        per_split = _split_counts(spec, "superclasses_per_split", file)
        sizes = [int(n) for n in _by_id(spec["classes_per_superclass"],
                                        "classes_per_superclass", file)]
        names = [str(n) for n in _by_id(spec.get("superclass_names", {
            str(i): str(i) for i in range(len(sizes))}), "superclass_names", file)]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        superclasses, superclass_names, splits = {}, {}, {}
        for split, ids in _contiguous(per_split).items():
            superclasses[split] = [tuple(range(offsets[i], offsets[i + 1])) for i in ids]
            superclass_names[split] = [names[i] for i in ids]
            splits[split] = tuple(c for members in superclasses[split] for c in members)
        if sum(per_split.values()) != len(sizes):
            raise ValueError(f"{file}: superclasses_per_split sums to "
                             f"{sum(per_split.values())}, classes_per_superclass has "
                             f"{len(sizes)}")
    total = sum(len(ids) for ids in splits.values())
    if total != len(class_names):
        raise ValueError(f"{file}: the splits hold {total} classes, class_names "
                         f"{len(class_names)}")
    return SourceSpec(name, path, kind, class_names, tuple(counts), splits, superclasses,
                      superclass_names)


def _hierarchical(spec, name, path, file, class_names) -> SourceSpec:
    graphs = spec["split_subgraphs"]
    images = spec["images_per_class"]
    ids_of = {n: i for i, n in enumerate(class_names)}
    counts = [0] * len(class_names)
    splits, nodes, start = {}, {}, 0
    for split, key in SPLIT_KEYS.items():
        if key not in graphs or key not in images:
            raise ValueError(f"{file}: split_subgraphs and images_per_class need a {key!r} "
                             "entry")
        leaves, spans = _spanned_leaves(graphs[key], file, split)
        ids = tuple(range(start, start + len(leaves)))
        start += len(leaves)
        if sorted(class_names[i] for i in ids if i < len(class_names)) != leaves:
            raise ValueError(f"{file}: the leaves of the {key!r} subgraph are not the "
                             f"class_names of ids {ids[0] if ids else 0} .. "
                             f"{start - 1} (Meta-Dataset numbers classes split by split)")
        for leaf in leaves:
            if leaf not in images[key]:
                raise ValueError(f"{file}: images_per_class[{key!r}] has no count for "
                                 f"leaf {leaf!r}")
            counts[ids_of[leaf]] = int(images[key][leaf])
        splits[split] = ids
        nodes[split] = [tuple(sorted(ids_of[leaf] for leaf in spans[n])) for n in spans]
    if start != len(class_names):
        raise ValueError(f"{file}: the subgraphs have {start} leaves, class_names "
                         f"{len(class_names)}")
    return SourceSpec(name, path, "HierarchicalDatasetSpecification", class_names,
                      tuple(counts), splits, nodes=nodes)


# --- the records ------------------------------------------------------------------

HEADER = 12  # uint64 length + uint32 masked CRC of the length
FOOTER = 4   # uint32 masked CRC of the data


class RecordReader:
    """Random access to the records of a source's class files.

    The first read of a class walks its file's record headers once and keeps each
    record's byte offset (8 bytes a record); reads then seek to the records an episode
    needs. Thread-safe (``tf.data`` calls it from parallel map threads).

    Args:
      spec: the source.
    """

    def __init__(self, spec: SourceSpec):
        self.spec = spec
        self._offsets: Dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def offsets(self, class_id: int) -> np.ndarray:
        """Byte offsets ``[records]`` of the records of ``class_id``'s file.

        Raises:
          FileNotFoundError: the class file is missing.
          ValueError: the file is truncated or damaged, or holds another number of
            records than ``dataset_spec.json`` says (naming the file).
        """
        class_id = int(class_id)
        with self._lock:
            if class_id in self._offsets:
                return self._offsets[class_id]
        file = self.spec.class_file(class_id)
        require_file(file, f"Meta-Dataset class file of class {class_id} "
                     f"({self.spec.class_names[class_id]!r})")
        size = os.path.getsize(file)
        found, position = [], 0
        with open(file, "rb") as f:
            while position < size:
                header = f.read(HEADER)
                if len(header) < HEADER:
                    raise ValueError(f"Meta-Dataset class file {file!r} is damaged: record "
                                     f"{len(found)} is cut short at byte {position} (the "
                                     "file was truncated)")
                length = struct.unpack("<Q", header[:8])[0]
                end = position + HEADER + length + FOOTER
                if end > size:
                    raise ValueError(f"Meta-Dataset class file {file!r} is damaged: record "
                                     f"{len(found)} at byte {position} claims {length} "
                                     f"bytes, past the end of the file ({size} bytes)")
                found.append(position)
                position = end
                f.seek(position)
        expected = self.spec.images_per_class[class_id]
        if len(found) != expected:
            raise ValueError(f"Meta-Dataset class file {file!r} holds {len(found)} records; "
                             f"{SPEC_FILE} says class {class_id} has {expected} images")
        offsets = np.asarray(found, np.int64)
        with self._lock:
            self._offsets[class_id] = offsets
        return offsets

    def read(self, class_id: int, indices: Sequence[int]) -> List[bytes]:
        """The encoded images of records ``indices`` of ``class_id``, in order.

        Raises:
          ValueError: a record is not a ``tf.train.Example`` with an ``image`` and a
            ``label`` feature, or its label is not ``class_id`` (naming the file).
        """
        from tensorflow.core.example import example_pb2  # protobuf only, no graph
        offsets = self.offsets(class_id)
        file = self.spec.class_file(class_id)
        images = []
        with open(file, "rb") as f:
            for index in indices:
                f.seek(int(offsets[index]))
                length = struct.unpack("<Q", f.read(HEADER)[:8])[0]
                data = f.read(length)
                try:
                    example = example_pb2.Example.FromString(data)
                    feature = example.features.feature
                    image = feature["image"].bytes_list.value[0]
                    label = feature["label"].int64_list.value[0]
                except Exception as error:  # protobuf's DecodeError, a missing feature
                    raise ValueError(
                        f"Meta-Dataset class file {file!r} is damaged: record {index} is "
                        f"not a tf.train.Example with 'image' and 'label' features "
                        f"({type(error).__name__}: {error})") from None
                if label != class_id:
                    raise ValueError(f"Meta-Dataset class file {file!r}: record {index} "
                                     f"has label {label}, expected the class id {class_id}")
                if not image.startswith((b"\xff\xd8", b"\x89PNG", b"GIF8", b"BM")):
                    raise ValueError(f"Meta-Dataset class file {file!r} is damaged: the "
                                     f"image of record {index} is not JPEG, PNG, GIF or "
                                     "BMP data")
                images.append(image)
        return images

    def decode(self, class_id: int, indices: Sequence[int], size: int) -> np.ndarray:
        """The images of records ``indices`` of ``class_id`` as float32 ``[n, size, size,
        3]`` in ``[-1, 1]`` (Meta-Dataset's decoder: RGB, bilinear resize).

        Raises:
          ValueError: as :meth:`read`, and image bytes that do not decode; the message
            names the file and the record.
        """
        import tensorflow as tf
        from metalearn.tasks.datasets.images import decode_image
        file = self.spec.class_file(class_id)
        decoded = np.empty([len(indices), size, size, 3], np.float32)
        for row, (index, data) in enumerate(zip(indices, self.read(class_id, indices))):
            image = decode_image(data, f"the image of record {int(index)} of Meta-Dataset "
                                 f"class file {file!r}", channels=3)
            decoded[row] = tf.image.resize(image.astype(np.float32), [size, size],
                                           method="bilinear").numpy() / 127.5 - 1.0
        return decoded
