"""Data produced by the model inside the step: query inputs chosen from the adapted
model's own predictions (``Learner.query_data``) and support inputs from the current
weights before each inner step (``SupportFromWeights``). The meta-gradient through them
is checked against central finite differences in float64, second order and first order,
under every formulation that can run them."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution, functional, models
from metalearn.adapters import GradientDescent, SupportFromWeights
from metalearn.testing import (assert_meta_gradient_matches_finite_differences,
                               finite_difference_variables, relative_error)
from metalearn.testing import mse
from metalearn.tasks import Episode

ALPHA = 0.1


class ChosenQueries(metalearn.Learner):
    """1-D regression whose query inputs are chosen by the adapted model: each query
    point is moved to ``tanh`` of the adapted model's prediction there, and its target
    is the task's function ``sin(3 x)`` at the chosen input."""

    def query_data(self, weights, query_x, query_y):
        chosen = tf.tanh(self.predict(weights, query_x))  # [queries, 1], depends on phi
        return chosen, tf.sin(3.0 * chosen)


def _episodes(tasks=3, shots=5, seed=0):
    keys = tf.random.experimental.stateless_split([seed, 7], 2)
    x = lambda k: tf.random.stateless_uniform([tasks, shots, 1], k, -1, 1, tf.float64)
    support_x, query_x = x(keys[0]), x(keys[1])
    return Episode(support_x, tf.sin(3.0 * support_x), query_x, tf.zeros_like(query_x))


def _learner(first_order=False, steps=2, cls=ChosenQueries, wrappers=()):
    keras.utils.set_random_seed(1)
    model = models.mlp((1,), hidden=(6,), outputs=1, activation="tanh", dtype="float64")
    return cls(model, GradientDescent(steps, ALPHA, first_order=first_order,
                                      wrappers=list(wrappers)), loss=mse)


FORMULATIONS = ["map_fn", "unrolled", "accumulate", "auto"]


def _directions(learner, episodes, formulation):
    rule = metalearn.MetaGradient(keras.optimizers.SGD(1.0))
    directions, _ = tf.function(lambda e: rule.directions(
        learner, e, execution.formulation(formulation)))(episodes)
    return {v.path: d.numpy() for v, d in zip(learner.meta_variables, directions)}


def test_query_data_changes_the_meta_loss():
    """Not a no-op: the chosen queries give another loss than the sampled ones."""
    episodes = _episodes()
    chosen = float(_learner().meta_loss(episodes))
    sampled = float(_learner(cls=metalearn.Learner).meta_loss(episodes))
    assert abs(chosen - sampled) > 1e-3


@pytest.mark.parametrize("formulation", FORMULATIONS)
def test_second_order_meta_gradient_matches_finite_differences(formulation):
    learner = _learner()
    episodes = _episodes()
    numeric = finite_difference_variables(lambda: learner.meta_loss(episodes),
                                          learner.meta_variables)
    assert relative_error(_directions(learner, episodes, formulation), numeric) < 1e-6


def test_second_order_against_the_library_check():
    assert_meta_gradient_matches_finite_differences(_learner(), _episodes())


@pytest.mark.parametrize("formulation", ["map_fn", "accumulate"])
def test_first_order_meta_gradient_matches_finite_differences(formulation):
    """First order: the adapted weights are theta + u with the inner updates u held at
    their value at theta; the reference differentiates theta -> mean_i L_i(theta + u_i),
    the query data chosen by the weights theta + u_i, by central differences."""
    learner = _learner(first_order=True)
    episodes = _episodes()
    updates = []
    for i in range(episodes.num_tasks):
        task = episodes.task(i)
        adapted = learner.adapt(task.support_x, task.support_y).weights
        updates.append({p: (adapted[p] - w).numpy()
                        for p, w in learner.initial_weights().items()})

    def held(i):
        task = episodes.task(i)
        weights = {p: w + updates[i][p] for p, w in learner.initial_weights().items()}
        query_x, query_y = learner.query_data(weights, task.query_x, task.query_y)
        return learner.task_loss(query_y, learner.predict(weights, query_x))

    numeric = finite_difference_variables(
        lambda: tf.add_n([held(i) for i in range(episodes.num_tasks)]) / episodes.num_tasks,
        learner.meta_variables)
    analytic = _directions(learner, episodes, formulation)
    assert relative_error(analytic, numeric) < 1e-6
    # and it is not the second-order gradient
    second = _directions(_learner(), episodes, formulation)
    assert relative_error(analytic, second) > 1e-3


