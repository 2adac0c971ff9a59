"""Neural processes (metalearn.adapters.neural_process), the Gaussian predictive loss
(metalearn.functional.losses) and the Gaussian-process task prior
(metalearn.tasks.gaussian_process): the shipped contracts (regression, with the
Gaussian NLL as the loss; classification, with a logits read-out), regression checks of
their own, support-order invariance, padding, the attention
against a numpy reference, the NLL against the density, meta-gradients against float64
finite differences, and bad input."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.adapters import (AttentiveNeuralProcess, ConditionalNeuralProcess,
                                LatentNeuralProcess)
from metalearn.adapters.neural_process import CONTEXT
from metalearn.learners import LatentNeuralProcessLearner
from metalearn.functional import Gaussian, gaussian_nll, predictive_mse
from metalearn.tasks import Episode, GaussianProcess, Sinusoid, pad_episodes
from metalearn.testing import (DIM, WAYS, LearnerContract, RegressionContract,
                               assert_sampler_is_seeded_and_stateless,
                               assert_meta_gradient_matches_finite_differences,
                               synthetic_classification)
from metalearn.repository import ROOT
from tests.neural_process_fixtures import latent_learner

KINDS = {"cnp": ConditionalNeuralProcess, "anp": AttentiveNeuralProcess}


def np_learner(kind, x_size=1, y_size=1, representation=8, hidden=(16,), output="gaussian",
               dtype=None, heads=2):
    """A small neural process: encoder [x, y] -> r, decoder [x, r] -> 2 y (Gaussian) or
    y (raw logits)."""
    keras.utils.set_random_seed(0)
    encoder = models.mlp((x_size + y_size,), hidden=hidden, outputs=representation,
                         activation="tanh", dtype=dtype, name="encoder")
    outputs = 2 * y_size if output == "gaussian" else y_size
    decoder = models.mlp((x_size + representation,), hidden=hidden, outputs=outputs,
                         activation="tanh", dtype=dtype, name="decoder")
    extra = {"heads": heads} if kind == "anp" else {}
    adapter = KINDS[kind](encoder, output=output, **extra)
    if output == "gaussian":
        return metalearn.Learner(decoder, adapter, loss=gaussian_nll,
                                 metrics={"mse": predictive_mse})
    return metalearn.Learner(decoder, adapter, loss=metalearn.testing.softmax_cross_entropy,
                             metrics={"accuracy": "accuracy"})


def sinusoids(tasks=4, shots=5, seed=0, dtype="float32"):
    return Sinusoid(shots=shots, dtype=dtype).sample(tf.constant([seed, 0], tf.int64), tasks)


# --- the shipped contract, with a classification read-out (logits, one-hot labels) ----

class TestConditionalNeuralProcess(LearnerContract):
    covers = (ConditionalNeuralProcess,)

    def make_learner(self):
        return np_learner("cnp", x_size=DIM, y_size=WAYS, output="raw")


class TestAttentiveNeuralProcess(LearnerContract):
    covers = (AttentiveNeuralProcess,)

    def make_learner(self):
        return np_learner("anp", x_size=DIM, y_size=WAYS, output="raw")


class TestLatentNeuralProcess(LearnerContract):
    """The NP with a latent path; its loss the negative ELBO (cross-entropy here)."""
    covers = (LatentNeuralProcess, LatentNeuralProcessLearner)

    def make_learner(self):
        return latent_learner(x_size=DIM, y_size=WAYS, output="raw")


# --- the shipped regression contract: Gaussian predictions, the NLL as the loss --------

class GaussianRegressionContract(RegressionContract):
    """A fit is shown by the mean's error: the NLL falls below zero at the rate the
    predicted scale shrinks, so a fraction of its first value measures nothing."""
    fit_metric = "mse"


class TestConditionalNeuralProcessRegression(GaussianRegressionContract):
    covers = (ConditionalNeuralProcess,)

    def make_learner(self):
        return np_learner("cnp", x_size=DIM)


class TestAttentiveNeuralProcessRegression(GaussianRegressionContract):
    covers = (AttentiveNeuralProcess,)

    def make_learner(self):
        return np_learner("anp", x_size=DIM)


class TestLatentNeuralProcessRegression(GaussianRegressionContract):
    covers = (LatentNeuralProcess, LatentNeuralProcessLearner)

    def make_learner(self):
        return latent_learner(x_size=DIM)


# --- a regression contract: the Gaussian prediction -------------------------------------

@pytest.mark.parametrize("kind", sorted(KINDS))
class TestRegression:

    def test_predicts_a_gaussian_of_the_targets_shape(self, kind):
        learner = np_learner(kind)
        task = sinusoids().task(0)
        adapted = learner.adapt(task.support_x, task.support_y)
        assert adapted.state[CONTEXT]  # the encoded support set, beside the weights
        start = learner.initial_weights()
        adapted = learner.adapt(task.support_x, task.support_y, weights=start)
        assert sorted(adapted.weights) == sorted(start)
        for path, value in start.items():
            assert adapted.weights[path] is value  # no weight changes: no inner loop
        prediction = learner.predict(adapted, task.query_x)
        assert isinstance(prediction, Gaussian)
        assert prediction.mean.shape == prediction.scale.shape == task.query_y.shape
        assert np.all(prediction.scale.numpy() > 0)
        metrics = learner.meta_metrics(sinusoids())
        assert sorted(metrics) == ["loss", "mse"]

    def test_meta_training_lowers_nll_and_mse_under_tf_function(self, kind):
        learner = np_learner(kind)
        episodes = sinusoids(tasks=8, seed=1)
        before = learner.meta_metrics(episodes)
        compiled = tf.function(lambda e: learner.meta_metrics(e))(episodes)
        for name in before:
            np.testing.assert_allclose(before[name], compiled[name], rtol=1e-5, atol=1e-6)
        step = metalearn.training.make_meta_step(
            learner, metalearn.MetaGradient(keras.optimizers.Adam(0.01)), None)
        for _ in range(40):
            step(episodes)
        assert step.experimental_get_tracing_count() == 1
        after = learner.meta_metrics(episodes)
        assert np.mean(after["loss"]) < np.mean(before["loss"]) - 0.2, (before, after)
        assert np.mean(after["mse"]) < np.mean(before["mse"])

    def test_support_order_does_not_matter(self, kind):
        learner = np_learner(kind)
        task = sinusoids(shots=7).task(0)
        order = np.random.default_rng(0).permutation(7)
        one = learner.predict(learner.adapt(task.support_x, task.support_y), task.query_x)
        other = learner.predict(learner.adapt(tf.gather(task.support_x, order),
                                              tf.gather(task.support_y, order)), task.query_x)
        np.testing.assert_allclose(one.mean, other.mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(one.scale, other.scale, rtol=1e-5, atol=1e-6)

    def test_the_support_set_matters(self, kind):
        learner = np_learner(kind)
        task = sinusoids().task(0)
        one = learner.predict(learner.adapt(task.support_x, task.support_y), task.query_x)
        other = learner.predict(learner.adapt(task.support_x, -task.support_y), task.query_x)
        assert np.max(np.abs(one.mean - other.mean)) > 1e-3

    def test_any_support_size(self, kind):
        learner = np_learner(kind)
        for shots in (1, 3, 20):
            task = sinusoids(shots=shots).task(0)
            prediction = learner.predict(learner.adapt(task.support_x, task.support_y),
                                         task.query_x)
            assert prediction.mean.shape == (shots, 1)

    def test_meta_gradient_matches_finite_differences(self, kind):
        learner = np_learner(kind, representation=4, hidden=(3,), dtype="float64")
        episodes = sinusoids(tasks=2, shots=3, seed=2, dtype="float64")
        gradient = assert_meta_gradient_matches_finite_differences(learner, episodes)
        # every part gets a gradient: the decoder (the model) and the encoder (and the
        # attention), through the query loss
        assert all(np.any(g != 0) for g in gradient.values())


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_padding_is_left_out_of_the_context(kind):
    """A padded support set (MaskedLabels) gives the predictions of the unpadded one."""
    learner = np_learner(kind, x_size=DIM, y_size=WAYS, output="raw")
    episodes = synthetic_classification(0, tasks=1)
    task = episodes.task(0)
    padded = pad_episodes([task], max_support=task.support_x.shape[0] + 4,
                          max_query=task.query_x.shape[0], max_ways=WAYS).task(0)
    padded = padded._replace(support_x=tf.concat(  # junk where the padding is
        [task.support_x, 100.0 * tf.ones([4, DIM])], axis=0))
    expected = learner.predict(learner.adapt(task.support_x, task.support_y), task.query_x)
    got = learner.predict(learner.adapt(padded.support_x, padded.support_y), task.query_x)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(learner.meta_metrics(episodes)["loss"],
                               learner.meta_metrics(pad_episodes(
                                   [task], task.support_x.shape[0] + 4,
                                   task.query_x.shape[0], WAYS))["loss"], rtol=1e-5)


def _softmax(a, axis=-1):
    a = a - a.max(axis=axis, keepdims=True)
    return np.exp(a) / np.exp(a).sum(axis=axis, keepdims=True)


def test_attention_matches_a_numpy_reference():
    """Each query's representation: multi-head scaled dot-product attention over the
    support set, written out in numpy from the layer's weights."""
    learner = np_learner("anp", representation=6, heads=2, dtype="float64")
    adapter = learner.adapter
    task = sinusoids(shots=5, dtype="float64").task(0)
    context = learner.adapt(task.support_x, task.support_y).state[CONTEXT]
    got = adapter.condition(context, task.query_x).numpy()

    w = {v.path.split("/", 1)[1]: v.numpy() for v in adapter.attention.trainable_variables}
    x_query, x_support = task.query_x.numpy(), task.support_x.numpy()
    pairs = np.concatenate([x_support, task.support_y.numpy()], -1)
    hidden = np.tanh(pairs @ adapter.encoder.layers[0].kernel.numpy()
                     + adapter.encoder.layers[0].bias.numpy())
    values = hidden @ adapter.encoder.layers[1].kernel.numpy() + \
        adapter.encoder.layers[1].bias.numpy()                               # [support, r]
    q = np.einsum("nd,dhk->nhk", x_query, w["query/kernel"]) + w["query/bias"]
    k = np.einsum("md,dhk->mhk", x_support, w["key/kernel"]) + w["key/bias"]
    v = np.einsum("md,dhk->mhk", values, w["value/kernel"]) + w["value/bias"]
    # Keras rounds the 1 / sqrt(key size) factor to float32 (a Python float cast by tf)
    scores = np.einsum("nhk,mhk->hnm", q, k) * np.float32(1 / math.sqrt(q.shape[-1]))
    heads = np.einsum("hnm,mhk->nhk", _softmax(scores), v)
    expected = np.einsum("nhk,hko->no", heads, w["attention_output/kernel"]) + \
        w["attention_output/bias"]
    assert got.shape == (5, 6)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_cnp_representation_is_the_mean_of_the_encodings():
    learner = np_learner("cnp", dtype="float64")
    task = sinusoids(shots=4, dtype="float64").task(0)
    adapted = learner.adapt(task.support_x, task.support_y)
    pairs = tf.concat([task.support_x, task.support_y], -1)
    np.testing.assert_allclose(adapted.state[CONTEXT]["representation"],
                               np.mean(learner.adapter.encoder(pairs), axis=0), rtol=1e-12)


