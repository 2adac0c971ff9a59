"""Composites ask their parts: the combinations that were wrong before metalearn 0.2.

Each of the first four tests is a case the composable-inner-loops issue reproduced in
0.1 (capabilities were class flags a wrapper forgot to forward, the outer step was
assembled in three places). They now hold by construction: ``Piece`` computes
capabilities, task paths and meta-variables over every part it holds, the learner binds
its counter to every part, and ``make_meta_step`` is the only step builder.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution, models
from metalearn.adapters import (AnnealOrder, Capabilities, GradientDescent, GradientStep,
                                Hypernetwork, ImplicitGradientDescent, Mask, MiniBatches,
                                PerStepWeights, Recompute, WhileLoop)
from metalearn.tasks import Episode
from metalearn.testing import (analytic_meta_gradient,
                               assert_meta_gradient_matches_finite_differences,
                               compiled_meta_gradient, regression_episodes, relative_error)
from metalearn.training import Loop, Runtime
from metalearn.training.step import make_meta_step

WAYS, SHOTS, DIM = 3, 2, 4
MAP_FN, UNROLLED = execution.MapFn(), execution.Unrolled()


def xent(y, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        tf.cast(tf.reshape(y, [-1]), tf.int32), logits))


def _episodes(tasks=2, seed=0):
    keys = tf.random.experimental.stateless_split([seed, 3], 2)
    labels = tf.tile(tf.repeat(tf.range(WAYS), SHOTS)[None], [tasks, 1])
    x = lambda k: tf.random.stateless_normal([tasks, WAYS * SHOTS, DIM], k, dtype=tf.float64)
    return Episode(x(keys[0]), labels, x(keys[1]), labels)


def _hypernetwork_learner(then):
    """An MLP 4-3-3 whose head is generated from per-class means, then adapted by ``then``."""
    keras.utils.set_random_seed(0)
    model = models.mlp((DIM,), hidden=(3,), outputs=WAYS, activation="tanh", dtype="float64")
    generator = keras.Sequential([keras.Input((WAYS * DIM,), dtype="float64"),
                                  keras.layers.Dense(3 * WAYS + WAYS, dtype="float64",
                                                     name="dense")], name="generator")
    adapter = Hypernetwork(generator, generate=("head",), then=then)
    return metalearn.Learner(model, adapter=adapter, loss=xent)


def test_annealing_inside_a_hypernetwork_reads_the_learners_counter():
    """0.1: ``Hypernetwork(then=GradientDescent(first_order_steps=5))`` raised
    'first_order_steps needs the learner's meta-step counter'."""
    then = GradientDescent(2, update=[AnnealOrder(5), GradientStep(0.3)])
    learner = _hypernetwork_learner(then)
    assert then.update.transforms[0].meta_step is learner.meta_step
    first = _hypernetwork_learner(GradientDescent(2, 0.3, first_order=True))
    second = _hypernetwork_learner(GradientDescent(2, 0.3))
    episodes = _episodes()
    gradient = lambda l: analytic_meta_gradient(l, episodes, MAP_FN)
    annealed = gradient(learner)  # meta-step 0: first order
    assert relative_error(annealed, gradient(first)) < 1e-12
    assert relative_error(annealed, gradient(second)) > 1e-4
    learner.meta_step.assign(5)
    annealed = gradient(learner)
    assert relative_error(annealed, gradient(second)) < 1e-12


def test_per_step_weights_inside_a_hypernetwork_leave_the_meta_variables():
    """0.1: ``Hypernetwork(then=GradientDescent(per_step=("hidden0/bias",)))`` left the
    replaced variable in ``meta_variables`` with a ``None`` meta-gradient."""
    then = GradientDescent(2, 0.3, wrappers=[PerStepWeights(("hidden0/bias",))])
    learner = _hypernetwork_learner(then)
    paths = [v.path for v in learner.meta_variables]
    assert "mlp/hidden0/bias" not in paths
    assert "mlp/hidden0/bias" in learner.pieces.task_paths(learner.initial_weights())
    assert any("per_step" in p for p in paths)  # the copies are meta-learned instead
    analytic = assert_meta_gradient_matches_finite_differences(learner, _episodes(),
                                                               formulation=MAP_FN)
    assert np.any(analytic[then.wrappers[0].own_meta_variables()[0].path])


def test_implicit_gradient_inside_a_hypernetwork_runs_unrolled():
    """0.1: ``Hypernetwork(then=ImplicitGradientDescent())`` ran under ``tf.map_fn``, where
    TensorFlow ignores the custom gradient: the meta-gradient was the plain one."""
    then = lambda: ImplicitGradientDescent(steps=3, learning_rate=0.1, regularization=2.0,
                                           cg_steps=3)
    learner = _hypernetwork_learner(then())  # run with MapFn below
    assert learner.adapter.needs_unrolled_tasks and learner.pieces.capabilities.custom_gradient
    unrolled = _hypernetwork_learner(then())
    episodes = _episodes()
    got = compiled_meta_gradient(learner, episodes, MAP_FN)  # tf.map_fn: a graph loop
    want = compiled_meta_gradient(unrolled, episodes, UNROLLED)
    assert relative_error(got, want) < 1e-12  # 0.1: 0.13
    assert relative_error(want, analytic_meta_gradient(unrolled, episodes, UNROLLED)) < 1e-12


