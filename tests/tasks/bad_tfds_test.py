"""Bad TFDS data sets for TFDSImages: a builder, feature, split or class that the
builder's metadata do not have, features of the wrong kind, too few classes for the
ways; each named from the metadata, before anything is downloaded or decoded. Real
builders under ``tfds.testing.mock_data`` (offline). Cases of docs/errors.md
(tests/bad_input.py)."""

import os

import tensorflow_datasets as tfds

from metalearn.tasks.datasets import TFDSImages
from tests.bad_input import CLASSIFICATION, Case, check, gin_line, parametrize, run_gin

TITLE = "TFDS data sets"

# bad_input's classification run on TFDS's mnist (10 classes) instead of tiny images
TFDS_CLASSIFICATION = [
    line for line in CLASSIFICATION
    if not line.startswith(("FewShotClassification.dataset", "FewShotClassification.train",
                            "FewShotClassification.test"))] + [
    "FewShotClassification.dataset = @TFDSImages()",
    "TFDSImages.name = 'mnist'",
    "TFDSImages.data_dir = '/nonexistent'",
    "TFDSImages.image_size = 4",
    "TFDSImages.train = [0, 1, 2, 3, 4, 5]",
    "TFDSImages.test = [6, 7, 8, 9]",
]


def mocked_gin_case(name, bad_line, error, excerpt) -> Case:
    """A bad binding, the last line of ``bad.gin`` after :data:`TFDS_CLASSIFICATION`,
    run under TFDS's mock data; the error points to that file and line."""
    lines = TFDS_CLASSIFICATION + [bad_line]

    def run(tmp_path) -> None:
        with tfds.testing.mock_data():
            run_gin(tmp_path, lines)

    return Case(name, f"`{bad_line}`", error, excerpt, run, gin_line(lines))


def mocked(make) -> callable:
    def run(tmp_path) -> None:
        with tfds.testing.mock_data():
            make()
    return run


def missing_split(tmp_path) -> None:
    """mnist prepared in ``tmp_path`` (its metadata: splits train and test)."""
    with tfds.testing.mock_data(policy=tfds.testing.MockPolicy.USE_CODE):
        builder = tfds.builder("mnist")
        builder.info.set_splits(tfds.core.SplitDict([
            tfds.core.SplitInfo(name=name, shard_lengths=[3], num_bytes=0)
            for name in ("train", "test")]))
        folder = tmp_path / "mnist" / str(builder.info.version)
        os.makedirs(folder)
        builder.info.write_to_directory(str(folder))
    with tfds.testing.mock_data(data_dir=str(tmp_path)):
        TFDSImages("mnist", split="validation", data_dir=str(tmp_path))


CASES = [
    mocked_gin_case("unknown TFDS builder", "TFDSImages.name = 'oxford_flower102'",
                    ValueError, "no TFDS builder named 'oxford_flower102' (TFDSImages "
                    "name); close names: ['oxford_flowers102'"),
    mocked_gin_case("TFDS feature key the builder lacks", "TFDSImages.label_key = 'digit'",
                    ValueError, "TFDS 'mnist' has no feature 'digit' (label_key); its "
                    "features are ['image', 'label']"),
    mocked_gin_case("TFDS image key that is no image", "TFDSImages.image_key = 'label'",
                    ValueError, "feature 'label' (image_key) is ClassLabel, not an image "
                    "(tfds.features.Image); its features of that kind are ['image']"),
    Case("TFDS label that is no class label", "`TFDSImages('omniglot', "
         "label_key='alphabet_char_id')`", ValueError, "TFDS 'omniglot': feature "
         "'alphabet_char_id' (label_key) is Tensor, not a class label "
         "(tfds.features.ClassLabel); its features of that kind are ['alphabet', 'label']",
         mocked(lambda: TFDSImages("omniglot", label_key="alphabet_char_id")), None,
         "the builder's class labels"),
    Case("TFDS images of varying sizes without image_size",
         "`TFDSImages('oxford_flowers102')`", ValueError, "image feature 'image' has images "
         "of varying sizes (shape (None, None, 3)); give image_size=",
         mocked(lambda: TFDSImages("oxford_flowers102")), None,
         "the parameter"),
    Case("TFDS split the data lack", "`TFDSImages('mnist', split='validation')` on "
         "prepared data", ValueError, "TFDS 'mnist' has no split 'validation' "
         "(split='validation'); its splits are ['test', 'train']", missing_split, None,
         "the builder's splits"),
    mocked_gin_case("TFDS class id out of range", "TFDSImages.test = [6, 7, 10]",
                    ValueError, "class id 10 in the 'test' split is not one of the 10 "
                    "classes of TFDS 'mnist' (ids 0 to 9 of 'label')"),
    mocked_gin_case("more ways than the TFDS classes", "FewShotClassification.ways = 8",
                    ValueError, "ways=8 is more than the 6 classes the 'train' split has in "
                    "all (of TFDSImages('mnist', split='train'), before reading it)"),
    Case("TFDS data not prepared, download off", "`TFDSImages('mnist', "
         "download=False)()` on a `data_dir` without it", FileNotFoundError,
         "TFDS 'mnist' is not prepared in",
         mocked(lambda: TFDSImages("mnist", download=False)()), None, "the data_dir"),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
