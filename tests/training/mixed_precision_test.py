"""Mixed precision (Keras dtype policies): bfloat16 compute, float32 meta-gradients.

Runs on the CPU with ``mixed_bfloat16``; ``mixed_float16`` is for GPUs (see
benchmarks/README.md for where the GPU check stands)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution
from metalearn.adapters import GradientDescent
from metalearn.tasks import Episode


@pytest.fixture
def bfloat16_policy():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def _episodes(tasks=2, ways=3, seed=0):
    keys = tf.random.experimental.stateless_split([seed, 3], 2)
    images = lambda k: tf.random.stateless_uniform([tasks, ways * 2, 8, 8, 1], k)
    labels = tf.tile(tf.repeat(tf.range(ways), 2)[None], [tasks, 1])
    return Episode(images(keys[0]), labels, images(keys[1]), labels)


def _meta_gradient(learner, episodes, formulation):
    @tf.function
    def run(episodes):
        with tf.GradientTape() as tape:
            loss = learner.meta_loss(episodes, formulation=formulation)
        return loss, tape.gradient(loss, learner.meta_variables)
    return run(episodes)


def _model():
    keras.utils.set_random_seed(0)
    return metalearn.models.conv_net(input_shape=(8, 8, 1), outputs=3, filters=8, blocks=2)


@pytest.mark.parametrize("formulation", ["map_fn", "batched"])
def test_bfloat16_compute_gives_float32_meta_gradients_close_to_float32(
        formulation, bfloat16_policy):
    mixed = _model()
    assert mixed.layers[0].compute_dtype == "bfloat16"
    assert mixed.layers[0].kernel.dtype == "float32"
    keras.mixed_precision.set_global_policy("float32")
    full = _model()
    full.set_weights(mixed.get_weights())
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    results = {}
    for name, model in (("mixed", mixed), ("full", full)):
        learner = metalearn.Learner(model, GradientDescent(1, 0.4), loss=loss)
        results[name] = _meta_gradient(learner, _episodes(),
                                       execution.formulation(formulation))
    (mixed_loss, mixed_grads), (full_loss, full_grads) = results["mixed"], results["full"]
    assert mixed_loss.dtype == tf.float32
    assert all(g.dtype == tf.float32 for g in mixed_grads)
    np.testing.assert_allclose(float(mixed_loss), float(full_loss), rtol=3e-2)
    flat = lambda gs: np.concatenate([g.numpy().ravel() for g in gs])
    a, b = flat(mixed_grads), flat(full_grads)
    # bfloat16 keeps 8 bits of mantissa: gradients of this small BatchNorm net differ by
    # ~15% in norm (first order alike) but point the same way.
    cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    assert cosine > 0.95, cosine


def test_experiment_dtype_policy_builds_a_mixed_model_that_trains():
    from metalearn.training import build_experiment, make_meta_step, parse_config
    try:
        parse_config(["experiments/sinusoid/maml.gin"],
                     ["Runtime.dtype_policy = 'mixed_bfloat16'",
                      "Experiment.meta_batch_size = 4"])
        experiment = build_experiment()
        layer = experiment.learner.model.layers[0]
        assert (layer.compute_dtype, layer.kernel.dtype) == ("bfloat16", "float32")
        step = make_meta_step(experiment.learner, experiment.outer_rule,
                              experiment.formulation)
        episodes = next(iter(experiment.sampler.dataset(4, seed=0)))
        before = [v.numpy().copy() for v in experiment.learner.meta_variables]
        metrics = step(episodes)
        assert metrics["loss"].dtype == tf.float32 and np.isfinite(float(metrics["loss"]))
        after = experiment.learner.meta_variables
        assert all(v.dtype == "float32" for v in after)
        assert any(not np.array_equal(b, a.numpy()) for b, a in zip(before, after))
        parse_config(["experiments/sinusoid/maml.gin"],
                     ["Runtime.dtype_policy = 'float8_nonsense'"])
        with pytest.raises(ValueError, match="Runtime.dtype_policy"):
            build_experiment()
    finally:
        keras.mixed_precision.set_global_policy("float32")