# --- the Gaussian loss -----------------------------------------------------------------

def test_gaussian_nll_is_minus_the_log_density():
    rng = np.random.default_rng(0)
    y, mean = rng.normal(size=(5, 2)), rng.normal(size=(5, 2))
    scale = rng.uniform(0.1, 2.0, size=(5, 2))
    density = np.exp(-(y - mean) ** 2 / (2 * scale ** 2)) / (scale * np.sqrt(2 * np.pi))
    expected = -np.log(density).sum(-1)  # independent outputs: densities multiply
    got = gaussian_nll(tf.constant(y), Gaussian(tf.constant(mean), tf.constant(scale)))
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    np.testing.assert_allclose(predictive_mse(tf.constant(y), Gaussian(
        tf.constant(mean), tf.constant(scale))), ((y - mean) ** 2).mean(-1), rtol=1e-12)


def test_learner_loss_is_the_mean_nll_of_its_prediction():
    learner = np_learner("cnp")
    task = sinusoids().task(0)
    prediction = learner.predict(learner.adapt(task.support_x, task.support_y), task.query_x)
    mean, scale, y = (t.numpy().astype(np.float64) for t in (*prediction, task.query_y))
    expected = np.mean(np.log(scale) + (y - mean) ** 2 / (2 * scale ** 2)
                       + 0.5 * np.log(2 * np.pi))
    np.testing.assert_allclose(learner.run_task(task).metrics["loss"], expected, rtol=1e-5)


