"""Hypernetwork adapter: generated weights, purity, meta-gradients against finite differences."""

import glob
import os
import re
import runpy

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.adapters import GradientDescent, Hypernetwork
from metalearn.tasks import Episode
from metalearn.training import build_experiment, parse_config, train
from metalearn.testing import finite_difference_gradient, relative_error
from metalearn.repository import ROOT

WAYS, SHOTS, DIM = 3, 2, 4


@pytest.fixture(autouse=True)
def no_gin_bindings():
    """Tests build by hand: no binding of a gin test may leak into another."""
    gin.clear_config()
    yield
    gin.clear_config()


def xent(y, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        tf.cast(tf.reshape(y, [-1]), tf.int32), logits))


def mse(y, p):
    return tf.reduce_mean(tf.square(y - p))


def _classification_episodes(tasks=2, seed=0, dim=DIM):
    keys = tf.random.experimental.stateless_split([seed, 3], 2)
    labels = tf.tile(tf.repeat(tf.range(WAYS), SHOTS)[None], [tasks, 1])  # [tasks, 6]
    x = lambda k: tf.random.stateless_normal([tasks, WAYS * SHOTS, dim], k, dtype=tf.float64)
    return Episode(x(keys[0]), labels, x(keys[1]), labels)


def _dense(inputs, units, name, activation=None):
    return keras.Sequential([keras.Input((inputs,), dtype="float64"),
                             keras.layers.Dense(units, activation=activation,
                                                dtype="float64", name="dense")], name=name)


def _support_learner(mode="replace", then=None, encoder=True, batchnorm=False):
    """An MLP 4-3-3 whose head (12 values) is generated from per-class mean features."""
    keras.utils.set_random_seed(0)
    model = models.mlp((DIM,), hidden=(3,), outputs=WAYS, activation="tanh",
                       dtype="float64")
    if batchnorm:
        enc = keras.Sequential([keras.Input((DIM,), dtype="float64"),
                                keras.layers.Dense(2, dtype="float64", name="dense"),
                                keras.layers.BatchNormalization(dtype="float64", name="bn")],
                               name="encoder")
    else:
        enc = _dense(DIM, 2, "encoder", "tanh") if encoder else None
    features = 2 if encoder else DIM
    generator = _dense(WAYS * features, 3 * WAYS + WAYS, "generator")
    adapter = Hypernetwork(generator, encoder=enc, generate=("head",), mode=mode, then=then)
    return metalearn.Learner(model, adapter=adapter, loss=xent)


def _input_learner(mode="replace", then=None):
    """The crash-course set-up in miniature: Linear(3 * 2 + 2) generates Linear(2)."""
    keras.utils.set_random_seed(1)
    model = models.linear((3,), 2, dtype="float64")
    generator = models.linear((3,), 3 * 2 + 2, dtype="float64", name="generator")
    adapter = Hypernetwork(generator, condition="input", mode=mode, then=then)
    return metalearn.Learner(model, adapter=adapter, loss=xent)


def _input_episodes(tasks=2, seed=0):
    keys = tf.random.experimental.stateless_split([seed, 4], 4)
    x = lambda k: tf.random.stateless_normal([tasks, 4, 3], k, dtype=tf.float64)
    y = lambda k: tf.random.stateless_uniform([tasks, 4], k, maxval=2, dtype=tf.int32)
    return Episode(x(keys[0]), y(keys[1]), x(keys[2]), y(keys[3]))


def _meta_gradients(learner, episodes):
    variables = learner.meta_variables
    with tf.GradientTape() as tape:
        loss = learner.meta_loss(episodes)
    grads = tape.gradient(loss, variables)
    return {v.path: g for v, g in zip(variables, grads)}


def _check_against_finite_differences(learner, episodes):
    analytic = {k: g.numpy() for k, g in _meta_gradients(learner, episodes).items()}
    variables = learner.meta_variables
    values = {v.path: v.numpy() for v in variables}

    def meta_loss_at(point):
        for v in variables:
            v.assign(point[v.path])
        return learner.meta_loss(episodes)

    numeric = finite_difference_gradient(meta_loss_at, values)
    for v in variables:
        v.assign(values[v.path])
    assert relative_error(analytic, numeric) < 1e-6


# --- generated weights ---------------------------------------------------------------

