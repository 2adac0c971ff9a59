"""Shared by the tests of collection (``tests/rl/dynamics_test.py``, ``tests/ray_test.py``):
a learner's stochastic policy as a collector's NumPy function."""

import keras

import metalearn
from metalearn.adapters import GradientDescent
from metalearn.rl import DiCE, PolicyLearner, PolicySampler, Rollouts, gaussian_policy


def sampled_policy(environment, size):
    """A seeded Gaussian MLP policy (observations of ``size`` values, one hidden layer
    of 8) of a :class:`PolicyLearner` on ``environment``, sampled at its initial
    weights: ``(observations, seed) -> (actions, log-probabilities)``."""
    keras.utils.set_random_seed(3)
    model = gaussian_policy(metalearn.models.mlp((size,), hidden=(8,),
                                                 outputs=environment.action_size))
    learner = PolicyLearner(model, environment, GradientDescent(1, 0.1, wrappers=[Rollouts()]),
                            rollouts=3, estimator=DiCE())
    return PolicySampler(learner)(learner.initial_weights())
