"""Meta-World v3 (``metalearn.rl.MetaWorld``): its task sets, the task reaching the
simulator, the ``success`` metric, collection across worker processes, and the agent
run through Meta-World's own ``metalearning_evaluation``.

Kept small for the suite's budget: ML1 reach with horizons of a few steps and tiny
policies; one test that starts worker processes. The bad inputs are cases of
``tests/rl/bad_rl_test.py`` (docs/errors.md)."""

import pickle

import keras
import numpy as np
import pytest
import tensorflow as tf

metaworld = pytest.importorskip("metaworld")
pytestmark = pytest.mark.xdist_group(__name__)  # the module's fixture, built once

import metalearn  # noqa: E402  (after the skip)
from metalearn.adapters import GradientDescent  # noqa: E402
from metalearn.rl import (DiCE, GymCollector, MetaWorld, MetaWorldAgent,  # noqa: E402
                          PolicyLearner, PolicySampler, Rollouts, collect_episodes,
                          gaussian_policy, success_rate)
from metalearn.rl.environments import Trajectories  # noqa: E402
from metalearn.rl.gym import PythonEnvironment  # noqa: E402


@pytest.fixture(scope="module")
def reach():
    """ML1 reach-v3, benchmark seed 0, 4-step rollouts (made once: Meta-World draws its
    goals by resetting its simulators)."""
    return MetaWorld("ML1", "reach-v3", seed=0, horizon=4)


def _goal(environment, task):
    """The task's goal vector as Meta-World keeps it (``rand_vec`` in its task's data,
    read here independently of the library, which hands the task to the simulator)."""
    return np.asarray(pickle.loads(environment.task(task).data)["rand_vec"])


def _learner(environment, rollouts=2):
    keras.utils.set_random_seed(5)
    model = gaussian_policy(metalearn.models.mlp((39,), hidden=(8,), outputs=4))
    return PolicyLearner(model, environment, GradientDescent(1, 0.1, wrappers=[Rollouts()]),
                         rollouts=rollouts, estimator=DiCE())


