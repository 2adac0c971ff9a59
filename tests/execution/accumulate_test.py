"""The Accumulate formulation: per-task meta-gradients summed inside the compiled loop
equal the one-tape meta-gradient, for every kind of learner and under XLA and
tf.distribute."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution, models
from metalearn.adapters import (GradientDescent, ImplicitGradientDescent, InnerAdam,
                                MetaSGD, PerStepLearningRates, PerStepWeights, Recompute)
from metalearn.heads import RidgeHead
from metalearn.testing import (WAYS, LearnerContract, classification_learner,
                               contract_model, relative_error, synthetic_classification)
from metalearn.training import distribute, make_meta_step

from tests.formulation_fixtures import bn_model as _bn_model
from tests.formulation_fixtures import meta_gradients as _gradients


LEARNERS = {
    "maml_bn": lambda: classification_learner(GradientDescent(2, 0.3), _bn_model()),
    "fomaml": lambda: classification_learner(GradientDescent(2, 0.3, first_order=True),
                                             contract_model("float64")),
    "meta_sgd": lambda: classification_learner(MetaSGD(1, 0.3), contract_model("float64")),
    "maml_plus_plus": lambda: classification_learner(
        PerStepLearningRates(2, 0.2, wrappers=[PerStepWeights(("bn0",)), Recompute()]),
        _bn_model(), learner_class=metalearn.MultiStepLossLearner, anneal_steps=4),
    "inner_adam": lambda: classification_learner(
        GradientDescent(2, update=InnerAdam(0.05, epsilon=1e-4)), contract_model("float64")),
    "imaml": lambda: classification_learner(
        ImplicitGradientDescent(3, 0.1, regularization=2.0, cg_steps=3),
        contract_model("float64")),
    "protonets": lambda: metalearn.PrototypicalNetworks(
        contract_model("float64"), ways=WAYS, drop_head="head"),
    "r2d2": lambda: metalearn.EmbeddingLearner(
        contract_model("float64"), head=RidgeHead(0.5), ways=WAYS, drop_head="head"),
}


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_accumulated_meta_gradient_equals_the_one_tape_meta_gradient(name):
    episodes = synthetic_classification(0, tasks=3, dtype=tf.float64)
    reference, ref_metrics = _gradients(LEARNERS[name](), episodes, execution.Unrolled())
    for jit_compile in (False, True):
        grads, metrics = _gradients(LEARNERS[name](), episodes, execution.Accumulate(),
                                    jit_compile)
        for a, b in zip(grads, reference):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13)
        for k in ref_metrics:
            np.testing.assert_allclose(metrics[k], ref_metrics[k], rtol=1e-6)  # accuracy: float32


def test_accumulate_under_two_replicas_equals_one_device():
    strategy = distribute.make_strategy("mirrored", ["/cpu:0", "/cpu:1"],
                                        cross_device_ops="reduce_to_one_device")
    episodes = synthetic_classification(1, tasks=4)
    single = classification_learner(GradientDescent(2, 0.3))
    make_meta_step(single, metalearn.MetaGradient(keras.optimizers.SGD(0.5)),
                   execution.Accumulate())(episodes)
    with strategy.scope():
        replicated = classification_learner(GradientDescent(2, 0.3))
        rule = metalearn.MetaGradient(keras.optimizers.SGD(0.5))
    step = make_meta_step(replicated, rule, execution.Accumulate(), strategy=strategy)
    step(distribute.split_episodes(strategy, episodes))
    for a, b in zip(single.meta_variables, replicated.meta_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_a_disconnected_meta_variable_is_named():
    learner = classification_learner(GradientDescent(1, 0.3))
    unused = keras.Variable(1.0, name="unused")
    with pytest.raises(ValueError, match="no meta-gradient reaches"):
        execution.Accumulate().gradients(
            learner, synthetic_classification(0, tasks=2), learner.meta_variables + [unused])


def test_accumulate_runs_eagerly():
    # Outside any tf.function (Auto's choice on a CPU, e.g. an eager meta_loss): the
    # while_loop's variables must keep one structure (a list against the body's tuple
    # raised a TypeError once maximum_iterations was given).
    learner = classification_learner(GradientDescent(1, 0.3), contract_model("float64"))
    episodes = synthetic_classification(0, tasks=2, dtype=tf.float64)
    got = learner.meta_metrics(episodes, formulation=execution.Accumulate())
    want = learner.meta_metrics(episodes, formulation=execution.Unrolled())
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-12)
    grads, _ = execution.Accumulate().gradients(learner, episodes, learner.meta_variables)
    reference, _ = execution.Unrolled().gradients(learner, episodes, learner.meta_variables)
    for a, b in zip(grads, reference):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13)


class TestAccumulatedMAML(LearnerContract):
    def make_learner(self):
        return classification_learner(GradientDescent(2, 0.1))

    def make_formulation(self):
        return execution.Accumulate()
