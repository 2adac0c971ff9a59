"""N-way K-shot episodes: disjoint splits, episode structure, seeds, rotations, errors."""

import numpy as np
import pytest
import tensorflow as tf

from metalearn.tasks import FewShotClassification, rotate
from metalearn.tasks.datasets import LabelledImages

SIZE = 4


def _tagged(num_classes=12, per_class=6, groups=None, counts=None):
    """Images whose pixels say which class and example they are: pixel [0, 0] holds
    the class, pixel [0, 1] the example's index in the data set, the rest is a unique
    asymmetric pattern (so rotations are visible)."""
    counts = counts or [per_class] * num_classes
    labels = np.repeat(np.arange(num_classes), counts).astype(np.int32)
    rng = np.random.default_rng(0)
    images = rng.uniform(size=(len(labels), SIZE, SIZE, 1)).astype(np.float32)
    images[:, 0, 0, 0] = labels
    images[:, 0, 1, 0] = np.arange(len(labels))
    names = [f"c{i:02d}" for i in range(num_classes)]
    return LabelledImages(images, labels, names, groups, preprocessing={"source": "tagged"})


def _owner(image):
    return int(round(float(image[0, 0, 0]))), int(round(float(image[0, 1, 0])))


def _check_episode(episode, ways, shots, queries, allowed_classes):
    support_x, support_y, query_x, query_y = (np.asarray(t) for t in episode)
    assert support_y.dtype == np.int32 and query_y.dtype == np.int32
    assert support_x.dtype == np.float32 and query_x.dtype == np.float32
    tasks = support_x.shape[0]
    assert support_x.shape == (tasks, ways * shots, SIZE, SIZE, 1)
    assert query_x.shape == (tasks, ways * queries, SIZE, SIZE, 1)
    for t in range(tasks):
        assert sorted(np.bincount(support_y[t], minlength=ways)) == [shots] * ways
        assert sorted(np.bincount(query_y[t], minlength=ways)) == [queries] * ways
        assert set(support_y[t]) == set(range(ways)) == set(query_y[t])
        classes, examples = {}, []
        for x, y in list(zip(support_x[t], support_y[t])) + list(zip(query_x[t], query_y[t])):
            cls, index = _owner(x)
            classes.setdefault(int(y), set()).add(cls)
            examples.append(index)
        assert all(len(c) == 1 for c in classes.values()), "one class per label"
        drawn = [next(iter(c)) for c in classes.values()]
        assert len(set(drawn)) == ways, "distinct classes"
        assert set(drawn) <= set(allowed_classes)
        assert len(set(examples)) == len(examples), "no example twice in an episode"


@pytest.mark.parametrize("ways, shots, queries", [(5, 1, 1), (3, 2, 3), (4, 5, 1)])
def test_every_episode_has_n_classes_with_k_and_q_examples(ways, shots, queries):
    data = _tagged()
    sampler = FewShotClassification(data, ways=ways, shots=shots, queries=queries,
                                     train=[f"c{i:02d}" for i in range(8)],
                                     test=[f"c{i:02d}" for i in range(8, 12)])
    episode = sampler.sample(tf.constant([1, 2]), num_tasks=20, split="train")
    _check_episode(episode, ways, shots, queries, allowed_classes=range(8))
    if ways <= 4:
        test_episode = sampler.sample(tf.constant([1, 2]), num_tasks=20, split="test")
        _check_episode(test_episode, ways, shots, queries, allowed_classes=range(8, 12))


def test_labels_are_a_random_assignment_and_all_classes_get_drawn():
    sampler = FewShotClassification(_tagged(), ways=5, shots=1, split_fractions=(1, 0, 0))
    episode = sampler.sample(tf.constant([0, 0]), num_tasks=200)
    first_class = [_owner(x)[0] for x in np.asarray(episode.support_x)[:, 0]]
    assert set(first_class) == set(range(12))  # label 0 is not tied to any class


