"""Small fixtures in the exact on-disk formats of the few-shot benchmarks.

Each writer makes the canonical number of classes (so the loaders' split checks run as
on the real data) with a few images per class, written the way the published files
are: mini-ImageNet's split CSVs + images/ and its pickle caches, tiered-ImageNet's
Python 2 pickles of PNG bytes and labels, CUB-200-2011's archive folder, and the
examples TFDS's ``cifar100`` builder yields.
"""

from __future__ import annotations

import os
import pickle
import struct
from typing import Dict, List, Sequence

import numpy as np
import tensorflow as tf

SPLIT_FILES = {"train": "train", "validation": "val", "test": "test"}


def wnids(count: int, start: int = 0) -> List[str]:
    """WordNet-like ids ``n0100000x``: the shape of ImageNet class names."""
    return [f"n{1000000 + start + i:08d}" for i in range(count)]


def class_image(label: int, index: int, size: int = 84, seed: int = 0) -> np.ndarray:
    """A uint8 RGB image whose mean colour tells its class (learnable), with noise."""
    rng = np.random.default_rng([seed, label, index])
    colour = np.random.default_rng([seed, label]).integers(30, 225, 3)
    noise = rng.integers(-30, 30, (size, size, 3))
    return np.clip(colour + noise, 0, 255).astype(np.uint8)


# --- mini-ImageNet ------------------------------------------------------------------

MINI_SIZES = {"train": 64, "validation": 16, "test": 20}


def mini_imagenet_classes() -> Dict[str, List[str]]:
    names, start = {}, 0
    for split, count in MINI_SIZES.items():
        names[split] = wnids(count, start)
        start += count
    return names


