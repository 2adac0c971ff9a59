"""Python environments whose tasks change the dynamics (``PythonEnvironment.set_task``,
``reset_options``: ``PendulumGravity``), and collection stepped in worker processes
(``GymCollector(workers=...)``), bit-identical whatever the number of workers.

Kept small for the suite's budget: Pendulum and HalfCheetah for a few steps, one test
that starts worker processes."""

import time

import numpy as np
import pytest

from metalearn.rl import (GymCollector, HalfCheetahVelocity, PendulumGravity,
                          SimulatorError)
from tests.rl_fixtures import sampled_policy

ACTIONS = np.array([[1.5], [-0.7], [2.5]], np.float32)  # the last one clipped to 2


def fixed_actions(observations, seed):
    """The same torques whatever the state: ``ACTIONS[:n]``."""
    n = len(observations)
    return ACTIONS[:n].copy(), np.zeros([n], np.float32)


def pendulum_step(observation, torque, gravity):
    """Gymnasium's Pendulum-v1 dynamics (m = l = 1, dt = 0.05), written out here."""
    theta = np.arctan2(observation[:, 1], observation[:, 0]).astype(np.float64)
    speed = observation[:, 2].astype(np.float64)
    u = np.clip(torque[:, 0], -2.0, 2.0)
    speed = np.clip(speed + (3 * gravity / 2 * np.sin(theta) + 3.0 * u) * 0.05, -8, 8)
    theta = theta + speed * 0.05
    return np.stack([np.cos(theta), np.sin(theta), speed], -1)


def test_the_task_sets_the_gravity_of_every_copy():
    """Two tasks, the same seed and actions: the same start states, other next states,
    each the Pendulum step at the task's gravity; the same task twice: the same
    trajectories bit for bit."""
    collector = GymCollector(PendulumGravity(horizon=3), rollouts=3)
    light = collector.collect(fixed_actions, np.float32(5.0), [7, 1])
    heavy = collector.collect(fixed_actions, np.float32(15.0), [7, 1])
    again = collector.collect(fixed_actions, np.float32(5.0), [7, 1])
    collector.close()
    for a, b in zip(light.trajectories, again.trajectories):
        assert np.array_equal(a, b)
    start, light_next = light.trajectories.observations[:, 0], \
        light.trajectories.observations[:, 1]
    assert np.array_equal(start, heavy.trajectories.observations[:, 0])
    assert np.abs(light_next - heavy.trajectories.observations[:, 1]).min() > 1e-4
    for gravity, run in ((5.0, light), (15.0, heavy)):
        np.testing.assert_allclose(run.trajectories.observations[:, 1],
                                   pendulum_step(start, ACTIONS, gravity), atol=2e-6)
    assert not np.array_equal(light.trajectories.rewards, heavy.trajectories.rewards)


def test_reset_options_reach_the_simulators_reset():
    class UprightStart(PendulumGravity):  # Pendulum reads its start range from options
        def reset_options(self, task):
            return {"x_init": 0.0, "y_init": 0.0}

    run = GymCollector(UprightStart(horizon=1), rollouts=2).collect(
        fixed_actions, np.float32(9.0), [3, 3])
    np.testing.assert_array_equal(run.trajectories.observations[:, 0], [[1, 0, 0]] * 2)


class HangingGravity(PendulumGravity):
    """Its simulators hang on the task 99 (in the worker process that steps them)."""

    def set_task(self, env, task):
        if float(task) == 99.0:
            time.sleep(30)
        super().set_task(env, task)


def test_collection_is_bit_identical_whatever_the_number_of_workers():
    """The learner's stochastic policy in Pendulum (two gravities) and HalfCheetah (a
    task reward from the simulator's info): 1, 2 and 3 worker processes give the same
    trajectories bit for bit. Then a worker that hangs ends its pool within the time
    limit, and the pool refuses further work."""
    runs = {}
    for name, environment, task, size in (
            ("pendulum", HangingGravity(horizon=4), [np.float32(6.0), np.float32(13.0)], 3),
            ("cheetah", HalfCheetahVelocity(horizon=4), [np.float32(1.2)], 17)):
        policy = sampled_policy(environment, size)
        for workers in (1, 2, 3):
            collector = GymCollector(environment, rollouts=3, workers=workers,
                                     step_time_limit=None if workers < 3 else 1.0)
            runs[name, workers] = [collector.collect(policy, t, [5, 8]) for t in task]
            if name == "pendulum" and workers == 3:
                start = time.monotonic()
                with pytest.raises(SimulatorError, match=r"the simulator's reset did not "
                                   r"return within 1 s \(HangingGravity task 99\.0"):
                    collector.collect(policy, np.float32(99.0), [5, 8])
                assert time.monotonic() - start < 10
                assert not any(p.is_alive() for p in collector.env.workers.processes)
                with pytest.raises(RuntimeError, match="worker processes were ended"):
                    collector.collect(policy, np.float32(6.0), [5, 8])
            collector.close()
    for name in ("pendulum", "cheetah"):
        for workers in (2, 3):
            for one, many in zip(runs[name, 1], runs[name, workers]):
                for field in ("observations", "actions", "rewards", "mask"):
                    a, b = (getattr(r.trajectories, field) for r in (one, many))
                    assert a.dtype == b.dtype and np.array_equal(a, b), (name, workers,
                                                                         field)
                assert np.array_equal(one.log_probs, many.log_probs)
    light, heavy = runs["pendulum", 1]
    assert not np.array_equal(light.trajectories.observations,
                              heavy.trajectories.observations)
    assert np.ptp(runs["cheetah", 1][0].trajectories.rewards) > 0
