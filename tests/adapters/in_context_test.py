"""The in-context adapter (metalearn.adapters.in_context): the shipped contracts
(classification, regression, a prototype head as the read-out), invariance to the
support set's order, independent queries, the attention mask and the whole sequence
model against a numpy reference, meta-gradients against float64 finite differences,
the head read-out against ProtoNets on the transformed tokens, a frozen warm-started
embedding (CAML's setting), padding, a short learning run, bad input (more ways than
built for), the Omniglot files' ways; and the random task priors (metalearn.tasks.random_tasks; the tutorial
docs/tutorials/in_context.md meta-trains the adapter on the linear one)."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.adapters import InContext
from metalearn.adapters.in_context import attention_mask
from metalearn.adapters.neural_process import CONTEXT
from metalearn.functional import Gaussian, gaussian_nll, predictive_mse
from metalearn.heads import PrototypeHead, RidgeHead
from metalearn.tasks import RandomLinearClassification, RandomMLPFunctions, pad_episodes
from metalearn.testing import (DIM, WAYS, LearnerContract, RegressionContract,
                               analytic_meta_gradient, image_episodes,
                               assert_meta_gradient_matches_finite_differences,
                               assert_sampler_is_seeded_and_stateless,
                               softmax_cross_entropy, synthetic_classification,
                               synthetic_regression, uninformative_support)


def icl_learner(ways=WAYS, targets=None, output="raw", embedding=8, width=16, depth=2,
                heads=2, dtype=None, activation="gelu", seed=0, head=None):
    """A small in-context learner over an MLP embedding of the contract's inputs."""
    keras.utils.set_random_seed(seed)
    model = models.mlp((DIM,), hidden=(16,), outputs=embedding, activation="tanh",
                       dtype=dtype, name="embedding")
    adapter = InContext(ways=ways, targets=targets, output=output, width=width,
                        depth=depth, heads=heads, activation=activation, head=head)
    if targets is None:
        return metalearn.Learner(model, adapter, loss=softmax_cross_entropy,
                                 metrics={"accuracy": "accuracy"})
    if output == "gaussian":
        return metalearn.Learner(model, adapter, loss=gaussian_nll,
                                 metrics={"mse": predictive_mse})
    return metalearn.Learner(model, adapter, loss="mse")


def task64(seed=0, **kwargs):
    return synthetic_classification(seed, tasks=1, dtype=tf.float64, **kwargs).task(0)


# --- the shipped contracts --------------------------------------------------------------

class TestInContext(LearnerContract):
    covers = (InContext,)

    def make_learner(self):
        return icl_learner()


class TestInContextPrototypes(LearnerContract):
    """The prototype head as the read-out (``InContext.head = @PrototypeHead()``)."""
    covers = (InContext, PrototypeHead)

    def make_learner(self):
        return icl_learner(head=PrototypeHead(learn_scale=True))

    def chance_metrics(self, learner, episodes):
        """Class means classify before any training (as ProtoNets do): at chance only
        when the support set carries no information."""
        return learner.meta_metrics(uninformative_support(episodes))


class TestInContextRegression(RegressionContract):
    covers = (InContext,)

    def make_learner(self):
        return icl_learner(ways=None, targets=1)


# --- structure: order, independence, the mask -------------------------------------------

def test_adapt_returns_the_weights_and_the_embedded_support_set():
    learner = icl_learner(dtype="float64")
    task = task64()
    start = learner.initial_weights()
    adapted = learner.adapt(task.support_x, task.support_y, weights=start)
    for path, value in start.items():
        assert adapted.weights[path] is value  # no weight changes: no inner loop
    assert sorted(adapted.weights) == sorted(start)  # the context is not a weight
    support = task.support_x.shape[0]
    context = adapted.state[CONTEXT]
    assert context["embeddings"].shape == (support, 8)
    np.testing.assert_allclose(context["embeddings"],
                               learner.model(task.support_x), rtol=1e-12)
    np.testing.assert_array_equal(context["labels"],
                                  np.eye(WAYS + 1)[task.support_y.numpy()])
    assert learner.predict(adapted, task.query_x).shape == (task.query_x.shape[0], WAYS)


