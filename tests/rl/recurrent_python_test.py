"""RL² on Python environments: trials collected outside the step by
``GymCollector.collect_trials`` (the recurrent policy stepped in the collecting process,
its hidden state carried across a trial's episodes) against the in-graph
``RecurrentPolicyLearner.trajectories`` on the twin of ``tests/rl_fixtures.PythonPoint``
(``PointNavigation`` with tolerance 0), the clipped-ratio objective and its gradient on
collected trials against the in-graph ones, and a tiny Meta-World ML1 run of
``experiments/rl/metaworld_ml1_reach_rl2.gin`` through ``metalearn.train`` and
``metalearn.evaluate``.

Everything is float32 here (a Python environment's trajectories are): the positions,
rewards and inputs are the same IEEE float32 operations in NumPy as in TensorFlow, so
the trials are compared bit for bit; the objective and gradients, whose reductions run
in different orders in the two graphs, to float32 rounding."""

import json

import gin
import gymnasium
import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution
from metalearn.rl import (ClippedRatio, DiCE, GymCollector, LinearFeatureBaseline,
                          MetaWorldAgent, PointNavigation, RecurrentPolicyLearner,
                          RecurrentTrial, recurrent_policy, success_rate)
from metalearn.rl.gym import GymCollection
from tests.rl_fixtures import HORIZON, PointEnv, PythonPoint

EPISODES, ROLLOUTS = 2, 3
IN_GRAPH = PointNavigation(horizon=HORIZON, tolerance=0.0)


class EndingPointEnv(PointEnv):
    """``PointEnv`` that ends an episode (``terminated``, ``info["success"]`` 1) once
    both coordinates are within ``TOLERANCE`` of the goal (set by the task), as the
    in-graph ``PointNavigation(tolerance=TOLERANCE)``."""

    goal = np.zeros(2, np.float32)

    def step(self, action):
        observation, reward, _, truncated, info = super().step(action)
        ended = bool(np.all(np.abs(observation - self.goal) < TOLERANCE))
        return observation, reward, ended, truncated, {**info, "success": float(ended)}


gymnasium.register("MetalearnTestEndingPoint-v0", entry_point=EndingPointEnv)
TOLERANCE = 0.1


class EndingPoint(PythonPoint):
    env_id = "MetalearnTestEndingPoint-v0"
    step_infos = ("success",)

    def set_task(self, env, task):
        env.unwrapped.goal = np.asarray(task, np.float32)

    def task_metrics(self):
        return {"success": success_rate}


def _learners(units=4):
    """The in-graph and the Python learner around one recurrent policy (its read-out
    scaled so that the moves, hence the inputs, are of the order of the goals)."""
    keras.utils.set_random_seed(5)
    model = recurrent_policy(IN_GRAPH, units=units, initial_log_std=-0.5)
    model.get_layer("policy").kernel.assign(
        np.random.default_rng(1).normal(0, 1.0, (units, 2)).astype(np.float32))
    make = lambda env: RecurrentPolicyLearner(
        model, env, RecurrentTrial(EPISODES), rollouts=ROLLOUTS,
        estimator=DiCE(discount=0.99, baseline=LinearFeatureBaseline(),
                       normalize_advantages=True))
    return make(IN_GRAPH), make(PythonPoint())


def _trial(learner, goal, seed):
    collector = GymCollector(PythonPoint(), rollouts=ROLLOUTS)
    return learner.policy_sampler().collect(collector, learner.initial_weights(),
                                            goal.numpy(), seed), collector


