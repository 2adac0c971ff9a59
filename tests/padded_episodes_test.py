"""Episodes of different ways and shots padded into one batch (MaskedLabels): the padded,
masked, batched meta-step equals the per-episode reference, each episode run alone at
its own size with a model of its own number of ways (float64, first and second order),
for MAML with BatchNorm, Proto-MAML and Prototypical Networks, per formulation and
through make_meta_step under a three-replica strategy."""

import contextlib
import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn.adapters import GradientDescent
from metalearn.tasks.episode import Episode, pad_episodes
from metalearn.training import distribute, make_meta_step

MAX_WAYS, MAX_SUPPORT, MAX_QUERY = 4, 9, 8
SHAPE = (3, 3, 1)
# (support shots per class, queries per class): ways 2, 3 and 4, unequal shots.
EPISODES = [((1, 3), 2), ((2, 1, 2), 1), ((1, 1, 2, 3), 2)]


def episodes():
    rng = np.random.default_rng(0)
    out = []
    for shots, queries in EPISODES:
        ways = len(shots)
        support_y = np.concatenate([[c] * s for c, s in enumerate(shots)]).astype(np.int32)
        query_y = np.repeat(np.arange(ways), queries).astype(np.int32)
        centres = rng.normal(size=(ways,) + SHAPE)
        out.append(Episode(centres[support_y] + 0.5 * rng.normal(size=(len(support_y),) + SHAPE),
                           support_y,
                           centres[query_y] + 0.5 * rng.normal(size=(len(query_y),) + SHAPE),
                           query_y))
    return out


def body():
    keras.utils.set_random_seed(1)
    return [keras.layers.Conv2D(2, 2, dtype="float64", name="conv"),
            keras.layers.BatchNormalization(dtype="float64", name="bn"),
            keras.layers.ReLU(dtype="float64"), keras.layers.Flatten(dtype="float64")]


def classifier(layers, ways, name):
    model = keras.Sequential([keras.Input(SHAPE, dtype="float64"), *layers,
                              keras.layers.Dense(ways, dtype="float64", name="head")],
                             name=name)
    return model


def xent():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")


def make(kind, ways, layers, first_order, **kwargs):
    """A learner of ``kind`` for ``ways``-way tasks on the shared ``layers``."""
    adapter = GradientDescent(1, 0.25, first_order=first_order)
    if kind == "protonets":
        embedding = keras.Sequential([keras.Input(SHAPE, dtype="float64"), *layers])
        return metalearn.PrototypicalNetworks(embedding, ways=ways,
                                              metrics={"accuracy": "accuracy"}, **kwargs)
    model = classifier(layers, ways, f"{kind}_{ways}")
    if kind == "protomaml":
        return metalearn.ProtoMAML(model, adapter, ways=ways,
                                   metrics={"accuracy": "accuracy"}, **kwargs)
    return metalearn.Learner(model, adapter, loss=xent(), metrics={"accuracy": "accuracy"},
                             **kwargs)


@functools.lru_cache(maxsize=None)
def reference(kind, first_order):
    """Per-episode: each episode alone, a learner of its own ways (MAML's head the
    first ``ways`` columns of the padded model's), mean metrics and meta-gradient, from
    the weights that :func:`make` gives the padded learner."""
    layers = body()
    padded_learner = make(kind, MAX_WAYS, layers, first_order)
    variables = padded_learner.meta_variables
    totals = [np.zeros(v.shape) for v in variables]
    metrics = []
    for episode in episodes():
        ways = int(episode.support_y.max()) + 1
        learner = make(kind, ways, layers, first_order)
        if kind == "maml":
            head = padded_learner.model.get_layer("head")
            learner.model.get_layer("head").kernel.assign(head.kernel[:, :ways])
            learner.model.get_layer("head").bias.assign(head.bias[:ways])
        # The body's variables are the same objects; MAML's head is matched by name.
        own = {id(v): v for v in learner.meta_variables}
        own.update({id(v): learner.model.get_layer("head").trainable_variables[i]
                    for i, v in enumerate(variables[-2:])} if kind == "maml" else {})
        with tf.GradientTape() as tape:
            values = learner.episode_metrics(tf.nest.map_structure(tf.constant, episode))
        grads = tape.gradient(values["loss"], [own[id(v)] for v in variables])
        for i, (variable, grad) in enumerate(zip(variables, grads)):
            grad = grad.numpy()
            if grad.shape != tuple(variable.shape):  # the head of `ways` columns
                grad = np.pad(grad, [(0, 0)] * (grad.ndim - 1) + [(0, MAX_WAYS - ways)])
            totals[i] += grad / len(EPISODES)
        metrics.append({k: float(v) for k, v in values.items()})
    return totals, {k: np.mean([m[k] for m in metrics]) for k in metrics[0]}


