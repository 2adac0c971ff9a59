"""Differentiable inner optimizers: equal to Keras' step by step, exact second-order
meta-gradients through their state and learned hyperparameters, composition."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.adapters import (GradientDescent, GradientStep, InnerAdam, InnerMomentum,
                                InnerRMSProp, Learned, Mask, PerStepWeights, Recompute)
from metalearn.adapters.optimizers import safe_sqrt
from metalearn.testing import (analytic_meta_gradient, keras_optimizer_trajectory,
                               assert_meta_gradient_matches_finite_differences, mse,
                               regression_episodes, relative_error)

STEPS = 4

# Hyperparameters exactly representable in float32: Keras keeps its learning rate in a
# float32 variable, so 0.1 would differ from ours in float64 by float32 rounding.
EPS = 2.0 ** -20
PAIRS = {  # our transform, the Keras optimizer it must equal
    "momentum": (lambda: InnerMomentum(0.125, 0.75),
                 lambda: keras.optimizers.SGD(0.125, momentum=0.75)),
    "nesterov": (lambda: InnerMomentum(0.125, 0.75, nesterov=True),
                 lambda: keras.optimizers.SGD(0.125, momentum=0.75, nesterov=True)),
    "adam": (lambda: InnerAdam(0.0625, 0.75, 0.875, EPS),
             lambda: keras.optimizers.Adam(0.0625, beta_1=0.75, beta_2=0.875, epsilon=EPS)),
    "rmsprop": (lambda: InnerRMSProp(0.0625, rho=0.75, epsilon=EPS),
                lambda: keras.optimizers.RMSprop(0.0625, rho=0.75, epsilon=EPS)),
    "rmsprop_momentum_centered": (
        lambda: InnerRMSProp(0.0625, rho=0.75, momentum=0.5, epsilon=EPS, centered=True),
        lambda: keras.optimizers.RMSprop(0.0625, rho=0.75, momentum=0.5, epsilon=EPS,
                                         centered=True)),
}


def _model():
    keras.utils.set_random_seed(0)
    return models.mlp((2,), hidden=(4,), outputs=1, activation="tanh", dtype="float64")


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_each_inner_optimizer_equals_its_keras_counterpart_step_by_step(name):
    ours, theirs = PAIRS[name]
    model = _model()
    task = regression_episodes(tasks=1, shots=6).task(0)
    learner = metalearn.Learner(model, GradientDescent(STEPS, update=ours()), loss=mse)
    trajectory = metalearn.learners.adapt_trajectory(learner, task.support_x, task.support_y)
    start = learner.initial_weights()
    reference = keras_optimizer_trajectory(learner, task.support_x, task.support_y,
                                           theirs(), STEPS)
    for step, weights in enumerate(reference):
        for path, value in weights.items():
            np.testing.assert_allclose(trajectory[step + 1][path], value,
                                       rtol=1e-12, atol=1e-15, err_msg=f"{name} {step}")
    moved = np.abs(trajectory[-1]["mlp/head/kernel"] - start["mlp/head/kernel"]).max()
    assert moved > 1e-3  # the steps did something


LEARNED = {  # second order through the state and every learned hyperparameter
    "momentum": lambda: InnerMomentum(Learned(0.1, "layer"), Learned(0.7, "step")),
    "nesterov": lambda: InnerMomentum(0.1, Learned(0.7), nesterov=True),
    "adam": lambda: InnerAdam(Learned(0.05, "layer_step"), Learned(0.8), Learned(0.9),
                              epsilon=1e-4),
    "rmsprop": lambda: InnerRMSProp(Learned(0.02, "element"), rho=Learned(0.8),
                                    momentum=Learned(0.5), epsilon=1e-4, centered=True),
}


@pytest.mark.parametrize("name", sorted(LEARNED))
def test_second_order_meta_gradient_through_state_and_learned_hyperparameters(name):
    learner = metalearn.Learner(_model(), GradientDescent(3, update=LEARNED[name]()),
                                loss=mse)
    update = learner.adapter.update
    assert update.hyperparameters.meta_variables
    assert all(any(v is h for v in learner.meta_variables)
               for h in update.hyperparameters.meta_variables)
    episodes = regression_episodes(tasks=2, shots=5)
    analytic = assert_meta_gradient_matches_finite_differences(learner, episodes)
    for variable in update.hyperparameters.meta_variables:
        assert np.any(analytic[variable.path]), variable.path


def test_inner_adam_composes_with_a_mask_per_step_weights_and_recompute():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,), dtype="float64"),
                              keras.layers.Dense(4, name="hidden0", dtype="float64"),
                              keras.layers.BatchNormalization(name="bn0", dtype="float64"),
                              keras.layers.Activation("tanh", dtype="float64"),
                              keras.layers.Dense(1, name="head", dtype="float64")],
                             name="net")
    adapter = GradientDescent(2, update=[Mask(("head", "hidden0")),
                                         InnerAdam(Learned(0.05, "layer"), epsilon=1e-4)],
                              wrappers=[PerStepWeights(("bn0",)), Recompute()])
    learner = metalearn.Learner(model, adapter, loss=mse)
    assert learner.pieces.capabilities.custom_gradient
    episodes = regression_episodes(tasks=2, shots=5)
    assert_meta_gradient_matches_finite_differences(learner, episodes)


@pytest.mark.parametrize("formulation", ["map_fn", "batched"])
def test_inner_optimizers_work_on_a_task_axis(formulation):
    """Every operation is elementwise, so the batched formulation accepts them and gives
    the per-task loop's meta-gradient."""
    episodes = regression_episodes(tasks=3, shots=5)
    results = {}
    for batching in ("unrolled", formulation):
        learner = metalearn.Learner(_model(), GradientDescent(
            2, update=InnerAdam(Learned(0.05, "element"), epsilon=1e-4)), loss=mse)
        results[batching] = analytic_meta_gradient(
            learner, episodes, formulation=metalearn.execution.formulation(batching))
    assert relative_error(results[formulation], results["unrolled"]) < 1e-10