def test_collected_trials_equal_the_in_graph_trials_bit_for_bit():
    in_graph, python = _learners()
    goal, seed = tf.constant([0.3, -0.2]), tf.constant([7, 9], tf.int64)
    collected, collector = _trial(python, goal, seed)
    expected, _ = in_graph.trajectories(in_graph.initial_weights(), goal, seed)
    found = collected.trajectories
    T = EPISODES * HORIZON
    assert found.observations.shape == (ROLLOUTS, T, 2 + 2 + 2)
    for name in ("observations", "actions", "rewards", "mask"):
        np.testing.assert_array_equal(getattr(found, name), getattr(expected, name).numpy(),
                                      err_msg=name)
    done = found.observations[..., -1]
    assert done[:, HORIZON].tolist() == [1.0] * ROLLOUTS and done.sum() == ROLLOUTS
    # the inputs of the second episode start from the first one's last action and reward
    np.testing.assert_array_equal(found.observations[:, HORIZON, 2:4],
                                  found.actions[:, HORIZON - 1])
    np.testing.assert_array_equal(found.observations[:, HORIZON, 4],
                                  found.rewards[:, HORIZON - 1])
    # the behaviour log-probabilities are those of the policy unrolled over the trial
    log_probs = in_graph.policy_log_probs(in_graph.initial_weights(), expected.observations,
                                          expected.actions, expected.mask)
    np.testing.assert_allclose(collected.log_probs, log_probs.numpy(), rtol=1e-5, atol=1e-6)
    assert collector.steps_taken == ROLLOUTS * T
    # the two episodes' hidden states differ: episode 2 is not a restart of episode 1
    assert not np.array_equal(found.actions[:, :HORIZON], found.actions[:, HORIZON:])


def test_an_episode_that_ends_early_is_padded_as_in_graph():
    """Episodes that end early (``terminated``): up to the step after the end, the
    first episode is the in-graph one; after it the rewards, the previous-reward inputs
    and the step infos are zero while the policy keeps acting (the mask all ones, the
    log-probabilities of every step kept), the next episode starts afresh with the done
    flag; ``success`` is taken per episode, as ``return``."""
    _, python = _learners()
    learner = RecurrentPolicyLearner(python.model, EndingPoint(), RecurrentTrial(EPISODES),
                                     rollouts=6)
    in_graph = RecurrentPolicyLearner(python.model, PointNavigation(
        horizon=HORIZON, tolerance=TOLERANCE), RecurrentTrial(EPISODES), rollouts=6)
    goal, seed = tf.constant([0.1, 0.08]), tf.constant([2, 3], tf.int64)
    collector = GymCollector(EndingPoint(), rollouts=6)
    collected = learner.policy_sampler().collect(collector, learner.initial_weights(),
                                                 goal.numpy(), seed)
    expected, _ = in_graph.trajectories(in_graph.initial_weights(), goal, seed)
    found = collected.trajectories
    success = found.infos["success"].reshape(6, EPISODES, HORIZON)
    ends = [[int(np.argmax(row)) if row.any() else None for row in copy] for copy in success]
    assert any(e[0] is not None and e[0] < HORIZON - 2 for e in ends)  # some end early
    assert any(e[0] is None for e in ends)                              # some do not
    np.testing.assert_array_equal(found.mask, np.ones([6, EPISODES * HORIZON]))
    assert np.all(collected.log_probs != 0)
    rewards = found.rewards.reshape(6, EPISODES, HORIZON)
    for i, copy in enumerate(ends):
        for e, end in enumerate(copy):
            if end is None:
                assert np.all(rewards[i, e] != 0)
                continue
            assert np.all(rewards[i, e, :end + 1] != 0)
            assert np.all(rewards[i, e, end + 1:] == 0)
            assert np.all(success[i, e, end + 1:] == 0)
            start = e * HORIZON
            np.testing.assert_array_equal(  # the previous reward read: 0 after the end
                found.observations[i, start + end + 2:start + HORIZON, 4], 0)
        first = HORIZON if copy[0] is None else copy[0] + 2  # in-graph up to here
        for name in ("observations", "actions", "rewards"):
            np.testing.assert_array_equal(getattr(found, name)[i, :first],
                                          getattr(expected, name).numpy()[i, :first])
    np.testing.assert_array_equal(found.observations[:, HORIZON, :2], 0)  # a fresh reset
    np.testing.assert_array_equal(found.observations[:, :, -1].sum(1), 1)  # done once
    assert found.observations[0, HORIZON, -1] == 1
    episode = tf.nest.map_structure(lambda t: t[0], EndingPoint().sample(
        tf.constant([1, 1], tf.int64), 1))
    episode = episode._replace(query_x=goal, query_y=tf.nest.map_structure(
        tf.constant, collected), support_y=tf.nest.map_structure(
        lambda t: tf.zeros([0, *t.shape], t.dtype), collected))
    reached = (success.max(-1) > 0).mean(0)  # per episode, over the copies
    for steps, value in ((None, reached.mean()), (0, reached[0]), (1, reached[1])):
        np.testing.assert_allclose(learner.run_task(episode, steps).metrics["success"],
                                   value, rtol=1e-6)
    assert reached[0] != reached[1]


