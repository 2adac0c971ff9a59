"""Property tests (hypothesis) for task samplers and adapters over random ways, shots,
queries, shapes, steps and seeds.

Samplers: every N-way episode has exactly N classes with K support and Q query examples
each, all distinct, labels 0 .. N-1; the same seed gives the same episodes; a stream
resumed at a step continues where the uninterrupted one is; impossible combinations raise
the errors docs/errors.md lists. Adapters: adaptation never assigns a variable, keeps
every weight's shape, returns the initial weights after zero steps, takes the step
``theta - alpha * grad`` by hand, and its first-order meta-gradient is the query loss's
gradient at the adapted weights (the defining property of first-order MAML), and the
batched formulation (every layer once for all tasks) gives the per-task loop's losses
and meta-gradients.

Examples are derandomized (the same on every run) and few: the whole file runs in about
a minute on two cores.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metalearn
from metalearn import functional
from metalearn.adapters import GradientDescent, MetaSGD, PerStepLearningRates
from metalearn.tasks import FewShotClassification, Sinusoid
from metalearn.tasks.datasets import LabelledImages

FAST = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
SEEDS = st.integers(0, 2**31 - 1)


# --- N-way K-shot episodes ------------------------------------------------------------


def labelled(classes: int, per_class: int) -> LabelledImages:
    """2x2 images whose pixels say which class and which example they are."""
    n = classes * per_class
    images = np.zeros([n, 2, 2, 1], np.float32)
    images[:, 0, 0, 0] = np.repeat(np.arange(classes), per_class)    # class
    images[:, 0, 1, 0] = np.arange(n)                                 # example
    return LabelledImages(images, np.repeat(np.arange(classes), per_class),
                          [f"c{i}" for i in range(classes)])


@st.composite
def few_shot(draw):
    classes = draw(st.integers(1, 7))
    per_class = draw(st.integers(2, 6))
    ways = draw(st.integers(1, classes))
    shots = draw(st.integers(1, per_class - 1))
    queries = draw(st.integers(1, per_class - shots))
    return classes, per_class, ways, shots, queries, draw(st.integers(1, 3)), draw(SEEDS)


@FAST
@given(few_shot())
def test_episodes_have_n_classes_with_k_and_q_distinct_examples(setup):
    classes, per_class, ways, shots, queries, tasks, seed = setup
    sampler = FewShotClassification({"train": labelled(classes, per_class)}, ways=ways,
                                    shots=shots, queries=queries)
    episode = sampler.sample(tf.constant([seed, 0], tf.int64), tasks, "train")
    assert tuple(episode.support_x.shape) == (tasks, ways * shots, 2, 2, 1)
    assert tuple(episode.query_x.shape) == (tasks, ways * queries, 2, 2, 1)
    for t in range(tasks):
        support_y, query_y = episode.support_y[t].numpy(), episode.query_y[t].numpy()
        np.testing.assert_array_equal(support_y, np.repeat(np.arange(ways), shots))
        np.testing.assert_array_equal(query_y, np.repeat(np.arange(ways), queries))
        x = np.concatenate([episode.support_x[t], episode.query_x[t]])[:, 0, :, 0]
        y = np.concatenate([support_y, query_y])
        class_of_label = {j: set(x[y == j, 0].astype(int)) for j in range(ways)}
        assert all(len(c) == 1 for c in class_of_label.values())       # one class a label
        assert len(set().union(*class_of_label.values())) == ways       # N distinct classes
        assert len(set(x[:, 1].astype(int))) == ways * (shots + queries)  # distinct examples
    again = sampler.sample(tf.constant([seed, 0], tf.int64), tasks, "train")
    for first, second in zip(episode, again):
        np.testing.assert_array_equal(first, second)


@FAST
@given(st.integers(1, 6), st.integers(2, 6), st.integers(1, 4), SEEDS)
def test_too_many_ways_raise_the_documented_error(classes, per_class, extra, seed):
    sampler = FewShotClassification({"train": labelled(classes, per_class)},
                                    ways=classes + extra, shots=1, queries=1)
    with pytest.raises(ValueError, match=rf"ways={classes + extra} is more than the "
                                         rf"{classes} classes the 'train' split has"):
        sampler.dataset(1, seed=seed)


@FAST
@given(st.integers(1, 5), st.integers(2, 6), st.integers(1, 6), st.integers(0, 4))
def test_too_many_shots_and_queries_raise_the_documented_error(classes, per_class, shots,
                                                               extra):
    queries = max(1, per_class - shots + 1 + extra)
    with pytest.raises(ValueError, match=rf"{shots} shots \+ {queries} queries need "
                                         rf"{shots + queries} examples per class, but class "
                                         rf"'c\d+' of the 'train' split has {per_class}"):
        FewShotClassification({"train": labelled(classes, per_class)}, ways=1, shots=shots,
                              queries=queries)


# --- sinusoids ---------------------------------------------------------------------------


@FAST
@given(st.integers(1, 12), st.integers(1, 12), st.integers(1, 4), SEEDS)
def test_sinusoid_episodes_are_shaped_bounded_and_seeded(shots, queries, tasks, seed):
    sampler = Sinusoid(shots=shots, queries=queries)
    episode = sampler.sample(tf.constant([seed, 1], tf.int64), tasks)
    shapes = [tuple(t.shape) for t in episode]
    assert shapes == [(tasks, shots, 1), (tasks, shots, 1), (tasks, queries, 1),
                      (tasks, queries, 1)]
    x = np.concatenate([episode.support_x, episode.query_x], axis=1)
    y = np.concatenate([episode.support_y, episode.query_y], axis=1)
    assert np.all(np.abs(x) <= 5.0) and np.all(np.abs(y) <= 5.0)
    again = sampler.sample(tf.constant([seed, 1], tf.int64), tasks)
    for first, second in zip(episode, again):
        np.testing.assert_array_equal(first, second)


@FAST
@given(st.integers(1, 5), st.integers(0, 5), st.integers(0, 1000))
def test_a_resumed_stream_continues_the_uninterrupted_one(tasks, start, seed):
    sampler = Sinusoid(shots=3, queries=2)
    whole = list(sampler.dataset(tasks, seed=seed, num_steps=start + 2))
    resumed = list(sampler.dataset(tasks, seed=seed, start_step=start, num_steps=2))
    for first, second in zip(whole[start:], resumed):
        for a, b in zip(first, second):
            np.testing.assert_array_equal(a, b)


@FAST
@given(st.integers(-3, 0))
def test_non_positive_sinusoid_shots_raise(shots):
    with pytest.raises(ValueError, match=f"shots must be >= 1, got {shots}"):
        Sinusoid(shots=shots)


# --- adapters ------------------------------------------------------------------------------

ADAPTERS = {"GradientDescent": GradientDescent, "MetaSGD": MetaSGD,
            "PerStepLearningRates": PerStepLearningRates}


@st.composite
def adaptation(draw, first_order=None):
    kind = draw(st.sampled_from(sorted(ADAPTERS)))
    steps = draw(st.integers(1 if kind == "PerStepLearningRates" else 0, 3))
    return dict(kind=kind, steps=steps, inputs=draw(st.integers(1, 3)),
                hidden=draw(st.integers(1, 4)), outputs=draw(st.integers(1, 3)),
                support=draw(st.integers(1, 5)), queries=draw(st.integers(1, 4)),
                learning_rate=draw(st.floats(1e-3, 0.2)),
                first_order=draw(st.booleans()) if first_order is None else first_order,
                seed=draw(st.integers(0, 1000)))


def make(case):
    """A float64 MLP learner with the drawn adapter, and a task's support and query."""
    keras.utils.set_random_seed(case["seed"])
    model = metalearn.models.mlp(input_shape=(case["inputs"],), hidden=(case["hidden"],),
                                 outputs=case["outputs"], activation="tanh", dtype="float64")
    adapter = ADAPTERS[case["kind"]](steps=case["steps"], learning_rate=case["learning_rate"],
                                     first_order=case["first_order"])
    # Keras losses compute in floatx (float32) unless told otherwise
    learner = metalearn.Learner(model, adapter,
                                loss=keras.losses.MeanSquaredError(dtype="float64"))
    rng = np.random.default_rng(case["seed"])
    data = [rng.normal(size=(n, d)) for n, d in [
        (case["support"], case["inputs"]), (case["support"], case["outputs"]),
        (case["queries"], case["inputs"]), (case["queries"], case["outputs"])]]
    return learner, [tf.constant(a, tf.float64) for a in data]


