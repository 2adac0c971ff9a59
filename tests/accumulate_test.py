"""task_batching="accumulate": per-task meta-gradients summed inside the compiled loop
equal the one-tape meta-gradient, for every kind of learner and under XLA and
tf.distribute."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.adapters import (GradientDescent, ImplicitGradientDescent, InnerAdam,
                                MetaSGD, PerStepLearningRates, PerStepWeights, Recompute)
from metalearn.heads import RidgeHead
from metalearn.testing import (WAYS, LearnerContract, classification_learner,
                               contract_model, relative_error, synthetic_classification)
from metalearn.training import distribute, make_meta_step

from tests.formulation_fixtures import bn_model as _bn_model
from tests.formulation_fixtures import meta_gradients as _gradients


LEARNERS = {
    "maml_bn": lambda b: classification_learner(GradientDescent(2, 0.3), _bn_model(),
                                                task_batching=b),
    "fomaml": lambda b: classification_learner(GradientDescent(2, 0.3, first_order=True),
                                               contract_model("float64"), task_batching=b),
    "meta_sgd": lambda b: classification_learner(MetaSGD(1, 0.3), contract_model("float64"),
                                                 task_batching=b),
    "maml_plus_plus": lambda b: classification_learner(
        PerStepLearningRates(2, 0.2, wrappers=[PerStepWeights(("bn0",)), Recompute()]),
        _bn_model(), learner_class=metalearn.MultiStepLossLearner, anneal_steps=4,
        task_batching=b),
    "inner_adam": lambda b: classification_learner(
        GradientDescent(2, update=InnerAdam(0.05, epsilon=1e-4)), contract_model("float64"),
        task_batching=b),
    "imaml": lambda b: classification_learner(
        ImplicitGradientDescent(3, 0.1, regularization=2.0, cg_steps=3),
        contract_model("float64"), task_batching=b),
    "protonets": lambda b: metalearn.PrototypicalNetworks(
        contract_model("float64"), ways=WAYS, drop_head="head", task_batching=b),
    "r2d2": lambda b: metalearn.EmbeddingLearner(
        contract_model("float64"), head=RidgeHead(0.5), ways=WAYS, drop_head="head",
        task_batching=b),
}


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_accumulated_meta_gradient_equals_the_one_tape_meta_gradient(name):
    episodes = synthetic_classification(0, tasks=3, dtype=tf.float64)
    reference, ref_metrics = _gradients(LEARNERS[name]("unrolled"), episodes)
    for jit_compile in (False, True):
        grads, metrics = _gradients(LEARNERS[name]("accumulate"), episodes, jit_compile)
        for a, b in zip(grads, reference):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13)
        for k in ref_metrics:
            np.testing.assert_allclose(metrics[k], ref_metrics[k], rtol=1e-6)  # accuracy: float32


def test_accumulate_under_two_replicas_equals_one_device():
    strategy = distribute.make_strategy("mirrored", ["/cpu:0", "/cpu:1"],
                                        cross_device_ops="reduce_to_one_device")
    episodes = synthetic_classification(1, tasks=4)
    single = classification_learner(GradientDescent(2, 0.3), task_batching="accumulate")
    make_meta_step(single, metalearn.MetaOptimizer(keras.optimizers.SGD(0.5)))(episodes)
    with strategy.scope():
        replicated = classification_learner(GradientDescent(2, 0.3),
                                            task_batching="accumulate")
        optimizer = metalearn.MetaOptimizer(keras.optimizers.SGD(0.5))
    step = make_meta_step(replicated, optimizer, strategy=strategy)
    step(distribute.split_episodes(strategy, episodes))
    for a, b in zip(single.meta_variables, replicated.meta_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_a_disconnected_meta_variable_is_named():
    learner = classification_learner(GradientDescent(1, 0.3), task_batching="accumulate")
    unused = keras.Variable(1.0, name="unused")
    with pytest.raises(ValueError, match="no meta-gradient reaches"):
        metalearn.learners.task_batching.accumulate(
            learner, synthetic_classification(0, tasks=2), learner.meta_variables + [unused])


class TestAccumulatedMAML(LearnerContract):
    def make_learner(self):
        return classification_learner(GradientDescent(2, 0.1), task_batching="accumulate")