def write_mini_imagenet_csv(root: str, per_class: int = 3, size: int = 84) -> Dict:
    """``root/images/<wnid><index:08d>.jpg`` and ``root/{train,val,test}.csv`` with a
    ``filename,label`` header, as Ravi & Larochelle's split files."""
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    classes = mini_imagenet_classes()
    label = 0
    for split, names in classes.items():
        lines = ["filename,label"]
        for name in names:
            for i in range(per_class):
                file = f"{name}{i + 1:08d}.jpg"
                jpeg = tf.io.encode_jpeg(class_image(label, i, size), quality=95).numpy()
                with open(os.path.join(root, "images", file), "wb") as f:
                    f.write(jpeg)
                lines.append(f"{file},{name}")
            label += 1
        with open(os.path.join(root, SPLIT_FILES[split] + ".csv"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return classes


def write_mini_imagenet_pickles(root: str, per_class: int = 3, protocol: int = 4) -> Dict:
    """``root/mini-imagenet-cache-{train,val,test}.pkl``: ``{"image_data": uint8 [N, 84,
    84, 3], "class_dict": {wnid: [indices]}}``, indices interleaved across classes."""
    os.makedirs(root, exist_ok=True)
    classes = mini_imagenet_classes()
    label = 0
    for split, names in classes.items():
        images, class_dict = [], {}
        for i in range(per_class):  # interleaved: image order is not class order
            for c, name in enumerate(names):
                class_dict.setdefault(name, []).append(len(images))
                images.append(class_image(label + c, i))
        label += len(names)
        cache = {"image_data": np.stack(images), "class_dict": class_dict}
        with open(os.path.join(root, f"mini-imagenet-cache-{SPLIT_FILES[split]}.pkl"),
                  "wb") as f:
            pickle.dump(cache, f, protocol=protocol)
    return classes


# --- tiered-ImageNet ------------------------------------------------------------------

TIERED_SIZES = {"train": (351, 20), "validation": (97, 6), "test": (160, 8)}


def _py2_str(value: bytes) -> bytes:
    """A Python 2 ``str`` as protocol 2 writes it (SHORT_BINSTRING / BINSTRING)."""
    if len(value) < 256:
        return b"U" + bytes([len(value)]) + value
    return b"T" + struct.pack("<I", len(value)) + value


def _py2_array(array: np.ndarray) -> bytes:
    """A NumPy array as Python 2 NumPy pickles it at protocol 2: ``_reconstruct``, a
    dtype with its state, and the raw data as a Python 2 string."""
    dtype = array.dtype
    order = b"|" if dtype.itemsize == 1 else b"<"
    shape = b"(" + b"".join(b"J" + struct.pack("<i", d) for d in array.shape) + b"t"
    return (b"cnumpy.core.multiarray\n_reconstruct\n"
            b"cnumpy\nndarray\n" + b"K\x00\x85" + _py2_str(b"b") + b"\x87R"
            b"(K\x01" + shape +
            b"cnumpy\ndtype\n" + _py2_str(dtype.str[1:].encode()) + b"K\x00K\x01\x87R"
            b"(K\x03" + _py2_str(order) + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
            b"\x89" + _py2_str(array.tobytes()) + b"tb")


def py2_pickle(value) -> bytes:
    """Protocol 2 bytes of plain data as Python 2 writes them (str as byte strings)."""
    def encode(v) -> bytes:
        if isinstance(v, np.ndarray):
            return _py2_array(v)
        if isinstance(v, str):
            return _py2_str(v.encode("latin-1"))
        if isinstance(v, bool):
            return b"\x88" if v else b"\x89"
        if isinstance(v, int):
            return b"J" + struct.pack("<i", v)
        if isinstance(v, list):
            return b"](" + b"".join(encode(x) for x in v) + b"e" if v else b"]"
        if isinstance(v, dict):
            return b"}(" + b"".join(encode(k) + encode(x) for k, x in v.items()) + b"u"
        raise TypeError(type(v))
    return b"\x80\x02" + encode(value) + b"."


def tiered_imagenet_classes():
    """``{split: (wnids, categories per class)}``: classes spread over the categories."""
    out, start, category = {}, 0, 0
    for split, (count, groups) in TIERED_SIZES.items():
        names = wnids(count, 5000 + start)
        cats = [f"category_{category + c % groups:02d}" for c in range(count)]
        out[split] = (names, cats)
        start += count
        category += groups
    return out


def write_tiered_imagenet(root: str, per_class: int = 2) -> Dict:
    """``root/{train,val,test}_images_png.pkl`` (a list of uint8 arrays of PNG bytes, as
    ``cv2.imencode`` gives) and ``root/{train,val,test}_labels.pkl``, both Python 2
    pickles as Ren et al.'s code writes them."""
    os.makedirs(root, exist_ok=True)
    classes = tiered_imagenet_classes()
    label = 0
    for split, (names, cats) in classes.items():
        general_names = sorted(set(cats))
        pngs, specific, general = [], [], []
        for i in range(per_class):
            for c in range(len(names)):
                png = tf.io.encode_png(class_image(label + c, i)).numpy()
                pngs.append(np.frombuffer(png, np.uint8))
                specific.append(c)
                general.append(general_names.index(cats[c]))
        label += len(names)
        labels = {"label_specific": np.array(specific, np.int64),
                  "label_general": np.array(general, np.int64),
                  "label_specific_str": list(names),
                  "label_general_str": general_names}
        name = SPLIT_FILES[split]
        with open(os.path.join(root, f"{name}_images_png.pkl"), "wb") as f:
            f.write(py2_pickle(pngs))
        with open(os.path.join(root, f"{name}_labels.pkl"), "wb") as f:
            f.write(py2_pickle(labels))
    return classes


# --- CUB-200-2011 ------------------------------------------------------------------


def cub_class_names() -> List[str]:
    return [f"{i:03d}.Bird_{i:03d}" for i in range(1, 201)]


def write_cub(root: str, per_class: int = 2) -> str:
    """``root/CUB_200_2011/`` with ``images/<class>/<file>.jpg``, ``images.txt``,
    ``image_class_labels.txt``, ``classes.txt`` (1-based ids, space-separated), images of
    varying sizes as in the archive."""
    base = os.path.join(root, "CUB_200_2011")
    images, labels, classes = [], [], []
    image_id = 1
    for c, name in enumerate(cub_class_names(), start=1):
        classes.append(f"{c} {name}")
        os.makedirs(os.path.join(base, "images", name), exist_ok=True)
        for i in range(per_class):
            file = f"{name}/{name.split('.')[1]}_{i:04d}_{c}.jpg"
            height, width = 40 + 3 * i, 50 + c % 7
            image = class_image(c, i, size=max(height, width))[:height, :width]
            with open(os.path.join(base, "images", file), "wb") as f:
                f.write(tf.io.encode_jpeg(image, quality=95).numpy())
            images.append(f"{image_id} {file}")
            labels.append(f"{image_id} {c}")
            image_id += 1
    for name, lines in (("images.txt", images), ("image_class_labels.txt", labels),
                        ("classes.txt", classes)):
        with open(os.path.join(base, name), "w") as f:
            f.write("\n".join(lines) + "\n")
    return base


# --- what every benchmark loader's test checks --------------------------------------


def check_splits(splits, sizes: Dict[str, int], image_shape) -> None:
    """Canonical class counts, no class in two splits, shapes and dtype, labels from 0."""
    assert sorted(splits) == ["test", "train", "validation"]
    for split, count in sizes.items():
        data = splits[split]
        assert data.num_classes == count, (split, data.num_classes, count)
        assert data.images.shape[1:] == tuple(image_shape), data.images.shape
        assert data.images.dtype == np.uint8
        np.testing.assert_array_equal(np.unique(data.labels), np.arange(count))
    names = [n for data in splits.values() for n in data.class_names]
    assert len(names) == len(set(names)), "a class in two splits"


def check_episodes(splits, ways: int = 5, shots: int = 1, queries: int = 1) -> None:
    """Episodes from every split: labels 0..ways-1, shapes, determinism by seed."""
    from metalearn.tasks import FewShotClassification
    sampler = FewShotClassification(splits, ways=ways, shots=shots, queries=queries)
    shape = splits["train"].images.shape[1:]
    for split in ("train", "validation", "test"):
        batch = sampler.sample(tf.constant([7, 1], tf.int64), 2, split)
        assert batch.support_x.shape == (2, ways * shots) + shape
        assert batch.query_x.shape == (2, ways * queries) + shape
        assert batch.support_x.dtype == tf.float32
        assert 0.0 <= float(tf.reduce_min(batch.support_x)) <= \
            float(tf.reduce_max(batch.support_x)) <= 1.0
        for task in range(2):
            np.testing.assert_array_equal(np.unique(batch.support_y[task]), np.arange(ways))
            np.testing.assert_array_equal(np.unique(batch.query_y[task]), np.arange(ways))
        again = sampler.sample(tf.constant([7, 1], tf.int64), 2, split)
        np.testing.assert_array_equal(batch.support_x.numpy(), again.support_x.numpy())
        other = sampler.sample(tf.constant([8, 1], tf.int64), 2, split)
        assert not np.array_equal(batch.support_x.numpy(), other.support_x.numpy())


# --- CIFAR-100 as TFDS yields it ----------------------------------------------------

CIFAR100_SUPERCLASS_MEMBERS = {
    "aquatic_mammals": ("beaver", "dolphin", "otter", "seal", "whale"),
    "fish": ("aquarium_fish", "flatfish", "ray", "shark", "trout"),
    "flowers": ("orchid", "poppy", "rose", "sunflower", "tulip"),
    "food_containers": ("bottle", "bowl", "can", "cup", "plate"),
    "fruit_and_vegetables": ("apple", "mushroom", "orange", "pear", "sweet_pepper"),
    "household_electrical_devices": ("clock", "keyboard", "lamp", "telephone", "television"),
    "household_furniture": ("bed", "chair", "couch", "table", "wardrobe"),
    "insects": ("bee", "beetle", "butterfly", "caterpillar", "cockroach"),
    "large_carnivores": ("bear", "leopard", "lion", "tiger", "wolf"),
    "large_man-made_outdoor_things": ("bridge", "castle", "house", "road", "skyscraper"),
    "large_natural_outdoor_scenes": ("cloud", "forest", "mountain", "plain", "sea"),
    "large_omnivores_and_herbivores": ("camel", "cattle", "chimpanzee", "elephant",
                                       "kangaroo"),
    "medium_mammals": ("fox", "porcupine", "possum", "raccoon", "skunk"),
    "non-insect_invertebrates": ("crab", "lobster", "snail", "spider", "worm"),
    "people": ("baby", "boy", "girl", "man", "woman"),
    "reptiles": ("crocodile", "dinosaur", "lizard", "snake", "turtle"),
    "small_mammals": ("hamster", "mouse", "rabbit", "shrew", "squirrel"),
    "trees": ("maple_tree", "oak_tree", "palm_tree", "pine_tree", "willow_tree"),
    "vehicles_1": ("bicycle", "bus", "motorcycle", "pickup_truck", "train"),
    "vehicles_2": ("lawn_mower", "rocket", "streetcar", "tank", "tractor"),
}
"""CIFAR-100's published superclass of every class."""


def cifar100_examples(split: str, per_class: int):
    """What TFDS's ``cifar100`` builder yields for ``split``: ``id``, uint8 ``image``
    [32, 32, 3], fine ``label`` and ``coarse_label`` (label order of the name files),
    shuffled as TFDS's records are."""
    from metalearn.tasks.datasets.cifar import CIFAR100_LABELS, CIFAR100_SUPERCLASSES
    coarse_of = {f: CIFAR100_SUPERCLASSES.index(c)
                 for c, members in CIFAR100_SUPERCLASS_MEMBERS.items() for f in members}
    offset = 0 if split == "train" else per_class
    rows = [(label, i) for label in range(100) for i in range(per_class)]
    order = np.random.default_rng(0 if split == "train" else 1).permutation(len(rows))
    examples = {"id": [], "image": [], "label": [], "coarse_label": []}
    for k in order:
        label, i = rows[k]
        examples["id"].append(f"{split}_{k:05d}")
        examples["image"].append(class_image(label, offset + i, size=32))
        examples["label"].append(label)
        examples["coarse_label"].append(coarse_of[CIFAR100_LABELS[label]])
    return {k: np.stack(v) if k == "image" else np.array(v) for k, v in examples.items()}


def write_tiered_imagenet_images(root: str, per_class: int = 1, csvs: bool = True,
                                 classes: Dict = None) -> Dict:
    """The images layout of tiered-ImageNet's generation tools: ``root/{train,val,test}/
    <wnid>/<image>``, with Ren et al.'s split files ``root/{train,val,test}.csv`` (rows
    ``wnid,category``, no header) unless ``csvs=False``. Images are 84x84 PNGs (the tools
    write JPEGs; PNG keeps the fixture exact, and the loader reads both). ``classes``
    (``{split: (wnids, categories)}``) defaults to Ren et al.'s counts."""
    classes = classes or tiered_imagenet_classes()
    label = 0
    for split, (names, cats) in classes.items():
        name = SPLIT_FILES[split]
        for c, wnid in enumerate(names):
            folder = os.path.join(root, name, wnid)
            os.makedirs(folder, exist_ok=True)
            for i in range(per_class):
                png = tf.io.encode_png(class_image(label + c, i)).numpy()
                with open(os.path.join(folder, f"{wnid}_{i:05d}.png"), "wb") as f:
                    f.write(png)
        label += len(names)
        if csvs:
            with open(os.path.join(root, f"{name}.csv"), "w") as f:
                f.writelines(f"{wnid},{cat}\n" for wnid, cat in zip(names, cats))
    return classes


# --- Meta-Dataset's converted records ---------------------------------------------

META_DATASET_SPLITS = ("TRAIN", "VALID", "TEST")


def _write_class_file(folder: str, class_id: int, count: int, gray: bool = False) -> None:
    """``folder/<class_id>.tfrecords``: ``count`` tf.train.Example records, each an
    encoded ``image`` (JPEG, or PNG for grey images as Omniglot's) and its ``label``."""
    with tf.io.TFRecordWriter(os.path.join(folder, f"{class_id}.tfrecords")) as writer:
        for i in range(count):
            image = class_image(class_id, i, size=10 + class_id % 3)
            data = (tf.io.encode_png(image[..., :1]) if gray else
                    tf.io.encode_jpeg(image, quality=95)).numpy()
            example = tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[class_id]))}))
            writer.write(example.SerializeToString())


