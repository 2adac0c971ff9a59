"""Formulations (metalearn.execution): every one equals the per-task reference, in float64.

``Unrolled()`` (one inner loop per task, the reference, itself checked against finite
differences in tests/adapters/gradient_descent_test.py), ``MapFn()`` (a compiled loop
over tasks) and ``Batched()`` (metalearn.functional.batched: each layer runs once for all
tasks with a task axis on inputs and weights). The formulations under test run compiled
(one ``tf.function``); the unrolled reference they are compared with runs eagerly
(:func:`_reference`: a Python loop over the tasks, the same values, several times
cheaper than tracing it).
"""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution, functional
from metalearn.functional import batched
from metalearn.adapters import (GradientDescent, GradientStep, Mask, MetaSGD,
                                PerStepLearningRates, PerStepWeights, Recompute)
from metalearn.tasks import Episode
from metalearn.testing import finite_difference_variables
from metalearn.testing.tasks import mse, regression_episodes

from tests.formulation_fixtures import metrics_and_meta_gradient as _metrics_and_meta_gradient

FORMULATIONS = ("map_fn", "batched")


def _episodes(tasks, ways=3, shots=2, queries=2, size=8, channels=1, seed=0):
    keys = tf.random.experimental.stateless_split([seed, 7], 2)
    images = lambda key, n: tf.random.stateless_normal(
        [tasks, ways * n, size, size, channels], key, dtype=tf.float64)
    labels = lambda n: tf.tile(tf.repeat(tf.range(ways), n)[None], [tasks, 1])
    return Episode(images(keys[0], shots), labels(shots), images(keys[1], queries),
                   labels(queries))


def _conv_net(**kwargs):
    keras.utils.set_random_seed(0)
    options = dict(input_shape=(8, 8, 1), outputs=3, filters=4, blocks=2, dtype="float64")
    options.update(kwargs)
    return metalearn.models.conv_net(**options)


def _learner(model, adapter, **kwargs):
    # A Keras loss object computes in its own dtype (floatx, float32, by default).
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")
    return metalearn.Learner(
        model, adapter, loss=loss, metrics={"accuracy": "accuracy"}, **kwargs)


def _per_step_bn(learning_rate=0.2, wrappers=()):
    """MAML++'s pieces: per-step learning rates and per-step BatchNorm copies."""
    return PerStepLearningRates(steps=2, learning_rate=learning_rate,
                                wrappers=[PerStepWeights(("bn",))] + list(wrappers))


def _reference(learner, episodes):
    """The unrolled reference of :func:`_metrics_and_meta_gradient`, eagerly:
    ``learner.meta_metrics`` under ``Unrolled()`` and the gradient of their mean loss
    with respect to the meta-variables (NumPy)."""
    with tf.GradientTape() as tape:
        metrics = learner.meta_metrics(episodes, formulation=execution.Unrolled())
        loss = tf.reduce_mean(metrics["loss"])
    grads = tape.gradient(loss, learner.meta_variables)
    return {k: v.numpy() for k, v in metrics.items()}, [g.numpy() for g in grads]


@functools.lru_cache(maxsize=None)
def _per_step_bn_reference():
    """The unrolled metrics and meta-gradient of :func:`_per_step_bn` on a one-block conv
    net and ``_episodes(2)``: the reference of two tests, computed once per process
    (NumPy; never modified)."""
    return _reference(_learner(_conv_net(blocks=1), _per_step_bn()), _episodes(2))


def _assert_same(learner_fn, episodes, reference=None):
    """Every formulation of FORMULATIONS against one unrolled reference (``None``: that
    of ``learner_fn()`` on ``episodes``, computed here)."""
    if reference is None:
        reference = _reference(learner_fn(), episodes)
    for formulation in FORMULATIONS:
        result = _metrics_and_meta_gradient(learner_fn(), episodes, formulation)
        assert sorted(result[0]) == sorted(reference[0]), formulation
        for name in reference[0]:
            assert result[0][name].shape == reference[0][name].shape, (formulation, name)
            np.testing.assert_allclose(result[0][name], reference[0][name], rtol=1e-10,
                                       atol=1e-12, err_msg=f"{formulation}: {name}")
        assert len(result[1]) == len(reference[1]), formulation
        for got, want in zip(result[1], reference[1]):
            assert np.abs(want).max() > 0  # a real gradient, not an unconnected zero
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12, err_msg=formulation)


@pytest.mark.parametrize("tasks,first_order", [(1, False), (3, False), (3, True)])
def test_conv_batchnorm_equals_per_task_reference(tasks, first_order):
    model = _conv_net()
    make = lambda: _learner(
        model, GradientDescent(steps=2, learning_rate=0.3, first_order=first_order))
    _assert_same(make, _episodes(tasks))


