"""Episodes of different ways and shots padded into one batch (MaskedLabels): the padded,
masked, batched meta-step equals the per-episode reference, each episode run alone at
its own size with a model of its own number of ways (float64, first and second order),
for MAML with BatchNorm, Proto-MAML, Prototypical Networks and the embedding learners
of every head (MetaOptNet's SVM, LR-D2, RFS, the linear probe; with an inner loop on the
embedding where the head is differentiable throughout), per formulation and through
make_meta_step under a three-replica strategy; and every head's fit on a padded support
set classifies the queries as the fit on its real rows alone does."""

import contextlib
import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn.adapters import GradientDescent
from metalearn.heads import (LinearProbeHead, LogisticHead, LogisticRegressionHead,
                             PrototypeHead, RidgeHead, SVMHead)
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


# Every head, as an embedding learner's: each configuration that fits differently.
HEADS = {
    "svm": lambda: SVMHead(c=0.5, scale=2.0, steps=60),
    "svm_ridge": lambda: SVMHead(c=0.1, steps=60, ridge=0.1),
    "lr_d2": lambda: LogisticHead(0.5, scale=2.0, bias=0.1, steps=12),
    "lr_d2_intercept": lambda: LogisticHead(0.5, steps=12, intercept=True, normalize=True),
    "lr_d2_unrolled": lambda: LogisticHead(0.5, scale=2.0, steps=3, gradient="unrolled"),
    "rfs": lambda: LogisticRegressionHead(C=2.0, iterations=4),
    "probe": lambda: LinearProbeHead(steps=8, learning_rate=0.2),
    "probe_cosine": lambda: LinearProbeHead("cosine", steps=8, learning_rate=0.2),
}


def make(kind, ways, layers, first_order, head=None, **kwargs):
    """A learner of ``kind`` for ``ways``-way tasks on the shared ``layers`` (and, for an
    embedding learner of a head in :data:`HEADS`, the shared ``head``; an inner loop on
    the embedding unless ``first_order`` is None)."""
    adapter = GradientDescent(1, 0.25, first_order=first_order)
    if kind == "protonets" or kind in HEADS:
        embedding = keras.Sequential([keras.Input(SHAPE, dtype="float64"), *layers])
        if kind == "protonets":
            return metalearn.PrototypicalNetworks(embedding, ways=ways,
                                                  metrics={"accuracy": "accuracy"}, **kwargs)
        return metalearn.EmbeddingLearner(
            embedding, head=HEADS[kind]() if head is None else head, ways=ways,
            adapter=None if first_order is None else adapter,
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
    head = HEADS[kind]() if kind in HEADS else None  # its variables shared, as the body's
    padded_learner = make(kind, MAX_WAYS, layers, first_order, head)
    variables = padded_learner.meta_variables
    totals = [np.zeros(v.shape) for v in variables]
    metrics = []
    for episode in episodes():
        ways = int(episode.support_y.max()) + 1
        learner = make(kind, ways, layers, first_order, head)
        if kind == "maml":
            head = padded_learner.model.get_layer("head")
            learner.model.get_layer("head").kernel.assign(head.kernel[:, :ways])
            learner.model.get_layer("head").bias.assign(head.bias[:ways])
        # The body's variables are the same objects; MAML's head is matched by name.
        own = {id(v): v for v in learner.meta_variables}
        own.update({id(v): learner.model.get_layer("head").trainable_variables[i]
                    for i, v in enumerate(variables[-2:])} if kind == "maml" else {})
        with tf.GradientTape() as tape:
            values = learner.run_task(tf.nest.map_structure(tf.constant, episode)).metrics
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
    ("protonets", False, "map_fn"),
    # the heads' learners: no inner loop (None), and one on the embedding through the
    # heads that are differentiable throughout (the implicit ones run unrolled tasks)
    ("svm", None, "unrolled"), ("svm_ridge", None, "unrolled"), ("lr_d2", None, "unrolled"),
    ("lr_d2_intercept", None, "unrolled"), ("lr_d2_unrolled", None, "map_fn"),
    ("rfs", None, "map_fn"), ("probe", None, "map_fn"), ("probe_cosine", None, "map_fn"),
    ("lr_d2_unrolled", False, "map_fn"), ("rfs", True, "map_fn"), ("probe", False, "map_fn"),
    ("probe_cosine", True, "accumulate")])
