"""Issue 43, the library's BAD cases of the fourth reliability round, each kept as a
test that failed before its fix:

* 4. ``LearnedRuleOptimizer``'s learning rate gets the range check every number gets;
* 5. the SVM head on identical support rows (a singular face system) is finite;
* 6. a dangling symlink in an image-folder class is an error naming it;
* 7. / 8. mini-ImageNet splits that share an image, or classes that share image
  indices, are refused by the loaders' one validation of splits;
* 9. a float64 model compiled with a trained ``LearnedRuleOptimizer`` comes back from
  its ``.keras`` file exactly (the rule's dtype is saved with it).
"""

from __future__ import annotations

import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from metalearn import heads, models
from metalearn.adapters import LearnedRule, LearnedRuleOptimizer
from metalearn.pieces import HyperparameterRangeError


# --- 4. the learned optimizer's learning rate ----------------------------------------


@pytest.mark.parametrize("rate, shown", [(-0.5, "-0.5"), (0.0, "0.0"),
                                         (float("nan"), "nan")])
def test_a_learned_rule_optimizer_s_learning_rate_is_range_checked(rate, shown):
    rule = LearnedRule(0.1, hidden=(4,))
    rule.create("float32")
    with pytest.raises(HyperparameterRangeError,
                       match=rf"LearnedRuleOptimizer.learning_rate must be > 0, got {shown}"):
        LearnedRuleOptimizer(rule, learning_rate=rate)
    LearnedRuleOptimizer(rule, learning_rate=0.5)  # a number in range, or a schedule
    LearnedRuleOptimizer(rule, learning_rate=keras.optimizers.schedules.ExponentialDecay(
        0.1, 10, 0.9))


# --- 5. the SVM head on identical support rows ---------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_svm_head_on_identical_support_rows_is_finite(dtype):
    """Six identical support embeddings, two per class: no class can be told from
    another, so the logits are equal and the loss is ln 3; its gradient is finite."""
    head = heads.SVMHead()
    labels = tf.constant([0, 0, 1, 1, 2, 2])
    embeddings = tf.ones([6, 4], dtype)
    with tf.GradientTape() as tape:
        tape.watch(embeddings)
        logits = head.logits(head.fit_finite(embeddings, labels, 3), embeddings)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True))
    gradient = tape.gradient(loss, embeddings)
    np.testing.assert_allclose(float(loss), math.log(3), rtol=1e-5)
    assert np.all(np.isfinite(gradient.numpy()))


# --- 6. a dangling symlink in an image-folder class ----------------------------------


def _image_folder(root, classes=3, per_class=3):
    rng = np.random.default_rng(0)
    for c in range(classes):
        os.makedirs(os.path.join(root, f"class{c}"))
        for i in range(per_class):
            with open(os.path.join(root, f"class{c}", f"{i:03d}.png"), "wb") as f:
                f.write(tf.io.encode_png(rng.integers(0, 256, (6, 6, 3), np.uint8)).numpy())


def test_a_dangling_symlink_in_an_image_folder_class_is_named(tmp_path):
    from metalearn.tasks.datasets import clear_caches, load_image_folder
    root = str(tmp_path / "images")
    _image_folder(root)
    link = os.path.join(root, "class1", "003.png")
    os.symlink(os.path.join(str(tmp_path), "moved_away.png"), link)
    clear_caches()
    with pytest.raises(FileNotFoundError, match="dangling symbolic link") as info:
        load_image_folder(root, image_size=6, split_fractions=(0.34, 0.33, 0.33))
    assert link in str(info.value) and "moved_away.png" in str(info.value)


# --- 7. / 8. mini-ImageNet splits that share images ----------------------------------


@pytest.fixture
def _fresh_mini_imagenet():
    from metalearn.tasks.datasets import clear_caches
    clear_caches()
    yield
    clear_caches()


def test_a_mini_imagenet_test_image_also_listed_in_train_csv_is_refused(
        tmp_path, _fresh_mini_imagenet):
    from metalearn.tasks.datasets import load_mini_imagenet
    from tests import benchmark_fixtures as fixtures
    classes = fixtures.write_mini_imagenet_csv(str(tmp_path), per_class=2, size=8)
    leaked = f"{classes['test'][0]}00000001.jpg"  # a test image, labelled a train class
    with open(tmp_path / "train.csv", "a") as f:
        f.write(f"{leaked},{classes['train'][0]}\n")
    with pytest.raises(ValueError, match="is in both") as info:
        load_mini_imagenet(str(tmp_path), image_size=8, cache_dir=str(tmp_path / "cache"))
    message = str(info.value)
    assert leaked in message and "train.csv" in message and "test.csv" in message, message
    assert not list((tmp_path / "cache").glob("*.npz"))  # nothing cached from it


def test_two_mini_imagenet_classes_holding_the_same_images_are_refused(
        tmp_path, _fresh_mini_imagenet):
    import pickle
    from metalearn.tasks.datasets import load_mini_imagenet
    from tests import benchmark_fixtures as fixtures
    classes = fixtures.write_mini_imagenet_pickles(str(tmp_path), per_class=2)
    file = tmp_path / "mini-imagenet-cache-val.pkl"
    with open(file, "rb") as f:
        cache = pickle.load(f)
    first, second = classes["validation"][0], classes["validation"][3]
    cache["class_dict"][second] = list(cache["class_dict"][first])
    with open(file, "wb") as f:
        pickle.dump(cache, f, protocol=4)
    with pytest.raises(ValueError, match="both") as info:
        load_mini_imagenet(str(tmp_path), image_size=84)
    message = str(info.value)
    assert first in message and second in message and str(file) in message, message


# --- 9. a float64 learned-rule optimizer saved in a .keras file -------------------


def test_a_float64_learned_rule_optimizer_comes_back_exactly_from_a_keras_file(tmp_path):
    rule = LearnedRule(0.02, hidden=(4,))
    rule.create("float64")
    rng = np.random.default_rng(1)
    for variable in rule.network.values():  # trained: values float32 cannot hold
        variable.assign(variable.numpy() + 0.05 * rng.standard_normal(variable.shape))
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(32, 2))
    y = x @ np.array([[1.0], [-2.0]]) + 0.5
    model = models.mlp((2,), hidden=(8,), outputs=1, activation="tanh", dtype="float64")
    model.compile(optimizer=LearnedRuleOptimizer(rule), loss="mse")
    model.fit(x, y, epochs=2, batch_size=16, verbose=0, shuffle=False)
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    for key, value in rule.values().items():
        assert loaded.optimizer.frozen[key].dtype == np.float64
        np.testing.assert_array_equal(loaded.optimizer.frozen[key], value)
    model.fit(x, y, epochs=2, batch_size=16, verbose=0, shuffle=False)
    loaded.fit(x, y, epochs=2, batch_size=16, verbose=0, shuffle=False)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