def test_safe_sqrt_has_the_values_and_a_finite_derivative_at_zero():
    x = tf.constant([0.0, 4.0], tf.float64)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = safe_sqrt(x)
        plain = tf.sqrt(x)
    np.testing.assert_array_equal(y, plain)
    np.testing.assert_array_equal(tape.gradient(y, x), [0.0, 0.25])
    assert np.isinf(tape.gradient(plain, x)[0])  # what the plain formula would give


def test_a_dead_unit_gives_a_finite_second_order_meta_gradient_with_inner_adam():
    keras.utils.set_random_seed(0)
    model = models.mlp((2,), hidden=(3,), outputs=1, activation="relu", dtype="float64")
    hidden = model.get_layer("hidden0")
    hidden.bias.assign([-100.0, 0.0, 0.0])  # unit 0 is dead for these inputs
    learner = metalearn.Learner(model, GradientDescent(2, update=InnerAdam(0.05)), loss=mse)
    grads = analytic_meta_gradient(learner, regression_episodes(tasks=2))
    assert all(np.all(np.isfinite(g)) for g in grads.values())


def test_boil_adapts_the_body_and_freezes_the_head():
    learner = metalearn.Learner(_model(), GradientDescent(
        2, update=[Mask(("head",), invert=True), GradientStep(0.3)]), loss=mse)
    task = regression_episodes(tasks=1).task(0)
    start, fast = learner.initial_weights(), learner.adapt(task.support_x, task.support_y).weights
    for path in start:
        changed = not np.array_equal(start[path], fast[path])
        assert changed == ("head" not in path), path
    episodes = regression_episodes(tasks=2)
    assert_meta_gradient_matches_finite_differences(learner, episodes)


def test_bad_hyperparameters_are_named():
    with pytest.raises(ValueError, match="learning_rate must be > 0, got -1"):
        InnerAdam(-1)
    with pytest.raises(ValueError, match=r"InnerAdam.beta_1 must be in \[0, 1\), got 1.0"):
        InnerAdam(beta_1=1.0)
    with pytest.raises(ValueError, match=r"InnerMomentum.momentum must be in \[0, 1\), got 1.5"):
        InnerMomentum(momentum=1.5)
    with pytest.raises(ValueError, match="Learned per must be one of"):
        Learned(0.1, per="row")
    with pytest.raises(ValueError, match=r"Mask\(invert=True\) of \('mlp',\) leaves no "
                                         "weight"):
        metalearn.Learner(_model(), GradientDescent(
            1, update=[Mask(("mlp",), invert=True), GradientStep(0.1)]), loss=mse)