# --- bad input -------------------------------------------------------------------------

def test_non_positive_scale_is_an_error_naming_it():
    with pytest.raises(tf.errors.InvalidArgumentError, match="predicted scale"):
        gaussian_nll(tf.ones([3, 1]), Gaussian(tf.zeros([3, 1]), tf.constant([[1.], [0.], [2.]])))


def test_gaussian_loss_of_a_point_prediction_is_an_error():
    with pytest.raises(TypeError, match="Gaussian.*got EagerTensor"):
        gaussian_nll(tf.ones([3, 1]), tf.ones([3, 1]))


def test_steps_are_an_error():
    learner = np_learner("cnp")
    task = sinusoids().task(0)
    with pytest.raises(ValueError, match="takes no inner steps.*steps=2"):
        learner.adapt(task.support_x, task.support_y, steps=2)


def test_weights_without_context_are_an_error():
    learner = np_learner("anp")
    with pytest.raises(ValueError, match="needs the task.s encoded support set"):
        learner.predict(learner.initial_weights(), tf.zeros([3, 1]))


def test_decoder_of_the_wrong_input_size_is_an_error_naming_the_sizes():
    encoder = models.mlp((2,), hidden=(4,), outputs=8, name="encoder")
    decoder = models.mlp((8,), hidden=(4,), outputs=2, name="decoder")
    with pytest.raises(ValueError, match="reads 8 and gives 2.*must read x \\+ r = 9"):
        metalearn.Learner(decoder, ConditionalNeuralProcess(encoder), loss=gaussian_nll)