def test_support_order_does_not_matter():
    learner = icl_learner(dtype="float64")
    task = task64(shots=3)
    order = np.random.default_rng(0).permutation(task.support_x.shape[0])
    one = learner.predict(learner.adapt(task.support_x, task.support_y), task.query_x)
    other = learner.predict(learner.adapt(tf.gather(task.support_x, order),
                                          tf.gather(task.support_y, order)), task.query_x)
    np.testing.assert_allclose(one, other, rtol=1e-12, atol=1e-12)
    relabelled = learner.predict(learner.adapt(task.support_x, (task.support_y + 1) % WAYS),
                                 task.query_x)
    assert np.max(np.abs(relabelled - one)) > 1e-3  # the labels are read


def test_queries_are_independent_of_each_other():
    """Changing one query changes its prediction only; predicting the queries one at a
    time gives what predicting them together does."""
    learner = icl_learner(dtype="float64")
    task = task64()
    adapted = learner.adapt(task.support_x, task.support_y)
    together = learner.predict(adapted, task.query_x).numpy()
    changed = tf.tensor_scatter_nd_update(task.query_x, [[0]], [10.0 * tf.ones(DIM, tf.float64)])
    after = learner.predict(adapted, changed).numpy()
    np.testing.assert_allclose(after[1:], together[1:], rtol=1e-12, atol=1e-12)
    assert np.max(np.abs(after[0] - together[0])) > 1e-3
    alone = np.concatenate([learner.predict(adapted, task.query_x[i:i + 1])
                            for i in range(task.query_x.shape[0])])
    np.testing.assert_allclose(alone, together, rtol=1e-12, atol=1e-12)


def test_attention_mask_is_the_hand_written_one():
    got = attention_mask(tf.constant([True, True, False]), 2).numpy()
    expected = np.array([  # columns: support 0, 1, padding, query 0, 1
        [1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 1, 0, 0, 1]], bool)
    np.testing.assert_array_equal(got, expected)


def _layer_norm(x, gamma, beta, epsilon=1e-3):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * gamma + beta


def _softmax(a, mask):
    a = np.where(mask, a, -np.inf)
    a = a - a.max(-1, keepdims=True)
    return np.exp(a) / np.exp(a).sum(-1, keepdims=True)


def test_sequence_model_matches_a_numpy_reference():
    """The logits of a tiny model (one block, two heads, random weights everywhere),
    written out in numpy with the mask built by hand: support rows see the support set,
    each query row the support set and itself."""
    # tanh in the MLP: TensorFlow's float64 erf (GELU) is itself only good to ~1e-9
    learner = icl_learner(embedding=5, width=4, depth=1, dtype="float64", activation="tanh")
    adapter = learner.adapter
    rng = np.random.default_rng(1)
    for variable in adapter.transformer.trainable_variables:
        variable.assign(rng.normal(size=variable.shape))
    task = task64()
    got = learner.predict(learner.adapt(task.support_x, task.support_y), task.query_x).numpy()

    w = {v.path.replace("in_context_", ""): v.numpy()
         for v in adapter.transformer.trainable_variables}
    support, queries = learner.model(task.support_x).numpy(), learner.model(task.query_x).numpy()
    m, n = len(support), len(queries)
    labels = np.zeros((m + n, WAYS + 1))
    labels[np.arange(m), task.support_y.numpy()] = 1.0
    labels[m:, WAYS] = 1.0                                          # "unknown label"
    h = np.concatenate([support, queries]) @ w["embed/kernel"] + w["embed/bias"] + \
        labels @ w["label_embedding/kernel"]
    mask = np.zeros((m + n, m + n), bool)
    mask[:, :m] = True
    mask[m:, m:] = np.eye(n, dtype=bool)
    a = _layer_norm(h, w["block0_attention_norm/gamma"], w["block0_attention_norm/beta"])
    q = np.einsum("td,dhk->thk", a, w["block0_attention/query/kernel"]) + \
        w["block0_attention/query/bias"]
    k = np.einsum("td,dhk->thk", a, w["block0_attention/key/kernel"]) + \
        w["block0_attention/key/bias"]
    v = np.einsum("td,dhk->thk", a, w["block0_attention/value/kernel"]) + \
        w["block0_attention/value/bias"]
    # Keras rounds the 1 / sqrt(key size) factor to float32 (a Python float cast by tf)
    scores = np.einsum("thk,shk->hts", q, k) * np.float32(1 / math.sqrt(q.shape[-1]))
    heads = np.einsum("hts,shk->thk", _softmax(scores, mask[None]), v)
    h = h + np.einsum("thk,hko->to", heads, w["block0_attention/attention_output/kernel"]) + \
        w["block0_attention/attention_output/bias"]
    f = _layer_norm(h, w["block0_mlp_norm/gamma"], w["block0_mlp_norm/beta"])
    f = f @ w["block0_mlp_hidden/kernel"] + w["block0_mlp_hidden/bias"]
    f = np.tanh(f)
    h = h + f @ w["block0_mlp_output/kernel"] + w["block0_mlp_output/bias"]
    h = _layer_norm(h, w["final_norm/gamma"], w["final_norm/beta"])
    expected = (h @ w["readout/kernel"] + w["readout/bias"])[m:]
    assert got.shape == (n, WAYS)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


