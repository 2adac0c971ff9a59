"""tiered-ImageNet from Ren et al.'s compressed caches (Python 2 pickles, plain data)."""

import pickle

import numpy as np
import pytest

from metalearn.tasks import FewShotClassification
from metalearn.tasks.datasets import clear_caches, load_tiered_imagenet, plain_pickle
from tests import benchmark_fixtures as fixtures

# Its tests share a module-scoped fixture: one worker runs them (tests/conftest.py).
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_caches()
    yield
    clear_caches()


@pytest.fixture(scope="module")
def tiered_dir(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tiered"))
    return root, fixtures.write_tiered_imagenet(root, per_class=2)


def test_the_python2_fixture_is_what_pickle_reads():
    """The hand-written Python 2 bytes are a valid pickle: the standard library reads
    them (with encoding='latin1', as Python 3 reads Python 2 NumPy pickles) to the same
    values as the plain reader."""
    value = {"label_specific": np.array([3, 1], np.int64), "label_general_str": ["a", "b"],
             "pngs": [np.frombuffer(b"\x89PNG..", np.uint8)]}
    data = fixtures.py2_pickle(value)
    ours, theirs = plain_pickle.loads(data), pickle.loads(data, encoding="latin1")
    np.testing.assert_array_equal(ours["label_specific"], theirs["label_specific"])
    np.testing.assert_array_equal(ours["pngs"][0], theirs["pngs"][0])
    assert ours["label_general_str"] == theirs["label_general_str"] == ["a", "b"]


def test_ren_s_split_by_category(tiered_dir):
    root, classes = tiered_dir
    splits = load_tiered_imagenet(root)
    fixtures.check_splits(splits, {"train": 351, "validation": 97, "test": 160}, (84, 84, 3))
    assert [len(set(splits[s].groups)) for s in ("train", "validation", "test")] == [20, 6, 8]
    categories = [set(splits[s].groups) for s in ("train", "validation", "test")]
    assert not (categories[0] & categories[1] or categories[0] & categories[2]
                or categories[1] & categories[2])
    assert len(set.union(*categories)) == 34
    for split, (names, cats) in classes.items():
        data = splits[split]
        assert data.class_names == tuple(sorted(names))
        assert dict(zip(data.class_names, data.groups)) == dict(zip(names, cats))
    # PNGs decoded exactly, class-major
    test = splits["test"]
    label = test.class_names.index(classes["test"][0][4])
    np.testing.assert_array_equal(test.images[test.labels == label][1],
                                  fixtures.class_image(351 + 97 + 4, 1))
    fixtures.check_episodes(splits)
    within = FewShotClassification(splits, ways=3, shots=1, queries=1, within_group=True)
    batch = within.sample(np.array([0, 0]), 4, "test")
    assert batch.support_x.shape == (4, 3, 84, 84, 3)


def test_damaged_and_mismatched_files_are_named(tmp_path, tiered_dir):
    root, _ = tiered_dir
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    with pytest.raises(FileNotFoundError, match="tiered-ImageNet folder '/no/such'"):
        load_tiered_imagenet("/no/such")
    pngs = plain_pickle.load(str(bad / "val_images_png.pkl"))
    pngs[3] = np.frombuffer(b"\x89PNG\r\n\x1a\n broken", np.uint8)
    (bad / "val_images_png.pkl").write_bytes(fixtures.py2_pickle(pngs))
    with pytest.raises(ValueError, match=f"image 3 of tiered-ImageNet images file "
                                         f"'{bad / 'val_images_png.pkl'}' is not a "
                                         "decodable image"):
        load_tiered_imagenet(str(bad))
    (bad / "val_images_png.pkl").write_bytes(fixtures.py2_pickle(pngs[:-1]))
    with pytest.raises(ValueError, match="holds 193 images but .*val_labels.pkl' 194 labels"):
        load_tiered_imagenet(str(bad))
    (bad / "val_images_png.pkl").unlink()
    with pytest.raises(FileNotFoundError, match="val_images_png.pkl' not found"):
        load_tiered_imagenet(str(bad))


def test_decoded_arrays_cache_keeps_the_categories(tmp_path, tiered_dir):
    root, _ = tiered_dir
    first = load_tiered_imagenet(root, cache_dir=str(tmp_path))
    clear_caches()
    second = load_tiered_imagenet(root, cache_dir=str(tmp_path))
    assert len(list(tmp_path.glob("tiered_imagenet_*.npz"))) == 3
    for split in first:
        np.testing.assert_array_equal(first[split].images, second[split].images)
        assert first[split].groups == second[split].groups


@pytest.fixture(scope="module")
def tiered_images_dir(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tiered_images"))
    return root, fixtures.write_tiered_imagenet_images(root, per_class=2)


def test_images_layout_with_ren_s_split_files(tiered_images_dir):
    root, classes = tiered_images_dir
    splits = load_tiered_imagenet(root)  # "auto": no caches here, so the folders
    fixtures.check_splits(splits, {"train": 351, "validation": 97, "test": 160}, (84, 84, 3))
    assert [len(set(splits[s].groups)) for s in ("train", "validation", "test")] == [20, 6, 8]
    for split, (names, cats) in classes.items():
        assert splits[split].class_names == tuple(sorted(names))
        assert dict(zip(splits[split].class_names, splits[split].groups)) == \
            dict(zip(names, cats))
    test = splits["test"]
    label = test.class_names.index(classes["test"][0][4])
    np.testing.assert_array_equal(test.images[test.labels == label][0],
                                  fixtures.class_image(351 + 97 + 4, 0))
    assert splits["test"].preprocessing["source"] == "images"
    fixtures.check_episodes(splits)
    within = FewShotClassification(splits, ways=3, shots=1, queries=1, within_group=True)
    batch = within.sample(np.array([0, 0]), 2, "test")
    assert batch.support_x.shape == (2, 3, 84, 84, 3)


def test_images_layout_errors_name_the_file(tmp_path):
    import shutil
    bad = tmp_path / "bad"
    small = {split: (fixtures.wnids(2, 10 * i), [f"cat{i}", f"cat{i}"])
             for i, split in enumerate(("train", "validation", "test"))}
    fixtures.write_tiered_imagenet_images(str(bad), 1, classes=small)
    with pytest.raises(ValueError, match=r"has 2 classes.*strict=False"):
        load_tiered_imagenet(str(bad))
    lines = (bad / "val.csv").read_text().splitlines()
    (bad / "val.csv").write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(ValueError, match=f"split file '{bad / 'val.csv'}' does not list "
                                         r"the class folder\(s\) \['"):
        load_tiered_imagenet(str(bad), strict=False)
    (bad / "val.csv").write_text("n0000001\n")
    with pytest.raises(ValueError, match=f"'{bad / 'val.csv'}', line 1: expected "
                                         "'wnid,category'"):
        load_tiered_imagenet(str(bad), strict=False)
    # without the split files: classes load, categories are unknown
    for name in ("train", "val", "test"):
        (bad / f"{name}.csv").unlink()
    splits = load_tiered_imagenet(str(bad), strict=False)
    assert splits["train"].num_classes == 2 and splits["train"].groups is None
    shutil.rmtree(bad / "test")
    with pytest.raises(FileNotFoundError, match="image folder .*test' not found"):
        load_tiered_imagenet(str(bad), strict=False, image_size=32)
    with pytest.raises(ValueError, match="source must be 'auto', 'pickle' or 'images'"):
        load_tiered_imagenet(str(bad), source="png")
