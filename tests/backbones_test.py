"""Backbones (metalearn.models) and DropBlock (metalearn.layers), at small widths.

Second-order MAML meta-gradients through each backbone against central finite
differences in float64 (BatchNorm in training mode, DropBlock active); the task-batched
and accumulating formulations against the per-task reference; DropBlock's masks,
schedule and determinism.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution, functional, models
from metalearn.adapters import GradientDescent
from metalearn.layers import DropBlock
from metalearn.tasks import Episode
from metalearn.testing import finite_difference_directions, flat

WAYS = 3


def _episodes(tasks=2, shots=1, size=8, seed=0):
    keys = tf.random.experimental.stateless_split([seed, 3], 2)
    images = lambda key: tf.random.stateless_normal([tasks, WAYS * shots, size, size, 1],
                                                    key, dtype=tf.float64)
    labels = tf.tile(tf.repeat(tf.range(WAYS), shots)[None], [tasks, 1])
    return Episode(images(keys[0]), labels, images(keys[1]), labels)


# Small widths and images, the paper's structure: the residual blocks, shortcuts,
# DropBlock (rate 0.3: dropout after block 1, blocks of 2 after block 2), BatchNorm.
BACKBONES = {
    "resnet12": (lambda: models.resnet12((8, 8, 1), WAYS, widths=(2, 3), drop_rate=0.3,
                                         drop_block_size=2, seed=1, dtype="float64"), 8),
    "wide_resnet": (lambda: models.wide_resnet((8, 8, 1), WAYS, depth=10, widen_factor=1,
                                               base_width=2, dtype="float64"), 8),
    # The 64-filter net as it is (mini_imagenet_conv_net is the same builder, conv_net,
    # with 32 filters; conv_net's own checks are in
    # tests/adapters/gradient_descent_test.py).
    "protonets_conv_net": (lambda: models.protonets_conv_net(WAYS, (16, 16, 1), "float64"),
                           16),
}


def _learner(name):
    keras.utils.set_random_seed(0)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")
    return metalearn.Learner(BACKBONES[name][0](), GradientDescent(1, 0.25), loss=loss)


def _loss_and_gradient(learner, episodes, task_batching):
    formulation = execution.formulation(task_batching)
    if task_batching == "accumulate":
        run = lambda e: tuple(reversed(formulation.gradients(
            learner, e, learner.meta_variables)))
    else:
        def run(episodes):
            with tf.GradientTape() as tape:
                metrics = learner.meta_metrics(episodes, formulation=formulation)
                loss = tf.reduce_mean(metrics["loss"])
            return metrics, tape.gradient(loss, learner.meta_variables)
    metrics, grads = tf.function(run)(episodes)
    assert all(g is not None for g in grads)
    return metrics["loss"].numpy(), [g.numpy() for g in grads]


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_second_order_meta_gradient_and_task_batching(name):
    """MAML, one inner step, second order, BatchNorm in training mode: the meta-gradient
    against finite differences; the batched and accumulating formulations against it."""
    learner = _learner(name)
    episodes = _episodes(size=BACKBONES[name][1])
    # the per-task reference (cheapest to trace)
    losses, grads = _loss_and_gradient(learner, episodes, "unrolled")
    # A small step: a ReLU or max-pool kink crossed by the step would spoil a difference.
    derivatives, directions = finite_difference_directions(
        lambda: learner.meta_loss(episodes, formulation=execution.Unrolled()),
        learner.meta_variables, directions=2,
        eps=1e-7)
    analytic = directions @ flat(grads)
    error = np.linalg.norm(analytic - derivatives) / np.linalg.norm(derivatives)
    assert error < 1e-6, (name, error, analytic, derivatives)
    # accumulate does not depend on the model's layers: checked once, on ResNet-12.
    formulations = {"resnet12": ("batched", "accumulate"), "wide_resnet": ("batched",)}
    for task_batching in formulations.get(name, ()):
        got_losses, got = _loss_and_gradient(_learner(name), episodes, task_batching)
        np.testing.assert_allclose(got_losses, losses, rtol=1e-10, err_msg=task_batching)
        for g, want in zip(got, grads):
            np.testing.assert_allclose(g, want, rtol=1e-9, atol=1e-12, err_msg=task_batching)


def test_resnet12_layout_and_embedding():
    model = models.resnet12((84, 84, 3), 5, widths=(2, 2, 2, 4), drop_rate=0.1)
    assert model.get_layer("head").input.shape == (None, 5 * 5 * 4)  # 84 -> 42 -> ... -> 5
    convs = [l for l in model.layers if isinstance(l, keras.layers.Conv2D)]
    assert len(convs) == 16 and not any(c.use_bias for c in convs)  # 12 + 4 shortcuts
    drops = [l for l in model.layers if isinstance(l, DropBlock)]
    assert [d.block_size for d in drops] == [1, 1, 5, 5]
    assert all(isinstance(l.negative_slope, float) and l.negative_slope == 0.1
               for l in model.layers if isinstance(l, keras.layers.LeakyReLU))
    mean = models.resnet12((32, 32, 3), 5, widths=(2, 2, 2, 4), pool="mean")
    assert mean.get_layer("head").input.shape == (None, 4)
    assert not any(isinstance(l, DropBlock) for l in mean.layers)


def test_wide_resnet_layout():
    model = models.wide_resnet((32, 32, 3), 5, depth=16, widen_factor=2, base_width=2)
    assert sum(l.name.endswith("_add") for l in model.layers) == 6  # 2 blocks x 3 groups
    assert model.get_layer("group3_block1_conv1").filters == 16  # 2 * 2 * 4
    assert [l.name for l in model.layers if l.name.endswith("_shortcut")] == \
        ["group1_block1_shortcut", "group2_block1_shortcut", "group3_block1_shortcut"]
    assert model.get_layer("head").input.shape == (None, 16)
    assert model.name == "wrn_16_2"


@pytest.mark.parametrize("builder, message", [
    (lambda: models.wide_resnet(depth=27), "depth must be 6n \\+ 4 with n >= 1"),
    (lambda: models.resnet12(widths=(64, 0)), "widths must be a non-empty sequence"),
    (lambda: models.resnet12(pool="max"), "pool must be 'mean' or 'flatten', got 'max'"),
    (lambda: DropBlock(rate=1.0), "rate must be in \\[0, 1\\), got 1.0"),
    (lambda: DropBlock(block_size=0), "block_size must be >= 1, got 0"),
    (lambda: DropBlock(schedule_steps=-1), "schedule_steps must be >= 0, got -1"),
])
def test_bad_arguments_are_named(builder, message):
    with pytest.raises(ValueError, match=message):
        builder()


def _zero_squares_cover_zeros(zeros, block):
    """Every dropped pixel lies in a whole block x block square of dropped pixels."""
    covered = np.zeros_like(zeros)
    h, w = zeros.shape
    for i in range(h - block + 1):
        for j in range(w - block + 1):
            if zeros[i:i + block, j:j + block].all():
                covered[i:i + block, j:j + block] = True
    return np.array_equal(covered, zeros)


def test_drop_block_drops_whole_blocks_and_keeps_the_mean():
    layer = DropBlock(rate=0.2, block_size=3, seed=5)
    x = tf.ones([4, 12, 12, 2])
    y = layer(x, training=True).numpy()
    zeros = y == 0
    assert 0 < zeros.mean() < 0.6
    for n in range(4):
        for c in range(2):
            assert _zero_squares_cover_zeros(zeros[n, :, :, c], 3)
    np.testing.assert_allclose(y.mean(), 1.0, rtol=1e-6)  # rescaled by size / kept
    np.testing.assert_array_equal(layer(x, training=False), x)
    assert np.array_equal(DropBlock(rate=0.0)(x, training=True), x)
    dropout = DropBlock(rate=0.5, block_size=1, seed=1)(tf.ones([1, 40, 40, 8]), training=True)
    assert 0.4 < float(tf.reduce_mean(tf.cast(dropout == 0, tf.float32))) < 0.6


def test_drop_block_is_deterministic_and_follows_the_learners_meta_step():
    model = models.resnet12((16, 16, 1), WAYS, widths=(2, 2, 2, 2), drop_rate=0.5,
                            drop_block_size=2, drop_schedule_steps=10, seed=3)
    drop = model.get_layer("block3_drop")
    assert float(drop.keep_probability()) == 1.0  # the schedule starts at keep = 1
    x = tf.random.stateless_normal([2, 4, 4, 2], [0, 0])
    weights = functional.weights(model)
    first = functional.call(model, weights, tf.ones([3, 16, 16, 1]), training=True)
    np.testing.assert_array_equal(
        functional.call(model, weights, tf.ones([3, 16, 16, 1]), training=True), first)
    assert int(drop.iterations.numpy()) == 0  # functional.call assigns nothing
    drop(x, training=True)  # plain Keras: a training call advances the counter
    assert int(drop.iterations.numpy()) == 1
    learner = metalearn.Learner(model, GradientDescent(1, 0.25), loss="mse")
    assert drop.meta_step is learner.meta_step
    masks = []
    for step in (0, 5, 10, 20):
        learner.meta_step.assign(step)
        masks.append(drop.scaled_mask(tf.TensorShape([2, 8, 8, 4]), tf.float32).numpy())
    assert [round(float(drop.keep_probability(s)), 6) for s in (0, 5, 10, 20)] == \
        [1.0, 0.75, 0.5, 0.5]
    assert np.all(masks[0] == 1.0) and not np.array_equal(masks[2], masks[3])
    learner.meta_step.assign(20)
    np.testing.assert_array_equal(
        drop.scaled_mask(tf.TensorShape([2, 8, 8, 4]), tf.float32), masks[3])
