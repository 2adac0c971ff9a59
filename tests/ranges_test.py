"""Hyperparameter ranges (metalearn.ranges): one check (:func:`metalearn.pieces.check_range`)
for every piece that takes a number, the range stated in the message and in the
docstring, and a learned value kept inside its bounds, eagerly and in a compiled
training step; the learned optimizer's learning rate gets the same check."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import keras

import metalearn
from metalearn import adapters, heads, models
from metalearn.adapters import (GradientDescent, GradientStep, InnerAdam, InnerMomentum,
                                InnerRMSProp, Learned, LearnedRates, LearnedRule,
                                LearnedRuleOptimizer)
from metalearn.pieces import HyperparameterRangeError, Range, check_range
from metalearn.tasks.episode import Episode


# --- hyperparameter ranges -------------------------------------------------------


@pytest.mark.parametrize("build, piece, name, value", [
    (lambda: InnerMomentum(momentum=-0.9), "InnerMomentum", "momentum", "-0.9"),
    (lambda: InnerMomentum(momentum=1.0), "InnerMomentum", "momentum", "1.0"),
    (lambda: InnerAdam(beta_1=-1), "InnerAdam", "beta_1", "-1"),
    (lambda: InnerAdam(beta_2=1.5), "InnerAdam", "beta_2", "1.5"),
    (lambda: InnerAdam(epsilon=0.0), "InnerAdam", "epsilon", "0.0"),
    (lambda: InnerRMSProp(rho=-0.1), "InnerRMSProp", "rho", "-0.1"),
    (lambda: InnerRMSProp(momentum=Learned(-0.5)), "InnerRMSProp", "momentum", "-0.5"),
    (lambda: GradientStep(-0.1), "GradientStep", "learning_rate", "-0.1"),
    (lambda: GradientStep(float("nan")), "GradientStep", "learning_rate", "nan"),
    (lambda: GradientDescent(-1), "GradientDescent", "steps", "-1"),
    (lambda: GradientDescent(1.5), "GradientDescent", "steps", "1.5"),
    (lambda: LearnedRates(initial=0.0), "LearnedRates", "initial", "0.0"),
    (lambda: heads.RidgeHead(regularization=0.0), "RidgeHead", "regularization", "0.0"),
    (lambda: heads.SVMHead(c=-1.0), "SVMHead", "c", "-1.0"),
    (lambda: heads.LogisticHead(damping=0.0), "LogisticHead", "damping", "0.0"),
    (lambda: heads.PrototypeHead(scale=0.0), "PrototypeHead", "scale", "0.0"),
    (lambda: heads.LinearProbeHead(momentum=1.0), "LinearProbeHead", "momentum", "1.0"),
    (lambda: adapters.ImplicitGradientDescent(cg_steps=0), "ImplicitGradientDescent",
     "cg_steps", "0"),
])
def test_a_hyperparameter_out_of_range_is_named_with_its_range(build, piece, name, value):
    with pytest.raises(HyperparameterRangeError) as info:
        build()
    message = str(info.value)
    assert f"{piece}.{name}" in message, message
    assert f"got {value}" in message, message
    assert "must be" in message, message


def test_the_range_is_stated_in_the_message():
    with pytest.raises(HyperparameterRangeError,
                       match=r"InnerAdam.beta_1 must be in \[0, 1\), got -1"):
        InnerAdam(beta_1=-1)
    with pytest.raises(HyperparameterRangeError,
                       match=r"InnerMomentum.learning_rate must be > 0, got 0"):
        InnerMomentum(learning_rate=0)
    with pytest.raises(TypeError, match=r"GradientDescent.steps must be a whole number "
                                        r">= 0, got 'two' \(str\)"):
        GradientDescent("two")


def test_check_range_is_the_one_check():
    assert check_range("P", "x", 0.5, Range(0, 1, high_open=True)) == 0.5
    assert check_range("P", "n", 3.0, Range(1, whole=True)) == 3
    assert isinstance(check_range("P", "n", 3.0, Range(1, whole=True)), int)
    for bad in (True, float("inf"), None, "1"):
        with pytest.raises((TypeError, HyperparameterRangeError)):
            check_range("P", "x", bad, Range(0, low_open=True))
    assert str(Range(0, 1, high_open=True)) == "in [0, 1)"
    assert str(Range(0, low_open=True)) == "> 0"
    assert str(Range(1, whole=True)) == "a whole number >= 1"


@pytest.mark.parametrize("piece", [InnerMomentum, InnerAdam, InnerRMSProp, GradientStep,
                                   GradientDescent, heads.RidgeHead, heads.SVMHead,
                                   heads.LogisticHead, heads.PrototypeHead,
                                   heads.LinearProbeHead])
def test_each_docstring_states_its_ranges(piece):
    doc = piece.__doc__
    assert "> 0" in doc or "[0, 1)" in doc or ">= 0" in doc or ">= 1" in doc, doc


def test_learned_initial_outside_its_bounds_is_refused():
    with pytest.raises(HyperparameterRangeError,
                       match=r"Learned.initial must be in \[0, 0.1\], got 0.5"):
        Learned(0.5, low=0, high=0.1)
    with pytest.raises(HyperparameterRangeError, match=r"Learned.initial must be >= 0.2"):
        Learned(0.1, low=0.2)


def _rate_learner(learned):
    keras.utils.set_random_seed(0)
    model = models.mlp((1,), hidden=(), outputs=1)
    return metalearn.Learner(model, GradientDescent(1, update=GradientStep(learned)),
                             loss="mse")


def _episode():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 8, 1)).astype(np.float32)
    return Episode(x[:, :4], 3 * x[:, :4], x[:, 4:], 3 * x[:, 4:])


def test_a_learned_value_pushed_past_its_bound_comes_back_and_keeps_learning():
    """The outer optimizer moves a bounded learned rate past ``high``: it is projected
    back onto the bound after the update (the variable never stays outside), and at the
    bound its gradient is the unclipped one (so the next step can move it back)."""
    learner = _rate_learner(Learned(0.09, low=0.0, high=0.1))
    episode = _episode()
    rate = [v for v in learner.meta_variables if "lr" in v.path][0]
    rule = metalearn.outer.MetaGradient(keras.optimizers.SGD(1.0))
    rule.build(learner)
    # a gradient that pushes the rate far above high
    rule.apply(learner, [tf.zeros_like(v) if v is not rate else tf.constant(-5.0)
                         for v in learner.meta_variables], {"loss": tf.constant(0.0)})
    assert float(rate.numpy()) == pytest.approx(0.1)
    # at the bound the meta-gradient reaches the rate (not stuck) ...
    with tf.GradientTape() as tape:
        loss = learner.meta_loss(episode)
    gradient = tape.gradient(loss, rate)
    assert gradient is not None and float(gradient) != 0.0
    # ... and equals the one-sided finite difference from inside the bound
    h = 1e-3
    values = []
    for value in (0.1 - h, 0.1):
        rate.assign(value)
        values.append(float(learner.meta_loss(episode)))
    assert float(gradient) == pytest.approx((values[1] - values[0]) / h, rel=0.05)
    # a step the other way moves it back inside
    rule.apply(learner, [tf.zeros_like(v) if v is not rate else tf.constant(0.05)
                         for v in learner.meta_variables], {"loss": tf.constant(0.0)})
    assert float(rate.numpy()) == pytest.approx(0.05)


@pytest.mark.parametrize("piece, name, outside, inside", [
    (lambda v: InnerAdam(beta_1=v), "beta_1", 1.5, 1.0),
    (lambda v: InnerAdam(beta_2=v), "beta_2", -0.5, 0.0),
    (lambda v: InnerMomentum(momentum=v), "momentum", 3.0, 1.0),
    (lambda v: InnerRMSProp(rho=v), "rho", 1.0, 1.0),
    (lambda v: InnerAdam(epsilon=v), "epsilon", -1e-3, 0.0),
])
def test_a_learned_value_without_bounds_stays_in_its_piece_s_range(piece, name, outside,
                                                                   inside):
    """A learned beta, momentum, rho or epsilon given no ``low``/``high`` is kept in
    its piece's range (where leaving it breaks the rule: a decay of 1 or more, an
    epsilon of 0 or less): after an outer update pushes it out, it is projected back
    to just inside the range, never outside."""
    keras.utils.set_random_seed(0)
    model = models.mlp((1,), hidden=(), outputs=1)
    learner = metalearn.Learner(model, GradientDescent(2, update=piece(Learned(0.5 if name != "epsilon" else 1e-3))), loss="mse")
    variable = [v for v in learner.meta_variables if name in v.path][0]
    rule = metalearn.outer.MetaGradient(keras.optimizers.SGD(1.0))
    rule.build(learner)
    push = float(variable.numpy()) - outside  # SGD(1): new = old - direction
    rule.apply(learner, [tf.constant(push) if v is variable else tf.zeros_like(v)
                         for v in learner.meta_variables], {"loss": tf.constant(0.0)})
    value = float(variable.numpy())
    allowed = {"epsilon": metalearn.pieces.POSITIVE}.get(name, metalearn.pieces.DECAY)
    assert value in allowed and value == pytest.approx(inside, abs=1e-6), value
    assert np.isfinite(float(learner.meta_loss(_episode())))


def test_a_learned_decay_s_own_bounds_must_lie_in_its_range():
    with pytest.raises(HyperparameterRangeError,
                       match=r"InnerAdam.beta_1 \(Learned.high\) must be in \[0, 1\), got 1.5"):
        InnerAdam(beta_1=Learned(0.9, high=1.5))
    adam = InnerAdam(beta_1=Learned(0.9, low=0.5))  # the range's high fills the other end
    assert adam.hyperparameters.values["beta_1"].low == 0.5
    assert 0.9999 < adam.hyperparameters.values["beta_1"].high < 1


def test_a_learned_learning_rate_may_change_sign():
    """Rates are not projected unless bounds are given (Meta-SGD learns signed rates)."""
    learner = _rate_learner(Learned(0.01))
    rate = [v for v in learner.meta_variables if "lr" in v.path][0]
    rule = metalearn.outer.MetaGradient(keras.optimizers.SGD(1.0))
    rule.build(learner)
    rule.apply(learner, [tf.constant(0.5) if v is rate else tf.zeros_like(v)
                         for v in learner.meta_variables], {"loss": tf.constant(0.0)})
    assert float(rate.numpy()) == pytest.approx(-0.49)


def test_a_bounded_learned_value_stays_in_its_bounds_in_a_compiled_training_step():
    """The projection runs inside the compiled meta-step (the Keras optimizer applies the
    variables' constraint after its update), with an outer step large enough to cross
    the bound many times over."""
    from metalearn.training.step import make_meta_step
    learner = _rate_learner(Learned(0.099, per="layer", low=0.05, high=0.1))
    rule = metalearn.outer.MetaGradient(keras.optimizers.SGD(100.0))
    rule.build(learner)
    step = make_meta_step(learner, rule, "unrolled", skip_non_finite=True)
    rates = [v for v in learner.meta_variables if "lr" in v.path]
    for _ in range(3):
        step(_episode())
        for rate in rates:  # float32 bounds
            assert np.float32(0.05) <= rate.numpy() <= np.float32(0.1), rate.numpy()
    assert any(r.numpy() in (np.float32(0.05), np.float32(0.1)) for r in rates)  # reached


# --- the learned optimizer's learning rate ----------------------------------------


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
