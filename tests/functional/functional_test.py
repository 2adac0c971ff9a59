"""The functional seam: forward with given weights on unmodified Keras models."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from metalearn import functional, models
from metalearn.testing import finite_difference_gradient, relative_error


def _bn_net(dtype="float64"):
    return keras.Sequential([
        keras.Input((3,), dtype=dtype), keras.layers.Dense(4, dtype=dtype, name="d0"),
        keras.layers.BatchNormalization(dtype=dtype, name="bn"),
        keras.layers.Dense(2, dtype=dtype, name="d1")])


def test_call_with_current_weights_equals_model_call():
    model = models.conv_net((8, 8, 1), outputs=3, filters=4, blocks=2)
    x = tf.random.stateless_normal([5, 8, 8, 1], seed=[1, 2])
    got = functional.call(model, functional.weights(model), x, training=True)
    np.testing.assert_allclose(got, model(x, training=True), rtol=1e-5, atol=1e-6)


def test_call_uses_given_weights_and_partial_mapping():
    model = models.mlp((2,), hidden=(3,), outputs=1)
    x = tf.ones([4, 2])
    zero_head = {"mlp/head/kernel": tf.zeros([3, 1]), "mlp/head/bias": tf.fill([1], 7.0)}
    np.testing.assert_allclose(functional.call(model, zero_head, x), np.full([4, 1], 7.0))


def test_call_never_touches_variables_and_batchnorm_statistics():
    model = _bn_net()
    before = [v.numpy().copy() for v in model.variables]
    weights = {k: v * 2.0 for k, v in functional.weights(model).items()}
    functional.call(model, weights, tf.random.stateless_normal([6, 3], [0, 1], dtype=tf.float64))
    for old, new in zip(before, model.variables):
        np.testing.assert_array_equal(old, new.numpy())


def test_unknown_path_and_bad_shape_give_clear_errors():
    model = models.mlp((2,), hidden=(3,))
    with pytest.raises(KeyError, match="mlp/nope/kernel"):
        functional.call(model, {"mlp/nope/kernel": tf.zeros([1])}, tf.ones([1, 2]))
    with pytest.raises(ValueError, match=r"mlp/head/kernel.*\(3, 1\)"):
        functional.call(model, {"mlp/head/kernel": tf.zeros([2, 2])}, tf.ones([1, 2]))


def test_unbuilt_model_is_refused():
    with pytest.raises(ValueError, match="build it first"):
        functional.weights(keras.Sequential([keras.layers.Dense(2)]))


def test_batchnorm_second_derivative_is_exact():
    """Keras' tf.nn.moments drops a Hessian term; functional.call must not."""
    model = _bn_net()
    x = tf.random.stateless_normal([6, 3], [3, 4], dtype=tf.float64)

    def grad_norm(weights):  # a function of first derivatives: tests second order
        with tf.GradientTape() as tape:
            tape.watch(weights)
            out = functional.call(model, weights, x, training=True)
            loss = tf.reduce_sum(tf.sin(out))
        grads = tape.gradient(loss, weights)
        return tf.add_n([tf.reduce_sum(g ** 2) for g in grads.values()])

    weights = functional.weights(model)
    with tf.GradientTape() as tape:
        tape.watch(weights)
        value = grad_norm(weights)
    analytic = {k: g.numpy() for k, g in tape.gradient(value, weights).items()}
    numeric = finite_difference_gradient(grad_norm, weights)
    assert relative_error(analytic, numeric) < 1e-6


def test_exact_moments_is_scoped_to_functional_calls():
    from metalearn import _compat
    from metalearn.functional import moments
    backend_nn = _compat.keras_tf_backend_nn()
    model = _bn_net()
    functional.call(model, functional.weights(model), tf.ones([2, 3], dtype=tf.float64))
    assert not moments._exact_moments_enabled()
    x = tf.random.stateless_normal([5, 4], [0, 0], dtype=tf.float64)
    with functional.exact_moments():
        exact = backend_nn.moments(x, axes=[0])
    plain = tf.nn.moments(x, axes=[0])
    for a, b in zip(exact, plain):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_the_one_softmax_cross_entropy():
    """``functional.softmax_cross_entropy`` is ``-log softmax(logits)[label]`` per example,
    in the logits' dtype, for labels of any dtype or with a trailing axis of 1; the
    embedding learners' default loss and the shipped test tasks' losses are this one."""
    from metalearn.learners import embedding
    from metalearn import testing
    logits = tf.constant([[0.5, -1.0, 2.0], [1e-9, 0.0, 0.0]], tf.float64)
    expected = -np.log(tf.nn.softmax(logits).numpy())[[0, 1], [2, 0]]
    for labels in (tf.constant([2, 0]), tf.constant([[2.0], [0.0]]), np.array([2, 0])):
        value = functional.softmax_cross_entropy(labels, logits)
        assert value.dtype == tf.float64 and value.shape == (2,)
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-14)
    np.testing.assert_allclose(testing.softmax_xent(tf.constant([2, 0]), logits).numpy(),
                               expected.mean(), rtol=1e-14)
    assert embedding.softmax_cross_entropy is testing.softmax_cross_entropy \
        is functional.softmax_cross_entropy
