"""WhileLoop: the inner steps in one tf.while_loop give the Python loop's values and
meta-gradients (float64, every formulation, every piece that reads the step index), match
finite differences, and keep the traced graph's size independent of the steps."""

import functools

import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution
from metalearn.adapters import (AnnealOrder, GradientDescent, GradientStep, InnerAdam,
                                Learned, Mask, MetaSGD, MiniBatches, PerStepLearningRates,
                                PerStepWeights, Recompute, WhileLoop)
from metalearn.testing import (analytic_meta_gradient, finite_difference_gradient,
                               image_episodes, relative_error, small_learner)

from metalearn.testing import classification_learner, synthetic_classification

from tests.formulation_fixtures import bn_model as _bn_model
from tests.formulation_fixtures import meta_gradients as _gradients
from tests.formulation_fixtures import metrics_and_meta_gradient as _metrics_and_meta_gradient

# Each: a function of the wrappers the loop runs with (WhileLoop added or not).
ADAPTERS = {
    "maml": lambda w: GradientDescent(2, 0.3, wrappers=w),
    "first_order": lambda w: GradientDescent(2, 0.3, first_order=True, wrappers=w),
    "anil": lambda w: GradientDescent(2, update=[Mask(("head",)), GradientStep(0.3)],
                                      wrappers=w),
    "meta_sgd": lambda w: MetaSGD(2, 0.3, wrappers=w),
    # per-step rates and per-step BatchNorm copies: indexed by the (tensor) step
    "maml_plus_plus": lambda w: PerStepLearningRates(
        3, 0.3, wrappers=[PerStepWeights(("bn0",))] + w),
    "per_step_momentum": lambda w: GradientDescent(
        3, update=metalearn.adapters.InnerMomentum(Learned(0.2, "step"), 0.5), wrappers=w),
    # Adam's bias correction reads the step
    "inner_adam": lambda w: GradientDescent(2, update=InnerAdam(0.05, epsilon=1e-4),
                                            wrappers=w),
    "anneal_order": lambda w: GradientDescent(2, update=[AnnealOrder(1), GradientStep(0.3)],
                                              wrappers=w),
    "mini_batches": lambda w: GradientDescent(4, 0.3, wrappers=[MiniBatches(3)] + w),
}


def _learner(adapter, learner_class=metalearn.Learner, **kw):
    return classification_learner(adapter, _bn_model(), learner_class=learner_class, **kw)


def _episodes(tasks=2, shots=3):
    return synthetic_classification(0, tasks=tasks, shots=shots, dtype=tf.float64)


def _eager_metrics_and_meta_gradient(learner, episodes, formulation):
    """``_metrics_and_meta_gradient`` run eagerly (NumPy): a reference of the Python
    loop at a fraction of the cost of tracing it, which the compiled WhileLoop is
    compared with."""
    formulation = execution.formulation(formulation)
    with tf.GradientTape() as tape:
        metrics = learner.meta_metrics(episodes, formulation=formulation)
        loss = tf.reduce_mean(metrics["loss"])
    grads = tape.gradient(loss, learner.meta_variables)
    return ({k: v.numpy() for k, v in metrics.items()}, [g.numpy() for g in grads])


@functools.lru_cache(maxsize=None)
def _python_loop(name):
    """The Python loop's values and meta-gradients of ``ADAPTERS[name]`` (unrolled,
    eagerly): the reference of several tests, computed once per process (NumPy; never
    modified)."""
    return _eager_metrics_and_meta_gradient(_learner(ADAPTERS[name]([])), _episodes(),
                                            "unrolled")


def _assert_close(result, reference, what):
    for name in reference[0]:
        np.testing.assert_allclose(result[0][name], reference[0][name], rtol=1e-10,
                                   atol=1e-12, err_msg=f"{what}: {name}")
    assert len(result[1]) == len(reference[1]), what
    for got, want in zip(result[1], reference[1]):
        assert np.abs(want).max() > 0, what  # a real gradient, not an unconnected zero
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12, err_msg=what)


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_each_piece_in_a_while_loop_equals_the_python_loop(name):
    """Values and meta-gradients of the Python loop, for every piece that reads the step
    (in accumulate, the CPU's default formulation; the next test covers the others)."""
    _assert_close(_metrics_and_meta_gradient(_learner(ADAPTERS[name]([WhileLoop()])),
                                             _episodes(), "accumulate"), _python_loop(name),
                  name)


@pytest.mark.parametrize("formulation", ["unrolled", "map_fn", "batched"])
def test_while_loop_in_every_formulation(formulation):
    rolled = _learner(ADAPTERS["maml_plus_plus"]([WhileLoop(parallel_iterations=2)]))
    _assert_close(_metrics_and_meta_gradient(rolled, _episodes(), formulation),
                  _python_loop("maml_plus_plus"), formulation)


