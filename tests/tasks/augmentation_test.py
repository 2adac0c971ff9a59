"""ImageAugmentation and FewShotClassification(augment=, normalize=): stateless, seeded
from the episode, training split only by default, resumed exactly."""

import numpy as np
import pytest
import tensorflow as tf

from metalearn.tasks import FewShotClassification, ImageAugmentation
from metalearn.tasks.datasets import LabelledImages

SEED = tf.constant([3, 4], tf.int64)
OFF = dict(crop_scale=None, flip=False, brightness=0.0, contrast=0.0, saturation=0.0)


def images(n=16, size=12, seed=0):
    return tf.constant(np.random.default_rng(seed).uniform(size=(n, size, size, 3)),
                       tf.float32)


def test_everything_off_is_the_identity_and_a_seed_fixes_the_draw():
    x = images()
    np.testing.assert_allclose(ImageAugmentation(**OFF)(x, SEED).numpy(), x.numpy())
    full = ImageAugmentation()
    np.testing.assert_array_equal(full(x, SEED).numpy(), full(x, SEED).numpy())
    assert not np.allclose(full(x, SEED).numpy(), full(x, SEED + 1).numpy())
    out = full(x, SEED).numpy()
    assert out.shape == x.shape and out.min() >= 0.0 and out.max() <= 1.0


def test_flip_mirrors_each_image_or_keeps_it():
    x = images(32)
    out = ImageAugmentation(**{**OFF, "flip": True})(x, SEED).numpy()
    kept = [np.allclose(o, i) for o, i in zip(out, x.numpy())]
    mirrored = [np.allclose(o, i[:, ::-1]) for o, i in zip(out, x.numpy())]
    assert all(k or m for k, m in zip(kept, mirrored))
    assert 5 < sum(mirrored) < 27  # about half, per image


def test_crop_of_a_ramp_is_a_window_of_the_ramp():
    """On an image that rises linearly left to right, a crop of relative width w at
    left l resized back is the ramp from l to l + w: slope w, intercept in [0, 1 - w]."""
    size = 17
    ramp = np.tile(np.linspace(0, 1, size)[None, :, None], (size, 1, 3))
    x = tf.constant(np.stack([ramp] * 8), tf.float32)
    out = ImageAugmentation(**{**OFF, "crop_scale": (0.25, 0.25), "crop_ratio": (1, 1)})(
        x, SEED).numpy()
    row = out[:, 5, :, 0]                                       # [images, width]
    slope = (row[:, -1] - row[:, 0])
    np.testing.assert_allclose(slope, 0.5, atol=1e-5)           # width sqrt(0.25)
    assert np.all(row[:, 0] >= -1e-6) and np.all(row[:, 0] <= 0.5 + 1e-6)
    assert len(np.unique(np.round(row[:, 0], 4))) > 4           # placed per image
    whole = ImageAugmentation(**{**OFF, "crop_scale": (1, 1), "crop_ratio": (1, 1)})
    np.testing.assert_allclose(whole(x, SEED).numpy(), x.numpy(), atol=1e-5)


def test_colour_jitter_factors_lie_in_their_ranges():
    grey = tf.fill([64, 4, 4, 3], 0.5)
    out = ImageAugmentation(**{**OFF, "brightness": 0.4})(grey, SEED).numpy()
    factors = out[:, 0, 0, 0] / 0.5
    assert factors.min() >= 0.6 - 1e-6 and factors.max() <= 1.4 + 1e-6
    assert factors.std() > 0.1  # drawn per image
    x = images()
    flat = ImageAugmentation(**{**OFF, "saturation": 1.0})(x, SEED).numpy()
    assert flat.shape == x.shape  # saturation 0..2: from grey to twice as saturated
    contrast = ImageAugmentation(**{**OFF, "contrast": 0.4})(grey, SEED).numpy()
    np.testing.assert_allclose(contrast, 0.5, atol=1e-6)  # a flat image has no contrast


def uint8_data(classes=8, per_class=4, size=10):
    rng = np.random.default_rng(1)
    return LabelledImages(rng.integers(0, 256, (classes * per_class, size, size, 3), np.uint8),
                          np.repeat(np.arange(classes), per_class),
                          [f"c{i}" for i in range(classes)],
                          preprocessing={"mean": (0.5, 0.4, 0.3), "std": (0.2, 0.25, 0.3)})


def sampler(**kwargs):
    return FewShotClassification(uint8_data(), ways=3, shots=1, queries=2,
                                 train=[f"c{i}" for i in range(4)],
                                 test=["c4", "c5", "c6", "c7"], **kwargs)


def test_sampler_augments_training_episodes_only_and_resumes_exactly():
    plain, augmented = sampler(), sampler(augment=ImageAugmentation())
    seed = tf.constant([0, 9], tf.int64)
    for split in ("test",):  # not augmented by default: the same episodes
        np.testing.assert_array_equal(plain.sample(seed, 2, split).query_x.numpy(),
                                      augmented.sample(seed, 2, split).query_x.numpy())
    a, b = plain.sample(seed, 2, "train"), augmented.sample(seed, 2, "train")
    np.testing.assert_array_equal(a.support_y.numpy(), b.support_y.numpy())  # same classes
    assert not np.allclose(a.support_x.numpy(), b.support_x.numpy())
    stream = list(augmented.dataset(2, seed=5, num_steps=5))
    resumed = list(sampler(augment=ImageAugmentation()).dataset(2, seed=5, start_step=3,
                                                                num_steps=2))
    for one, other in zip(stream[3:], resumed):
        np.testing.assert_array_equal(one.support_x.numpy(), other.support_x.numpy())
        np.testing.assert_array_equal(one.query_x.numpy(), other.query_x.numpy())
    assert not np.allclose(stream[0].support_x.numpy(), stream[1].support_x.numpy())
    everywhere = sampler(augment=ImageAugmentation(), augment_splits=("train", "test"))
    assert not np.allclose(everywhere.sample(seed, 2, "test").query_x.numpy(),
                           plain.sample(seed, 2, "test").query_x.numpy())


def test_normalize_uses_the_data_set_s_statistics():
    plain, normal = sampler(), sampler(normalize=True)
    seed = tf.constant([1, 2], tf.int64)
    for split in ("train", "test"):
        x = plain.sample(seed, 2, split).support_x.numpy()
        assert 0.0 <= x.min() and x.max() <= 1.0  # uint8 scaled to [0, 1]
        np.testing.assert_allclose(normal.sample(seed, 2, split).support_x.numpy(),
                                   (x - [0.5, 0.4, 0.3]) / [0.2, 0.25, 0.3], rtol=1e-5,
                                   atol=1e-6)
    assert normal.preprocessing["mean"] == pytest.approx((0.5, 0.4, 0.3))
    assert normal.preprocessing["normalize"] is True and plain.preprocessing["scale"] == 1 / 255
    bare = LabelledImages(np.zeros([8, 4, 4, 3], np.uint8), np.repeat(np.arange(4), 2),
                          ["a", "b", "c", "d"])
    with pytest.raises(ValueError, match="normalize=True needs the data set's per-channel "
                                         "mean and std"):
        FewShotClassification(bare, ways=2, normalize=True)


@pytest.mark.parametrize("kwargs, message", [
    ({"crop_scale": (0.5, 0.1)}, r"crop_scale must be \(min, max\)"),
    ({"crop_ratio": (0, 1)}, r"crop_ratio must be \(min, max\)"),
    ({"brightness": 1.5}, r"brightness must be in \[0, 1\], got 1.5"),
])
def test_bad_augmentation_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ImageAugmentation(**kwargs)
