"""GradientDescent (MAML): inner loop by hand, meta-gradients against finite differences."""

import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import functional, models
from metalearn.adapters import GradientDescent, MiniBatches
from metalearn.testing import (analytic_meta_gradient, finite_difference_gradient,
                               image_episodes, mse, regression_episodes, relative_error,
                               small_learner)


@pytest.mark.parametrize("kind", ["mlp", "conv_batchnorm"])
def test_second_order_meta_gradient_equals_finite_differences(kind):
    learner = small_learner(kind, steps=2)
    episodes = regression_episodes() if kind == "mlp" else image_episodes()
    analytic = analytic_meta_gradient(learner, episodes)
    numeric = finite_difference_gradient(
        lambda w: learner.meta_loss(episodes, weights=w), learner.initial_weights())
    assert relative_error(analytic, numeric) < 1e-6


def _hand_unrolled_meta_loss(learner, episodes, weights, steps, lr, stop_inner_gradient,
                             batches=None):
    """An independent copy of the MAML objective, written out step by step (inner step
    ``k`` on the support examples ``batches[k]`` when given)."""
    losses = []
    for t in range(episodes.num_tasks):
        task = episodes.task(t)
        fast = dict(weights)
        for k in range(steps):
            x, y = task.support_x, task.support_y
            if batches is not None:
                x, y = tf.gather(x, batches[k]), tf.gather(y, batches[k])
            with tf.GradientTape() as tape:
                tape.watch(fast)
                inner = learner.task_loss(y, functional.call(learner.model, fast, x))
            grads = tape.gradient(inner, fast)
            if stop_inner_gradient:
                grads = {k: tf.stop_gradient(g) for k, g in grads.items()}
            fast = {k: fast[k] - lr * grads[k] for k in fast}
        losses.append(learner.task_loss(task.query_y,
                                        functional.call(learner.model, fast, task.query_x)))
    return tf.reduce_mean(losses)


@pytest.mark.parametrize("first_order", [False, True])
def test_meta_gradient_equals_hand_unrolled_reference(first_order):
    learner = small_learner("conv", steps=2, first_order=first_order)
    episodes = image_episodes()
    analytic = analytic_meta_gradient(learner, episodes)
    weights = learner.initial_weights()
    with tf.GradientTape() as tape:
        tape.watch(weights)
        loss = _hand_unrolled_meta_loss(learner, episodes, weights, 2, 0.3, first_order)
    reference = {k: g.numpy() for k, g in tape.gradient(loss, weights).items()}
    assert relative_error(analytic, reference) < 1e-10


def test_mini_batch_inner_steps_equal_hand_unrolled_reference_and_finite_differences():
    learner = small_learner("mlp", steps=4, wrappers=[MiniBatches(2)])
    episodes = regression_episodes(shots=6)
    batches = [[0, 3], [1, 4], [2, 5], [0, 3]]  # 6 examples, 2 per step: stride 3
    analytic = analytic_meta_gradient(learner, episodes)
    weights = learner.initial_weights()
    with tf.GradientTape() as tape:
        tape.watch(weights)
        loss = _hand_unrolled_meta_loss(learner, episodes, weights, 4, 0.3, False, batches)
    reference = {k: g.numpy() for k, g in tape.gradient(loss, weights).items()}
    assert relative_error(analytic, reference) < 1e-10
    numeric = finite_difference_gradient(
        lambda w: learner.meta_loss(episodes, weights=w), learner.initial_weights())
    assert relative_error(analytic, numeric) < 1e-6
    full_batch = analytic_meta_gradient(small_learner("mlp", steps=4), episodes)
    assert relative_error(analytic, full_batch) > 1e-3


@pytest.mark.parametrize("n,batch_size,step,expected", [
    (50, 10, 0, list(range(0, 50, 5))),   # 5-way 10-shot, class-major: 2 per class
    (50, 10, 6, list(range(1, 50, 5))),   # step 6 = step 1 of the second pass
    (7, 2, 0, [0, 3, 6]), (7, 2, 1, [1, 4]),  # uneven: stride 3
    (5, 10, 3, [0, 1, 2, 3, 4]),          # fewer examples than a batch: all of them
])
def test_inner_batch_takes_strided_examples(n, batch_size, step, expected):
    wrapper = MiniBatches(batch_size)
    x = tf.reshape(tf.range(2 * n), [n, 2])
    x_batch, y_batch = wrapper.batch({"a": x}, tf.range(n), step)
    np.testing.assert_array_equal(y_batch, expected)
    np.testing.assert_array_equal(x_batch["a"][:, 0], 2 * np.array(expected))


def test_mini_batches_refuse_the_batched_formulation():
    model = models.mlp((2,), hidden=(3,), outputs=1)
    learner = metalearn.Learner(model, GradientDescent(wrappers=[MiniBatches(2)]), loss=mse)
    with pytest.raises(ValueError, match=r"MiniBatches cannot run on a task axis"):
        metalearn.training.make_meta_step(learner, metalearn.MetaGradient(),
                                          metalearn.execution.Batched())
    with pytest.raises(ValueError, match="MiniBatches.batch_size must be a whole number >= 1, got 0"):
        MiniBatches(0)


def test_first_order_differs_from_second_order():
    episodes = regression_episodes()
    second = analytic_meta_gradient(small_learner("mlp"), episodes)
    first = analytic_meta_gradient(small_learner("mlp", first_order=True), episodes)
    assert relative_error(first, second) > 1e-3


def test_one_step_matches_closed_form_on_linear_regression():
    model = models.mlp((2,), hidden=(), outputs=1, dtype="float64")
    learner = metalearn.Learner(model, GradientDescent(steps=1, learning_rate=0.1), loss=mse)
    x = tf.constant([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]], tf.float64)
    y = tf.constant([[1.0], [0.0], [2.0]], tf.float64)
    w = model.trainable_variables[0].numpy()
    b = model.trainable_variables[1].numpy()
    residual = x.numpy() @ w + b - y.numpy()  # d mean(r^2)/dw = 2 x^T r / n
    fast = learner.adapt(x, y).weights
    np.testing.assert_allclose(fast["mlp/head/kernel"], w - 0.1 * 2 * x.numpy().T @ residual / 3)
    np.testing.assert_allclose(fast["mlp/head/bias"], b - 0.1 * 2 * residual.mean(0))


def test_anil_adapts_only_matching_weights():
    learner = small_learner("mlp", steps=3, adapt=("head",))
    episode = regression_episodes().task(0)
    start = learner.initial_weights()
    fast = learner.adapt(episode.support_x, episode.support_y).weights
    for path in start:
        changed = not np.array_equal(start[path], fast[path])
        assert changed == ("head" in path), path


def test_adapt_pattern_matching_nothing_is_an_error():
    with pytest.raises(ValueError, match="no_such_layer"):
        small_learner("mlp", adapt=("no_such_layer",))  # found when the learner is built


def test_negative_steps_rejected():
    with pytest.raises(ValueError, match="steps must be a whole number >= 0, got -1"):
        GradientDescent(steps=-1)
