"""Learner: purity of adaptation, formulations and compilation (the README's example runs
as pasted in tests/docs_test.py)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution, models
from metalearn.adapters import GradientDescent
from metalearn.tasks import Sinusoid
from metalearn.testing import image_episodes, small_learner, softmax_xent


def test_variables_bit_identical_after_adapt_and_meta_loss():
    learner = small_learner("conv", steps=3)
    episodes = image_episodes()
    before = [v.numpy().copy() for v in learner.model.variables]
    learner.adapt(episodes.support_x[0], episodes.support_y[0])
    learner.meta_loss(episodes)
    tf.function(learner.meta_loss)(episodes)
    for old, variable in zip(before, learner.model.variables):
        assert old.tobytes() == variable.numpy().tobytes(), variable.path


def _meta_gradient(learner, episodes, mode, formulation=None):
    def grads(batch):
        with tf.GradientTape() as tape:
            loss = learner.meta_loss(batch, formulation=formulation)
        return tape.gradient(loss, learner.meta_variables)
    if mode == "eager":
        return [g.numpy() for g in grads(episodes)]
    compiled = tf.function(grads, jit_compile=(mode == "xla"))
    return [g.numpy() for g in compiled(episodes)]


def test_meta_gradient_same_eager_function_and_xla():
    """A conv net's second-order meta-gradient, eagerly, in a graph and under XLA (the
    formulations against each other: tests/execution/formulations_test.py). One block
    of small_learner's conv net (conv, BatchNorm, ReLU, max-pool, then the head): the
    layer kinds of its two blocks, in half the XLA compile time."""
    keras.utils.set_random_seed(0)
    model = models.conv_net((8, 8, 1), outputs=3, filters=3, blocks=1, dtype="float64")
    learner = metalearn.Learner(model, GradientDescent(steps=2, learning_rate=0.3),
                                loss=softmax_xent)
    formulation = execution.formulation("map_fn")
    episodes = image_episodes(tasks=3)
    eager = _meta_gradient(learner, episodes, "eager", formulation)
    for mode in ("function", "xla"):
        for a, b in zip(eager, _meta_gradient(learner, episodes, mode, formulation)):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, err_msg=mode)


def test_meta_metrics_per_task_and_accuracy():
    keras.utils.set_random_seed(1)
    model = models.conv_net((8, 8, 1), outputs=3, filters=3, blocks=2, dtype="float64")
    learner = metalearn.Learner(model, GradientDescent(steps=1, learning_rate=0.1),
                                loss=softmax_xent, metrics={"accuracy": "accuracy"})
    metrics = learner.meta_metrics(image_episodes(tasks=5))
    assert sorted(metrics) == ["accuracy", "loss"]
    assert metrics["loss"].shape == (5,) and metrics["accuracy"].shape == (5,)
    assert np.all((metrics["accuracy"] >= 0) & (metrics["accuracy"] <= 1))


def test_more_inner_steps_at_test_time_lower_support_loss():
    learner = small_learner("mlp", steps=1)
    from metalearn.testing import regression_episodes
    episode = regression_episodes().task(0)
    losses = [float(learner.support_loss(learner.adapt(episode.support_x, episode.support_y,
                                                       steps=s).weights,
                                         episode.support_x, episode.support_y))
              for s in (0, 1, 5)]
    assert losses[0] > losses[1] > losses[2]


def test_bad_arguments_are_named():
    model = models.mlp()
    with pytest.raises(ValueError, match="needs a loss"):
        metalearn.Learner(model, GradientDescent())
    # task_batching moved to the formulation (metalearn 0.3): the old keyword names it,
    # and an unknown formulation name is named where formulations are made
    with pytest.raises(TypeError, match="task_batching=.*moved.*formulation"):
        metalearn.Learner(model, GradientDescent(), loss="mse", task_batching="vmap")
    with pytest.raises(ValueError, match="unknown formulation 'vmap'"):
        execution.formulation("vmap")
    with pytest.raises(TypeError, match="Adapter"):
        metalearn.Learner(model, adapter="sgd", loss="mse")
    with pytest.raises(ValueError, match="unknown loss 'msee'"):
        metalearn.Learner(model, GradientDescent(), loss="msee")


# The learner's public surface, each member a deliberate choice (issue 27: about 20):
# what it holds (the constructor's arguments and the outer-step counter) and what it
# does. A new member is a decision to record here, not a drift.
SURFACE = {
    "held": ["adapter", "loss", "meta_step", "metrics", "model", "query_training",
             "task_init"],
    "does": ["adapt", "adapt_and_measure", "forward", "initial_weights", "meta_loss",
             "meta_metrics", "meta_variables", "metric_names", "objective_of", "pieces",
             "predict", "query_data", "query_metrics", "records_trajectory", "run_task",
             "run_tasks", "split", "support_loss", "task_initial_weights", "task_loss"],
}


def test_learner_public_surface_is_the_recorded_one():
    learner = metalearn.Learner(models.mlp(), GradientDescent(), loss="mse")
    module = set(dir(tf.Module))
    held = sorted(n for n in vars(learner) if not n.startswith("_"))
    does = sorted(n for n in dir(type(learner)) if not n.startswith("_") and n not in module)
    assert (held, does) == (SURFACE["held"], SURFACE["does"])
    assert len(does) <= 20


@pytest.mark.parametrize("name, new", [
    ("capabilities", r"learner\.pieces\.capabilities"),
    ("gradient_metrics", r"learner\.pieces\.gradient_metrics"),
    ("metric_dtype", r"functional\.metric_dtype\(learner\.model\)"),
    ("predict_on", r"learners\.predict_on\(learner"),
    ("support_objective", r"learners\.support_objective\(learner\)"),
    ("support_outputs", "support_loss"),
    ("query_metric_names", "metric_names"),
])
def test_moved_members_name_their_new_spelling(name, new):
    learner = metalearn.Learner(models.mlp(), GradientDescent(), loss="mse")
    with pytest.raises(AttributeError, match=rf"Learner\.{name} moved in metalearn 0\.3.*{new}"):
        getattr(learner, name)
    # an override of a member the learner no longer calls would be silently ignored
    subclass = type("Old", (metalearn.Learner,), {name: lambda self, *a: None})
    with pytest.raises(TypeError, match=rf"Old defines {name}, which Learner no longer calls"):
        subclass(models.mlp(), GradientDescent(), loss="mse")
    assert not hasattr(learner, "no_such_member")


def test_pieces_answer_for_the_whole_learner():
    """learner.pieces is one Piece over the adapter, task initialisers (and a head):
    capabilities, task paths and meta-variables are asked of every part."""
    head = metalearn.heads.SVMHead()
    learner = metalearn.learners.EmbeddingLearner(
        models.mlp(hidden=(4,), outputs=3), head=head, ways=2,
        task_init=[metalearn.learners.ZeroInit(("head",))])
    pieces = learner.pieces
    assert list(pieces) == [learner.adapter, *learner.task_init,
                            learner._task_axis_rules, head]
    assert pieces.capabilities.custom_gradient == head.capabilities.custom_gradient
    assert set(pieces.task_paths(learner.initial_weights())) == set(learner.pieces.task_paths(learner.initial_weights()))
    assert [id(v) for v in pieces.meta_variables] == [id(v) for v in head.meta_variables]


def test_subclass_overrides_task_loss():
    class L1Learner(metalearn.Learner):
        def task_loss(self, y_true, y_pred):
            return tf.reduce_mean(tf.abs(y_true - y_pred))

    learner = L1Learner(models.mlp(), GradientDescent(steps=0), loss="mse")
    episodes = Sinusoid(shots=5).sample(tf.constant([1, 1]), num_tasks=2)
    predictions = learner.predict(learner.initial_weights(), episodes.query_x[0])
    expected = tf.reduce_mean(tf.abs(episodes.query_y[0] - predictions))
    np.testing.assert_allclose(learner.meta_metrics(episodes)["loss"][0], expected,
                               rtol=1e-6)


@pytest.mark.parametrize("loss", [keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                  keras.losses.MeanSquaredError()])
def test_keras_loss_objects_compute_in_a_float64_models_precision(loss):
    # Keras 3 loss objects cast predictions to their own dtype (floatx, float32): a
    # float64 model's loss, and every meta-gradient through it, would be float32-exact
    model = models.mlp(input_shape=(3,), hidden=(4,), outputs=2, dtype="float64")
    learner = metalearn.Learner(model, GradientDescent(1, 0.1), loss=loss)
    logits = tf.constant([[0.1, 0.2 + 1e-9], [3.0, -1.0]], tf.float64)
    labels = tf.constant([1, 0]) if "Sparse" in type(loss).__name__ else \
        tf.constant([[0.0, 1.0], [1.0, 0.0]], tf.float64)
    value = learner.task_loss(labels, logits)
    assert value.dtype == tf.float64
    if "Sparse" in type(loss).__name__:
        log_p = tf.nn.log_softmax(logits)
        expected = -(log_p[0, 1] + log_p[1, 0]) / 2
    else:
        expected = tf.reduce_mean(tf.square(labels - logits))
    np.testing.assert_allclose(value.numpy(), expected.numpy(), rtol=1e-14)
    assert loss.dtype == "float32"  # the caller's object is left as it was


def test_a_keras_loss_without_a_dtype_argument_computes_in_a_float64_models_precision():
    # rebuilt from its config it cannot be (no dtype argument), nor copied by Keras'
    # pickling (a class defined here, which Keras cannot locate by name)
    class Difference(keras.losses.Loss):
        def __init__(self):
            super().__init__(name="difference")

        def call(self, y_true, y_pred):
            return tf.reduce_sum(y_pred - y_true, axis=-1)

    loss = Difference()
    model = models.mlp(input_shape=(3,), hidden=(4,), outputs=2, dtype="float64")
    learner = metalearn.Learner(model, GradientDescent(1, 0.1), loss=loss)
    targets = tf.zeros([2, 2], tf.float64)
    predictions = tf.constant([[1e-12, 0.0], [0.0, 0.0]], tf.float64)
    value = learner.task_loss(targets, predictions)
    assert value.dtype == tf.float64 and float(value) == 0.5e-12
    assert loss.dtype == "float32"  # the caller's object is left as it was


# --- one shape of adaptation, pieces found on the learner ---------------------------


def test_adapt_gives_one_shape_for_every_family():
    from metalearn.adapters import ConditionalNeuralProcess
    from metalearn.functional import gaussian_nll
    episodes = Sinusoid(shots=4).sample(tf.constant([0, 0]), num_tasks=2)
    task = episodes.task(0)
    maml = metalearn.Learner(models.mlp((1,), hidden=(4,)), GradientDescent(steps=1),
                             loss="mse")
    encoder = models.mlp((2,), hidden=(8,), outputs=8, name="encoder")
    cnp = metalearn.Learner(models.mlp((9,), hidden=(8,), outputs=2, name="decoder"),
                            ConditionalNeuralProcess(encoder), loss=gaussian_nll)
    for learner in (maml, cnp):
        adapted = learner.adapt(task.support_x, task.support_y)
        assert isinstance(adapted, metalearn.Adapted)
        assert sorted(adapted.weights) == sorted(learner.initial_weights())  # no extra keys
    assert maml.adapt(task.support_x, task.support_y).state == {}
    assert set(cnp.adapt(task.support_x, task.support_y).state) == {"context"}
    batched = maml.run_tasks(episodes).adapted  # every task at once: the same shape
    assert isinstance(batched, metalearn.Adapted) and batched.state == {}
    with pytest.raises(TypeError, match=r"adapt\(\) returns holds them as .weights"):
        metalearn.functional.call(maml.model, maml.adapt(task.support_x, task.support_y),
                                  task.query_x)


def test_a_task_state_on_a_task_axis_is_refused_by_name():
    class StatefulStep(GradientDescent):  # says task_axis, yet gives a task state
        def task_state(self, weights, support_x, support_y, loss_fn):
            return {"note": tf.reduce_mean(support_y)}

    learner = metalearn.Learner(models.mlp((1,), hidden=(4,)), StatefulStep(steps=1),
                                loss="mse")
    episodes = Sinusoid(shots=4).sample(tf.constant([0, 0]), num_tasks=2)
    assert "note" in learner.adapt(episodes.support_x[0], episodes.support_y[0]).state
    with pytest.raises(ValueError, match="StatefulStep gives a task state"):
        learner.run_tasks(episodes)


def test_a_subclass_piece_is_asked_without_an_override():
    class Marker(metalearn.adapters.Piece):
        def own_capabilities(self):
            return metalearn.adapters.Capabilities(custom_gradient=True)

    class WithMarker(metalearn.Learner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.extras = [Marker(name="marker")]  # in a list, set after the base's

    learner = WithMarker(models.mlp((1,), hidden=(4,)), GradientDescent(steps=1), loss="mse")
    names = [type(p).__name__ for p in learner.pieces]
    assert names == ["GradientDescent", "TaskAxisRules", "Marker"], names
    assert learner.pieces.capabilities.custom_gradient
    assert not metalearn.Learner(models.mlp((1,), hidden=(4,)), GradientDescent(steps=1),
                                 loss="mse").pieces.capabilities.custom_gradient