def test_odd_gaussian_outputs_are_an_error():
    encoder = models.mlp((2,), hidden=(4,), outputs=8, name="encoder")
    decoder = models.mlp((9,), hidden=(4,), outputs=3, name="decoder")
    with pytest.raises(ValueError, match="gives 3 values.*2 \\* outputs"):
        metalearn.Learner(decoder, AttentiveNeuralProcess(encoder), loss=gaussian_nll)


def test_labels_out_of_range_are_an_error():
    learner = np_learner("cnp", x_size=DIM, y_size=WAYS, output="raw")
    task = synthetic_classification(0, tasks=1).task(0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="labels must be in 0 .. 2"):
        learner.adapt(task.support_x, task.support_y + 1)


def test_constructor_arguments_are_checked():
    encoder = models.mlp((2,), hidden=(4,), outputs=8, name="encoder")
    with pytest.raises(ValueError, match="output must be one of.*'logits'"):
        ConditionalNeuralProcess(encoder, output="logits")
    with pytest.raises(ValueError, match="min_scale.*got 1.5"):
        ConditionalNeuralProcess(encoder, min_scale=1.5)
    with pytest.raises(TypeError, match="encoder must be a built keras.Model"):
        AttentiveNeuralProcess("encoder")


# --- the Gaussian-process task prior ----------------------------------------------------

def test_gaussian_process_sampler_is_seeded_and_stateless():
    one = assert_sampler_is_seeded_and_stateless(GaussianProcess(shots=5, queries=7))
    assert one.support_x.shape == (4, 5, 1) and one.query_y.shape == (4, 7, 1)


def test_gaussian_process_covariance_is_the_kernel():
    """With every x at 0 and 1 (fixed length scale and variance), the targets'
    covariance over many tasks is the RBF kernel plus the noise."""
    length, variance, noise = 0.8, 0.5, 0.1
    sampler = GaussianProcess(shots=1, queries=1, length_scale=(length, length),
                              variance=(variance, variance), x_range=(0.0, 0.0),
                              noise=noise, dtype="float64")
    episodes = sampler.sample(tf.constant([0, 0], tf.int64), 20000)
    y = np.concatenate([episodes.support_y, episodes.query_y], axis=1)[..., 0]
    covariance = np.cov(y.T)
    np.testing.assert_allclose(np.diag(covariance), variance + noise ** 2, rtol=0.05)
    np.testing.assert_allclose(covariance[0, 1], variance, rtol=0.05)  # x equal: k = v
    shifted = GaussianProcess(shots=1, queries=1, length_scale=(length, length),
                              variance=(variance, variance), x_range=(1.0, 1.0),
                              noise=0.0, dtype="float64")
    x = tf.constant([[[0.0], [1.0]]], tf.float64)
    from metalearn.tasks.gaussian_process import rbf_kernel
    kernel = rbf_kernel(x, tf.constant([length], tf.float64), tf.constant([variance], tf.float64))
    np.testing.assert_allclose(kernel[0, 0, 1], variance * np.exp(-0.5 / length ** 2))
    assert shifted.sample(tf.constant([0, 0], tf.int64), 2).support_x.numpy().max() == 1.0


