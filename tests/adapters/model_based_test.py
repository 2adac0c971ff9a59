"""The model-based adapters (neural processes, ``InContext``) at their limits: a task that
would need more memory than the budget (by default this machine's) is refused before the
work, naming the estimate, the sizes and the limit; an empty context predicts from the
zero representation; padded regression episodes (real ``[n, 1]`` targets in
``MaskedLabels``) give the unpadded predictions."""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.adapters import (AttentiveNeuralProcess, ConditionalNeuralProcess,
                                InContext, LatentNeuralProcess)
from metalearn.functional import gaussian_nll, predictive_mse
from metalearn.functional.memory import MemoryBudgetError, parse_memory
from metalearn.learners import LatentNeuralProcessLearner


NP_KINDS = {"cnp": ConditionalNeuralProcess, "anp": AttentiveNeuralProcess}


def neural_process(kind, memory_budget=None, x_size=1, y_size=1, representation=8):
    """A small Gaussian neural process: encoder [x, y] -> r, decoder [x, r] -> 2 y."""
    keras.utils.set_random_seed(0)
    mlp = lambda inputs, outputs, name: models.mlp(  # noqa: E731
        (inputs,), hidden=(16,), outputs=outputs, activation="tanh", name=name)
    encoder = mlp(x_size + y_size, representation, "encoder")
    if kind == "latent":
        adapter = LatentNeuralProcess(encoder, mlp(x_size + y_size, 6, "latent_encoder"),
                                      memory_budget=memory_budget)
        return LatentNeuralProcessLearner(mlp(x_size + representation + 3, 2 * y_size,
                                              "decoder"), adapter, loss=gaussian_nll,
                                          metrics={"mse": predictive_mse})
    extra = {"heads": 2} if kind == "anp" else {}
    adapter = NP_KINDS[kind](encoder, memory_budget=memory_budget, **extra)
    return metalearn.Learner(mlp(x_size + representation, 2 * y_size, "decoder"), adapter,
                             loss=gaussian_nll, metrics={"mse": predictive_mse})


def in_context(memory_budget=None, x_size=1, output="gaussian"):
    keras.utils.set_random_seed(0)
    model = models.mlp((x_size,), hidden=(16,), outputs=8, activation="tanh",
                       name="embedding")
    adapter = InContext(targets=1, output=output, width=16, depth=1, heads=2,
                        memory_budget=memory_budget)
    return metalearn.Learner(model, adapter, loss=gaussian_nll,
                             metrics={"mse": predictive_mse})


def regression_task(support=5, queries=7, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, [support + queries, 1]).astype(np.float32)
    y = np.sin(x).astype(np.float32)
    return (tf.constant(x[:support]), tf.constant(y[:support]), tf.constant(x[support:]),
            tf.constant(y[support:]))


# --- a memory estimate before the work ------------------------------------------------


@pytest.mark.parametrize("kind", ["anp", "cnp", "latent", "in_context"])
def test_a_task_beyond_the_memory_budget_is_refused_before_the_work(kind):
    """2000 context points and 2000 targets against a small budget: refused, naming the
    estimate, the sizes and the limit; 5 and 7 pass the same learner. The attention
    (ANP, InContext) is refused with both sizes, before any query is read; the CNPs'
    encoding, linear in the context, is refused before it runs."""
    budget = "1MiB" if kind in ("anp", "in_context") else "64KiB"
    learner = in_context(budget) if kind == "in_context" else neural_process(kind, budget)
    support_x, support_y, query_x, _ = regression_task()
    prediction = learner.predict(learner.adapt(support_x, support_y), query_x)
    assert np.all(np.isfinite(prediction.mean.numpy()))
    big_x = tf.zeros([2000, 1])
    with pytest.raises(MemoryBudgetError) as info:
        learner.predict(learner.adapt(big_x, tf.zeros([2000, 1])), big_x)
    message = str(info.value)
    sizes = "2000 support examples" if kind == "in_context" else "2000 context points"
    assert sizes in message, message
    if kind in ("anp", "in_context"):
        assert "2000 targets" in message or "2000 queries" in message, message
    limit = parse_memory(budget)
    assert f"more than the limit of {budget[:-3]}.0 {budget[-3:]} ({limit} B) " \
           f"(memory_budget)" in message, message
    estimate = int(re.search(r"need an estimated [0-9.]+ [KMG]iB \(([0-9]+) B\)",
                             message).group(1))
    assert estimate > limit