def _write_spec(folder: str, spec: Dict) -> None:
    import json
    spec = dict(spec, path=folder, file_pattern="{}.tfrecords")
    with open(os.path.join(folder, "dataset_spec.json"), "w") as f:
        json.dump(spec, f, indent=2)


def write_meta_dataset(root: str, sources: Sequence[str] = ("aircraft", "omniglot",
                                                           "ilsvrc_2012")
                       ) -> Dict[str, Dict[str, int]]:
    """Three sources under ``root`` in Meta-Dataset's converted layout, one of each spec
    kind: ``aircraft`` (classes_per_split 6/5/5), ``omniglot`` (bi-level: alphabets
    2/1/1 of 5, 6, 5, 5 characters) and ``ilsvrc_2012`` (hierarchical: a WordNet-like
    DAG per split with 11/5/5 leaves), or those of ``sources``. Returns the class counts
    per split and source."""
    counts = {"aircraft": {"train": 6, "validation": 5, "test": 5},
              "omniglot": {"train": 11, "validation": 5, "test": 5},
              "ilsvrc_2012": {"train": 11, "validation": 5, "test": 5}}
    for name in sources:
        {"aircraft": _md_aircraft, "omniglot": _md_omniglot,
         "ilsvrc_2012": _md_ilsvrc}[name](os.path.join(root, name))
    return {name: counts[name] for name in sources}