def _support_from_model(model):
    """Support inputs moved by the current weights before each inner step (as a
    rollout of the current policy would be): x + 0.3 tanh(f_w(x)), targets sin(3 x)."""
    def fn(weights, x, y, step):
        moved = x + 0.3 * tf.tanh(functional.call(model, weights, x))
        return moved, tf.sin(3.0 * moved)
    return fn


@pytest.mark.parametrize("formulation", ["map_fn", "accumulate"])
def test_support_from_weights_matches_finite_differences(formulation):
    keras.utils.set_random_seed(1)
    model = models.mlp((1,), hidden=(6,), outputs=1, activation="tanh", dtype="float64")
    learner = metalearn.Learner(model, GradientDescent(
        2, ALPHA, wrappers=[SupportFromWeights(_support_from_model(model))]), loss=mse)
    episodes = _episodes()
    episodes = Episode(episodes.support_x, episodes.support_y, episodes.query_x,
                       tf.sin(3.0 * episodes.query_x))
    numeric = finite_difference_variables(lambda: learner.meta_loss(episodes),
                                          learner.meta_variables)
    assert relative_error(_directions(learner, episodes, formulation), numeric) < 1e-6
    # the hook runs before every step, with that step's weights: not the same as
    # moving the support set once with the initial weights
    plain = metalearn.Learner(model, GradientDescent(2, ALPHA), loss=mse)
    weights = plain.initial_weights()
    once = [_support_from_model(model)(weights, episodes.support_x[i], None, 0)
            for i in range(episodes.num_tasks)]
    moved_once = Episode(tf.stack([m[0] for m in once]), tf.stack([m[1] for m in once]),
                         episodes.query_x, episodes.query_y)
    assert abs(float(plain.meta_loss(moved_once)) - float(learner.meta_loss(episodes))) > 1e-6


def test_batched_refuses_an_overridden_query_data():
    with pytest.raises(ValueError, match="overrides query_data"):
        metalearn.training.make_meta_step(_learner(), metalearn.MetaGradient(),
                                          execution.Batched())


class WeightedTargets(metalearn.Learner):
    """A loss that is not the supervised comparison of predictions with targets: each
    row of ``y`` holds a target and a weight (as a policy-gradient loss's rows hold an
    action and its advantage), so ``y`` has a column more than the predictions."""

    def task_loss(self, y_true, y_pred):
        target, weight = y_true[..., :1], y_true[..., 1:]
        return tf.reduce_mean(weight * tf.square(tf.cast(y_pred, target.dtype) - target))


def test_a_learner_with_its_own_loss_replaces_the_supervised_output_checks():
    from metalearn.runs import validation
    keras.utils.set_random_seed(1)
    model = models.mlp((1,), hidden=(6,), outputs=1, activation="tanh", dtype="float64")
    episodes = _episodes()
    weighted = lambda y: tf.concat([y, tf.ones_like(y)], axis=-1)  # [tasks, n, 2]
    episodes = Episode(episodes.support_x, weighted(episodes.support_y),
                       episodes.query_x, weighted(tf.sin(3.0 * episodes.query_x)))
    supervised = metalearn.Learner(model, GradientDescent(1, ALPHA), loss=mse)
    with pytest.raises(ValueError, match="must match the targets"):
        validation.check_outputs(supervised, episodes.task(0), sampler=None)
    own = WeightedTargets(model, GradientDescent(1, ALPHA), loss=mse)
    validation.check_outputs(own, episodes.task(0), sampler=None)  # its loss decides
    validation.check_loss_and_metrics(own, episodes.task(0))
    step = metalearn.training.make_meta_step(own, metalearn.MetaGradient(
        keras.optimizers.SGD(0.1)), "map_fn")
    first = float(step(episodes)["loss"])
    for _ in range(20):
        last = float(step(episodes)["loss"])
    assert last < first
