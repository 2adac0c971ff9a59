"""mini-ImageNet from the split CSVs + images/, and from the pickle caches (plain data)."""


import numpy as np
import pytest

from metalearn.tasks.datasets import clear_caches, load_mini_imagenet, mini_imagenet
from tests import benchmark_fixtures as fixtures


pytestmark = pytest.mark.usefixtures("fresh_data_caches")


def test_csv_layout_gives_ravi_s_split(tmp_path):
    classes = fixtures.write_mini_imagenet_csv(str(tmp_path), per_class=3)
    splits = load_mini_imagenet(str(tmp_path))
    fixtures.check_splits(splits, {"train": 64, "validation": 16, "test": 20}, (84, 84, 3))
    for split, names in classes.items():
        assert splits[split].class_names == tuple(sorted(names))
        assert np.all(np.bincount(splits[split].labels) == 3)
    assert splits["train"].preprocessing["mean"][0] == pytest.approx(120.39586422 / 255)
    fixtures.check_episodes(splits)
    small = load_mini_imagenet(str(tmp_path), source="csv", image_size=32)
    assert small["test"].images.shape == (60, 32, 32, 3)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_pickle_caches_give_the_same_split(tmp_path, protocol):
    classes = fixtures.write_mini_imagenet_pickles(str(tmp_path), per_class=3,
                                                   protocol=protocol)
    splits = load_mini_imagenet(str(tmp_path))  # auto: no train.csv, so the caches
    fixtures.check_splits(splits, {"train": 64, "validation": 16, "test": 20}, (84, 84, 3))
    # class-major, in file order within a class, pixels as written
    train = splits["train"]
    label = train.class_names.index(classes["train"][5])
    np.testing.assert_array_equal(train.images[train.labels == label][2],
                                  fixtures.class_image(5, 2))
    fixtures.check_episodes(splits)


def test_a_split_of_other_class_counts_is_named(tmp_path):
    fixtures.write_mini_imagenet_csv(str(tmp_path), per_class=2)
    rows = (tmp_path / "val.csv").read_text().splitlines()
    (tmp_path / "val.csv").write_text("\n".join(rows[:-2]) + "\n")  # one class cut off
    with pytest.raises(ValueError, match="the 'validation' split has 15 classes, the "
                                         "canonical split has 16"):
        load_mini_imagenet(str(tmp_path))
    assert load_mini_imagenet(str(tmp_path), strict=False)["validation"].num_classes == 15


def test_bad_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="mini-ImageNet folder '/no/such'"):
        load_mini_imagenet("/no/such")
    with pytest.raises(FileNotFoundError, match="mini-imagenet-cache-train.pkl' not found"):
        load_mini_imagenet(str(tmp_path))
    fixtures.write_mini_imagenet_csv(str(tmp_path / "csv"), per_class=2)
    test_csv = tmp_path / "csv" / "test.csv"
    test_csv.write_text(test_csv.read_text() + "just-one-column\n")
    with pytest.raises(ValueError, match=f"'{test_csv}', line 42: expected 'filename,label'"):
        load_mini_imagenet(str(tmp_path / "csv"))
    (tmp_path / "cache").mkdir()
    fixtures.write_mini_imagenet_pickles(str(tmp_path / "cache"), per_class=2)
    val = tmp_path / "cache" / "mini-imagenet-cache-val.pkl"
    val.write_bytes(val.read_bytes()[:1000])
    with pytest.raises(ValueError, match=f"'{val}' is not a pickle of plain data: the file "
                                         "ends inside a value"):
        load_mini_imagenet(str(tmp_path / "cache"))


def test_decoded_arrays_cache_round_trip(tmp_path):
    fixtures.write_mini_imagenet_csv(str(tmp_path / "data"), per_class=2, size=16)
    first = load_mini_imagenet(str(tmp_path / "data"), image_size=16,
                               cache_dir=str(tmp_path / "cache"))
    assert len(list((tmp_path / "cache").glob("mini_imagenet_*.npz"))) == 3
    clear_caches()
    # from the cache now, not the images (the cache is kept while the images it was made
    # from are unchanged: tests/tasks/data_caches_test.py changes them)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mini_imagenet.image_files, "read_image_files",
                      lambda *a, **k: pytest.fail("decoded the images again"))
        second = load_mini_imagenet(str(tmp_path / "data"), image_size=16,
                                    cache_dir=str(tmp_path / "cache"))
    for split in first:
        np.testing.assert_array_equal(first[split].images, second[split].images)
        np.testing.assert_array_equal(first[split].labels, second[split].labels)
        assert first[split].class_names == second[split].class_names
        assert second[split].groups is None
        assert second[split].preprocessing == first[split].preprocessing