def _same_tasks(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.env_name == b.env_name
        ka, kb = pickle.loads(a.data), pickle.loads(b.data)
        np.testing.assert_array_equal(ka["rand_vec"], kb["rand_vec"])
        assert ka["partially_observable"] and kb["partially_observable"]


def test_task_sets_are_meta_worlds(reach):
    """The train and test tasks are Meta-World's ML1 sets for the seed (50 goals each,
    the test goals from seed + 1, the goal hidden); the train split draws from the
    training tasks, validation and test from the test tasks, as a pure function of the
    seed."""
    benchmark = metaworld.ML1("reach-v3", seed=0)
    _same_tasks(reach.task_sets[0], benchmark.train_tasks)
    _same_tasks(reach.task_sets[1], benchmark.test_tasks)
    assert reach.observation_size == 39 and reach.action_size == 4
    seed = tf.constant([3, 1], tf.int64)
    for split, which in (("train", 0), ("validation", 1), ("test", 1)):
        tasks = reach.sample(seed, 30, split).support_x.numpy()
        assert (tasks[:, 0] == which).all() and (0 <= tasks[:, 1]).all()
        assert (tasks[:, 1] < 50).all() and len(set(tasks[:, 1])) > 10
        np.testing.assert_array_equal(tasks, reach.sample(seed, 30, split).support_x)
    assert not np.array_equal(_goal(reach, [0, 7]), _goal(reach, [1, 7]))


def test_the_task_sets_the_simulators_goal(reach):
    """set_task (through the collector's reset) puts the task's goal in the simulator:
    its target position is the goal's; in collected rollouts the start observation holds
    the task's object position, and two goals give other rewards under the same
    actions."""
    env = reach.make_env()
    for task in ([0, 3], [1, 11]):
        reach.set_task(env, np.array(task))
        env.reset(seed=1)
        np.testing.assert_allclose(env.current._target_pos, _goal(reach, task)[3:], atol=1e-9)
    env.close()
    still = lambda observations, seed: (np.zeros([len(observations), 4], np.float32),
                                        np.zeros([len(observations)], np.float32))
    collector = GymCollector(reach, rollouts=2)
    near, far = (collector.collect(still, np.array(t), [2, 9]) for t in ([0, 3], [0, 4]))
    collector.close()
    for task, run in (([0, 3], near), ([0, 4], far)):
        np.testing.assert_allclose(run.trajectories.observations[:, 0, 4:7],
                                   np.tile(_goal(reach, task)[:3], (2, 1)), atol=1e-6)
    assert np.abs(near.trajectories.rewards - far.trajectories.rewards).min() > 1e-6
    assert set(near.trajectories.infos) == {"success"}


class ScriptedSuccess(PythonEnvironment):
    """A simulator whose ``info["success"]`` follows a script per copy (to check the
    metric against a stream written by hand); copy 1 ends after 2 steps."""

    observation_size, action_size, horizon, env_id = 1, 1, 4, "scripted"
    step_infos = ("success",)
    SCRIPT = [[0, 0, 1, 0], [0, 0, 1, 1], [0, 0, 0, 0]]  # copy 1 succeeds after its end

    def tasks(self, seed, num_tasks):
        return tf.zeros([num_tasks])

    def make_env(self):
        import gymnasium

        script = self.SCRIPT

        class Scripted(gymnasium.Env):
            observation_space = gymnasium.spaces.Box(-1, 1, (1,), np.float32)
            action_space = gymnasium.spaces.Box(-1, 1, (1,), np.float32)

            def reset(self, *, seed=None, options=None):
                self.copy, self.t = (seed or 0) % 3, 0
                return np.zeros(1, np.float32), {}

            def step(self, action):
                success = float(script[self.copy][self.t])
                self.t += 1
                ended = self.copy == 1 and self.t == 2
                return (np.zeros(1, np.float32), 1.0, ended, False,
                        {"success": success})

        return Scripted()

    def task_reward(self, task, reward, info):
        return reward

    def task_metrics(self):
        return {"success": success_rate}


def test_success_is_any_step_of_the_episode():
    """By hand: copy 0 succeeds at step 2, copy 1 only after its episode ended (not
    counted), copy 2 never: the recorded stream is masked and the rate is 1/3; with
    weights (0.5, 0.25, 0.25), 0.5."""
    collector = GymCollector(ScriptedSuccess(), rollouts=3)
    zero = lambda observations, seed: (np.zeros([3, 1], np.float32), np.zeros([3], np.float32))
    run = collector.collect(zero, np.float32(0), [0, 0])
    collector.close()
    np.testing.assert_array_equal(run.trajectories.infos["success"],
                                  [[0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(run.trajectories.mask[1], [1, 1, 0, 0])
    batch = DiCE().targets(Trajectories(*[tf.constant(t) for t in run.trajectories[:4]],
                                        {"success": tf.constant(run.trajectories.infos[
                                            "success"])}))
    assert float(success_rate(batch, None)) == pytest.approx(1 / 3)
    weighted = batch._replace(weights=tf.constant([0.5, 0.25, 0.25]))
    assert float(success_rate(weighted, None)) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="success_rate needs the trajectories' per-step "
                       "'success'"):
        success_rate(batch._replace(infos={}), None)


def test_success_and_return_are_the_learners_metrics(reach):
    """Through the collection the meta-step takes (GymCollection): ``success`` beside
    ``return`` in the learner's metrics, each task's the collected query trajectories'."""
    learner = _learner(reach)
    assert learner.metric_names[:3] == ["loss", "return", "success"]
    episodes = reach.sample(tf.constant([0, 4], tf.int64), 2, "train")
    collector = GymCollector(reach, rollouts=2)
    collected = collect_episodes(learner, collector, episodes)
    collector.close()
    metrics = learner.meta_metrics(collected)
    query = collected.query_y.trajectories
    np.testing.assert_allclose(metrics["return"], query.rewards.numpy().sum(-1).mean(-1),
                               rtol=1e-5)
    expected = (query.infos["success"].numpy().max(-1) > 0).mean(-1)
    np.testing.assert_allclose(metrics["success"], expected)


def test_collection_is_bit_identical_with_one_and_two_workers(reach):
    policy = PolicySampler(_learner(reach))(_learner(reach).initial_weights())
    runs = []
    for workers in (1, 2):
        collector = GymCollector(reach, rollouts=2, workers=workers)
        runs.append(collector.collect(policy, np.array([0, 5]), [1, 2]))
        collector.close()
    one, two = runs
    for a, b in zip(one.trajectories[:4], two.trajectories[:4]):
        assert np.array_equal(a, b)
    assert np.array_equal(one.trajectories.infos["success"],
                          two.trajectories.infos["success"])
    assert np.array_equal(one.log_probs, two.log_probs)


def test_the_agent_runs_through_meta_worlds_evaluator(reach):
    """Meta-World's metalearning_evaluation on the agent (1 evaluation, 5 copies, one
    adaptation episode of 4 steps): finite figures, the per-task success rate of
    reach-v3, each copy adapted from its own episode by the learner's inner step."""
    from metalearn.rl.metaworld import metaworld_evaluation
    learner = _learner(reach)
    agent = MetaWorldAgent(learner, seed=3)
    report = metaworld_evaluation(learner, num_evals=1, adaptation_episodes=1,
                                  evaluation_episodes=1, meta_batch_size=5, agent=agent)
    assert np.isfinite(report["mean_success_rate"]) and np.isfinite(report["mean_return"])
    assert set(report["success_rate_per_task"]) == {"reach-v3"}
    assert 0 <= report["mean_success_rate"] <= 1
    # the adaptation: a copy's weights are the learner's one step on its own episode
    assert len(agent.rounds) == 1 and len(agent.weights) == 5
    initial = learner.initial_weights()
    for copy in (0, 4):
        support = tf.nest.map_structure(lambda t: tf.constant(t[None]), agent.rounds[0][copy])
        assert support.trajectories.observations.shape == (1, 1, 4, 39)
        expected = learner.adapt(tf.zeros([2], tf.int64), support, steps=1).weights
        for name in expected:
            np.testing.assert_allclose(agent.weights[copy][name], expected[name],
                                       rtol=1e-5, atol=1e-6)
        assert any(not np.allclose(agent.weights[copy][n], initial[n]) for n in initial)