# --- gradients ----------------------------------------------------------------------------

def test_meta_gradient_matches_finite_differences():
    learner = icl_learner(embedding=3, width=4, depth=1, dtype="float64")
    episodes = synthetic_classification(2, tasks=2, dtype=tf.float64)
    gradient = assert_meta_gradient_matches_finite_differences(learner, episodes)
    # the embedding (the model) and every part of the transformer get a gradient
    assert all(np.any(g != 0) for g in gradient.values()), \
        [k for k, g in gradient.items() if not np.any(g)]


def test_gaussian_meta_gradient_matches_finite_differences():
    learner = icl_learner(ways=None, targets=1, output="gaussian", embedding=3, width=4,
                          depth=1, dtype="float64")
    episodes = synthetic_regression(3, tasks=2, dtype=tf.float64)
    assert_meta_gradient_matches_finite_differences(learner, episodes)
    task = episodes.task(0)
    prediction = learner.predict(learner.adapt(task.support_x, task.support_y), task.query_x)
    assert isinstance(prediction, Gaussian) and np.all(prediction.scale.numpy() > 0)


def test_prototype_head_meta_gradient_matches_finite_differences():
    learner = icl_learner(embedding=3, width=4, depth=1, dtype="float64",
                          head=PrototypeHead(learn_scale=True, scale=0.5))
    episodes = synthetic_classification(4, tasks=2, dtype=tf.float64)
    gradient = assert_meta_gradient_matches_finite_differences(learner, episodes)
    assert any(path.endswith("scale") for path in gradient)  # the head's own variable
    assert all(np.any(g != 0) for g in gradient.values()), \
        [k for k, g in gradient.items() if not np.any(g)]


# --- a head as the read-out ---------------------------------------------------------------

def test_prototype_read_out_is_protonets_on_the_transformed_tokens():
    """With ``head=PrototypeHead()`` the logits are minus the squared distances of each
    query token's output to the class means of the support tokens' outputs (the
    transformer, which has no Dense read-out then, run by hand on the sequence)."""
    learner = icl_learner(dtype="float64", head=PrototypeHead())
    adapter = learner.adapter
    assert not [v for v in adapter.transformer.trainable_variables if "readout" in v.path]
    task = task64(shots=2)
    got = learner.predict(learner.adapt(task.support_x, task.support_y), task.query_x).numpy()
    support, queries = learner.model(task.support_x), learner.model(task.query_x)
    m, n = support.shape[0], queries.shape[0]
    labels = np.zeros((m + n, WAYS + 1))
    labels[np.arange(m), task.support_y.numpy()] = 1.0
    labels[m:, WAYS] = 1.0
    outputs = adapter.transformer([tf.concat([support, queries], 0)[None],
                                   tf.constant(labels[None]),
                                   attention_mask(tf.ones([m], tf.bool), n)[None]])[0].numpy()
    prototypes = np.stack([outputs[:m][task.support_y.numpy() == k].mean(0)
                           for k in range(WAYS)])
    expected = -((outputs[m:, None, :] - prototypes[None]) ** 2).sum(-1)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)
    order = np.random.default_rng(0).permutation(m)  # still order-invariant
    shuffled = learner.predict(learner.adapt(tf.gather(task.support_x, order),
                                             tf.gather(task.support_y, order)), task.query_x)
    np.testing.assert_allclose(shuffled, got, rtol=1e-10, atol=1e-10)


