"""The learned optimizer: an inner update whose rule is a small network per element.

It starts as Adam (an independent reference), its meta-gradient matches float64 finite
differences to first and second order, alone and composed (Mask, WhileLoop, a task
axis), and the same rule as a Keras optimizer gives the piece's updates step by step,
saved and loaded with the model.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.adapters import (FirstOrder, GradientDescent, InnerAdam, LearnedRule,
                                LearnedRuleOptimizer, Mask, WhileLoop)
from metalearn.adapters.learned_optimizer import RuleMismatchError
from metalearn.execution import Batched, Unrolled
from metalearn.learners import FixedInit
from metalearn.pieces import HyperparameterRangeError
from metalearn.testing import (LearnerContract, analytic_meta_gradient,
                               assert_meta_gradient_matches_finite_differences,
                               carried_segment_gradients,
                               classification_learner, finite_difference_variables,
                               keras_optimizer_trajectory, mse,
                               regression_episodes, relative_error)


def _model(hidden=(3,)):
    keras.utils.set_random_seed(0)
    return models.mlp((2,), hidden=hidden, outputs=1, activation="tanh", dtype="float64")


def _perturbed(rule: LearnedRule, seed: int = 1, scale: float = 0.3) -> LearnedRule:
    """The rule's network moved off its initial point, so every path of the network
    (hidden layers, magnitude) matters."""
    rng = np.random.default_rng(seed)
    for variable in rule.network.values():
        variable.assign(variable.numpy() + scale * rng.standard_normal(variable.shape))
    return rule


def _learner(update, steps=3, wrappers=(), task_init=(), model=None):
    return metalearn.Learner(model or _model(),
                             GradientDescent(steps, update=update, wrappers=wrappers),
                             loss=mse, task_init=task_init)


def _rule(learner):
    return [p for p in learner.adapter.parts() if isinstance(p, LearnedRule)][0]


def test_the_rule_starts_as_adam_step_by_step():
    task = regression_episodes(tasks=1, shots=6).task(0)
    ours = _learner(LearnedRule(0.05, epsilon=1e-14), steps=4)
    adam = _learner(InnerAdam(0.05, 0.9, 0.999, 1e-14), steps=4)
    a = metalearn.learners.adapt_trajectory(ours, task.support_x, task.support_y)
    b = metalearn.learners.adapt_trajectory(adam, task.support_x, task.support_y)
    for step in range(1, 5):
        for path in a[step]:
            np.testing.assert_allclose(a[step][path], b[step][path], rtol=1e-9, atol=1e-11)
    assert np.abs(a[-1]["mlp/head/kernel"] - a[0]["mlp/head/kernel"]).max() > 1e-2


def test_the_network_is_meta_learned_and_changes_the_steps():
    learner = _learner(LearnedRule(0.05, hidden=(4,)))
    names = [v.path for v in learner.meta_variables]
    assert {"learned_rule_hidden_0_kernel", "learned_rule_skip_kernel",
            "learned_rule_output_kernel"} <= set(names)
    task = regression_episodes(tasks=1).task(0)
    before = learner.adapt(task.support_x, task.support_y).weights
    _perturbed(_rule(learner))
    after = learner.adapt(task.support_x, task.support_y).weights
    assert np.abs(before["mlp/head/kernel"] - after["mlp/head/kernel"]).max() > 1e-3


@pytest.mark.parametrize("case", ["alone", "mask", "while_loop"])
def test_second_order_meta_gradient_matches_finite_differences(case):
    rule = LearnedRule(0.1, hidden=(3,), betas=(0.5, 0.9), timescales=(1.0, 10.0))
    update = [Mask(("head",)), rule] if case == "mask" else rule
    wrappers = [WhileLoop()] if case == "while_loop" else ()
    learner = _learner(update, steps=3, wrappers=wrappers)
    _perturbed(rule)
    grads = assert_meta_gradient_matches_finite_differences(
        learner, regression_episodes(tasks=2), formulation=Unrolled())
    assert np.abs(grads["learned_rule_hidden_0_kernel"]).max() > 1e-6  # reaches the MLP


def test_first_order_meta_gradient_matches_finite_differences_with_the_gradients_fixed():
    """First order (FirstOrder before the rule) against the meta-loss of the same steps
    with every inner gradient a recorded constant, differenced in every meta-variable."""
    rule = LearnedRule(0.1, hidden=(3,), betas=(0.9,), timescales=(1.0,))
    learner = _learner([FirstOrder(), rule], steps=3)
    _perturbed(rule)
    episodes = regression_episodes(tasks=1)
    task = episodes.task(0)
    trajectory = metalearn.learners.adapt_trajectory(learner, task.support_x, task.support_y)
    recorded = []
    for weights in trajectory[:-1]:
        with tf.GradientTape() as tape:
            tape.watch(weights)
            loss = learner.support_loss(weights, task.support_x, task.support_y)
        recorded.append({p: tf.constant(g) for p, g in tape.gradient(loss, weights).items()})

    def fixed_gradient_meta_loss():
        weights = learner.initial_weights()
        state = rule.init(weights)
        for step, grads in enumerate(recorded):
            updates, state = rule.update(grads, state, weights, metalearn.adapters.StepInfo(step, 3))
            weights = {p: weights[p] + updates[p] for p in weights}
        return mse(task.query_y, learner.predict(weights, task.query_x))

    analytic = analytic_meta_gradient(learner, episodes, Unrolled())
    numeric = finite_difference_variables(fixed_gradient_meta_loss, learner.meta_variables)
    assert relative_error(analytic, numeric) < 1e-6
    with pytest.raises(AssertionError):  # and it is not the full (second-order) gradient
        assert_meta_gradient_matches_finite_differences(learner, episodes,
                                                        formulation=Unrolled())


def test_a_task_axis_gives_the_same_meta_loss_and_gradient():
    rule = LearnedRule(0.1, hidden=(3,))
    learner = _learner(rule, steps=2)
    _perturbed(rule)
    episodes = regression_episodes(tasks=3)
    assert learner.pieces.capabilities.task_axis
    a = analytic_meta_gradient(learner, episodes, Batched())
    b = analytic_meta_gradient(learner, episodes, Unrolled())
    assert relative_error(a, b) < 1e-10


def test_fixed_init_leaves_the_model_out_of_the_meta_variables():
    learner = _learner(LearnedRule(0.1, hidden=(3,)), task_init=[FixedInit()])
    assert all(v.path.startswith("learned_rule") for v in learner.meta_variables)
    grads = assert_meta_gradient_matches_finite_differences(
        learner, regression_episodes(tasks=2), formulation=Unrolled())
    assert len(grads) == 5


def _keras_pair(rule, steps, optimizer):
    """The rule's inner trajectory on one task against the same steps by
    ``optimizer(rule)`` applied to variables starting at the same weights."""
    learner = _learner(rule, steps=steps)
    task = regression_episodes(tasks=1, shots=6).task(0)
    trajectory = metalearn.learners.adapt_trajectory(learner, task.support_x, task.support_y)
    reference = keras_optimizer_trajectory(learner, task.support_x, task.support_y,
                                           optimizer(rule), steps)
    for step, weights in enumerate(reference):
        for path, value in weights.items():
            np.testing.assert_allclose(trajectory[step + 1][path], value,
                                       rtol=1e-10, atol=1e-13, err_msg=f"step {step}")


def test_the_keras_optimizer_gives_the_pieces_updates_step_by_step():
    rule = LearnedRule(0.125, hidden=(4,))  # exact in float32, where Keras keeps its rate
    rule.create("float64")
    _perturbed(rule, scale=0.2)
    _keras_pair(rule, 5, LearnedRuleOptimizer)
    # a later change to the rule leaves a made optimizer frozen
    optimizer = LearnedRuleOptimizer(rule)
    rule.network["skip_kernel"].assign(np.zeros(rule.shapes()["skip_kernel"]))
    assert np.abs(optimizer.frozen["skip_kernel"]).max() > 0.5


def test_the_keras_optimizer_trains_a_model_with_fit_and_saves_with_it(tmp_path):
    rule = LearnedRule(0.02, hidden=(4,))
    rule.create("float32")
    _perturbed(rule, scale=0.05)
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(64, 2)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0]], "float32") + 0.5).astype("float32")
    model = models.mlp((2,), hidden=(8,), outputs=1, activation="tanh")
    model.compile(optimizer=LearnedRuleOptimizer(rule), loss="mse")
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=8, batch_size=16, verbose=0)
    after = model.evaluate(x, y, verbose=0)
    assert after < 0.5 * before
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.optimizer, LearnedRuleOptimizer)
    for key, value in rule.values().items():
        np.testing.assert_array_equal(loaded.optimizer.frozen[key], value)
    # both continue identically: the optimizer's state (momenta, step) came back too
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, shuffle=False)
    loaded.fit(x, y, epochs=1, batch_size=16, verbose=0, shuffle=False)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_rule_saves_and_loads_and_comes_back_from_a_learner_checkpoint(tmp_path):
    learner = _learner(LearnedRule(0.125, hidden=(3,), activation="gelu"))
    rule = _perturbed(_rule(learner))
    path = os.path.join(tmp_path, "rule.npz")
    rule.save(path)
    loaded = LearnedRule.load(path, dtype="float64")
    assert loaded.config() == rule.config()
    for key, value in rule.values().items():
        np.testing.assert_array_equal(loaded.values()[key], value)
    _keras_pair(loaded, 3, LearnedRuleOptimizer)  # the loaded rule's steps are the learner's
    checkpoint = tf.train.Checkpoint(learner=learner)
    saved = checkpoint.write(os.path.join(tmp_path, "ckpt"))
    meta_trained = rule.values()
    _perturbed(rule, seed=5)
    checkpoint.read(saved).assert_consumed()
    for key, value in meta_trained.items():
        np.testing.assert_array_equal(LearnedRuleOptimizer(rule).frozen[key], value)


def test_bad_input_is_named():
    with pytest.raises(HyperparameterRangeError, match=r"LearnedRule.betas must be in \[0, 1\), got 1"):
        LearnedRule(betas=(0.5, 1.0))
    with pytest.raises(HyperparameterRangeError, match="LearnedRule.learning_rate"):
        LearnedRule(learning_rate=0.0)
    with pytest.raises(ValueError, match="activation must be one of"):
        LearnedRule(activation="sigmoid")
    learner = _learner([Mask(("head",)), LearnedRule(0.1)])
    weights = learner.initial_weights()
    rule = _rule(learner)
    with pytest.raises(RuleMismatchError, match="built for the weights .*mlp/head.*not .mlp/hidden0"):
        rule.update({"mlp/hidden0/kernel": weights["mlp/hidden0/kernel"]},
                    rule.init({"mlp/hidden0/kernel": weights["mlp/hidden0/kernel"]}),
                    weights, metalearn.adapters.StepInfo(0, 3))
    other = LearnedRule(0.1, hidden=(5,))
    with pytest.raises(RuleMismatchError, match="hidden_0_kernel' has shape"):
        other.create("float32", rule.values())
    with pytest.raises(TypeError, match="takes a metalearn LearnedRule"):
        LearnedRuleOptimizer(InnerAdam())


class TestLearnedRule(LearnerContract):
    covers = (LearnedRule,)

    def make_learner(self):
        return classification_learner(GradientDescent(2, update=LearnedRule(0.1)))


class TestLearnedRuleFromAFixedInit(LearnerContract):
    """Only the rule meta-trains; every task starts at the model's fixed weights."""
    covers = (FixedInit,)

    def make_learner(self):
        return classification_learner(GradientDescent(2, update=LearnedRule(0.1)),
                                      task_init=[FixedInit()])


# --- meta-training over a longer horizon: truncated backpropagation ------------------


def test_a_truncated_segments_gradient_is_finite_differences_from_the_carried_state():
    """TruncatedUnroll on a learned rule in a while-loop, horizon 4 in segments of 2:
    the second segment's direction (the carried weights and accumulators after the
    first segment held constant) equals float64 central differences of that segment's
    mean query loss from the same carried state, in every network weight."""
    from metalearn.outer import TruncatedUnroll
    rule = LearnedRule(0.1, hidden=(3,), betas=(0.5, 0.9), timescales=(1.0, 10.0))
    learner = _learner(rule, steps=4, wrappers=[WhileLoop()], task_init=[FixedInit()])
    _perturbed(rule, seed=3)  # built now: moved off its Adam start
    analytic, numeric = carried_segment_gradients(
        TruncatedUnroll(keras.optimizers.SGD(0.1), horizon=4, truncation=2), learner,
        regression_episodes(tasks=2, shots=4))
    assert set(analytic) == {v.path for v in rule.network.values()}
    assert max(np.abs(g).max() for g in numeric.values()) > 1e-3
    assert relative_error(analytic, numeric) < 1e-6
