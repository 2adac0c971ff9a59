"""RL² (metalearn.rl.recurrent): the recurrent policy against a hand-unrolled GRU in
NumPy (log-probabilities; a near-deterministic policy simulated end to end on two
tasks, the hidden state carried across a trial's episodes and started afresh for each
task), the clipped-ratio meta-gradient against finite differences in float64, and the
gin file's training through the entry point's loop."""

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn.rl import (DiCE, LinearFeatureBaseline, ClippedRatio, PointNavigation,
                          RecurrentPolicyLearner, RecurrentTrial, recurrent_policy)
from metalearn.testing.reference import finite_difference_variables, relative_error

H, K, UNITS = 3, 2, 3


def _learner(log_std=0.0, rollouts=2, horizon=H, units=UNITS, estimator=None):
    keras.utils.set_random_seed(0)
    env = PointNavigation(horizon=horizon, tolerance=0.0, dtype="float64")
    model = recurrent_policy(env, units=units, initial_log_std=log_std)
    model.get_layer("policy").kernel.assign(  # outputs of the order of the moves
        np.random.default_rng(1).normal(0, 1.0, (units, 2)))
    return RecurrentPolicyLearner(model, env, RecurrentTrial(K), rollouts=rollouts,
                                  estimator=estimator)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _reference(learner, inputs, reset_between_episodes=False):
    """``[n, T, 4]`` outputs of the policy on ``inputs [n, T, in]``: Keras' GRUCell
    (reset_after) written out in NumPy, from a zero hidden state, carried over every
    step (or reset at each episode's start)."""
    m = learner.model
    gru = m.get_layer("gru")
    kernel, recurrent, bias = (np.asarray(v) for v in (gru.kernel, gru.recurrent_kernel,
                                                       gru.bias))
    dense = m.get_layer("policy")
    log_std = np.asarray(m.get_layer("log_std").log_std)
    n, steps, _ = inputs.shape
    h = np.zeros((n, UNITS))
    outputs = []
    for t in range(steps):
        if reset_between_episodes and t % H == 0:
            h = np.zeros((n, UNITS))
        x_z, x_r, x_h = np.split(inputs[:, t] @ kernel + bias[0], 3, -1)
        r_z, r_r, r_h = np.split(h @ recurrent + bias[1], 3, -1)
        z, r = _sigmoid(x_z + r_z), _sigmoid(x_r + r_r)
        h = z * h + (1 - z) * np.tanh(x_h + r * r_h)
        mean = h @ np.asarray(dense.kernel) + np.asarray(dense.bias)
        outputs.append(np.concatenate([mean, np.broadcast_to(log_std, mean.shape)], -1))
    return np.stack(outputs, 1)


def _gaussian_log_prob(outputs, actions):
    mean, log_std = np.split(outputs, 2, -1)
    z = (actions - mean) / np.exp(log_std)
    return np.sum(-0.5 * z ** 2 - log_std - 0.5 * np.log(2 * np.pi), -1)


def test_log_probs_match_a_hand_unrolled_gru_carried_across_the_episodes():
    learner = _learner()
    task = tf.constant([0.3, -0.2], tf.float64)
    trials, _ = learner.trajectories(learner.initial_weights(), task,
                                     tf.constant([3, 4], tf.int64))
    inputs, actions = trials.observations.numpy(), trials.actions.numpy()
    assert inputs.shape == (2, K * H, 2 + 2 + 2)
    # the second episode starts at the origin, told the last action and reward, done 1
    np.testing.assert_array_equal(inputs[:, H, :2], 0.0)
    np.testing.assert_array_equal(inputs[:, H, 2:4], actions[:, H - 1])
    np.testing.assert_array_equal(inputs[:, H, 4], trials.rewards.numpy()[:, H - 1])
    np.testing.assert_array_equal(inputs[:, :, 5], [[0, 0, 0, 1, 0, 0]] * 2)
    ours = learner.policy_log_probs(learner.initial_weights(), trials.observations,
                                    trials.actions, trials.mask).numpy()
    reference = _gaussian_log_prob(_reference(learner, inputs), actions)
    np.testing.assert_allclose(ours, reference, rtol=1e-10, atol=1e-12)
    # the second episode's figures need the state carried: reset, they differ
    reset = _gaussian_log_prob(_reference(learner, inputs, True), actions)
    np.testing.assert_allclose(ours[:, :H], reset[:, :H], rtol=1e-10)
    assert np.max(np.abs(ours[:, H:] - reset[:, H:])) > 1e-3


def test_a_trial_simulated_by_hand_carries_the_state_and_restarts_it_per_task():
    """A policy with log std -30 acts its mean: two tasks in one MapFn batch, each
    trial simulated in NumPy (the GRU, PointNavigation's moves and rewards) from a zero
    hidden state carried over the episode boundary, give the learner's returns."""
    learner = _learner(log_std=-30.0, rollouts=1)
    episodes = learner.environment.sample(tf.constant([5, 6], tf.int64), 2)
    figures = learner.meta_metrics(episodes, formulation="map_fn")
    for i, goal in enumerate(episodes.query_x.numpy()):
        h_model = _reference  # the GRU of _reference, one step at a time below
        inputs, position, returns = [], np.zeros(2), []
        previous, reward = np.zeros(2), 0.0
        for episode in range(K):
            position, total = np.zeros(2), 0.0
            for t in range(H):
                x = np.concatenate([position, previous, [reward, float(episode > 0
                                                                       and t == 0)]])
                inputs.append(x)
                mean = h_model(learner, np.array(inputs)[None])[0, -1, :2]
                position = position + np.clip(mean, -1, 1) * 0.1
                reward = -np.linalg.norm(position - goal)
                previous, total = mean, total + reward
            returns.append(total)
        np.testing.assert_allclose([figures["first_return"][i], figures["last_return"][i]],
                                   returns, rtol=1e-9)
        assert abs(returns[1] - returns[0]) > 1e-3  # the episodes differ: the state carried