def test_no_class_appears_in_two_splits():
    data = _tagged(num_classes=30, groups=[f"g{i % 6}" for i in range(30)])
    for kwargs in ({"split_by": "class"}, {"split_by": "group"},
                   {"split_by": "class", "split_sizes": (20, 5)}):
        sampler = FewShotClassification(data, ways=2, split_fractions=(0.5, 0.2, 0.3),
                                        **kwargs)
        names = sampler.class_names
        assert sum(len(v) for v in names.values()) == 30
        for a in ("train", "validation", "test"):
            for b in ("train", "validation", "test"):
                if a < b:
                    assert not set(names[a]) & set(names[b]), (kwargs, a, b)
        if kwargs["split_by"] == "group":
            group_of = dict(zip(data.class_names, data.groups))
            split_groups = {s: {group_of[n] for n in v} for s, v in names.items()}
            assert not split_groups["train"] & split_groups["test"]
        for split in ("train", "validation", "test"):
            allowed = [int(n[1:]) for n in names[split]]
            episode = sampler.sample(tf.constant([5, 5]), 10, split)
            _check_episode(episode, 2, 1, 1, allowed)
    assert FewShotClassification(data, ways=2, split_sizes=(20, 5)).num_classes("test") == 5


def test_same_seed_same_episodes_and_different_seeds_differ():
    sampler = FewShotClassification(_tagged(), ways=3, shots=2, split_fractions=(1, 0, 0))
    a = [np.asarray(t) for t in sampler.sample(tf.constant([4, 2]), 8)]
    b = [np.asarray(t) for t in sampler.sample(tf.constant([4, 2]), 8)]
    c = [np.asarray(t) for t in sampler.sample(tf.constant([4, 3]), 8)]
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[0], c[0])
    # The tf.data stream: the same seed twice, and disjoint per-replica streams.
    first = [np.asarray(t) for t in next(iter(sampler.dataset(4, seed=3)))]
    again = [np.asarray(t) for t in next(iter(sampler.dataset(4, seed=3)))]
    other = [np.asarray(t) for t in next(iter(sampler.dataset(4, seed=3, streams=[1],
                                                              num_streams=2)))]
    np.testing.assert_array_equal(first[0], again[0])
    assert not np.array_equal(first[0], other[0])


def test_known_episode_does_not_change():
    # Pins the sampling algorithm: the same seed must give these episodes on any machine
    # and any version (stateless Philox random numbers; no global state).
    sampler = FewShotClassification(_tagged(), ways=3, shots=1, queries=1,
                                    split_fractions=(1, 0, 0))
    episode = sampler.sample(tf.constant([0, 0]), 2)
    owners = [[_owner(x) for x in task] for task in np.asarray(episode.support_x)]
    again = FewShotClassification(_tagged(), ways=3, shots=1, queries=1,
                                  split_fractions=(1, 0, 0)).sample(tf.constant([0, 0]), 2)
    assert owners == [[_owner(x) for x in task] for task in np.asarray(again.support_x)]
    tf.random.set_seed(123)  # global state must not matter
    np.random.seed(7)
    third = sampler.sample(tf.constant([0, 0]), 2)
    np.testing.assert_array_equal(episode.support_x, third.support_x)


def test_rotations_make_new_classes():
    data = _tagged(num_classes=6, per_class=4)
    plain = FewShotClassification(data, ways=2, split_fractions=(1, 0, 0))
    rotated = FewShotClassification(data, ways=24, shots=1, split_fractions=(1, 0, 0),
                                    rotations=(0, 90, 180, 270))
    assert rotated.num_classes("train") == 4 * plain.num_classes("train") == 24
    assert "c00/rot90" in rotated.class_names["train"]
    episode = rotated.sample(tf.constant([0, 1]), 3)
    originals = {_owner(x)[1]: x for x in data.images}
    for task in range(3):
        seen = set()
        for label in range(24):
            x = np.asarray(episode.support_x[task, label])
            # find which rotation of which original this is
            matches = [(index, k) for index, original in originals.items() for k in range(4)
                       if np.array_equal(np.rot90(original, k), x)]
            assert len(matches) == 1
            index, k = matches[0]
            seen.add((int(data.labels[index]), k))
        assert len(seen) == 24  # every (character, rotation) pair once: new classes
    np.testing.assert_array_equal(rotate(data.images[:2], 90), np.rot90(data.images[:2], 1,
                                                                          axes=(1, 2)))


def test_rotations_only_where_asked():
    data = _tagged(num_classes=8)
    sampler = FewShotClassification(data, ways=2, train=["c00", "c01", "c02", "c03"],
                                    test=["c04", "c05", "c06", "c07"],
                                    rotations=(0, 90, 180, 270), rotation_splits=("train",))
    assert sampler.num_classes("train") == 16 and sampler.num_classes("test") == 4
    assert sampler.preprocessing["rotations"] == (0, 90, 180, 270)
    assert sampler.preprocessing["source"] == "tagged"
    episode = sampler.sample(tf.constant([0, 0]), 30, "test")
    _check_episode(episode, 2, 1, 1, range(4, 8))  # unrotated: pixel tags intact