def test_a_head_read_out_fits_padded_episodes_on_their_real_examples():
    learner = icl_learner(head=PrototypeHead())
    task = synthetic_classification(0, tasks=1).task(0)
    support = task.support_x.shape[0]
    padded = pad_episodes([task], max_support=support + 4, max_query=task.query_x.shape[0],
                          max_ways=WAYS).task(0)
    junk = tf.concat([task.support_x, 100.0 * tf.ones([4, DIM])], axis=0)
    expected = learner.predict(learner.adapt(task.support_x, task.support_y), task.query_x)
    got = learner.predict(learner.adapt(junk, padded.support_y), task.query_x)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_head_read_out_arguments_are_checked():
    with pytest.raises(TypeError, match="head= must be a metalearn.heads.Head, got 'proto'"):
        InContext(ways=5, head="proto")
    with pytest.raises(ValueError, match="classifies with the head: give ways=, not targets=1"):
        InContext(targets=1, head=PrototypeHead())
    learner = icl_learner(head=RidgeHead())  # any head of metalearn.heads
    task = synthetic_classification(0, tasks=1).task(0)
    logits = learner.predict(learner.adapt(task.support_x, task.support_y), task.query_x)
    assert logits.shape == (task.query_x.shape[0], WAYS)


# --- CAML's setting: a frozen pre-trained embedding -----------------------------------------

def test_a_frozen_warm_started_embedding_does_not_move(tmp_path):
    """A conv embedding started from a Prototypical Networks checkpoint
    (``WarmStart``) and frozen (``models.frozen``, its head excluded): its weights and
    BatchNorm statistics are no meta-variables and stay the checkpoint's through
    meta-steps, while the head and the transformer train."""
    from metalearn.training import WarmStart
    conv = lambda: models.conv_net((8, 8, 1), outputs=8, filters=4, blocks=2,
                                   dtype="float64")
    keras.utils.set_random_seed(1)
    protonets = metalearn.PrototypicalNetworks(conv(), ways=WAYS, drop_head="head")
    for variable in protonets.model.variables:  # "pre-trained": not a fresh start
        variable.assign(variable + 0.25)
    saved = {v.path: v.numpy() for v in protonets.model.variables}
    source = tf.train.Checkpoint(learner=protonets).write(str(tmp_path / "protonets"))

    keras.utils.set_random_seed(0)
    embedding = models.frozen(conv(), exclude=("head",))
    learner = metalearn.Learner(embedding, InContext(ways=WAYS, width=8, depth=1),
                                loss=softmax_cross_entropy, query_training=True)
    assert sorted(WarmStart(source, exclude=("head",))(learner)) == sorted(saved)
    meta = {v.path for v in learner.meta_variables}
    assert not meta & set(saved)
    assert {"conv_net/head/kernel", "conv_net/head/bias"} <= meta
    head = embedding.get_layer("head").kernel.numpy().copy()
    transformer = {v.path: v.numpy().copy()
                   for v in learner.adapter.transformer.trainable_variables}
    step = metalearn.training.make_meta_step(
        learner, metalearn.MetaGradient(keras.optimizers.Adam(0.01)))
    for seed in range(2):
        step(image_episodes(tasks=2, ways=WAYS, seed=seed))
    for variable in embedding.variables:
        if variable.path in saved:  # kernels, biases, BatchNorm's moving statistics
            np.testing.assert_array_equal(variable.numpy(), saved[variable.path])
    assert np.max(np.abs(embedding.get_layer("head").kernel.numpy() - head)) > 1e-4
    moved = {v.path for v in learner.adapter.transformer.trainable_variables
             if np.max(np.abs(v.numpy() - transformer[v.path])) > 1e-6}
    assert {"in_context_embed/kernel", "in_context_readout/kernel"} <= moved, moved
    with pytest.raises(ValueError, match="select no layer with weights.*'conv0'"):
        models.frozen(conv(), layers=("nothing",))


# --- padding, learning ----------------------------------------------------------------------

def test_padding_is_left_out_of_the_context():
    """A padded support set (MaskedLabels, junk inputs) gives the unpadded predictions."""
    learner = icl_learner()
    episodes = synthetic_classification(0, tasks=1)
    task = episodes.task(0)
    support, queries = task.support_x.shape[0], task.query_x.shape[0]
    padded = pad_episodes([task], max_support=support + 4, max_query=queries,
                          max_ways=WAYS).task(0)
    junk = tf.concat([task.support_x, 100.0 * tf.ones([4, DIM])], axis=0)
    expected = learner.predict(learner.adapt(task.support_x, task.support_y), task.query_x)
    got = learner.predict(learner.adapt(junk, padded.support_y), task.query_x)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        learner.meta_metrics(episodes)["loss"],
        learner.meta_metrics(pad_episodes([task], support + 4, queries + 2, WAYS))["loss"],
        rtol=1e-5)
    with pytest.raises(ValueError, match="built for 3 ways.*up to 5 ways"):
        learner.meta_metrics(pad_episodes([task], support, queries, WAYS + 2))


