"""Meta-SGD and the MAML++ pieces: meta-gradients against finite differences in float64,
learned rates, per-step weights, the multi-step loss and derivative-order annealing."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.adapters import (AnnealOrder, GradientDescent, GradientStep, LearnedRates,
                                Mask, MetaSGD, PerStepLearningRates, PerStepWeights)
from metalearn.testing import regression_episodes, mse
from metalearn.testing import (assert_meta_gradient_matches_finite_differences,
                               relative_error)


def _support_gradient(learner):
    """A two-example linear-regression support set, the learner's initial weights and
    the support loss's gradient at them."""
    x = tf.constant([[1.0, 2.0], [3.0, -1.0]], tf.float64)
    y = tf.constant([[1.0], [0.0]], tf.float64)
    start = learner.initial_weights()
    with tf.GradientTape() as tape:
        tape.watch(start)
        loss = learner.support_loss(start, x, y)
    return x, y, start, tape.gradient(loss, start)


def _mlp(seed=0):
    keras.utils.set_random_seed(seed)
    return models.mlp((2,), hidden=(3,), outputs=1, activation="tanh", dtype="float64")


def _bn_mlp(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((2,), dtype="float64"),
        keras.layers.Dense(3, dtype="float64", name="hidden0"),
        keras.layers.BatchNormalization(dtype="float64", name="bn0"),
        keras.layers.Activation("tanh", dtype="float64", name="tanh0"),
        keras.layers.Dense(1, dtype="float64", name="head")], name="bn_mlp")


def _meta_gradient(learner, episodes):
    variables = learner.meta_variables
    with tf.GradientTape() as tape:
        loss = learner.meta_loss(episodes)
    return {v.path: g.numpy() for v, g in zip(variables, tape.gradient(loss, variables))}


def test_meta_sgd_meta_gradient_and_rates_receive_gradients():
    adapter = MetaSGD(steps=2, learning_rate=0.2)
    learner = metalearn.Learner(_mlp(), adapter, loss=mse)
    # Per-element rates: one per element of every adapted weight, all trained.
    rates = adapter.learning_rates
    assert sorted(rates) == sorted(learner.initial_weights())
    for path, rate in rates.items():
        assert rate.shape == learner.initial_weights()[path].shape
    rate_paths = {v.path for v in rates.values()}
    assert rate_paths <= {v.path for v in learner.meta_variables}
    rates["mlp/hidden0/kernel"].assign(np.linspace(0.05, 0.3, 6).reshape(2, 3))
    analytic = assert_meta_gradient_matches_finite_differences(learner, regression_episodes())
    for path in rate_paths:
        assert np.all(analytic[path] != 0), path  # every element gets its own gradient


def test_meta_sgd_step_uses_elementwise_rates():
    model = models.mlp((2,), hidden=(), outputs=1, dtype="float64")
    adapter = MetaSGD(steps=1)
    learner = metalearn.Learner(model, adapter, loss=mse)
    adapter.learning_rates["mlp/head/kernel"].assign([[0.1], [0.0]])
    adapter.learning_rates["mlp/head/bias"].assign([0.5])
    x, y, start, grads = _support_gradient(learner)
    fast = learner.adapt(x, y).weights
    np.testing.assert_allclose(fast["mlp/head/kernel"], start["mlp/head/kernel"]
                               - [[0.1], [0.0]] * grads["mlp/head/kernel"])
    np.testing.assert_allclose(fast["mlp/head/bias"], start["mlp/head/bias"]
                               - 0.5 * grads["mlp/head/bias"])


def test_lslr_meta_gradient_and_per_step_rates():
    rates = LearnedRates("layer_step", initial=0.2)
    adapter = GradientDescent(steps=3, update=[Mask(("hidden", "head")), rates])
    learner = metalearn.Learner(_mlp(), adapter, loss=mse)
    for i, rate in enumerate(rates.learning_rates.values()):
        assert rate.shape == (3,)
        rate.assign([0.1 + 0.05 * i, 0.2, 0.3 - 0.02 * i])
    analytic = assert_meta_gradient_matches_finite_differences(learner, regression_episodes())
    for rate in rates.learning_rates.values():
        assert np.all(analytic[rate.path] != 0), rate.path


def test_lslr_step_k_uses_rate_k():
    learner = metalearn.Learner(_mlp(), PerStepLearningRates(steps=2), loss=mse)
    plain = metalearn.Learner(_mlp(), GradientDescent(steps=1, learning_rate=0.3), loss=mse)
    for rate in learner.adapter.learning_rates.values():
        rate.assign([0.3, 0.0])  # the second step does nothing
    task = regression_episodes().task(0)
    fast = learner.adapt(task.support_x, task.support_y).weights
    expected = plain.adapt(task.support_x, task.support_y).weights
    for path in expected:
        np.testing.assert_allclose(fast[path], expected[path], rtol=1e-12)


