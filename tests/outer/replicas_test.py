"""The cross-replica apply (metalearn/outer/replicas.py) on one device: the update is the
plain optimizer's, and a meta-step that is dropped leaves none of its traced graphs
alive (Keras' all-reduce of the gradients, a graph-mode ``tf.custom_gradient`` that
TensorFlow registers for good, kept every traced step alive for the life of the
process)."""

import gc
import weakref

import keras
import numpy as np
from tensorflow.python.framework.func_graph import FuncGraph

import metalearn
from metalearn import execution
from metalearn.adapters import GradientDescent
from metalearn.outer import MetaGradient, SkipNonFinite
from metalearn.testing import task_meta_gradient, values
from metalearn.testing.tasks import mse, regression_episodes

LR = 0.5


def _learner():
    keras.utils.set_random_seed(5)
    model = metalearn.models.mlp((2,), hidden=(4,), outputs=1, activation="tanh",
                                 dtype="float64")
    return metalearn.Learner(model, GradientDescent(2, 0.1), loss=mse)


def _graphs() -> weakref.WeakSet:
    gc.collect()
    return weakref.WeakSet(o for o in gc.get_objects() if isinstance(o, FuncGraph))


def _reference(learner, episodes):
    """One SGD step of the mean meta-gradient, by hand, task by task, eagerly."""
    return {p: w - LR * np.mean(g, axis=0) for (p, w), g in zip(
        values(learner).items(),
        zip(*[task_meta_gradient(learner, episodes.task(i)) for i in range(4)]))}


def _step_and_drop(rule, expected):
    learner = _learner()
    episodes = regression_episodes(tasks=4, shots=4)
    step = metalearn.training.make_meta_step(learner, rule, execution.MapFn())
    step(episodes)
    found = values(learner)
    for path, value in expected.items():
        np.testing.assert_allclose(found[path], value, rtol=1e-10, atol=1e-10,
                                   err_msg=path)


def test_a_dropped_meta_step_leaves_none_of_its_graphs_alive():
    """Both rules step from the same learner and episodes, so the reference is computed
    once; the graphs alive after one rule's step was dropped are those the next one is
    compared with."""
    expected = _reference(_learner(), regression_episodes(tasks=4, shots=4))
    before = _graphs()
    for rule in (MetaGradient(keras.optimizers.SGD(LR)),  # and through the guard's tf.cond
                 SkipNonFinite(MetaGradient(keras.optimizers.SGD(LR)))):
        _step_and_drop(rule, expected)
        del rule
        after = _graphs()
        alive = [g.name for g in after if g not in before]
        assert not alive, alive
        before = after