def test_gaussian_process_arguments_are_checked():
    with pytest.raises(ValueError, match="GaussianProcess.length_scale's low end must be > 0"):
        GaussianProcess(length_scale=(0.0, 1.0))
    with pytest.raises(ValueError, match="GaussianProcess.noise must be >= 0, got -1"):
        GaussianProcess(noise=-1)
    with pytest.raises(ValueError, match="shots must be >= 1"):
        GaussianProcess(shots=0)


def test_neural_process_meta_trains_on_gaussian_processes():
    learner = np_learner("cnp")
    sampler = GaussianProcess(shots=8)
    episodes = sampler.sample(tf.constant([9, 2], tf.int64), 64)  # held out
    meta_loss = tf.function(learner.meta_loss)  # eagerly, 64 tasks cost more than training
    before = float(meta_loss(episodes))
    step = metalearn.training.make_meta_step(
        learner, metalearn.MetaGradient(keras.optimizers.Adam(0.003)), None)
    for batch in sampler.dataset(16, seed=0, num_steps=100):
        step(batch)
    assert float(meta_loss(episodes)) < before - 0.2, before
    assert isinstance(episodes, Episode)


# --- a trained run: the gin file, evaluation without inner steps, the report's band ---

@pytest.mark.parametrize("config, sampler", [("sinusoid/anp.gin", "Sinusoid"),
                                             ("gaussian_process/in_context.gin",
                                              "GaussianProcess")])
def test_a_run_trains_evaluates_and_plots_its_predictive_band(tmp_path, config, sampler):
    import os

    import gin
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from metalearn import report
    from metalearn.training import build_experiment, evaluate, parse_config, train

    root = ROOT
    parse_config([os.path.join(root, "experiments", config)],
                 ["Loop.num_steps = 4", "Loop.log_every = 2", "Loop.checkpoint_every = 4",
                  "Experiment.meta_batch_size = 2", "evaluate.num_tasks = 4",
                  "evaluate.batch_size = 2"])
    try:
        experiment = build_experiment()
        assert type(experiment.sampler).__name__ == sampler
        workdir = str(tmp_path / "run")
        train(experiment, workdir)
        result = evaluate(experiment.learner, experiment.sampler)  # inner_steps = (0,)
        assert sorted(result["results"]["0"]) == ["loss", "mse"]
        assert result["results"]["0"]["mse"]["ci95"] > 0
    finally:
        gin.clear_config()
    path = str(tmp_path / "band.png")
    assert report.plot_regression_adaptation(plt, workdir, path)
    assert os.path.getsize(path) > 1000


def test_the_plotted_gaussian_process_task_is_one_draw_at_support_and_grid():
    """report.regression_task draws the function jointly at the support points and on
    the grid: without observation noise the support values lie on the plotted curve."""
    from metalearn import report
    from metalearn.tasks import GaussianProcess

    grid = np.linspace(-2.0, 2.0, 400)[:, None]
    for seed in range(3):
        support_x, support_y, curve = report.regression_task(
            GaussianProcess(shots=6, noise=0.0), grid, seed)
        assert support_x.shape == support_y.shape == (6, 1) and curve.shape == (400,)
        np.testing.assert_allclose(np.interp(support_x[:, 0], grid[:, 0], curve),
                                   support_y[:, 0], atol=0.02)
        assert np.std(curve) > 0.05  # a curve, not a constant
    assert report.regression_task(object(), grid) is None


# --- the NP's ELBO ---------------------------------------------------------------------

def _log_normal(x, mean, scale):
    return -0.5 * ((x - mean) / scale) ** 2 - np.log(scale) - 0.5 * np.log(2 * np.pi)