def test_mini_imagenet_layout_equals_reference():
    # Max-pooling, flatten, no bias on a 1x1 conv, stride 1 'valid': other rule branches.
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 2), dtype="float64"),
        keras.layers.Conv2D(3, 3, padding="valid", dtype="float64", name="c0"),
        keras.layers.BatchNormalization(dtype="float64", name="bn"),
        keras.layers.ReLU(dtype="float64"),
        keras.layers.MaxPooling2D(2, dtype="float64"),
        keras.layers.Conv2D(4, 1, strides=2, use_bias=False, activation="tanh",
                            dtype="float64", name="c1"),
        keras.layers.Flatten(dtype="float64"),
        keras.layers.Dense(5, activation="relu", dtype="float64", name="hidden"),
        keras.layers.Dense(3, dtype="float64", name="head")])
    make = lambda: _learner(model, GradientDescent(1, 0.5))
    _assert_same(make, _episodes(4, channels=2))


def test_learned_rates_anil_and_per_step_batchnorm():
    model = _conv_net(blocks=1)  # the rules of a conv block: test_conv_batchnorm_...
    adapters = {
        "meta_sgd": lambda: MetaSGD(steps=2, learning_rate=0.2),
        "lslr_per_step_bn": _per_step_bn,
        "anil": lambda: GradientDescent(steps=2, update=[Mask(("head",)), GradientStep(0.2)]),
    }
    for name, adapter in adapters.items():
        make = lambda: _learner(model, adapter())
        _assert_same(make, _episodes(2),
                     _per_step_bn_reference() if name == "lslr_per_step_bn" else None)


def test_batched_second_order_meta_gradient_matches_finite_differences():
    model = _conv_net(filters=2, blocks=1)
    learner = _learner(model, GradientDescent(2, 0.4))
    formulation = execution.Batched()
    episodes = _episodes(2)
    with tf.GradientTape() as tape:
        loss = learner.meta_loss(episodes, formulation=formulation)
    grads = tape.gradient(loss, learner.meta_variables)
    numeric = finite_difference_variables(lambda: learner.meta_loss(episodes,
                                                                    formulation=formulation),
                                          learner.meta_variables)
    for variable, grad in zip(learner.meta_variables, grads):
        np.testing.assert_allclose(grad.numpy(), numeric[variable.path], rtol=1e-6,
                                   atol=1e-8, err_msg=variable.path)


def test_batched_call_equals_functional_call_per_task():
    model = _conv_net()
    base = functional.weights(model)
    tasks = 3
    noise = lambda w, t: w + 0.1 * t * tf.ones_like(w)
    per_task = {p: tf.stack([noise(w, t) for t in range(tasks)]) for p, w in base.items()}
    head_bias = next(p for p in base if p.endswith("head/bias"))
    per_task[head_bias] = base[head_bias]  # a shared weight (no task axis)
    x = _episodes(tasks).query_x
    for training in (True, False):
        got = batched.call(model, per_task, x, training=training)
        for t in range(tasks):
            weights_t = {p: (w[t] if w.shape.rank > base[p].shape.rank else w)
                         for p, w in per_task.items()}
            want = functional.call(model, weights_t, x[t], training=training)
            np.testing.assert_allclose(got[t].numpy(), want.numpy(), rtol=1e-12, atol=1e-12)


def test_graph_size_does_not_grow_with_meta_batch():
    """Compile time independent of B: the traced graph of map_fn/batched is the same size
    for 2 and 8 tasks, while the unrolled one grows (3 tasks: over twice 1 task's), on
    a one-block conv net (the formulation, not the net, sets how the graph grows)."""
    model = _conv_net(blocks=1)

    def graph_ops(batching, tasks):
        learner = _learner(model, GradientDescent(1, 0.3))
        formulation = execution.formulation(batching)
        spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype),
                                     _episodes(tasks))

        @tf.function
        def step(episodes):
            with tf.GradientTape() as tape:
                loss = learner.meta_loss(episodes, formulation=formulation)
            return tape.gradient(loss, learner.meta_variables)
        graph = step.get_concrete_function(spec).graph.as_graph_def()
        return len(graph.node) + sum(len(f.node_def) for f in graph.library.function)

    for batching in FORMULATIONS:  # equal up to a few shape constants
        small, large = graph_ops(batching, 2), graph_ops(batching, 8)
        assert abs(large - small) <= 0.01 * small, (batching, small, large)
    assert graph_ops("unrolled", 3) > 2 * graph_ops("unrolled", 1)