def _md_aircraft(folder: str) -> None:
    """DatasetSpecification, 3 to 6 images per class."""
    os.makedirs(folder, exist_ok=True)
    counts = {c: 3 + c % 4 for c in range(16)}
    for c, n in counts.items():
        _write_class_file(folder, c, n)
    _write_spec(folder, {
        "name": "aircraft", "classes_per_split": {"TRAIN": 6, "VALID": 5, "TEST": 5},
        "images_per_class": {str(c): n for c, n in counts.items()},
        "class_names": {str(c): f"Aircraft-{c:02d}" for c in counts},
        "__class__": "DatasetSpecification"})


def _md_omniglot(folder: str) -> None:
    """BiLevelDatasetSpecification, characters numbered alphabet by alphabet."""
    os.makedirs(folder, exist_ok=True)
    sizes = [5, 6, 5, 5]
    names, c = {}, 0
    for a, size in enumerate(sizes):
        for k in range(size):
            names[str(c)] = f"Alphabet_{a}-character{k + 1:02d}"
            _write_class_file(folder, c, 4, gray=True)
            c += 1
    _write_spec(folder, {
        "name": "omniglot", "superclasses_per_split": {"TRAIN": 2, "VALID": 1, "TEST": 1},
        "classes_per_superclass": {str(a): s for a, s in enumerate(sizes)},
        "images_per_class": {k: 4 for k in names},
        "superclass_names": {str(a): f"Alphabet_{a}" for a in range(len(sizes))},
        "class_names": names, "__class__": "BiLevelDatasetSpecification"})


