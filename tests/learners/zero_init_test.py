"""Learner(task_init=[ZeroInit(...)]): the zeroing trick. Every task starts its head at zero, the
meta-loss then cannot depend on how labels are numbered, and the meta-gradient equals
finite differences and a hand-zeroed copy of the model."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.adapters import GradientDescent, PerStepWeights
from metalearn.learners import ZeroInit
from metalearn.testing import (DIM, WAYS, LearnerContract, classification_learner,
                            softmax_cross_entropy, synthetic_classification)
from metalearn.testing import analytic_meta_gradient, image_episodes
from metalearn.testing import assert_meta_gradient_matches_finite_differences

HEAD = ("model/head/kernel", "model/head/bias")


def _mlp(seed=0):
    keras.utils.set_random_seed(seed)
    return models.mlp((DIM,), hidden=(5,), outputs=WAYS, activation="tanh",
                      dtype="float64", name="model")


def _conv(seed=0):
    keras.utils.set_random_seed(seed)
    return models.conv_net((8, 8, 1), outputs=3, filters=3, blocks=2, dtype="float64",
                           name="model")


def _learner(model, steps=2, **kwargs):
    return classification_learner(GradientDescent(steps=steps, learning_rate=0.5),
                                  model=model, task_init=[ZeroInit(("head",))], **kwargs)


def _relabel(episodes, permutation):
    """The same episodes with class ``k`` renamed ``permutation[k]`` in support and query."""
    rename = lambda y: tf.gather(tf.constant(permutation, y.dtype), y)
    return episodes._replace(support_y=rename(episodes.support_y),
                             query_y=rename(episodes.query_y))


def test_head_starts_every_task_at_zero_and_is_not_meta_learned():
    learner = _learner(_mlp())
    assert tuple(learner.pieces.task_paths(learner.initial_weights())) == HEAD
    assert not set(HEAD) & {v.path for v in learner.meta_variables}
    task = synthetic_classification(0, tasks=1, dtype=tf.float64).task(0)
    weights = learner.task_initial_weights(learner.initial_weights(), task.support_x,
                                           task.support_y)
    for path in HEAD:
        assert not np.any(weights[path].numpy())
    assert np.any(learner.model.get_layer("head").kernel.numpy())  # variable untouched
    logits = learner.predict(learner.adapt(task.support_x, task.support_y, steps=0),
                             task.query_x).numpy()
    np.testing.assert_array_equal(logits, np.zeros_like(logits))


@pytest.mark.parametrize("zero_init", [True, False])
def test_meta_loss_depends_on_label_numbering_only_without_zero_init(zero_init):
    model = _conv()
    learner = (_learner(model) if zero_init else
               classification_learner(GradientDescent(steps=2, learning_rate=0.5), model))
    episodes = image_episodes(tasks=3)
    losses = [float(learner.meta_loss(_relabel(episodes, p)))
              for p in ([0, 1, 2], [2, 0, 1], [1, 0, 2])]
    if zero_init:
        np.testing.assert_allclose(losses[1:], [losses[0]] * 2, rtol=1e-12)
    else:  # a meta-learned head prefers some classes: the numbering matters
        assert min(abs(losses[0] - losses[1]), abs(losses[0] - losses[2])) > 1e-6


def test_meta_gradient_equals_finite_differences():
    learner = _learner(_mlp())
    episodes = synthetic_classification(0, tasks=2, dtype=tf.float64)
    assert_meta_gradient_matches_finite_differences(learner, episodes)


@pytest.mark.parametrize("task_batching", ["map_fn", "batched"])
def test_meta_gradient_equals_a_plain_learner_on_a_zeroed_model(task_batching):
    episodes = image_episodes(tasks=3)
    learner = _learner(_conv())
    reference_model = _conv()
    for variable in reference_model.get_layer("head").weights:
        variable.assign(tf.zeros_like(variable))
    reference = classification_learner(GradientDescent(steps=2, learning_rate=0.5),
                                       reference_model)
    ours = analytic_meta_gradient(learner, episodes,
                                  formulation=metalearn.execution.formulation(task_batching))
    theirs = {p: g for p, g in analytic_meta_gradient(reference, episodes).items()
              if p not in HEAD}
    assert sorted(ours) == sorted(theirs)
    for path in ours:
        np.testing.assert_allclose(ours[path], theirs[path], rtol=1e-10, atol=1e-14,
                                   err_msg=path)


def test_reptile_moves_the_body_and_leaves_the_zeroed_head():
    learner = _learner(_mlp())
    head = [v.numpy().copy() for v in learner.model.get_layer("head").weights]
    body = [v.numpy().copy() for v in learner.meta_variables]
    step = metalearn.training.make_meta_step(learner, metalearn.Reptile())
    step(synthetic_classification(0, tasks=2, dtype=tf.float64))
    for old, variable in zip(head, learner.model.get_layer("head").weights):
        np.testing.assert_array_equal(old, variable.numpy())
    assert any(np.any(old != v.numpy()) for old, v in zip(body, learner.meta_variables))


def test_bad_zero_init_is_named():
    with pytest.raises(ValueError, match=r"zero_init=\('classifier',\) matches none"):
        classification_learner(GradientDescent(), _mlp(),
                               task_init=[ZeroInit(("classifier",))])
    with pytest.raises(ValueError, match="ZeroInit sets weights that the adapter "
                                         "GradientDescent sets per task.*model/head/bias"):
        classification_learner(GradientDescent(wrappers=[PerStepWeights(("head/bias",))]),
                               _mlp(), task_init=[ZeroInit(("head",))])


class TestZeroInitMAML(LearnerContract):
    covers = (metalearn.learners.ZeroInit,)

    def make_learner(self):
        return classification_learner(GradientDescent(steps=2, learning_rate=0.5),
                                      task_init=[ZeroInit(("head",))])