def test_padded_batch_equals_per_episode_reference(kind, first_order, task_batching):
    expected_grads, expected = reference(kind, first_order)
    learner = make(kind, MAX_WAYS, body(), first_order)
    formulation = metalearn.execution.formulation(task_batching)
    variables = learner.meta_variables
    batch = padded()
    if task_batching == "accumulate":
        grads, per_task = formulation.gradients(learner, batch, variables)
    else:
        with tf.GradientTape() as tape:
            per_task = learner.meta_metrics(batch, formulation=formulation)
            loss = tf.reduce_mean(per_task["loss"])
        grads = tape.gradient(loss, variables)
    for name, value in expected.items():
        np.testing.assert_allclose(np.mean(per_task[name]), value, rtol=1e-10, err_msg=name)
    for variable, grad, want in zip(variables, grads, expected_grads):
        np.testing.assert_allclose(grad, want, rtol=1e-8, atol=1e-12, err_msg=variable.path)


def _step_gradients(learner, strategy=None):
    """make_meta_step with SGD at rate 0.5: the meta-gradient is (before - after) / 0.5."""
    outer = metalearn.MetaGradient(keras.optimizers.SGD(learning_rate=0.5))
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


FIT_HEADS = dict(HEADS, prototypes=PrototypeHead,
                 ridge=lambda: RidgeHead(regularization=0.5, bias=0.1))


@pytest.mark.parametrize("padding_scale", [1.0, 1e3])  # 1e3: fitting the padding shows
@pytest.mark.parametrize("kind", sorted(FIT_HEADS))
def test_heads_fit_on_the_real_rows_and_classes_only(kind, padding_scale):
    """A 3-way support set of 6 real rows padded to 10 rows and 5 ways (the padding rows'
    embeddings arbitrary, labelled PADDING): the padded fit's query logits of the 3 real
    classes are those of the fit on the real rows at 3 ways (for a head with a free
    intercept, whose logits are defined up to one shift per query, their softmax)."""
    head = FIT_HEADS[kind]()
    head.build(tf.float64)
    rng = np.random.default_rng(2)
    labels = np.array([0, 1, 1, 2, 0, 2], np.int32)
    centres = rng.normal(size=(3, 4))
    real = centres[labels] + 0.5 * rng.normal(size=(6, 4))
    queries = tf.constant(centres[[0, 1, 2, 1]] + 0.5 * rng.normal(size=(4, 4)))
    garbage = padding_scale * (2 + rng.normal(size=(4, 4)))  # far from every class
    masked = metalearn.tasks.MaskedLabels(
        tf.constant(np.concatenate([labels, [-1] * 4]).astype(np.int32)),
        tf.range(10) < 6, tf.range(5) < 3)
    want = head.logits(head.fit(tf.constant(real), tf.constant(labels), 3), queries).numpy()
    got = head.logits(head.fit(tf.constant(np.concatenate([real, garbage])), masked, 5),
                      queries).numpy()[:, :3]
    if getattr(head, "intercept", False):
        want, got = (tf.nn.softmax(z).numpy() for z in (want, got))
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-12)


def test_every_library_head_says_it_fits_padding_and_a_third_party_one_does_not():
    from metalearn.learners.embedding import padding_heads
    for name in padding_heads():
        head = getattr(metalearn.heads, name)()
        assert head.capabilities.padding and head.supports_padding, name

    class Outside(metalearn.heads.Head):
        def fit(self, embeddings, labels, ways):
            return embeddings

    assert not Outside().capabilities.padding
    # a composite asks its parts: a learner holding the head says what the head says
    learner = metalearn.EmbeddingLearner(metalearn.models.mlp((2,), hidden=(), outputs=3),
                                         head=Outside(), ways=2)
    assert not learner.pieces.capabilities.padding
    assert metalearn.EmbeddingLearner(metalearn.models.mlp((2,), hidden=(), outputs=3),
                                      head=PrototypeHead(), ways=2).pieces.capabilities.padding
