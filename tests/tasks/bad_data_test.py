"""Bad data files, named with the file (and the entry or record): missing, damaged or
malformed archives, images, caches, split files and Meta-Dataset records, files other
than the published ones. Cases of docs/errors.md (tests/bad_input.py)."""

import gzip
import os
import pickle
import zipfile

import numpy as np
import tensorflow as tf

from metalearn.tasks import MetaDataset
from metalearn.tasks.datasets import (ChecksumError, clear_caches, load_cub,
                                      load_image_folder, load_meta_dataset_source,
                                      load_mini_imagenet, load_mnist, load_omniglot,
                                      load_tiered_imagenet)
from metalearn.tasks.datasets.meta_dataset import RecordReader
from tests import benchmark_fixtures
from tests.bad_input import Case, check, parametrize

TITLE = "Data files"


def _omniglot_zip(folder, entries) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "images_background_small1.zip")
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries:
            zf.writestr(f"images_background_small1/{name}", data)
    return path


def damaged_zip(tmp_path) -> None:
    folder = tmp_path / "omniglot"
    folder.mkdir()
    (folder / "images_background_small1.zip").write_bytes(b"PK\x03\x04 not really a zip")
    load_omniglot(str(folder), archives=("images_background_small1",),
                  verify_checksums=False)


def undecodable_png(tmp_path) -> None:
    _omniglot_zip(tmp_path / "omniglot", [("Greek/character01/0101_01.png",
                                           b"\x89PNG\r\n\x1a\n garbage")])
    load_omniglot(str(tmp_path / "omniglot"), archives=("images_background_small1",),
                  verify_checksums=False)