def test_per_step_batchnorm_weights():
    adapter = GradientDescent(steps=2, learning_rate=0.3, wrappers=[PerStepWeights(("bn0",))])
    learner = metalearn.Learner(_bn_mlp(), adapter, loss=mse)
    bn_paths = ["bn_mlp/bn0/gamma", "bn_mlp/bn0/beta"]
    assert sorted(learner.pieces.task_paths(learner.initial_weights())) == sorted(bn_paths)
    meta_paths = [v.path for v in learner.meta_variables]
    assert not set(bn_paths) & set(meta_paths)  # the model's own BN weights are unused
    copies = dict(zip(bn_paths, adapter.meta_variables))
    assert [c.shape for c in copies.values()] == [(3, 3), (3, 3)]  # [steps + 1, units]
    for path, copy in copies.items():
        copy.assign(np.random.default_rng(0).normal(size=(3, 3)))
    task = regression_episodes().task(0)
    trajectory = metalearn.learners.adapt_trajectory(learner, task.support_x, task.support_y)
    for k, weights in enumerate(trajectory):
        for path, copy in copies.items():
            np.testing.assert_array_equal(weights[path], copy.numpy()[k])
    # Test time with more steps reuses the last copy.
    longer = metalearn.learners.adapt_trajectory(learner, task.support_x, task.support_y, steps=4)
    np.testing.assert_array_equal(longer[4]["bn_mlp/bn0/gamma"], copies[bn_paths[0]][2])


def test_maml_plus_plus_meta_gradient_equals_finite_differences():
    """LSLR + per-step BatchNorm + multi-step loss (mid-annealing) + second order."""
    adapter = PerStepLearningRates(steps=2, learning_rate=0.2,
                                   wrappers=[PerStepWeights(("bn0",))])
    learner = metalearn.MultiStepLossLearner(_bn_mlp(), adapter, loss=mse, anneal_steps=4)
    learner.meta_step.assign(1)
    for copy in adapter.meta_variables[:2]:
        copy.assign(copy.numpy() + np.random.default_rng(1).normal(0, 0.1, copy.shape))
    assert_meta_gradient_matches_finite_differences(learner,
                                                    regression_episodes(tasks=2, shots=5))


def test_multi_step_loss_weights_and_value():
    learner = metalearn.MultiStepLossLearner(
        _mlp(), GradientDescent(steps=4, learning_rate=0.2), loss=mse, anneal_steps=10)
    for step, expected in [(0, [0.25, 0.25, 0.25, 0.25]),
                           (5, [0.125, 0.125, 0.125, 0.625]),
                           (10, [0, 0, 0, 1]), (50, [0, 0, 0, 1])]:
        learner.meta_step.assign(step)
        np.testing.assert_allclose(learner.step_importance(4), expected, atol=1e-15)
    learner.meta_step.assign(5)
    task = regression_episodes().task(0)
    by_hand = []
    for steps in (1, 2, 3, 4):
        fast = learner.adapt(task.support_x, task.support_y, steps=steps)
        by_hand.append(float(learner.task_loss(task.query_y, learner.predict(fast,
                                                                              task.query_x))))
    expected = np.dot([0.125, 0.125, 0.125, 0.625], by_hand)
    np.testing.assert_allclose(learner.run_task(task).metrics["loss"], expected, rtol=1e-12)
    # Evaluation (steps given) reports the last step's plain query loss.
    np.testing.assert_allclose(learner.run_task(task, steps=4).metrics["loss"], by_hand[-1])


def test_multi_step_loss_needs_a_trajectory():
    class OneShot(metalearn.adapters.Adapter):
        def adapt(self, weights, support_x, support_y, loss_fn, steps=None):
            return weights

    learner = metalearn.MultiStepLossLearner(_mlp(), OneShot(), loss=mse)
    with pytest.raises(NotImplementedError, match="OneShot does not expose"):
        learner.meta_loss(regression_episodes())
    with pytest.raises(ValueError, match="MultiStepLossLearner.anneal_steps must be a whole number >= 1, got 0"):
        metalearn.MultiStepLossLearner(_mlp(), GradientDescent(), loss=mse, anneal_steps=0)