def test_the_attention_is_the_estimate_s_largest_term():
    """20 000 context points and 50 000 targets, two heads: three [targets, context]
    float32 matrices per head, about 22 GiB, the figure the kernel killed at."""
    learner = neural_process("anp")
    learner.predict(learner.adapt(*regression_task()[:2]), regression_task()[2])  # built
    estimate = learner.adapter.memory_estimate(20000, 50000)
    attention = 2 * 3 * 20000 * 50000 * 4
    assert attention <= estimate < 1.1 * attention


def test_sizes_known_only_when_the_graph_runs_are_checked_before_the_work():
    learner = neural_process("anp", memory_budget=2 ** 20)
    spec = tf.TensorSpec([None, 1])
    predict = tf.function(lambda sx, sy, x: learner.predict(learner.adapt(sx, sy), x).mean,
                          input_signature=[spec] * 3)
    support_x, support_y, query_x, _ = regression_task()
    assert predict(support_x, support_y, query_x).shape == (7, 1)
    big = tf.zeros([2000, 1])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"AttentiveNeuralProcess: the estimated memory of one task .* "
                             r"exceeds the limit of 1.0 MiB"):
        predict(big, big, big)


def test_the_default_budget_is_this_machine_s_memory_and_spelled_as_auto_s():
    from metalearn import execution
    assert execution.parse_memory is parse_memory  # one parser of budgets
    assert ConditionalNeuralProcess(models.mlp((2,), outputs=4),
                                    memory_budget="2 GiB").memory_budget == 2 * 2 ** 30
    with pytest.raises(ValueError, match=r"memory_budget must be bytes or a size like "
                                         r"'2GiB'.*got '2 gigs'"):
        InContext(targets=1, memory_budget="2 gigs")
    learner = neural_process("anp")  # no budget: the machine's memory
    with pytest.raises(MemoryBudgetError, match=r"\(this machine's memory\)"):
        learner.adapter.check_memory(10 ** 6, 10 ** 6)


def test_the_machine_s_memory_is_a_container_s_limit_where_that_is_lower(tmp_path,
                                                                         monkeypatch):
    from metalearn.functional import memory
    limit = tmp_path / "memory.max"
    limit.write_text("1048576\n")
    monkeypatch.setattr(memory, "CGROUP_LIMITS", (str(limit), str(tmp_path / "absent")))
    assert memory.machine_memory() == 2 ** 20
    learner = neural_process("anp")
    learner.predict(learner.adapt(*regression_task()[:2]), regression_task()[2])
    with pytest.raises(MemoryBudgetError, match=r"the limit of 1.0 MiB \(1048576 B\) "
                                                r"\(this machine's memory\)"):
        learner.predict(learner.adapt(tf.zeros([2000, 1]), tf.zeros([2000, 1])),
                        tf.zeros([2000, 1]))
    limit.write_text("max\n")  # no container limit: the physical memory
    assert memory.machine_memory() > 2 ** 20