def corrupted_zip_entry(tmp_path) -> None:
    png = tf.io.encode_png(tf.zeros([3, 3, 1], tf.uint8)).numpy()
    path = tmp_path / "omniglot" / "images_background_small1.zip"
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("images_background_small1/Greek/character01/0101_01.png", png)
    data = bytearray(path.read_bytes())
    start = data.index(png)  # stored uncompressed: flip a byte of the image itself
    data[start + len(png) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    load_omniglot(str(path.parent), archives=("images_background_small1",),
                  verify_checksums=False)


def swapped_mnist_files(tmp_path) -> None:
    folder = tmp_path / "mnist"
    folder.mkdir()
    labels = gzip.compress(b"\x00\x00\x08\x01" + (3).to_bytes(4, "big") + bytes(3))
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(labels)  # a labels file
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(labels)
    load_mnist(str(folder), verify_checksums=False)


def truncated_mnist(tmp_path) -> None:
    folder = tmp_path / "mnist"
    folder.mkdir()
    whole = gzip.compress(b"\x00\x00\x08\x03" + b"\x00" * 400)
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(whole[:len(whole) // 2])
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\x00\x00\x08\x01"))
    load_mnist(str(folder), verify_checksums=False)


def unpublished_omniglot_archive(tmp_path) -> None:
    png = tf.io.encode_png(tf.zeros([3, 3, 1], tf.uint8)).numpy()
    _omniglot_zip(tmp_path / "omniglot", [("Greek/character01/0101_01.png", png)])
    load_omniglot(str(tmp_path / "omniglot"), archives=("images_background_small1",))


def mnist_file_of_the_published_size(tmp_path) -> None:
    folder = tmp_path / "mnist"
    folder.mkdir()
    (folder / "t10k-images-idx3-ubyte.gz").write_bytes(bytes(1648877))
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(bytes(4542))
    load_mnist(str(folder))


def cub_archive_as_path(tmp_path) -> None:
    (tmp_path / "CUB_200_2011.tgz").write_bytes(b"")
    load_cub(str(tmp_path / "CUB_200_2011.tgz"))


def empty_class_folder(tmp_path) -> None:
    (tmp_path / "images" / "cat").mkdir(parents=True)
    (tmp_path / "images" / "cat" / "notes.txt").write_text("no images here")
    load_image_folder(str(tmp_path / "images"))


def undecodable_folder_image(tmp_path) -> None:
    (tmp_path / "images" / "cat").mkdir(parents=True)
    (tmp_path / "images" / "cat" / "001.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    load_image_folder(str(tmp_path / "images"))


def dangling_folder_image(tmp_path) -> None:
    (tmp_path / "images" / "cat").mkdir(parents=True)
    (tmp_path / "images" / "cat" / "001.jpg").symlink_to(tmp_path / "moved.jpg")
    load_image_folder(str(tmp_path / "images"))


def leaked_test_image(tmp_path) -> None:
    classes = benchmark_fixtures.write_mini_imagenet_csv(str(tmp_path / "mini"),
                                                         per_class=1, size=8)
    with open(tmp_path / "mini" / "train.csv", "a") as f:
        f.write(f"{classes['test'][0]}00000001.jpg,{classes['train'][0]}\n")
    load_mini_imagenet(str(tmp_path / "mini"), image_size=8)


def classes_of_the_same_indices(tmp_path) -> None:
    (tmp_path / "mini").mkdir()
    cache = {"image_data": np.zeros([2, 84, 84, 3], np.uint8),
             "class_dict": {"n01": [0, 1], "n02": [1]}}
    for split in ("train", "val", "test"):
        (tmp_path / "mini" / f"mini-imagenet-cache-{split}.pkl").write_bytes(
            pickle.dumps(cache, protocol=4))
    load_mini_imagenet(str(tmp_path / "mini"))


def malformed_split_csv(tmp_path) -> None:
    (tmp_path / "mini" / "images").mkdir(parents=True)
    (tmp_path / "mini" / "train.csv").write_text("filename,label\nn0153282900000005.jpg\n")
    load_mini_imagenet(str(tmp_path / "mini"))


def truncated_pickle_cache(tmp_path) -> None:
    (tmp_path / "mini").mkdir()
    cache = {"image_data": np.zeros([2, 84, 84, 3], np.uint8), "class_dict": {"n01": [0, 1]}}
    data = pickle.dumps(cache, protocol=4)
    (tmp_path / "mini" / "mini-imagenet-cache-train.pkl").write_bytes(data[:len(data) // 2])
    load_mini_imagenet(str(tmp_path / "mini"))


def pickle_cache_naming_code(tmp_path) -> None:
    (tmp_path / "mini").mkdir()
    (tmp_path / "mini" / "mini-imagenet-cache-train.pkl").write_bytes(
        pickle.dumps({"image_data": print, "class_dict": {}}))
    load_mini_imagenet(str(tmp_path / "mini"))


def split_of_other_counts(tmp_path) -> None:
    benchmark_fixtures.write_mini_imagenet_csv(str(tmp_path / "mini"), per_class=1, size=8)
    rows = (tmp_path / "mini" / "val.csv").read_text().splitlines()
    (tmp_path / "mini" / "val.csv").write_text("\n".join(rows[:-1]) + "\n")
    load_mini_imagenet(str(tmp_path / "mini"), image_size=8)


def undecodable_cache_png(tmp_path) -> None:
    (tmp_path / "tiered").mkdir()
    labels = {"label_specific": np.zeros(1, np.int64), "label_general": np.zeros(1, np.int64),
              "label_specific_str": ["n01"], "label_general_str": ["c"]}
    (tmp_path / "tiered" / "train_labels.pkl").write_bytes(
        benchmark_fixtures.py2_pickle(labels))
    (tmp_path / "tiered" / "train_images_png.pkl").write_bytes(benchmark_fixtures.py2_pickle(
        [np.frombuffer(b"\x89PNG\r\n\x1a\n broken", np.uint8)]))
    load_tiered_imagenet(str(tmp_path / "tiered"))


def tiered_split_file_missing_a_class(tmp_path) -> None:
    small = {split: (benchmark_fixtures.wnids(2, 10 * i), ["c", "c"])
             for i, split in enumerate(("train", "validation", "test"))}
    benchmark_fixtures.write_tiered_imagenet_images(str(tmp_path / "tiered"), 1, classes=small)
    (tmp_path / "tiered" / "train.csv").write_text("n01000000,c\n")
    load_tiered_imagenet(str(tmp_path / "tiered"), strict=False, image_size=8)


def malformed_cub_index(tmp_path) -> None:
    (tmp_path / "CUB_200_2011").mkdir()
    (tmp_path / "CUB_200_2011" / "images.txt").write_text("001.Bird/a.jpg\n")
    load_cub(str(tmp_path / "CUB_200_2011"))


def _meta_dataset_source(tmp_path):
    benchmark_fixtures.write_meta_dataset(str(tmp_path), ("aircraft",))
    return tmp_path / "aircraft"


def missing_meta_dataset_class_file(tmp_path) -> None:
    os.remove(_meta_dataset_source(tmp_path) / "2.tfrecords")
    MetaDataset(str(tmp_path), train_sources=("aircraft",), min_ways=2).dataset(1)


def damaged_meta_dataset_record(cut: bool):
    def run(tmp_path) -> None:
        source = _meta_dataset_source(tmp_path)
        data = (source / "0.tfrecords").read_bytes()
        length = int.from_bytes(data[:8], "little")  # the first record's, kept
        (source / "0.tfrecords").write_bytes(data[:-7] if cut else data[:12] + b"\xff" *
                                             length + data[12 + length:])
        RecordReader(load_meta_dataset_source(str(source))).read(0, [0])
    return run


def meta_dataset_spec_of_other_counts(tmp_path) -> None:
    source = _meta_dataset_source(tmp_path)
    spec = (source / "dataset_spec.json").read_text()
    (source / "dataset_spec.json").write_text(spec.replace('"1": 4', '"1": 5', 1))
    RecordReader(load_meta_dataset_source(str(source))).offsets(1)


def damaged_meta_dataset_spec(tmp_path) -> None:
    (_meta_dataset_source(tmp_path) / "dataset_spec.json").write_text("{not json")
    load_meta_dataset_source(str(tmp_path / "aircraft"))


def undecodable_meta_dataset_image(tmp_path) -> None:
    file = _meta_dataset_source(tmp_path) / "0.tfrecords"
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(file))]
    example = tf.train.Example()
    example.ParseFromString(records[0])
    image = example.features.feature["image"].bytes_list
    image.value[0] = image.value[0][:2] + b"\x00" * 64  # JPEG's magic, no JPEG
    with tf.io.TFRecordWriter(str(file)) as writer:
        for record in [example.SerializeToString()] + records[1:]:
            writer.write(record)
    sampler = MetaDataset(str(tmp_path), train_sources=("aircraft",), min_ways=2,
                          max_ways=6, max_query=1, max_support_set_size=20, image_size=8)
    for _ in sampler.dataset(1, num_steps=30):  # until an episode reads record 0
        pass


def omniglot_other_layout(tmp_path) -> None:
    png = tf.io.encode_png(tf.zeros([3, 3, 1], tf.uint8)).numpy()
    _omniglot_zip(tmp_path / "omniglot", [("Greek_character01_0101_01.png", png)])
    load_omniglot(str(tmp_path / "omniglot"), archives=("images_background_small1",),
                  verify_checksums=False)


def damaged_data_cache(tmp_path) -> None:
    png = tf.io.encode_png(tf.zeros([3, 3, 1], tf.uint8)).numpy()
    _omniglot_zip(tmp_path / "omniglot", [("Greek/character01/0101_01.png", png)])
    load = lambda: load_omniglot(str(tmp_path / "omniglot"), verify_checksums=False,
                                 archives=("images_background_small1",))
    load()  # kept in the default cache folder (METALEARN_CACHE_DIR: the test's own)
    folder = os.environ["METALEARN_CACHE_DIR"]
    (file,) = [os.path.join(folder, name) for name in os.listdir(folder)]
    with open(file, "r+b") as f:
        f.truncate(64)
    clear_caches()  # a new process
    load()


CASES = [
    Case("missing data folder", "`load_omniglot(path='<tmp>/nowhere')`", FileNotFoundError,
         "Omniglot folder", lambda p: load_omniglot(str(p / "nowhere")),
         lambda p: str(p / "nowhere"), "the folder"),
    Case("missing archive", "Omniglot folder without `images_background_small1.zip`",
         FileNotFoundError, "not found (folder",
         lambda p: (p / "empty").mkdir() or load_omniglot(
             str(p / "empty"), archives=("images_background_small1",)),
         lambda p: str(p / "empty" / "images_background_small1.zip"), "the missing file"),
    Case("damaged zip", "`images_background_small1.zip` that is not a zip (checksums off)",
         ValueError,
         "is not a readable zip file", damaged_zip,
         lambda p: str(p / "omniglot" / "images_background_small1.zip"), "the zip file"),
    Case("undecodable PNG", "a zip entry `.png` holding no PNG (checksums off)", ValueError,
         "is not a decodable PNG image", undecodable_png,
         lambda p: "images_background_small1/Greek/character01/0101_01.png", "entry and zip"),
    Case("corrupted zip entry", "a zip whose PNG entry fails its CRC check (checksums off)",
         ValueError,
         "is damaged: entry 'images_background_small1/Greek/character01/0101_01.png' cannot "
         "be read", corrupted_zip_entry,
         lambda p: str(p / "omniglot" / "images_background_small1.zip"), "entry and zip"),
    Case("missing MNIST files", "`load_mnist(path=<empty folder>)`", FileNotFoundError,
         "MNIST 'test' split: none of",
         lambda p: (p / "mnist").mkdir() or load_mnist(str(p / "mnist")),
         lambda p: str(p / "mnist" / "t10k-images-idx3-ubyte.gz"), "the files looked for"),
    Case("truncated MNIST file", "a cut-off `t10k-images-idx3-ubyte.gz` (checksums off)",
         ValueError,
         "cannot be read as gzip-compressed IDX data", truncated_mnist,
         lambda p: str(p / "mnist" / "t10k-images-idx3-ubyte.gz"), "the file"),
    Case("MNIST file of the wrong kind", "a labels file named `t10k-images-idx3-ubyte.gz` "
         "(checksums off)",
         ValueError, "is not an IDX file of the expected kind: magic number 2049, expected "
         "2051", swapped_mnist_files,
         lambda p: str(p / "mnist" / "t10k-images-idx3-ubyte.gz"), "the file"),
    Case("archive other than the published one", "a valid `images_background_small1.zip` "
         "of other bytes", ChecksumError, "is not the published file: ",
         unpublished_omniglot_archive,
         lambda p: str(p / "omniglot" / "images_background_small1.zip"),
         "the file, both sizes, the published SHA-256, its source, `verify_checksums=False`"),
    Case("published size, other bytes", "a `t10k-images-idx3-ubyte.gz` of 1648877 zero "
         "bytes", ChecksumError, "the published file's is "
         "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
         mnist_file_of_the_published_size,
         lambda p: str(p / "mnist" / "t10k-images-idx3-ubyte.gz"),
         "the file, both SHA-256s, their source, `verify_checksums=False`"),
    Case("empty class folder", "`load_image_folder` on a folder whose `cat/` has no images",
         ValueError, "holds no image files", empty_class_folder,
         lambda p: str(p / "images" / "cat"), "the class folder"),
    Case("undecodable image in an image folder", "`cat/001.jpg` holding no JPEG", ValueError,
         "is not a decodable image", undecodable_folder_image,
         lambda p: str(p / "images" / "cat" / "001.jpg"), "the file"),
    Case("dangling symbolic link in an image folder", "`cat/001.jpg` a link to a file "
         "that was moved", FileNotFoundError, "is a dangling symbolic link",
         dangling_folder_image, lambda p: str(p / "images" / "cat" / "001.jpg"),
         "the link and its target"),
    Case("test image listed for training", "a mini-ImageNet test image also listed in "
         "`train.csv` (under a training class)", ValueError, "is in both class",
         leaked_test_image, lambda p: str(p / "mini" / "test.csv"),
         "the image, both classes, splits and files"),
    Case("two classes of the same images", "`class_dict` of a mini-ImageNet cache giving "
         "two classes the same image index", ValueError,
         "of the 'train' split", classes_of_the_same_indices,
         lambda p: str(p / "mini" / "mini-imagenet-cache-train.pkl"),
         "the image, both classes and the file"),
    Case("malformed split CSV row", "a mini-ImageNet `train.csv` row without its label",
         ValueError, "line 2: expected 'filename,label'", malformed_split_csv,
         lambda p: str(p / "mini" / "train.csv"), "the file and line"),
    Case("truncated pickle cache", "a cut-off `mini-imagenet-cache-train.pkl`", ValueError,
         "is not a pickle of plain data: the file ends", truncated_pickle_cache,
         lambda p: str(p / "mini" / "mini-imagenet-cache-train.pkl"), "the file"),
    Case("pickle cache naming code", "a `mini-imagenet-cache-train.pkl` that refers to a "
         "function", ValueError, "it refers to builtins.print, which is not plain data",
         pickle_cache_naming_code,
         lambda p: str(p / "mini" / "mini-imagenet-cache-train.pkl"), "the file"),
    Case("split of other class counts", "a mini-ImageNet `val.csv` with a class cut off",
         ValueError, "the 'validation' split has 15 classes, the canonical split has 16",
         split_of_other_counts, lambda p: "strict=False", "the files and `strict=False`"),
    Case("undecodable PNG in a pickle cache", "a tiered-ImageNet `train_images_png.pkl` "
         "entry holding no PNG", ValueError, "image 0 of tiered-ImageNet images file",
         undecodable_cache_png, lambda p: str(p / "tiered" / "train_images_png.pkl"),
         "the entry and file"),
    Case("split file missing a class folder", "tiered-ImageNet's `train.csv` without a "
         "class that `train/` holds", ValueError, "does not list the class folder(s) "
         "['n01000001']", tiered_split_file_missing_a_class,
         lambda p: str(p / "tiered" / "train.csv"), "the file and the classes"),
    Case("malformed CUB index line", "an `images.txt` line without its id", ValueError,
         "line 1: expected '<id> <value>'", malformed_cub_index,
         lambda p: str(p / "CUB_200_2011" / "images.txt"), "the file and line"),
    Case("missing Meta-Dataset class file", "a source folder without `2.tfrecords`",
         FileNotFoundError, "Meta-Dataset class file of class 2",
         missing_meta_dataset_class_file,
         lambda p: str(p / "aircraft" / "2.tfrecords"), "the file (found by `dataset()`)"),
    Case("truncated Meta-Dataset class file", "a cut-off `0.tfrecords`", ValueError,
         "past the end of the file", damaged_meta_dataset_record(cut=True),
         lambda p: str(p / "aircraft" / "0.tfrecords"), "the file and record (in a stream: "
         "inside `tf.errors.InvalidArgumentError`)"),
    Case("Meta-Dataset record that is not an Example", "a `0.tfrecords` record of garbled "
         "bytes", ValueError, "is damaged: record 0 is not a tf.train.Example",
         damaged_meta_dataset_record(cut=False), lambda p: str(p / "aircraft" / "0.tfrecords"),
         "the file and record"),
    Case("Meta-Dataset class file of another size", "`images_per_class` of 5 for a class "
         "file of 4 records", ValueError, "holds 4 records; dataset_spec.json says class 1 "
         "has 5 images", meta_dataset_spec_of_other_counts,
         lambda p: str(p / "aircraft" / "1.tfrecords"), "the file"),
    Case("damaged Meta-Dataset spec", "a `dataset_spec.json` that is not JSON", ValueError,
         "is damaged: not JSON", damaged_meta_dataset_spec,
         lambda p: str(p / "aircraft" / "dataset_spec.json"), "the file"),
    Case("CUB archive not extracted", "`load_cub(path='<tmp>/CUB_200_2011.tgz')`",
         ValueError, "is a file, not the extracted folder",
         cub_archive_as_path,
         lambda p: str(p / "CUB_200_2011.tgz"), "the file, and how to check and extract it"),
    Case("Omniglot archive of another layout", "a zip of `Greek_character01_0101_01.png` "
         "entries (checksums off)", ValueError, "has none of the expected entries "
         "'images_background_small1/<Alphabet>/characterNN/NNNN_NN.png'",
         omniglot_other_layout,
         lambda p: str(p / "omniglot" / "images_background_small1.zip"), "the zip file"),
    Case("absurd image_size", "`load_image_folder.image_size = 100000`", ValueError,
         "image_size must be a whole number of pixels from 1 to 1024",
         lambda p: load_image_folder(str(p), image_size=100_000), None,
         "the loader and the bound, before any allocation"),
    Case("damaged data cache", "a cut-off `omniglot_<key>_all.npz` in the data cache "
         "folder (`~/.cache/metalearn`)", ValueError,
         "is damaged or not a cache of plain arrays", damaged_data_cache,
         lambda p: os.environ["METALEARN_CACHE_DIR"], "the file, and to delete it"),
    Case("undecodable Meta-Dataset image", "a record whose image bytes start like a JPEG "
         "and are not one", tf.errors.InvalidArgumentError, "is not a decodable image",
         undecodable_meta_dataset_image,
         lambda p: f"the image of record 0 of Meta-Dataset class file "
                   f"'{p / 'aircraft' / '0.tfrecords'}'", "the file and record"),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