def _state(learner):
    return [v.numpy().copy() for v in learner.model.variables + learner.adapter.meta_variables]


@SLOW
@given(adaptation())
def test_adaptation_keeps_variables_and_shapes(case):
    learner, (support_x, support_y, _, _) = make(case)
    before = _state(learner)
    initial = learner.initial_weights()
    adapted = learner.adapt(support_x, support_y).weights
    assert sorted(adapted) == sorted(initial)
    assert all(adapted[p].shape == initial[p].shape for p in initial)
    for old, new in zip(before, _state(learner)):
        np.testing.assert_array_equal(old, new)
    unadapted = learner.adapt(support_x, support_y, steps=0).weights
    for path, value in initial.items():
        np.testing.assert_array_equal(unadapted[path], value)


@SLOW
@given(adaptation())
def test_one_inner_step_is_theta_minus_alpha_gradient(case):
    learner, (support_x, support_y, _, _) = make(case)
    initial = learner.initial_weights()
    with tf.GradientTape() as tape:
        tape.watch(initial)
        # the support loss written out: mean squared error of the model's output
        loss = tf.reduce_mean(tf.square(
            functional.call(learner.model, initial, support_x) - support_y))
    grads = tape.gradient(loss, initial)
    adapted = learner.adapt(support_x, support_y, steps=1).weights
    for path, value in initial.items():  # learned rates start at learning_rate
        np.testing.assert_allclose(adapted[path], value - case["learning_rate"] * grads[path],
                                   rtol=1e-12, atol=1e-12)