def test_the_clipped_ratio_on_collected_trials_equals_the_in_graph_one():
    """GymCollection (the training loop's hook) gives every task its trial and no
    support; the clipped-ratio objective, the figures and the gradient on them equal
    the in-graph learner's, which samples the trials inside the step, at the
    collecting weights (the ratio 1) and after a move of the weights (ratios off 1:
    the collected trials are replayed with the likelihood ratio to the collecting
    policy, the in-graph collected ones likewise)."""
    in_graph, python = _learners()
    episodes = IN_GRAPH.sample(tf.constant([5, 1], tf.int64), 2)
    collection = GymCollection(python, GymCollector(PythonPoint(), rollouts=ROLLOUTS))
    try:
        collected = collection(episodes)
        again = collection(episodes, steps=1)  # evaluation's steps: still no support
    finally:
        collection.close()
    assert collected.query_y.trajectories.observations.shape == (2, ROLLOUTS,
                                                                 EPISODES * HORIZON, 6)
    assert collected.support_y.weights.shape == (2, 0, ROLLOUTS)
    assert again.support_y.weights.shape == (2, 0, ROLLOUTS)
    with pytest.raises(TypeError, match=r"needs collect\(collector, weights, task, seed\)"):
        GymCollection(python, collection.collector, sampler=lambda weights: None)
    rule = ClippedRatio(keras.optimizers.SGD(0.1), epochs=1, clip=0.2)
    formulation = execution.MapFn()
    regions = [rule.region(learner, batch, formulation)
               for learner, batch in ((in_graph, episodes), (python, collected))]
    variables = in_graph.meta_variables  # one model: the same variables
    rng = np.random.default_rng(2)
    for move in (0.0, 0.3):
        for v in variables:
            v.assign(v.numpy() + move * rng.normal(size=v.shape).astype(np.float32))
        values, grads, figures = [], [], []
        for region in regions:
            with tf.GradientTape() as tape:
                figures.append(region.figures())
                values.append(region.mean(figures[-1], "clipped"))
            grads.append(tape.gradient(values[-1], variables))
        np.testing.assert_allclose(values[1].numpy(), values[0].numpy(), rtol=1e-5)
        for a, b in zip(grads[1], grads[0]):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(figures[1]["surrogate"].numpy(),
                                   figures[0]["surrogate"].numpy(), rtol=1e-5)
        assert np.abs(np.concatenate([g.numpy().ravel() for g in grads[0]])).max() > 1e-3
    moved = figures[0]  # ratios off 1, some clipped: the surrogate and the clipped differ
    assert abs(float(tf.reduce_mean(moved["clipped"] - moved["surrogate"]))) > 1e-6


def test_returns_per_episode_and_steps_and_the_meta_gradient_as_in_graph():
    """On a collected episode the learner's figures are the in-graph ones: ``return``
    the trial's mean episode return, or episode ``k + 1``'s with ``steps=k``; the DiCE
    meta-gradient (``MetaGradient``) of the batch is the in-graph one."""
    in_graph, python = _learners()
    episodes = IN_GRAPH.sample(tf.constant([3, 4], tf.int64), 1)
    collection = GymCollection(python, GymCollector(PythonPoint(), rollouts=ROLLOUTS))
    try:
        collected = collection(episodes)
    finally:
        collection.close()
    one = lambda e: tf.nest.map_structure(lambda t: t[0], e)
    for steps in (None, 0, 1):
        found = python.run_task(one(collected), steps).metrics
        expected = in_graph.run_task(one(episodes), steps).metrics
        for name in ("return", "first_return", "last_return", "loss"):
            np.testing.assert_allclose(found[name].numpy(), expected[name].numpy(),
                                       rtol=1e-5, err_msg=f"{name}, steps={steps}")
    assert float(found["first_return"]) != float(found["last_return"])
    # the meta-gradient (DiCE) of the batch: the same as in-graph at the collecting weights
    rule = metalearn.MetaGradient(keras.optimizers.SGD(1.0))
    expected = rule.directions(in_graph, episodes, execution.MapFn())[0]
    found = rule.directions(python, collected, execution.MapFn())[0]
    for a, b in zip(found, expected):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
    assert np.abs(np.concatenate([d.numpy().ravel() for d in expected])).max() > 1e-3