def test_the_clipped_ratio_meta_gradient_matches_finite_differences():
    """The clipped-ratio objective of collected trials (float64): its gradient by the
    tape equals central differences, at the collecting values (ratio 1) and after a
    move (ratios off 1, some clipped)."""
    learner = _learner(rollouts=2, horizon=2, units=2, estimator=DiCE(
        baseline=LinearFeatureBaseline(), normalize_advantages=True))
    episodes = learner.environment.sample(tf.constant([7, 8], tf.int64), 2)
    rule = ClippedRatio(keras.optimizers.SGD(0.1), epochs=1, clip=0.2)
    region = rule.region(learner, episodes, metalearn.execution.MapFn())
    variables = learner.meta_variables
    objective = lambda: region.mean(region.figures(), "clipped")
    rng = np.random.default_rng(2)
    for move in (0.0, 0.3):
        for v in variables:
            v.assign(v.numpy() + move * rng.normal(size=v.shape))
        with tf.GradientTape() as tape:
            value = objective()
        grads = {v.path: g.numpy() for v, g in zip(variables, tape.gradient(value,
                                                                            variables))}
        assert relative_error(grads, finite_difference_variables(
            objective, variables, eps=1e-6)) < 1e-6
    ratio_figures = region.figures()
    assert float(tf.reduce_mean(ratio_figures["clipped"])) != pytest.approx(
        float(tf.reduce_mean(ratio_figures["surrogate"])), abs=1e-9)  # the clip is active


def test_steps_count_episodes_of_the_trial_and_bad_steps_are_named():
    learner = _learner(log_std=-30.0, rollouts=1)
    episode = tf.nest.map_structure(lambda t: t[0], learner.environment.sample(
        tf.constant([5, 6], tf.int64), 1))
    runs = learner.run_task(episode, (0, 1))
    assert float(runs[0].metrics["return"]) == float(runs[0].metrics["first_return"])
    assert float(runs[1].metrics["return"]) == float(runs[1].metrics["last_return"])
    with pytest.raises(ValueError, match=r"k must be 0 \.\. 1, got steps=2"):
        learner.run_task(episode, 2)
    with pytest.raises(TypeError, match="must be a metalearn.rl.RecurrentTrial"):
        RecurrentPolicyLearner(learner.model, learner.environment,
                               metalearn.adapters.GradientDescent(1))


def test_the_gin_file_trains_with_the_clipped_ratio(tmp_path):
    from metalearn.training import build_experiment, parse_config, train
    parse_config(["experiments/rl/rl2_point_navigation.gin"],
                 ["Loop.num_steps = 1", "Loop.log_every = 1", "PointNavigation.horizon = 3",
                  "RecurrentPolicyLearner.rollouts = 2", "Experiment.meta_batch_size = 1",
                  "recurrent_policy.units = 4", "ClippedRatio.epochs = 1",
                  "Runtime.jit_compile = False"])
    try:
        experiment = build_experiment()
        assert isinstance(experiment.learner, RecurrentPolicyLearner)
        before = [v.numpy() for v in experiment.learner.meta_variables]
        metrics = train(experiment, str(tmp_path))
    finally:
        gin.clear_config()
    assert np.isfinite(metrics["return"]) and np.isfinite(metrics["last_return"])
    assert any(np.max(np.abs(a - v.numpy())) > 0
               for a, v in zip(before, experiment.learner.meta_variables))


def test_evaluation_pairs_with_the_maml_file_on_the_same_tasks():
    """``evaluate`` gives RL²'s file the MAML file's test tasks and seeds (the same
    ``episodes`` digest: what docs/results/meta_rl.md's paired table rests on), and
    reads both of its columns from one trial per task: episode 1's return after 0
    "steps" is the first episode of the trial measured after 1."""
    from metalearn.training import build_experiment, evaluate, parse_config
    shrunk = ["PointNavigation.horizon = 3", "evaluate.num_tasks = 2",
              "evaluate.batch_size = 2"]
    files = {"experiments/rl/rl2_point_navigation.gin": [
                 "RecurrentPolicyLearner.rollouts = 2", "recurrent_policy.units = 4"],
             "experiments/rl/point_nav_maml.gin": [
                 "PolicyLearner.rollouts = 2", "mlp.hidden = (4,)",
                 "evaluate.inner_steps = (0, 1)"]}
    reports = []
    for path, params in files.items():
        parse_config([path], shrunk + params)
        try:
            experiment = build_experiment()
            reports.append(evaluate(experiment.learner, experiment.sampler,
                                    formulation=experiment.formulation))
        finally:
            gin.clear_config()
    rl2, maml = reports
    assert rl2["episodes"] == maml["episodes"]
    assert rl2["num_tasks"] == maml["num_tasks"] == 2
    per_task = rl2["per_task"]
    assert per_task["0"]["return"] == per_task["1"]["first_return"]
    assert per_task["1"]["return"] == per_task["0"]["last_return"]
    assert per_task["0"]["return"] != per_task["1"]["return"]
