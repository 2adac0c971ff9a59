"""Helpers shared by the tests of the task-batching formulations and of ``WhileLoop``
(execution/accumulate_test.py, execution/formulations_test.py,
adapters/while_loop_test.py): a test module imports these, never another test module's
helpers."""

import keras
import tensorflow as tf

import metalearn
from metalearn import execution
from metalearn.testing import DIM, WAYS


def bn_model():
    """A float64 MLP with a BatchNormalization layer (``bn0``) for the contract's tasks."""
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((DIM,), dtype="float64"), keras.layers.Dense(8, name="hidden0",
                                                                 dtype="float64"),
        keras.layers.BatchNormalization(name="bn0", dtype="float64"),
        keras.layers.Activation("relu", dtype="float64"),
        keras.layers.Dense(WAYS, name="head", dtype="float64")], name="bn_mlp")


def meta_gradients(learner, episodes, formulation=None, jit_compile=False):
    """``MetaGradient``'s directions (the meta-gradients, NumPy) and metrics for
    ``episodes`` under ``formulation`` (an object or a name; ``None``: ``Auto()``)."""
    rule = metalearn.MetaGradient()
    grads, metrics = rule.compiled_directions(jit_compile)(
        learner, episodes, execution.formulation(formulation))
    return [g.numpy() for g in grads], {k: v.numpy() for k, v in metrics.items()}


def metrics_and_meta_gradient(learner, episodes, formulation=None):
    """``learner.meta_metrics(episodes, formulation=...)`` and the gradient of their mean
    loss with respect to the meta-variables, in one ``tf.function`` (NumPy)."""
    formulation = execution.formulation(formulation)

    @tf.function
    def run(episodes):
        with tf.GradientTape() as tape:
            metrics = learner.meta_metrics(episodes, formulation=formulation)
            loss = tf.reduce_mean(metrics["loss"])
        return metrics, tape.gradient(loss, learner.meta_variables)
    metrics, grads = run(episodes)
    return ({k: v.numpy() for k, v in metrics.items()}, [g.numpy() for g in grads])