def test_elbo_matches_a_monte_carlo_reference():
    """The learner's loss against numpy, the networks run directly: for each meta-step's
    noise draw exactly (-log p(y_T | z) / |T| + KL / |T|, the KL written out), and its
    mean over the steps' draws against a Monte-Carlo estimate of the expected negative
    ELBO from samples of the posterior, whose KL term (E_q[log q(z) - log p(z)]) also
    checks the closed form."""
    learner = latent_learner(dtype="float64")
    adapter = learner.adapter
    task = sinusoids(shots=4, dtype="float64").task(0)
    sx, sy, qx, qy = (t.numpy() for t in task)

    def latent(x, y):  # q(z | pairs): pooled latent-encoder features, numpy
        h = np.mean(adapter.latent_encoder(np.concatenate([x, y], -1)).numpy(), 0)
        mean, raw = np.split(h, 2)
        return mean, 0.1 + 0.9 / (1 + np.exp(-raw))

    prior = latent(sx, sy)
    posterior = latent(np.concatenate([sx, qx]), np.concatenate([sy, qy]))
    r = np.mean(adapter.encoder(np.concatenate([sx, sy], -1)).numpy(), 0)

    def nll(z):  # [samples, z] -> the mean query NLL given each z
        samples = len(z)
        inputs = np.concatenate([np.repeat(qx[None], samples, 0),
                                 np.broadcast_to(r, (samples, len(qx), r.size)),
                                 np.repeat(z[:, None], len(qx), 1)], -1)
        out = learner.model(inputs.reshape(samples * len(qx), -1)).numpy()
        scale = 0.01 + 0.99 * np.log1p(np.exp(out[:, 1:]))
        return -_log_normal(np.tile(qy, (samples, 1)), out[:, :1],
                            scale).reshape(samples, -1).mean(-1)

    (mq, sq), (mp, sp) = posterior, prior
    kl = np.sum(np.log(sp / sq) + (sq ** 2 + (mq - mp) ** 2) / (2 * sp ** 2) - 0.5)
    metrics = tf.function(lambda e: learner.run_task(e).metrics)
    losses = []
    for step in range(400):  # each meta-step draws its own noise
        learner.meta_step.assign(step)
        losses.append(float(metrics(task)["loss"]))
        if step < 3:
            z = mq + sq * learner.noise(task.support_x, tf.float64).numpy()
            np.testing.assert_allclose(losses[-1], nll(z[None])[0] + kl / len(qx),
                                       rtol=1e-9)
    assert np.std(losses) > 0  # the noise does change with the step

    samples = 4000
    z = mq + sq * np.random.default_rng(0).standard_normal((samples, mq.size))
    log_ratio = (_log_normal(z, mq, sq) - _log_normal(z, mp, sp)).sum(-1)
    assert abs(kl - log_ratio.mean()) < 4 * log_ratio.std() / np.sqrt(samples)
    reference = nll(z) + log_ratio / len(qx)  # one value per sample of z
    error = np.sqrt(np.var(losses) / len(losses) + np.var(reference) / samples)
    assert abs(np.mean(losses) - reference.mean()) < 4 * error, (np.mean(losses),
                                                                reference.mean(), error)


def test_elbo_meta_gradient_matches_finite_differences():
    learner = latent_learner(representation=3, latent=2, hidden=(3,), dtype="float64")
    episodes = sinusoids(tasks=2, shots=3, seed=3, dtype="float64")
    gradient = assert_meta_gradient_matches_finite_differences(learner, episodes)
    assert any(np.any(g != 0) for k, g in gradient.items() if k.startswith("latent_encoder"))


def test_latent_prediction_reads_the_prior_mean():
    learner = latent_learner()
    task = sinusoids().task(0)
    adapted = learner.adapt(task.support_x, task.support_y)
    prior = learner.adapter.latent(task.support_x, task.support_y)
    np.testing.assert_allclose(adapted.state[CONTEXT]["latent"], prior.mean)
    metrics = learner.run_task(task).metrics
    assert sorted(metrics) == sorted(learner.metric_names) == ["kl", "loss", "mse", "nll"]
    assert float(metrics["kl"]) >= 0


def test_latent_learner_needs_a_latent_adapter():
    with pytest.raises(TypeError, match="needs a LatentNeuralProcess adapter"):
        LatentNeuralProcessLearner(models.mlp((9,), outputs=2),
                                   ConditionalNeuralProcess(models.mlp((2,), outputs=8)),
                                   loss=gaussian_nll)