def padded():
    return pad_episodes(episodes(), MAX_SUPPORT, MAX_QUERY, MAX_WAYS)


@pytest.mark.parametrize("kind, first_order, task_batching", [
    ("maml", False, "map_fn"), ("maml", True, "map_fn"), ("maml", False, "batched"),
    ("maml", False, "accumulate"), ("protomaml", False, "unrolled"),
    ("protonets", False, "map_fn")])
def test_padded_batch_equals_per_episode_reference(kind, first_order, task_batching):
    expected_grads, expected = reference(kind, first_order)
    learner = make(kind, MAX_WAYS, body(), first_order, task_batching=task_batching)
    variables = learner.meta_variables
    batch = padded()
    if task_batching == "accumulate":
        grads, per_task = metalearn.learners.task_batching.accumulate(learner, batch, variables)
    else:
        with tf.GradientTape() as tape:
            per_task = learner.meta_metrics(batch)
            loss = tf.reduce_mean(per_task["loss"])
        grads = tape.gradient(loss, variables)
    for name, value in expected.items():
        np.testing.assert_allclose(np.mean(per_task[name]), value, rtol=1e-10, err_msg=name)
    for variable, grad, want in zip(variables, grads, expected_grads):
        np.testing.assert_allclose(grad, want, rtol=1e-8, atol=1e-12, err_msg=variable.path)


def _step_gradients(learner, strategy=None):
    """make_meta_step with SGD at rate 0.5: the meta-gradient is (before - after) / 0.5."""
    outer = metalearn.MetaOptimizer(keras.optimizers.SGD(learning_rate=0.5))
    step = make_meta_step(learner, outer, strategy=strategy)
    before = [v.numpy().copy() for v in learner.meta_variables]
    batch = padded()
    metrics = step(batch if strategy is None else distribute.split_episodes(strategy, batch))
    return [(b - v.numpy()) / 0.5 for b, v in zip(before, learner.meta_variables)], metrics


@pytest.mark.parametrize("kind, replicas", [("maml", 3)])
def test_meta_step_on_padded_batch_equals_reference(kind, replicas):
    if replicas > 1 and len(tf.config.list_logical_devices("CPU")) < replicas:
        pytest.skip("needs logical CPUs (tests/conftest.py)")
    strategy = None if replicas == 1 else distribute.make_strategy(
        "mirrored", [f"/cpu:{i}" for i in range(replicas)],
        cross_device_ops="reduce_to_one_device")
    expected_grads, expected = reference(kind, False)
    with strategy.scope() if strategy else contextlib.nullcontext():
        learner = make(kind, MAX_WAYS, body(), False)
    grads, metrics = _step_gradients(learner, strategy)
    for variable, grad, want in zip(learner.meta_variables, grads, expected_grads):
        np.testing.assert_allclose(grad, want, rtol=1e-7, atol=1e-11, err_msg=variable.path)
    for name, value in expected.items():
        np.testing.assert_allclose(float(metrics[name]), value, rtol=1e-10, err_msg=name)


def test_padded_labels_and_shapes():
    batch = padded()
    assert batch.support_x.shape == (3, MAX_SUPPORT) + SHAPE
    assert batch.query_x.shape == (3, MAX_QUERY) + SHAPE
    np.testing.assert_array_equal(batch.support_y.mask.numpy().sum(1), [4, 5, 7])
    np.testing.assert_array_equal(batch.support_y.classes.numpy().sum(1), [2, 3, 4])
    assert (batch.support_y.labels.numpy()[~batch.support_y.mask.numpy()] == -1).all()


def test_too_large_an_episode_is_named():
    with pytest.raises(ValueError, match="episode 2 has 7 support examples, more than "
                                         "max_support=5"):
        pad_episodes(episodes(), 5, MAX_QUERY, MAX_WAYS)


@pytest.mark.parametrize("head", [metalearn.heads.PrototypeHead(),
                                  metalearn.heads.RidgeHead(regularization=0.5)])
def test_heads_fit_on_the_real_rows_only(head):
    head.build(tf.float64)
    rng = np.random.default_rng(2)
    real = tf.constant(rng.normal(size=(5, 3)))
    labels = tf.constant([0, 1, 1, 2, 0])
    padded = tf.concat([real, tf.constant(rng.normal(size=(3, 3)))], 0)  # garbage rows
    masked = metalearn.tasks.MaskedLabels(
        tf.constant([0, 1, 1, 2, 0, -1, -1, -1]), tf.range(8) < 5, tf.range(4) < 3)
    want = head.fit(real, labels, 4)
    np.testing.assert_allclose(head.fit(padded, masked, 4), want, rtol=1e-12, atol=1e-14)