def test_within_group_episodes_share_a_group():
    groups = ["a"] * 4 + ["b"] * 6 + ["c"] * 2
    sampler = FewShotClassification(_tagged(groups=groups), ways=3, within_group=True,
                                    split_fractions=(1, 0, 0))
    episode = sampler.sample(tf.constant([2, 2]), 50)
    seen_groups = set()
    for task in np.asarray(episode.support_x):
        task_groups = {groups[_owner(x)[0]] for x in task}
        assert len(task_groups) == 1
        seen_groups |= task_groups
    assert seen_groups == {"a", "b"}  # "c" has too few classes for 3 ways


def test_variable_ways_and_shots():
    sampler = FewShotClassification(_tagged(), ways=(2, 4), shots=(1, 3), queries=2,
                                    split_fractions=(1, 0, 0))
    shapes = set()
    for batch in sampler.dataset(3, seed=0, num_steps=12):
        ways = int(np.max(batch.support_y)) + 1
        shots = batch.support_y.shape[1] // ways
        assert ways in (2, 4) and shots in (1, 3)
        _check_episode(batch, ways, shots, 2, range(12))
        shapes.add((ways, shots))
    assert len(shapes) > 1


def test_train_shots_apply_to_meta_training_episodes_only():
    sampler = FewShotClassification(_tagged(), ways=3, shots=1, train_shots=4, queries=1,
                                    train=[f"c{i:02d}" for i in range(8)],
                                    test=[f"c{i:02d}" for i in range(8, 12)])
    _check_episode(sampler.sample(tf.constant([1, 2]), 5, "train"), 3, 4, 1, range(8))
    _check_episode(sampler.sample(tf.constant([1, 2]), 5, "test"), 3, 1, 1, range(8, 12))


def _translate(image, dy, dx):
    """``image [H, W, C]`` moved down ``dy`` and right ``dx`` pixels, zeros filling in."""
    height, width = image.shape[:2]
    out = np.zeros_like(image)
    out[max(dy, 0):height + min(dy, 0), max(dx, 0):width + min(dx, 0)] = \
        image[max(-dy, 0):height + min(-dy, 0), max(-dx, 0):width + min(-dx, 0)]
    return out


def test_max_shift_translates_each_meta_training_image_independently():
    rng = np.random.default_rng(1)
    images = rng.uniform(0.5, 1.0, size=(48, 8, 8, 1)).astype(np.float32)  # no zeros
    data = LabelledImages(images, np.repeat(np.arange(8), 6).astype(np.int32),
                          [f"c{i}" for i in range(8)])
    kwargs = dict(ways=3, shots=2, queries=2, train=["c0", "c1", "c2", "c3", "c4"],
                  test=["c5", "c6", "c7"])
    plain = FewShotClassification(data, **kwargs)
    shifted = FewShotClassification(data, max_shift=2, **kwargs)
    seed = tf.constant([3, 4])
    before, after = plain.sample(seed, 6), shifted.sample(seed, 6)
    np.testing.assert_array_equal(before.support_y, after.support_y)
    offsets = []
    for part in ("support_x", "query_x"):
        for x, y in zip(np.asarray(getattr(before, part)).reshape(-1, 8, 8, 1),
                        np.asarray(getattr(after, part)).reshape(-1, 8, 8, 1)):
            matches = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)
                       if np.array_equal(_translate(x, dy, dx), y)]
            assert len(matches) == 1, matches  # the same example, moved once
            offsets.append(matches[0])
    assert len(offsets) == 6 * 12 and len(set(offsets)) >= 20  # drawn per image
    np.testing.assert_array_equal(shifted.sample(seed, 6).query_x, after.query_x)
    test = (plain.sample(seed, 6, "test"), shifted.sample(seed, 6, "test"))
    np.testing.assert_array_equal(test[0].query_x, test[1].query_x)  # train only
    with pytest.raises(ValueError, match="max_shift=8 pixels must be smaller .* \\(8, 8\\)"):
        FewShotClassification(data, max_shift=8, **kwargs)