def test_over_a_batch_norm_conv_net_with_padded_episodes():
    """Over models.conv_net (BatchNorm on batch statistics): the padding stays out of
    the support set's statistics as well as out of the attention, and the meta-gradient
    of a padded batch is the unpadded one's."""
    keras.utils.set_random_seed(0)
    model = models.conv_net((8, 8, 1), outputs=8, filters=4, blocks=2, dtype="float64")
    learner = metalearn.Learner(model, InContext(ways=WAYS, width=8, depth=1),
                                loss=softmax_cross_entropy, query_training=True)
    episodes = image_episodes(tasks=2, ways=WAYS)
    task = episodes.task(0)
    padded = pad_episodes([episodes.task(t) for t in range(2)], max_support=WAYS + 2,
                          max_query=WAYS, max_ways=WAYS)
    junk = padded.task(0)._replace(support_x=tf.concat(
        [task.support_x, 50.0 * tf.ones([2, 8, 8, 1], tf.float64)], axis=0))
    expected = learner.predict(learner.adapt(task.support_x, task.support_y), task.query_x)
    got = learner.predict(learner.adapt(junk.support_x, junk.support_y), task.query_x)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    unpadded, with_padding = (analytic_meta_gradient(learner, e) for e in (episodes, padded))
    for path, value in unpadded.items():
        np.testing.assert_allclose(with_padding[path], value, rtol=1e-9, atol=1e-12)


def test_learns_few_way_tasks_in_a_few_seconds():
    learner = icl_learner(width=16)
    held_out = synthetic_classification(999, tasks=50)
    # compiled once (it reads the variables as they are at each call): eagerly, the 50
    # tasks cost more than the training
    accuracy = tf.function(lambda episodes: learner.meta_metrics(episodes)["accuracy"])
    before = accuracy(held_out).numpy().mean()
    step = metalearn.training.make_meta_step(
        learner, metalearn.MetaGradient(keras.optimizers.Adam(0.01)))
    for seed in range(90):  # held-out accuracy 0.84 after 70 steps, 0.88 after 90
        step(synthetic_classification(10 + seed, tasks=8))
    after = accuracy(held_out).numpy().mean()
    assert before < 0.5 and after > 0.8, (before, after)


# --- bad input -----------------------------------------------------------------------------

def test_steps_are_an_error():
    learner = icl_learner()
    task = synthetic_classification(0, tasks=1).task(0)
    with pytest.raises(ValueError, match="takes no inner steps.*steps=2"):
        learner.adapt(task.support_x, task.support_y, steps=2)


def test_labels_out_of_range_are_an_error():
    learner = icl_learner()
    task = synthetic_classification(0, tasks=1).task(0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="labels must be in 0 .. 2"):
        learner.adapt(task.support_x, task.support_y + 1)
    with pytest.raises(TypeError, match="must be integers, got float32"):
        learner.adapt(task.support_x, tf.cast(task.support_y, tf.float32))


def test_an_episode_of_more_ways_than_built_for_is_an_error():
    """Unpadded 5-way episodes for an adapter built for 3 ways name both counts (padded
    ones: test_padding_is_left_out_of_the_context)."""
    learner = icl_learner()
    episodes = synthetic_classification(0, tasks=2, ways=WAYS + 2)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"InContext \(built for 3 ways\): support labels must be in "
                             r"0 .. 2 \(num_classes=3\)"):
        learner.meta_metrics(episodes)


@pytest.mark.parametrize("ways", [5, 20])
def test_the_omniglot_files_build_the_adapter_for_their_ways(ways):
    """experiments/omniglot/minimal/in_context_{5,20}way_1shot.gin: the read-out has as
    many logits as the sampler has ways (the data set is not loaded to build)."""
    import gin
    from metalearn.training import build_experiment, parse_config
    parse_config([f"experiments/omniglot/minimal/in_context_{ways}way_1shot.gin"],
                 ["Loop.num_steps = 1"])
    try:
        experiment = build_experiment()
    finally:
        gin.clear_config()
    adapter = experiment.learner.adapter
    assert experiment.sampler.ways == (ways,) and adapter.ways == ways
    assert adapter.transformer.output.shape[-1] == ways