def test_generated_head_by_hand_and_other_weights_untouched():
    learner = _support_learner()
    adapter = learner.adapter
    episode = _classification_episodes().task(0)
    start = learner.initial_weights()
    fast = learner.adapt(episode.support_x, episode.support_y).weights
    assert sorted(fast) == sorted(start)
    for path in start:
        assert fast[path].shape == start[path].shape, path
        if "head" not in path:
            np.testing.assert_array_equal(fast[path], start[path])
    # By hand: encoder, per-class means in label order, generator, split in path order.
    enc_w, enc_b = (v.numpy() for v in adapter.encoder.trainable_variables)
    gen_w, gen_b = (v.numpy() for v in adapter.generator.trainable_variables)
    features = np.tanh(episode.support_x.numpy() @ enc_w + enc_b)
    labels = episode.support_y.numpy()
    embedding = np.concatenate([features[labels == c].mean(0) for c in range(WAYS)])
    flat = embedding @ gen_w + gen_b
    np.testing.assert_allclose(fast["mlp/head/kernel"], flat[:9].reshape(3, 3), rtol=1e-12)
    np.testing.assert_allclose(fast["mlp/head/bias"], flat[9:], rtol=1e-12)


def test_per_input_forward_equals_crash_course_tape_version():
    learner = _input_learner()
    x = _input_episodes().query_x[0]                       # [4, 3]
    gen_w, gen_b = learner.adapter.generator.trainable_variables
    expected = []
    for i in range(4):  # the crash course: weights_pred = inner(x); reshape; outer(x)
        weights_pred = x[i:i + 1] @ gen_w + gen_b
        w = tf.reshape(weights_pred[:, :6], (3, 2))
        b = tf.reshape(weights_pred[:, 6:], (2,))
        expected.append((x[i:i + 1] @ w + b)[0])
    fast = learner.adapt(x[:0], tf.zeros([0], tf.int32))
    np.testing.assert_allclose(learner.predict(fast, x), tf.stack(expected), rtol=1e-12)
    assert [v.path for v in learner.meta_variables] == ["generator/dense/kernel",
                                                        "generator/dense/bias"]


def test_residual_adds_to_the_meta_learned_weights():
    replaced, residual = _support_learner("replace"), _support_learner("residual")
    episode = _classification_episodes().task(0)
    a = replaced.adapt(episode.support_x, episode.support_y).weights
    b = residual.adapt(episode.support_x, episode.support_y).weights
    start = residual.initial_weights()
    for path in ("mlp/head/kernel", "mlp/head/bias"):
        np.testing.assert_allclose(b[path], start[path] + a[path], rtol=1e-12)
    # Residual targets stay meta-learned; replaced ones are not meta-variables at all.
    paths = lambda learner: [v.path for v in learner.meta_variables]
    assert "mlp/head/kernel" in paths(residual)
    assert "mlp/head/kernel" not in paths(replaced)
    assert paths(replaced) == ["mlp/hidden0/kernel", "mlp/hidden0/bias", "encoder/dense/kernel",
                               "encoder/dense/bias", "generator/dense/kernel",
                               "generator/dense/bias"]


def test_permuting_the_support_set_keeps_the_generated_weights():
    learner = _support_learner()
    episode = _classification_episodes().task(0)
    fast = learner.adapt(episode.support_x, episode.support_y).weights
    order = np.random.default_rng(0).permutation(WAYS * SHOTS)
    permuted = learner.adapt(tf.gather(episode.support_x, order),
                             tf.gather(episode.support_y, order)).weights
    for path in fast:
        np.testing.assert_allclose(permuted[path], fast[path], rtol=1e-12, atol=1e-15)
    # Relabelling the classes is not a permutation of examples: the head changes.
    relabelled = learner.adapt(episode.support_x, (episode.support_y + 1) % WAYS).weights
    assert not np.allclose(relabelled["mlp/head/kernel"], fast["mlp/head/kernel"])


def test_regression_mean_pooling_sees_the_targets():
    keras.utils.set_random_seed(0)
    model = models.mlp((1,), hidden=(4,), outputs=1, dtype="float64")
    generator = _dense(3, 5, "generator")  # head kernel (4, 1) + bias (1,)
    learner = metalearn.Learner(model, Hypernetwork(
        generator, encoder=_dense(2, 3, "encoder", "tanh"), generate=("head",),
        pooling="mean"), loss=mse)
    x = tf.random.stateless_normal([5, 1], [0, 0], dtype=tf.float64)
    fast = learner.adapt(x, tf.sin(x)).weights
    other = learner.adapt(x, tf.cos(x)).weights
    assert fast["mlp/head/kernel"].shape == (4, 1)
    assert not np.allclose(fast["mlp/head/kernel"], other["mlp/head/kernel"])
    order = [4, 2, 0, 1, 3]
    np.testing.assert_allclose(learner.adapt(tf.gather(x, order), tf.sin(tf.gather(x, order))).weights
                               ["mlp/head/kernel"], fast["mlp/head/kernel"], rtol=1e-12)


# --- gradients and purity ------------------------------------------------------------