def test_per_split_data_sets():
    train, test = _tagged(num_classes=6), _tagged(num_classes=3)
    sampler = FewShotClassification({"train": train, "test": test}, ways=3)
    assert sampler.num_classes("train") == 6 and sampler.num_classes("test") == 3
    with pytest.raises(ValueError, match="'validation' split has no classes"):
        sampler.sample(tf.constant([0, 0]), 1, "validation")


def test_loader_given_by_reference_runs_when_first_needed():
    calls = []

    def load():
        calls.append(1)
        return _tagged()

    sampler = FewShotClassification(load, ways=2, split_fractions=(1, 0, 0))
    assert not calls
    batch = next(iter(sampler.dataset(2, seed=0)))
    assert calls == [1] and batch.support_x.shape == (2, 2, SIZE, SIZE, 1)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"ways": 13, "split_fractions": (1, 0, 0)}, ValueError,
     r"ways=13 is more than the 12 classes the 'train' split has"),
    ({"ways": 0}, ValueError, r"ways must be a positive integer .* got 0"),
    ({"shots": 4, "queries": 3}, ValueError,
     r"4 shots \+ 3 queries need 7 examples per class, but class 'c00' .* has 6"),
    ({"train_shots": 6}, ValueError,
     r"6 shots \+ 1 queries need 7 examples per class, but class 'c00' of the 'train'"),
    ({"train": ["c00", "c01"], "test": ["c01"]}, ValueError,
     r"class 'c01' is in both the 'train' and the 'test' split"),
    ({"train": ["c00", "nope"]}, ValueError, r"unknown class \['nope'\]"),
    ({"split_by": "group"}, ValueError, "split_by='group' needs a data set with groups"),
    ({"split_by": "alphabet"}, ValueError, "split_by must be one of .* got 'alphabet'"),
    ({"rotations": (0, 45)}, ValueError, r"multiples of 90 degrees, got \(0, 45\)"),
    ({"max_shift": -1}, ValueError, r"max_shift must be >= 0 pixels, got -1"),
    ({"augment_splits": ("tests",)}, ValueError, r"augment_splits must be among .* 'tests'"),
    ({"split_fractions": (0.5, 0.5, 0.5)}, ValueError, "split_fractions must be"),
    ({"dataset": "omniglot"}, TypeError, "dataset must be a LabelledImages"),
])
def test_bad_configuration(kwargs, error, message):
    kwargs = dict({"dataset": _tagged()}, **kwargs)
    with pytest.raises(error, match=message):
        sampler = FewShotClassification(**kwargs)
        sampler.sample(tf.constant([0, 0]), 1)


def test_classes_of_different_sizes_never_lend_examples():
    # MNIST-like: uneven counts per class; draws stay inside each class's examples.
    counts = [3, 9, 4, 12, 5, 3]
    sampler = FewShotClassification(_tagged(num_classes=6, counts=counts), ways=4, shots=2,
                                    queries=1, split_fractions=(1, 0, 0))
    episode = sampler.sample(tf.constant([9, 9]), 100)
    _check_episode(episode, 4, 2, 1, range(6))
    used = {_owner(x)[1] for x in np.asarray(episode.query_x).reshape(-1, SIZE, SIZE, 1)}
    assert len(used) > 20  # examples beyond the smallest class's count are drawn too


def test_large_image_pools_are_gathered_outside_the_graph(monkeypatch):
    """A pool over MAX_CONSTANT_BYTES (a graph constant cannot exceed 2 GB: tiered-
    ImageNet's training images are 9.5 GB) is gathered by NumPy: the same episodes."""
    from metalearn.tasks import ImageAugmentation, classification
    rng = np.random.default_rng(0)
    data = LabelledImages(rng.integers(0, 256, (120, 8, 8, 3), np.uint8),
                          np.arange(120) % 12, [f"c{i}" for i in range(12)])
    kwargs = dict(ways=3, shots=1, queries=2, rotations=(0, 90), augment=ImageAugmentation(),
                  split_fractions=(0.5, 0.0, 0.5))
    small = [b.query_x.numpy() for b in
             FewShotClassification(data, **kwargs).dataset(2, num_steps=3)]
    monkeypatch.setattr(classification, "MAX_CONSTANT_BYTES", 1000)
    large = [b.query_x.numpy() for b in
             FewShotClassification(data, **kwargs).dataset(2, num_steps=3)]
    for a, b in zip(small, large):
        np.testing.assert_array_equal(a, b)