@SLOW
@given(adaptation(first_order=True))
def test_first_order_meta_gradient_is_the_query_gradient_at_the_adapted_weights(case):
    learner, (support_x, support_y, query_x, query_y) = make(case)
    variables = functional.variables(learner.model)
    with tf.GradientTape() as tape:
        adapted = learner.adapt(support_x, support_y).weights
        loss = learner.task_loss(query_y, learner.predict(adapted, query_x))
    meta_grads = tape.gradient(loss, list(variables.values()))
    fixed = {p: tf.identity(w) for p, w in adapted.items()}  # the adapted weights, as inputs
    with tf.GradientTape() as tape:
        tape.watch(fixed)
        reference_loss = learner.task_loss(query_y, learner.predict(fixed, query_x))
    reference = tape.gradient(reference_loss, fixed)
    for (path, _), grad in zip(variables.items(), meta_grads):
        np.testing.assert_allclose(grad, reference[path], rtol=1e-10, atol=1e-12)


@settings(SLOW, max_examples=12)
@given(adaptation(), st.integers(1, 3))
def test_batched_formulation_equals_the_per_task_one(case, tasks):
    """The ``Batched`` formulation (every layer once for all tasks) gives the per-task
    losses and meta-gradients of the unrolled per-task loop, whatever the shapes."""
    learner, _ = make(case)
    if not learner.adapter.supports_task_axis:
        return
    rng = np.random.default_rng(case["seed"] + 1)
    shapes = [(case["support"], case["inputs"]), (case["support"], case["outputs"]),
              (case["queries"], case["inputs"]), (case["queries"], case["outputs"])]
    episodes = metalearn.tasks.Episode(*[tf.constant(rng.normal(size=(tasks,) + s))
                                         for s in shapes])
    results = {}
    for formulation in ("batched", "unrolled"):
        with tf.GradientTape() as tape:
            losses = learner.meta_metrics(
                episodes, formulation=metalearn.execution.formulation(formulation))["loss"]
            loss = tf.reduce_mean(losses)
        results[formulation] = [losses] + tape.gradient(loss, learner.meta_variables)
    for batched, unrolled in zip(results["batched"], results["unrolled"]):
        assert (batched is None) == (unrolled is None)  # e.g. rates unused with 0 steps
        if batched is not None:
            np.testing.assert_allclose(batched, unrolled, rtol=1e-10, atol=1e-12)