MW_TINY = ["MetaWorld.horizon = 4", "GymCollector.rollouts = 2",
           "RecurrentPolicyLearner.rollouts = 2", "Experiment.meta_batch_size = 2",
           "Loop.num_steps = 1", "Loop.checkpoint_every = 1", "recurrent_policy.units = 4",
           "ClippedRatio.epochs = 1", "evaluate.num_tasks = 2", "evaluate.batch_size = 2"]
"""experiments/rl/metaworld_ml1_reach_rl2.gin shrunk to seconds."""


def test_the_metaworld_rl2_config_trains_and_evaluates_through_the_entry_points(tmp_path):
    """The RL² file on Meta-World ML1 reach: one meta-step of the training loop (the
    trials collected by the collection hook), then ``metalearn.evaluate`` on the test
    goals: ``return`` and ``success`` of episodes 1 and 2 of each trial; Meta-World's
    own evaluator refuses the RL² learner by name."""
    from metalearn.training import build_experiment, evaluate, parse_config, train
    parse_config(["experiments/rl/metaworld_ml1_reach_rl2.gin"], MW_TINY)
    try:
        experiment = build_experiment()
        assert isinstance(experiment.learner, RecurrentPolicyLearner)
        assert experiment.learner.adapter.episodes == 2
        metrics = train(experiment, str(tmp_path))
        report = evaluate(experiment.learner, experiment.sampler,
                          formulation=experiment.formulation)
    finally:
        gin.clear_config()
    assert {"return", "first_return", "last_return", "success"} <= set(metrics)
    assert np.isfinite(metrics["return"]) and 0 <= metrics["success"] <= 1
    assert sorted(report["results"]) == ["0", "1"]
    per_task = report["per_task"]
    assert per_task["0"]["return"] == per_task["1"]["first_return"]
    assert per_task["1"]["return"] == per_task["1"]["last_return"]
    for figures in report["results"].values():
        assert np.isfinite(figures["return"]["mean"])
        assert 0 <= figures["success"]["mean"] <= 1
    json.dumps(report)
    with pytest.raises(TypeError, match="MetaWorldAgent .* RecurrentPolicyLearner"):
        MetaWorldAgent(experiment.learner)


def test_evaluation_collects_each_trial_once_for_every_count(monkeypatch):
    """RL²'s trials do not depend on the count evaluated (episode ``k + 1`` of one
    trial): ``metalearn.evaluate`` collects each batch once for ``inner_steps = (0,
    1)`` (``Collection.depends_on_steps``) and gives the figures of evaluating each
    count on its own."""
    from metalearn.training import evaluate
    _, python = _learners()
    calls = []
    collect_trials = GymCollector.collect_trials
    monkeypatch.setattr(GymCollector, "collect_trials", lambda self, *a, **k: (
        calls.append(1), collect_trials(self, *a, **k))[1])
    monkeypatch.setattr(PythonPoint, "collection", lambda self, learner: GymCollection(
        learner, GymCollector(self, rollouts=ROLLOUTS)))
    both = evaluate(python, PythonPoint(), num_tasks=2, batch_size=2, inner_steps=(0, 1))
    assert len(calls) == 2  # one trial set per task, not one per task and count
    for steps in (0, 1):
        alone = evaluate(python, PythonPoint(), num_tasks=2, batch_size=2,
                         inner_steps=(steps,))
        assert alone["per_task"][str(steps)] == both["per_task"][str(steps)], steps
    assert both["per_task"]["0"]["return"] != both["per_task"]["1"]["return"]