@pytest.mark.parametrize("condition", ["support", "input"])
def test_gradients_reach_generator_and_encoder_not_the_replaced_variables(condition):
    if condition == "support":
        learner, episodes = _support_learner(), _classification_episodes()
    else:
        learner, episodes = _input_learner(), _input_episodes()
    adapter = learner.adapter
    generated = set(adapter.task_paths(learner.initial_weights()))
    model_vars = learner.model.trainable_variables
    with tf.GradientTape() as tape:
        loss = learner.meta_loss(episodes)
    all_vars = model_vars + adapter.meta_variables
    grads = dict(zip([v.path for v in all_vars], tape.gradient(loss, all_vars)))
    assert generated and all(grads[p] is None or not np.any(grads[p]) for p in generated)
    for variable in adapter.meta_variables:  # the generator's and encoder's
        assert grads[variable.path] is not None and np.any(grads[variable.path])
    if condition == "support":
        assert any(v.path.startswith("encoder/") for v in adapter.meta_variables)


def test_variables_bit_identical_after_adaptation():
    learner = _support_learner(then=GradientDescent(steps=2, learning_rate=0.3),
                               batchnorm=True)
    episodes = _classification_episodes()
    everything = learner.model.variables + learner.adapter.encoder.variables + \
        learner.adapter.generator.variables
    assert any("moving_mean" in v.path for v in everything)
    before = [v.numpy().copy() for v in everything]
    learner.adapt(episodes.support_x[0], episodes.support_y[0])
    learner.meta_loss(episodes)
    tf.function(learner.meta_loss)(episodes)
    for old, variable in zip(before, everything):
        assert old.tobytes() == variable.numpy().tobytes(), variable.path


def test_meta_step_trains_the_generator_never_the_replaced_weights():
    learner = _input_learner()
    outer_rule = metalearn.MetaGradient(keras.optimizers.SGD(0.1))
    step = metalearn.training.make_meta_step(learner, outer_rule)
    model_before = [v.numpy().copy() for v in learner.model.variables]
    generator_before = [v.numpy().copy() for v in learner.adapter.generator.variables]
    for _ in range(3):
        step(_input_episodes())
    for old, variable in zip(model_before, learner.model.variables):
        assert old.tobytes() == variable.numpy().tobytes(), variable.path
    assert all(not np.array_equal(old, v.numpy())
               for old, v in zip(generator_before, learner.adapter.generator.variables))


@pytest.mark.parametrize("case", ["support", "support_residual", "support_then_steps",
                                  "batchnorm_encoder", "input_residual_then_steps"])
def test_meta_gradient_equals_finite_differences(case):
    then = GradientDescent(steps=2, learning_rate=0.3) if "then" in case else None
    if case.startswith("input"):
        learner, episodes = _input_learner("residual", then), _input_episodes()
    else:
        learner = _support_learner("residual" if "residual" in case else "replace", then,
                                   batchnorm=case == "batchnorm_encoder")
        episodes = _classification_episodes()
    _check_against_finite_differences(learner, episodes)


def test_composed_steps_start_from_the_generated_weights():
    steps = GradientDescent(steps=1, learning_rate=0.3)
    learner = _support_learner(then=steps)
    plain = _support_learner()
    episode = _classification_episodes().task(0)
    generated = plain.adapt(episode.support_x, episode.support_y).weights
    expected = steps.adapt(generated, episode.support_x, episode.support_y,
                           plain.support_loss)
    fast = learner.adapt(episode.support_x, episode.support_y).weights
    for path in expected:
        np.testing.assert_allclose(fast[path], expected[path], rtol=1e-12)
    assert not np.allclose(fast["mlp/head/kernel"], generated["mlp/head/kernel"])
    assert learner.adapter.steps == 1
    zero = learner.adapt(episode.support_x, episode.support_y, steps=0).weights
    np.testing.assert_allclose(zero["mlp/head/kernel"], generated["mlp/head/kernel"])


def test_checkpoint_saves_and_restores_the_generator(tmp_path):
    learner = _support_learner()
    saved = [v.numpy().copy() for v in learner.adapter.meta_variables]
    path = tf.train.Checkpoint(learner=learner).save(str(tmp_path / "ckpt"))
    for v in learner.adapter.meta_variables:
        v.assign(tf.zeros_like(v))
    tf.train.Checkpoint(learner=learner).restore(path).assert_existing_objects_matched()
    for old, v in zip(saved, learner.adapter.meta_variables):
        np.testing.assert_array_equal(old, v.numpy())


def test_unbuilt_generator_and_encoder_are_built_by_build():
    model = models.mlp((DIM,), hidden=(3,), outputs=WAYS, dtype="float64")
    generator = keras.Sequential([keras.layers.Dense(12, dtype="float64")], name="g")
    encoder = keras.Sequential([keras.layers.Dense(2, dtype="float64")], name="e")
    learner = metalearn.Learner(model, Hypernetwork(generator, encoder=encoder,
                                                    generate=("head",)), loss=xent)
    assert generator.built and encoder.built
    assert generator.trainable_variables[0].shape == (WAYS * 2, 12)
    assert len(learner.meta_variables) == 2 + 4