def test_constructor_arguments_are_checked():
    with pytest.raises(ValueError, match="exactly one; got ways=None, targets=None"):
        InContext()
    with pytest.raises(ValueError, match="exactly one; got ways=5, targets=1"):
        InContext(ways=5, targets=1)
    with pytest.raises(ValueError, match="give targets=, not ways=5"):
        InContext(ways=5, output="gaussian")
    with pytest.raises(ValueError, match="output must be one of.*'logits'"):
        InContext(ways=5, output="logits")
    with pytest.raises(ValueError, match="heads"):
        InContext(ways=5, heads=0)
    with pytest.raises(ValueError, match="gelux"):
        InContext(ways=5, activation="gelux")


def test_a_learner_without_a_split_support_loss_is_an_error():
    class Custom(metalearn.Learner):
        def support_loss(self, weights, x, y):
            return super().support_loss(weights, x, y)

    keras.utils.set_random_seed(0)
    learner = Custom(models.mlp((DIM,), hidden=(8,), outputs=4), InContext(ways=WAYS),
                     loss=softmax_cross_entropy)
    task = synthetic_classification(0, tasks=1).task(0)
    with pytest.raises(ValueError, match="overrides support_loss"):
        learner.adapt(task.support_x, task.support_y)


# --- the random task priors ------------------------------------------------------------

@pytest.mark.parametrize("sampler", [RandomMLPFunctions(shots=4, queries=6),
                                     RandomLinearClassification(ways=4, shots=2, queries=3,
                                                                dim=6)],
                         ids=["mlp", "linear"])
def test_random_priors_are_seeded_and_stateless(sampler):
    assert_sampler_is_seeded_and_stateless(sampler)


def test_random_linear_classification_labels_are_the_classifiers_cells():
    sampler = RandomLinearClassification(ways=5, shots=2, queries=3, dim=8, margin=0.1,
                                         dtype="float64")
    seed = tf.constant([1, 2], tf.int64)
    episodes = sampler.sample(seed, 4)
    assert episodes.support_x.shape == (4, 10, 8) and episodes.query_y.shape == (4, 15)
    np.testing.assert_array_equal(episodes.support_y[0], np.repeat(np.arange(5), 2))
    w, b = (t.numpy() for t in sampler.classifier(seed, 4))
    for x, y in ((episodes.support_x, episodes.support_y),
                 (episodes.query_x, episodes.query_y)):
        scores = np.einsum("tnd,tdk->tnk", x.numpy(), w) + b[:, None]
        np.testing.assert_array_equal(scores.argmax(-1), y)       # exactly linear
        ordered = np.sort(scores, -1)
        assert (ordered[..., -1] - ordered[..., -2]).min() > 0.1 - 1e-9  # the margin


def test_random_mlp_functions_without_hidden_layers_are_linear():
    sampler = RandomMLPFunctions(shots=5, queries=5, inputs=2, hidden=(), dtype="float64")
    episodes = sampler.sample(tf.constant([0, 1], tf.int64), 3)
    for t in range(3):
        x = np.concatenate([episodes.support_x[t], episodes.query_x[t]])
        y = np.concatenate([episodes.support_y[t], episodes.query_y[t]])
        coefficients, *_ = np.linalg.lstsq(x, y, rcond=None)
        np.testing.assert_allclose(x @ coefficients, y, atol=1e-12)
    curved = RandomMLPFunctions(shots=20, inputs=2, dtype="float64").sample(
        tf.constant([0, 1], tf.int64), 1)
    x, y = curved.support_x[0].numpy(), curved.support_y[0].numpy()
    design = np.concatenate([x, np.ones_like(x[:, :1])], -1)
    residual = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
    assert np.abs(residual).max() > 1e-3  # the hidden layers make it non-linear


def test_random_prior_arguments_are_checked():
    with pytest.raises(ValueError, match="needs dim >= ways, got dim=3, ways=5"):
        RandomLinearClassification(ways=5, dim=3)
    with pytest.raises(ValueError, match="margin and bias_scale must be >= 0.*margin=-1"):
        RandomLinearClassification(margin=-1)
    with pytest.raises(ValueError, match="output_scale must be > 0.*output_scale=0"):
        RandomMLPFunctions(output_scale=0)
    with pytest.raises(ValueError, match="hidden must be >= 1, got 0"):
        RandomMLPFunctions(hidden=(0,))
