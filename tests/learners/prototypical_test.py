"""Prototypical Networks and Proto-MAML: logits by hand, meta-gradients against finite
differences in float64, and the contract."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.adapters import GradientDescent
from metalearn.testing import (DIM, WAYS, LearnerContract, contract_model,
                            synthetic_classification, uninformative_support)
from metalearn.testing import assert_meta_gradient_matches_finite_differences


def _embedding(seed=0, dtype="float64"):
    keras.utils.set_random_seed(seed)
    return models.mlp((DIM,), hidden=(5,), outputs=4, activation="tanh", dtype=dtype,
                      name="embed")


def _episodes(tasks=2):
    return synthetic_classification(0, tasks=tasks, dtype=tf.float64)


def test_logits_are_negative_squared_distances_to_class_means():
    learner = metalearn.PrototypicalNetworks(_embedding(), ways=WAYS)
    task = _episodes().task(0)
    fast = learner.adapt(task.support_x, task.support_y)
    logits = learner.predict(fast, task.query_x).numpy()
    embed = lambda x: learner.model(x, training=True).numpy()
    support, labels = embed(task.support_x), task.support_y.numpy()
    prototypes = np.stack([support[labels == k].mean(0) for k in range(WAYS)])
    np.testing.assert_allclose(fast.state["head"], prototypes, rtol=1e-12)
    query = embed(task.query_x)
    expected = -((query[:, None, :] - prototypes[None]) ** 2).sum(-1)
    np.testing.assert_allclose(logits, expected, rtol=1e-12)


def test_protonets_meta_gradient_equals_finite_differences():
    learner = metalearn.PrototypicalNetworks(_embedding(), ways=WAYS)
    episodes = _episodes()
    assert_meta_gradient_matches_finite_differences(learner, episodes)


def _proto_maml(steps, seed=0, dtype="float64"):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((DIM,), dtype=dtype),
                              keras.layers.Dense(5, activation="tanh", dtype=dtype,
                                                 name="hidden0"),
                              keras.layers.Dense(4, dtype=dtype, name="embedding"),
                              keras.layers.Dense(WAYS, dtype=dtype, name="head")], name="net")
    return metalearn.ProtoMAML(model, GradientDescent(steps=steps, learning_rate=0.3),
                               ways=WAYS, metrics={"accuracy": "accuracy"})


def test_proto_maml_head_is_generated_and_equals_protonets_without_steps():
    learner = _proto_maml(steps=0)
    assert {"net/head/kernel", "net/head/bias"} == set(learner.pieces.task_paths(learner.initial_weights()))
    assert not {"net/head/kernel", "net/head/bias"} & {v.path for v in learner.meta_variables}
    # With no inner step, Proto-MAML's logits differ from ProtoNets' by -||f(x)||^2 per
    # example: the same softmax, so the same loss and accuracy.
    protonets = metalearn.PrototypicalNetworks(learner.model, ways=WAYS, drop_head="head",
                                               metrics={"accuracy": "accuracy"})
    episodes = _episodes(tasks=3)
    ours, theirs = learner.meta_metrics(episodes), protonets.meta_metrics(episodes)
    for name in ("loss", "accuracy"):
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-10)


def test_proto_maml_meta_gradient_equals_finite_differences():
    learner = _proto_maml(steps=1)
    episodes = _episodes()
    assert_meta_gradient_matches_finite_differences(learner, episodes)


def test_bad_arguments():
    with pytest.raises(ValueError, match="ways .* must be an int >= 2, got 1"):
        metalearn.PrototypicalNetworks(_embedding(), ways=1)
    with pytest.raises(TypeError, match="takes no adapter"):
        metalearn.PrototypicalNetworks(_embedding(), ways=3, adapter=GradientDescent())
    with pytest.raises(ValueError, match="no layer 'classifier'"):
        metalearn.ProtoMAML(contract_model(), ways=WAYS, head="classifier")
    with pytest.raises(ValueError, match="Dense layer with bias and 5 units"):
        metalearn.ProtoMAML(contract_model(), ways=5)
    learner = metalearn.PrototypicalNetworks(_embedding(), ways=WAYS)
    with pytest.raises(TypeError, match=r"needs what adapt\(\) returns"):
        learner.predict(learner.initial_weights(), _episodes().query_x[0])


class _UninformativeSupport:
    def chance_metrics(self, learner, episodes):
        """The support set is the adaptation here: make it carry no information."""
        return learner.meta_metrics(uninformative_support(episodes))


class TestPrototypicalNetworks(_UninformativeSupport, LearnerContract):
    covers = (metalearn.PrototypicalNetworks, metalearn.EmbeddingLearner,
              metalearn.heads.PrototypeHead, metalearn.adapters.NoAdaptation)

    def make_learner(self):
        keras.utils.set_random_seed(0)
        return metalearn.PrototypicalNetworks(
            models.mlp((DIM,), hidden=(16,), outputs=8, name="embed"), ways=WAYS,
            metrics={"accuracy": "accuracy"})

    def test_shapes(self):
        super().test_shapes()
        learner = self.make_learner()
        task = synthetic_classification(0, tasks=1).task(0)
        assert learner.adapt(task.support_x, task.support_y).state["head"].shape == (WAYS, 8)


class TestProtoMAML(_UninformativeSupport, LearnerContract):
    covers = (metalearn.ProtoMAML, metalearn.learners.PrototypeInit)

    def make_learner(self):
        return metalearn.ProtoMAML(contract_model(), GradientDescent(steps=1, learning_rate=0.1),
                                   ways=WAYS, metrics={"accuracy": "accuracy"})