# --- errors ----------------------------------------------------------------------------

def test_size_mismatch_lists_expected_shapes_and_sizes():
    model = models.mlp((DIM,), hidden=(3,), outputs=WAYS, dtype="float64")
    with pytest.raises(ValueError) as error:
        metalearn.Learner(model, Hypernetwork(_dense(WAYS * DIM, 10, "g"), generate=("head",)),
                          loss=xent)
    message = str(error.value)
    for part in ("outputs 10 values per example", "need 12",
                 "'mlp/head/kernel' shape (3, 3) = 9", "'mlp/head/bias' shape (3,) = 3"):
        assert part in message, message


def test_bad_arguments_are_named():
    model = models.mlp((DIM,), hidden=(3,), outputs=WAYS, dtype="float64")
    generator = _dense(WAYS * DIM, 12, "g")
    with pytest.raises(ValueError, match="generate=.*'nope'.* matches none"):
        metalearn.Learner(model, Hypernetwork(generator, generate=("nope",)), loss=xent)
    with pytest.raises(ValueError, match="condition must be one of .* got 'task'"):
        Hypernetwork(generator, condition="task")
    with pytest.raises(ValueError, match="mode must be one of .* got 'add'"):
        Hypernetwork(generator, mode="add")
    with pytest.raises(TypeError, match="generator must be a keras.Model"):
        Hypernetwork(lambda x: x)
    learner = metalearn.Learner(model, Hypernetwork(generator, generate=("head",)), loss=xent)
    episode = _classification_episodes().task(0)
    with pytest.raises(ValueError, match="takes no inner steps, got steps=3"):
        learner.adapt(episode.support_x, episode.support_y, steps=3)


# --- the crash-course experiment and its docs ----------------------------------------

MNIST_GIN = os.path.join(ROOT, "experiments", "mnist", "hypernetwork.gin")


def _logged_losses(workdir):
    events = glob.glob(os.path.join(workdir, "train", "events.out.tfevents.*"))
    losses = {}
    for event in tf.compat.v1.train.summary_iterator(events[0]):
        for value in event.summary.value:
            if value.tag == "meta_loss":
                losses[event.step] = float(tf.make_ndarray(value.tensor))
    return [losses[s] for s in sorted(losses)]


def test_mnist_experiment_logs_the_running_mean(tmp_path, shared_data, monkeypatch):
    monkeypatch.chdir(ROOT)  # the gin file names ../shared/data/mnist
    runs = {}
    for average, log_every in (("window", 1), ("running", 10)):
        parse_config([MNIST_GIN], ["Loop.num_steps = 30",
                                   f"Loop.log_every = {log_every}",
                                   f"Loop.log_average = '{average}'",
                                   f"load_mnist.path = '{shared_data}/mnist'"])
        experiment = build_experiment()
        assert [v.path for v in experiment.learner.meta_variables] == [
            "generator/dense/kernel", "generator/dense/bias"]
        workdir = str(tmp_path / average)
        runs[average] = (train(experiment, workdir), _logged_losses(workdir))
    per_step = runs["window"][1]                    # one loss per step
    assert len(per_step) == 30 and len(set(per_step)) == 30
    running = runs["running"][1]                    # steps 10, 20, 30
    np.testing.assert_allclose(running, [np.mean(per_step[:n]) for n in (10, 20, 30)],
                               rtol=1e-5)
    assert runs["running"][0]["loss"] == pytest.approx(np.mean(per_step), rel=1e-5)
    with pytest.raises(ValueError, match="log_average must be one of .* got 'ema'"):
        metalearn.Experiment(experiment.learner, experiment.sampler,
                             loop=metalearn.training.Loop(log_average="ema"))


def test_docs_examples_run(tmp_path, shared_data, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the examples name ../shared/data/mnist
    with open(os.path.join(ROOT, "docs", "hypernetwork.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(blocks) == 3
    for i, block in enumerate(blocks):
        path = tmp_path / f"block{i}.py"  # a real file, so autograph can read the source
        path.write_text(block)
        keras.utils.set_random_seed(i)
        runpy.run_path(str(path), run_name="__docs__")
        printed = capsys.readouterr().out
        if i < 2:  # the two crash-course versions: running mean every 100 steps falls
            means = [float(m) for m in re.findall(r"Loss: ([0-9.]+)", printed)]
            assert len(means) == 10 and means[1] > means[-1] and means[-1] < 2.5, printed
        else:
            assert printed.strip() == "(5, 5)"