def test_derivative_order_annealing_switches_at_the_right_step():
    """First order for meta-steps 0..N-1, second order from meta-step N, in one compiled
    meta-step that never retraces."""
    switch = 3
    episodes = regression_episodes()

    def learner(**kwargs):
        return metalearn.Learner(_mlp(), GradientDescent(steps=2, **kwargs), loss=mse)

    annealed = learner(update=[AnnealOrder(switch), GradientStep(0.3)])
    first, second = learner(learning_rate=0.3, first_order=True), learner(learning_rate=0.3)
    meta_step = metalearn.training.make_meta_step(
        annealed, metalearn.MetaGradient(keras.optimizers.SGD(learning_rate=0.1)))
    orders = []
    for step in range(switch + 2):
        assert int(annealed.meta_step) == step
        current = [v.numpy() for v in annealed.meta_variables]
        for reference in (first, second):
            for v, value in zip(reference.meta_variables, current):
                v.assign(value)
        expected = {name: _meta_gradient(ref, episodes)
                    for name, ref in (("first", first), ("second", second))}
        meta_step(episodes)
        applied = {v.path: (w - v.numpy()) / 0.1
                   for v, w in zip(annealed.meta_variables, current)}
        errors = {name: relative_error(applied, g) for name, g in expected.items()}
        orders.append(min(errors, key=errors.get))
        assert min(errors.values()) < 1e-6 < 1e-2 < max(errors.values()), errors
    assert orders == ["first"] * switch + ["second"] * 2
    assert meta_step.experimental_get_tracing_count() == 1


def test_annealing_outside_a_learner_is_an_error():
    adapter = GradientDescent(update=[AnnealOrder(2), GradientStep(0.01)])
    weights = {"w": tf.constant([1.0])}
    with pytest.raises(RuntimeError, match="meta-step counter"):
        adapter.adapt(weights, None, None, lambda w, x, y: tf.reduce_sum(w["w"] ** 2))


def test_learned_rates_are_checkpointed(tmp_path):
    learner = metalearn.Learner(_mlp(), MetaSGD(steps=1, learning_rate=0.1), loss=mse)
    rate = learner.adapter.meta_variables[0]
    rate.assign(np.full(rate.shape, 0.42))
    path = tf.train.Checkpoint(learner=learner).save(str(tmp_path / "ckpt"))
    restored = metalearn.Learner(_mlp(), MetaSGD(steps=1, learning_rate=0.1), loss=mse)
    tf.train.Checkpoint(learner=restored).restore(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(restored.adapter.meta_variables[0].numpy(), rate.numpy())


def test_bad_arguments():
    with pytest.raises(ValueError, match="AnnealOrder.first_order_steps must be a whole number >= 0, got -1"):
        AnnealOrder(-1)
    with pytest.raises(ValueError, match="PerStepWeights=\\('nope',\\) matches none"):
        metalearn.Learner(_mlp(), GradientDescent(wrappers=[PerStepWeights(("nope",))]),
                          loss=mse)
    with pytest.raises(ValueError, match="PerStepLearningRates.steps must be a whole number >= 1, got 0"):
        PerStepLearningRates(steps=0)
    with pytest.raises(ValueError, match="per-step learning_rate needs steps >= 1, got 0"):
        metalearn.Learner(_mlp(), GradientDescent(0, update=LearnedRates("layer_step")),
                          loss=mse)
    with pytest.raises(TypeError, match=r"GradientDescent\(per_step=...\) is a piece"):
        GradientDescent(per_step=("bn",))


def test_max_learning_rate_clips_the_rates_in_use():
    model = models.mlp((2,), hidden=(), outputs=1, dtype="float64")
    adapter = MetaSGD(steps=1, max_learning_rate=0.05)
    learner = metalearn.Learner(model, adapter, loss=mse)
    adapter.learning_rates["mlp/head/kernel"].assign([[1.0], [-1.0]])
    x, y, start, grads = _support_gradient(learner)
    grad = grads["mlp/head/kernel"]
    fast = learner.adapt(x, y).weights
    np.testing.assert_allclose(fast["mlp/head/kernel"],
                               start["mlp/head/kernel"] - [[0.05], [-0.05]] * grad)
    with pytest.raises(ValueError, match="LearnedRates.max_learning_rate must be > 0, got 0"):
        MetaSGD(max_learning_rate=0)


def test_min_learning_rate_keeps_rates_non_negative():
    model = models.mlp((2,), hidden=(), outputs=1, dtype="float64")
    adapter = PerStepLearningRates(steps=2, max_learning_rate=0.05, min_learning_rate=0.0)
    metalearn.Learner(model, adapter, loss=mse)  # builds the rates
    adapter.learning_rates["mlp/head/kernel"].assign([-1.0, 0.02])
    rate = adapter.rates.rate
    assert float(rate("mlp/head/kernel", tf.float64, 0)) == 0.0   # clipped
    assert float(rate("mlp/head/kernel", tf.float64, 1)) == 0.02  # inside
    adapter.learning_rates["mlp/head/kernel"].assign([1.0, 1.0])
    assert float(rate("mlp/head/kernel", tf.float64, 0)) == 0.05
    with pytest.raises(ValueError, match="LearnedRates.min_learning_rate must be "
                                         "<= 0.01, got 0.1"):
        PerStepLearningRates(max_learning_rate=0.05, min_learning_rate=0.1)