def test_more_steps_at_test_time_reuse_the_last_step_s_pieces():
    """A loop asked for more steps than it was built for reuses the last per-step rate and
    copy, as the Python loop does."""
    task = _episodes().task(0)
    want = _learner(ADAPTERS["maml_plus_plus"]([])).adapt(task.support_x, task.support_y,
                                                          steps=5).weights
    got = _learner(ADAPTERS["maml_plus_plus"]([WhileLoop()])).adapt(
        task.support_x, task.support_y, steps=5).weights
    for path in want:
        np.testing.assert_allclose(got[path], want[path], rtol=1e-12, err_msg=path)


def test_multi_step_loss_sees_every_step():
    """MAML++'s multi-step loss reads the whole trajectory (kept in TensorArrays)."""
    make = lambda w: _learner(PerStepLearningRates(3, 0.3, wrappers=w),
                              learner_class=metalearn.MultiStepLossLearner, anneal_steps=10)
    reference = _eager_metrics_and_meta_gradient(make([]), _episodes(), "accumulate")
    _assert_close(_metrics_and_meta_gradient(make([WhileLoop()]), _episodes(), "accumulate"),
                  reference, "multi-step loss")
    task = _episodes().task(0)
    want = metalearn.learners.adapt_trajectory(make([]), task.support_x, task.support_y)
    got = metalearn.learners.adapt_trajectory(make([WhileLoop()]), task.support_x,
                                              task.support_y)
    assert len(got) == len(want) == 4
    for a, b in zip(got, want):
        for path in b:
            np.testing.assert_allclose(a[path], b[path], rtol=1e-12)


@pytest.mark.parametrize("first_order", [False, True])
def test_second_order_meta_gradient_equals_finite_differences(first_order):
    learner = small_learner("conv", steps=3, first_order=first_order, wrappers=[WhileLoop()])
    episodes = image_episodes()
    analytic = analytic_meta_gradient(learner, episodes)
    numeric = finite_difference_gradient(
        lambda w: learner.meta_loss(episodes, weights=w), learner.initial_weights())
    # finite differences see the whole dependence: first order is an approximation of it
    error = relative_error(analytic, numeric)
    assert error < 1e-6 if not first_order else error > 1e-4


def _graph_size(learner, episodes) -> int:
    @tf.function
    def run(episodes):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(learner.meta_metrics(
                episodes, formulation=execution.Accumulate())["loss"])
        return tape.gradient(loss, learner.meta_variables)
    graph = run.get_concrete_function(episodes).graph.as_graph_def(add_shapes=False)
    # operations, not bytes: the serialized size counts the digits of generated names
    # (function and layer counters), which grow with whatever was traced before
    return len(graph.node) + sum(len(f.node_def) for f in graph.library.function)


def test_traced_graph_does_not_grow_with_the_steps():
    size = {(rolled, steps): _graph_size(_learner(
        GradientDescent(steps, 0.3, wrappers=[WhileLoop()] if rolled else [])), _episodes())
        for rolled in (False, True) for steps in (2, 6)}
    assert size[True, 6] == size[True, 2]
    assert size[False, 6] > 2 * size[False, 2]
    assert size[True, 6] < size[False, 6] / 2


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match=r"at most one wrapper may run the inner steps, got "
                                         r"\['WhileLoop', 'WhileLoop'\]"):
        GradientDescent(2, 0.1, wrappers=[WhileLoop(), WhileLoop()])
    with pytest.raises(ValueError, match="WhileLoop.parallel_iterations must be a whole number >= 1, got 0"):
        WhileLoop(parallel_iterations=0)
    with pytest.raises(NotImplementedError, match="MiniBatches does not run the inner steps"):
        MiniBatches(2).iterate(None, {}, (), 1, False)
    # TensorFlow cannot take the while loop's gradient through a custom gradient that
    # reads variables (an internal capture error): refused when the loop is built
    with pytest.raises(ValueError, match=r"WhileLoop cannot run steps that hold a "
                                         r"tf.custom_gradient \(Recompute\)"):
        GradientDescent(2, 0.1, wrappers=[Recompute(), WhileLoop()])


def test_while_loop_under_xla_equals_the_python_loop():
    grads, _ = _gradients(_learner(ADAPTERS["maml_plus_plus"]([WhileLoop()])), _episodes(),
                          execution.Accumulate(), jit_compile=True)
    reference = _python_loop("maml_plus_plus")[1]
    assert len(grads) == len(reference)
    for got, want in zip(grads, reference):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-13)