# --- an empty context ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["cnp", "anp", "latent"])
def test_an_empty_context_predicts_from_the_zero_representation(kind):
    """No support pair: the CNP's mean over nothing is the zero representation (the
    attentive NP attends to nothing, a zero mix of values), so the prediction is the
    prior's, finite, with a finite meta-gradient."""
    learner = neural_process(kind)
    support_x, support_y, query_x, query_y = regression_task()
    empty = learner.adapt(support_x[:0], support_y[:0])
    prediction = learner.predict(empty, query_x)
    assert np.all(np.isfinite(prediction.mean.numpy()))
    assert np.all(np.isfinite(prediction.scale.numpy()))
    if kind == "cnp":
        zero = tf.zeros([7, learner.adapter.representation_size])
        expected = learner.model(tf.concat([query_x, zero], axis=-1)).numpy()[:, :1]
        np.testing.assert_allclose(prediction.mean.numpy(), expected, rtol=1e-5, atol=1e-6)
    variables = learner.meta_variables
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(gaussian_nll(query_y, learner.predict(
            learner.adapt(support_x[:0], support_y[:0]), query_x)))
    gradients = tape.gradient(loss, variables)
    assert all(np.all(np.isfinite(g.numpy())) for g in gradients if g is not None)


# --- padded regression episodes ----------------------------------------------------------


def regression_episode(support, queries, seed):
    from metalearn.tasks import Episode
    return Episode(*regression_task(support, queries, seed))


def test_pad_episodes_pads_real_targets():
    from metalearn.tasks import pad_episodes
    padded = pad_episodes([regression_episode(3, 4, 0), regression_episode(5, 2, 1)],
                          max_support=6, max_query=4, max_ways=0)
    labels = padded.support_y
    assert labels.labels.shape == (2, 6, 1) and labels.labels.dtype == tf.float32
    np.testing.assert_array_equal(labels.mask, [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]])
    assert labels.classes.shape == (2, 0)  # real targets: no classes
    np.testing.assert_allclose(labels.labels[1, :5], regression_episode(5, 2, 1).support_y)
    assert padded.query_y.labels.shape == (2, 4, 1)


@pytest.mark.parametrize("kind", ["cnp", "anp", "latent", "in_context"])
def test_a_padded_regression_context_gives_the_unpadded_predictions(kind):
    """Real [n, 1] targets in MaskedLabels: padding (junk inputs and targets) is left out
    of the context; the padded batch's loss is the unpadded one's."""
    from metalearn.tasks import pad_episodes
    from metalearn.tasks.episode import MaskedLabels
    learner = in_context() if kind == "in_context" else neural_process(kind)
    support_x, support_y, query_x, query_y = regression_task()
    expected = learner.predict(learner.adapt(support_x, support_y), query_x).mean.numpy()
    junk_x = tf.concat([support_x, 100.0 * tf.ones([4, 1])], axis=0)
    junk_y = tf.concat([support_y, -50.0 * tf.ones([4, 1])], axis=0)
    mask = tf.range(9) < 5
    for classes in (tf.zeros([0], tf.bool), tf.ones([3], tf.bool)):  # any classes: none read
        got = learner.predict(learner.adapt(junk_x, MaskedLabels(junk_y, mask, classes)),
                              query_x).mean.numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    episode = regression_episode(5, 7, 0)
    batch = tf.nest.map_structure(lambda t: t[None], episode)
    padded = pad_episodes([episode], max_support=9, max_query=10, max_ways=0)
    if kind == "latent":  # its ELBO is refused padded episodes by name
        with pytest.raises(ValueError, match="does not take padded episodes"):
            learner.meta_metrics(padded)
        return
    np.testing.assert_allclose(learner.meta_metrics(padded)["loss"],
                               learner.meta_metrics(batch)["loss"], rtol=1e-5)


@pytest.mark.parametrize("kind", ["cnp", "anp"])
def test_a_padded_context_of_no_real_pair_is_the_empty_context(kind):
    from metalearn.tasks.episode import MaskedLabels
    learner = neural_process(kind)
    support_x, support_y, query_x, _ = regression_task()
    empty = learner.predict(learner.adapt(support_x[:0], support_y[:0]), query_x)
    padded = learner.adapt(support_x, MaskedLabels(support_y, tf.zeros([5], tf.bool),
                                                   tf.zeros([0], tf.bool)))
    np.testing.assert_allclose(learner.predict(padded, query_x).mean.numpy(),
                               empty.mean.numpy(), rtol=1e-5, atol=1e-6)