def _linear_learner():
    keras.utils.set_random_seed(0)
    model = models.mlp((2,), hidden=(), outputs=1, dtype="float64")
    return metalearn.Learner(model, GradientDescent(steps=2, learning_rate=0.1),
                             loss=lambda y, p: tf.reduce_mean(tf.square(y - p)))


def _serial_reptile_by_hand(learner, episodes, epsilon):
    weights = {v.path: v.numpy() for v in learner.meta_variables}
    for i in range(episodes.num_tasks):
        task = episodes.task(i)
        start = {p: tf.constant(w) for p, w in weights.items()}
        adapted = learner.adapt(task.support_x, task.support_y, weights=start).weights
        weights = {p: w + epsilon * (adapted[p].numpy() - w) for p, w in weights.items()}
    return weights


@pytest.mark.parametrize("jit_compile", [False, True])
def test_serial_reptile_is_serial_under_xla(jit_compile):
    """0.1: with ``jit_compile=True`` the training path called compute_gradients and
    apply_gradients itself, so ``Reptile(serial=True)`` silently ran batched Reptile.
    The learners run their tasks unrolled."""
    episodes = regression_episodes(tasks=3)
    expected = _serial_reptile_by_hand(_linear_learner(), episodes, 0.5)
    for strategy in (None, tf.distribute.get_strategy()):
        learner = _linear_learner()
        step = make_meta_step(learner, metalearn.SerialReptile(keras.optimizers.SGD(0.5)),
                              UNROLLED, jit_compile=jit_compile, skip_non_finite=True,
                              strategy=strategy)
        step(episodes)
        for v in learner.meta_variables:
            np.testing.assert_allclose(v.numpy(), expected[v.path], rtol=1e-10)
    batched = _linear_learner()
    make_meta_step(batched, metalearn.Reptile(keras.optimizers.SGD(0.5)), UNROLLED,
                   jit_compile=jit_compile)(episodes)
    assert not all(np.allclose(v.numpy(), expected[v.path]) for v in batched.meta_variables)


# --- the training loop's step is make_meta_step ------------------------------------

OUTER_RULES = {
    "meta_gradient": lambda: metalearn.MetaGradient(keras.optimizers.Adam(0.01)),
    "reptile": lambda: metalearn.Reptile(keras.optimizers.SGD(0.5)),
    "serial_reptile": lambda: metalearn.SerialReptile(keras.optimizers.SGD(0.5)),
}


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("rule", sorted(OUTER_RULES))
def test_training_loop_step_equals_make_meta_step(rule, jit_compile, tmp_path):
    sampler = metalearn.tasks.Sinusoid(shots=5, queries=5)
    make = lambda: metalearn.Experiment(
        learner=metalearn.Learner(_sinusoid_model(), GradientDescent(1, 0.01), loss="mse"),
        sampler=sampler, outer_rule=OUTER_RULES[rule](), meta_batch_size=2,
        loop=Loop(num_steps=3, log_every=3, checkpoint_every=3),
        runtime=Runtime(jit_compile=jit_compile))
    trained = make()
    metalearn.training.train(trained, str(tmp_path))
    by_hand = make()
    step = make_meta_step(by_hand.learner, by_hand.outer_rule, by_hand.formulation,
                          jit_compile=jit_compile, skip_non_finite=True)
    for batch in sampler.dataset(2, seed=0, split="train", num_steps=3):
        step(batch)
    assert int(trained.learner.meta_step) == int(by_hand.learner.meta_step) == 3
    for a, b in zip(trained.learner.meta_variables, by_hand.learner.meta_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


def _sinusoid_model():
    keras.utils.set_random_seed(0)
    return models.mlp((1,), hidden=(8,), outputs=1)


# --- capabilities are computed through composition ----------------------------------

@pytest.mark.parametrize("wrappers,update,expected", [
    ((), None, Capabilities(custom_gradient=False, task_axis=True, step_prefix=True)),
    ((Recompute(),), None, Capabilities(custom_gradient=True, task_axis=True,
                                        step_prefix=True)),
    ((MiniBatches(2),), None, Capabilities(custom_gradient=False, task_axis=False,
                                           step_prefix=True)),
    ((Recompute(), MiniBatches(2)), [Mask(("head",)), GradientStep(0.1)],
     Capabilities(custom_gradient=True, task_axis=False, step_prefix=True)),
    ((MiniBatches(2), WhileLoop()), None,  # a WhileLoop keeps no step's weights
     Capabilities(custom_gradient=False, task_axis=False, step_prefix=False)),
])
def test_capabilities_combine_over_every_part(wrappers, update, expected):
    adapter = GradientDescent(2, update=update, wrappers=list(wrappers)) if update else \
        GradientDescent(2, 0.1, wrappers=list(wrappers))
    assert adapter.capabilities == expected
    assert Hypernetwork(keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]),
                        then=adapter).capabilities.custom_gradient == expected.custom_gradient


def test_a_subclass_that_sets_a_legacy_flag_is_told_what_to_do():
    with pytest.raises(TypeError, match="own_capabilities"):
        class Old(metalearn.adapters.Adapter):  # noqa: F841
            supports_task_axis = True

            def adapt(self, weights, support_x, support_y, loss_fn, steps=None):
                return weights
