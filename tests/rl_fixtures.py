"""Shared by the tests of collection (``tests/rl/dynamics_test.py``, ``tests/ray_test.py``,
``tests/rl/gym_test.py``, ``tests/rl/recurrent_python_test.py``): a learner's stochastic
policy as a collector's NumPy function, and a Python environment with the dynamics of the
in-graph ``PointNavigation`` (tolerance 0)."""

import time

import gymnasium
import keras
import numpy as np

import metalearn
from metalearn.adapters import GradientDescent
from metalearn.rl import (DiCE, PointNavigation, PolicyLearner, PolicySampler, Rollouts,
                          gaussian_policy)
from metalearn.rl.gym import PythonEnvironment

HORIZON = 5


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


class PointEnv(gymnasium.Env):
    """PointNavigation's dynamics (tolerance 0) in Python: the goal is the task's, so
    the reward comes from ``info['position']`` (``PythonPoint.task_reward``)."""

    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    crash_at = None  # a step at which the simulator raises
    nan_at = None    # a step at which it gives NaN
    hang_at = None   # a step at which it hangs (sleeps a minute)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.t = np.zeros(2, np.float32), 0
        return self.position.copy(), {}

    def step(self, action):
        if self.t == PointEnv.crash_at:
            raise FloatingPointError("the integrator diverged")
        if self.t == PointEnv.hang_at:
            time.sleep(60)
        move = np.clip(np.asarray(action, np.float32), -1.0, 1.0) * np.float32(0.1)
        self.position = (self.position + move).astype(np.float32)
        if self.t == PointEnv.nan_at:
            self.position[0] = np.nan
        self.t += 1
        return self.position.copy(), 0.0, False, False, {"position": self.position.copy()}


gymnasium.register("MetalearnTestPoint-v0", entry_point=PointEnv)


class PythonPoint(PythonEnvironment):
    env_id = "MetalearnTestPoint-v0"
    observation_size, action_size, horizon = 2, 2, HORIZON

    def tasks(self, seed, num_tasks):
        return PointNavigation(horizon=HORIZON).tasks(seed, num_tasks)

    def task_reward(self, task, reward, info):
        return -np.linalg.norm(info["position"] - task, axis=-1)