def _md_ilsvrc(folder: str) -> None:
    """HierarchicalDatasetSpecification; leaves numbered split by split."""
    os.makedirs(folder, exist_ok=True)
    graphs, images, class_names, c = {}, {}, {}, 0
    shapes = {"TRAIN": {"a": 5, "b": 6}, "VALID": {"a": 5}, "TEST": {"a": 5}}
    for s, split in enumerate(META_DATASET_SPLITS):
        root_id = f"n{9000000 + 100 * s:08d}"
        nodes = [{"wn_id": root_id, "words": f"{split} root", "children_ids": [],
                  "parents_ids": []}]
        counts, start = {}, 1
        for group, leaves in shapes[split].items():
            inner = f"n{9000000 + 100 * s + start:08d}"
            start += 1
            nodes[0]["children_ids"].append(inner)
            leaf_ids = [f"n{1000000 + 100 * s + start + i:08d}" for i in range(leaves)]
            start += leaves
            nodes.append({"wn_id": inner, "words": group, "children_ids": leaf_ids,
                          "parents_ids": [root_id]})
            for leaf in leaf_ids:
                nodes.append({"wn_id": leaf, "words": leaf, "children_ids": [],
                              "parents_ids": [inner]})
                counts[leaf] = 3 + len(counts) % 3
            counts[inner] = sum(counts[leaf] for leaf in leaf_ids)
        counts[root_id] = sum(v for k, v in counts.items() if k.startswith("n01"))
        for leaf in sorted(k for k in counts if k.startswith("n01")):
            class_names[str(c)] = leaf
            _write_class_file(folder, c, counts[leaf])
            c += 1
        graphs[split], images[split] = nodes, counts
    _write_spec(folder, {
        "name": "ilsvrc_2012", "split_subgraphs": graphs, "images_per_class": images,
        "class_names": class_names, "__class__": "HierarchicalDatasetSpecification"})