def test_batched_refuses_what_it_cannot_run():
    # The refusal is the formulation's (Batched.check, run by make_meta_step and by
    # Batched itself), no longer the Learner constructor's.
    model = _conv_net()
    refuse = lambda learner: execution.Batched().check(learner)
    implicit = _learner(model, metalearn.adapters.ImplicitGradientDescent())
    with pytest.raises(ValueError, match="ImplicitGradientDescent cannot run on a task axis"):
        refuse(implicit)
    with pytest.raises(ValueError, match="ImplicitGradientDescent cannot run on a task axis"):
        implicit.meta_metrics(_episodes(2), formulation=execution.Batched())
    with pytest.raises(ValueError, match="ImplicitGradientDescent cannot run on a task axis"):
        metalearn.training.make_meta_step(implicit, metalearn.MetaGradient(),
                                          execution.Batched())
    with pytest.raises(ValueError, match="records every inner step's weights"):
        refuse(metalearn.MultiStepLossLearner(model, GradientDescent(2, 0.1), loss="mse"))
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2, dtype="float64")

        def call(self, x):
            return self.dense(x)
    subclassed = Subclassed()
    subclassed(np.zeros((1, 4)))
    with pytest.raises(ValueError, match="supports keras.Sequential and functional models"):
        refuse(_learner(subclassed, GradientDescent(1, 0.1)))

    class Custom(keras.layers.Layer):
        def build(self, shape):
            self.w = self.add_weight(shape=(shape[-1],), dtype="float64")

        def call(self, x):
            return x * self.w
    custom = keras.Sequential([keras.Input((4,), dtype="float64"),
                               Custom(dtype="float64", name="custom")])
    with pytest.raises(ValueError, match="'custom' \\(Custom\\) has weights and no batched"):
        refuse(_learner(custom, GradientDescent(1, 0.1)))
    with pytest.raises(ValueError, match="unknown formulation 'vmap'"):
        execution.formulation("vmap")


def test_registered_rule_extends_batched():
    class Scale(keras.layers.Layer):
        def build(self, shape):
            self.w = self.add_weight(shape=(shape[-1],), dtype="float64", name="w")

        def call(self, x):
            return x * self.w

    @batched.register(Scale)
    def _scale(layer, weights, x, training):
        w = weights["w"]
        return x * (w[:, None, :] if w.shape.rank == 2 else w)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,), dtype="float64"),
                              Scale(dtype="float64", name="scale"),
                              keras.layers.Dense(1, dtype="float64", name="out")])
    episodes = Episode(*[tf.random.stateless_normal([3, 5, d], [i, 0], dtype=tf.float64)
                         for i, d in enumerate((4, 1, 4, 1))])
    make = lambda: metalearn.Learner(model, GradientDescent(2, 0.1), loss="mse")
    reference = _reference(make(), episodes)
    result = _metrics_and_meta_gradient(make(), episodes, "batched")
    np.testing.assert_allclose(result[0]["loss"], reference[0]["loss"], rtol=1e-10)
    for got, want in zip(result[1], reference[1]):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_recomputed_inner_steps_equal_stored_ones():
    """GradientDescent(wrappers=[Recompute()]): same values and meta-gradients (variables read
    inside the step included: per-step BatchNorm copies, learned rates), unrolled and
    batched."""
    model = _conv_net(blocks=1)
    again = lambda r: [Recompute()] if r else []
    adapters = [lambda r: GradientDescent(3, 0.3, wrappers=again(r)),
                lambda r: _per_step_bn(wrappers=again(r))]
    for index, adapter in enumerate(adapters):
        reference = (_per_step_bn_reference() if index == 1 else  # the same learner
                     _reference(_learner(model, adapter(False)), _episodes(2)))
        for formulation in ("unrolled", "batched"):
            recomputing = _learner(model, adapter(True))
            if formulation == "unrolled":
                assert recomputing.adapter.needs_unrolled_tasks
            result = _metrics_and_meta_gradient(recomputing, _episodes(2), formulation)
            np.testing.assert_allclose(result[0]["loss"], reference[0]["loss"], rtol=1e-12,
                                       err_msg=formulation)
            for got, want in zip(result[1], reference[1]):
                np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-13,
                                           err_msg=formulation)


@pytest.mark.parametrize("name", ["map_fn", "unrolled", "batched", "accumulate", "auto"])
@pytest.mark.parametrize("kind", ["maml", "meta_sgd"])
def test_task_gradients_are_each_tasks_own_meta_gradient(name, kind):
    """Formulation.task_gradients: entry i of every variable's [tasks, ...] gradient is
    task i's meta-gradient taken alone with one tape (float64, 1e-10), under every
    formulation (Batched: one copy of the weights per task; with Meta-SGD's learned
    rates, piece variables, task by task); their mean is gradients'."""
    keras.utils.set_random_seed(5)
    model = metalearn.models.mlp((2,), hidden=(4,), outputs=1, activation="tanh",
                                 dtype="float64")
    adapter = (GradientDescent(2, 0.1) if kind == "maml" else
               GradientDescent(2, update=metalearn.adapters.LearnedRates("element", 0.1)))
    learner = metalearn.Learner(model, adapter, loss=mse)
    episodes = regression_episodes(tasks=3, shots=4)
    formulation = execution.formulation(name)
    variables = learner.meta_variables
    per_task, metrics = tf.function(lambda e: formulation.task_gradients(
        learner, e, variables))(episodes)
    for i in range(episodes.num_tasks):
        alone = metalearn.testing.task_meta_gradient(learner, episodes.task(i))
        for g, want in zip(per_task, alone):
            np.testing.assert_allclose(g[i].numpy(), want, rtol=1e-10, atol=1e-12)
    mean, _ = formulation.gradients(learner, episodes, variables)
    for g, m in zip(per_task, mean):
        np.testing.assert_allclose(np.mean(g.numpy(), axis=0), m.numpy(), rtol=1e-10,
                                   atol=1e-12)
    assert metrics["loss"].shape == (3,)
