"""Python environments (metalearn.rl.gym): the Gymnasium vector collector and the data
flow outside the step, against the in-graph path.

A Gymnasium environment written here has the dynamics of the in-graph
``PointNavigation``; the collector uses the seeds an in-graph rollout uses, so the
collected trajectories equal the in-graph ones, and the meta-gradient of a Python
environment's collected episodes (pre-update trajectories, the adaptation, post-update
trajectories with the adapted weights, collected outside the step) equals the one the
in-graph learner takes inside the step. HalfCheetah's task rewards are checked against
the MuJoCo state.
"""

import json
import re
import threading
import time

import gymnasium
import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution
from metalearn.adapters import GradientDescent
from metalearn.rl import (DiCE, HalfCheetahDirection, HalfCheetahVelocity, PointNavigation,
                          PolicyLearner, Rollouts, gaussian_policy)
from metalearn.rl.gym import GymCollector, PolicySampler, SimulatorError, collect_episodes
from metalearn.repository import ROOT
from tests.rl_fixtures import HORIZON, PointEnv, PythonPoint
from tests.run_fixtures import not_installed

IN_GRAPH = PointNavigation(horizon=HORIZON, tolerance=0.0)


def _model():
    keras.utils.set_random_seed(4)
    return gaussian_policy(metalearn.models.mlp((2,), hidden=(8,), outputs=2,
                                                activation="tanh"), initial_log_std=-0.5)


def _learner(environment, model, steps=1):
    return PolicyLearner(model, environment, GradientDescent(steps, 0.1,
                                                             wrappers=[Rollouts()]),
                         rollouts=3, estimator=DiCE(discount=0.99))


@pytest.fixture(autouse=True)
def _no_faults():
    yield
    PointEnv.crash_at = PointEnv.nan_at = PointEnv.hang_at = None


def test_collected_trajectories_equal_the_in_graph_rollouts():
    model = _model()
    learner = _learner(IN_GRAPH, model)
    collector = GymCollector(PythonPoint(), rollouts=3)
    goal = tf.constant([0.3, -0.2])
    seed = tf.constant([7, 9], tf.int64)
    weights = learner.initial_weights()
    collected = collector.collect(PolicySampler(learner)(weights), goal.numpy(), seed)
    expected, _ = learner.trajectories(weights, goal, seed)
    for name in ("observations", "actions", "rewards", "mask"):
        np.testing.assert_allclose(getattr(collected.trajectories, name),
                                   getattr(expected, name).numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    log_probs = learner.policy_log_probs(weights, expected.observations, expected.actions,
                                         expected.mask)
    np.testing.assert_allclose(collected.log_probs, log_probs.numpy(), rtol=1e-5)
    np.testing.assert_allclose(collected.weights, [1 / 3] * 3, rtol=1e-7)
    assert collector.steps_taken == 3 * HORIZON


@pytest.mark.parametrize("steps", [1, 2])
def test_the_meta_gradient_of_collected_episodes_equals_the_in_graph_one(steps):
    """Pre-update trajectories, the adaptation, the post-update trajectories with the
    adapted weights: collected in Python, then the meta-step's DiCE meta-gradient on
    them equals the in-graph learner's, which samples everything inside the step."""
    model = _model()
    in_graph, python = _learner(IN_GRAPH, model, steps), _learner(PythonPoint(), model, steps)
    episodes = IN_GRAPH.sample(tf.constant([5, 1], tf.int64), 2)
    collected = collect_episodes(python, GymCollector(PythonPoint(), rollouts=3), episodes)
    assert collected.support_y.trajectories.observations.shape == (2, steps, 3, HORIZON, 2)
    rule = metalearn.MetaGradient(keras.optimizers.SGD(1.0))
    formulation = execution.formulation("map_fn")
    expected, expected_figures = tf.function(
        lambda e: rule.directions(in_graph, e, formulation))(episodes)
    found, figures = tf.function(lambda e: rule.directions(python, e, formulation))(collected)
    for a, b in zip(found, expected):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(figures["return"].numpy(), expected_figures["return"].numpy(),
                               rtol=1e-5)
    assert np.abs(np.concatenate([d.numpy().ravel() for d in expected])).max() > 1e-3


def test_a_simulator_failure_names_the_task_seed_and_step():
    model = _model()
    learner = _learner(PythonPoint(), model)
    collector = GymCollector(PythonPoint(), rollouts=2)
    policy = PolicySampler(learner)(learner.initial_weights())
    PointEnv.crash_at = 3
    with pytest.raises(SimulatorError, match=r"the simulator's step failed mid-rollout \(PythonPoint task "
                                             r"\[0\.25, 0\.5\], seed \[1, 2\], step 3\): "
                                             r"FloatingPointError"):
        collector.collect(policy, np.array([0.25, 0.5]), [1, 2])
    PointEnv.crash_at, PointEnv.nan_at = None, 1
    with pytest.raises(SimulatorError, match="non-finite observations or rewards "
                                             r"mid-rollout \(PythonPoint .* step 1\)"):
        collector.collect(policy, np.array([0.25, 0.5]), [1, 2])


class RewardFails(PythonPoint):
    def task_reward(self, task, reward, info):
        return info["speed"]  # no such key


def _policy(environment):
    learner = _learner(environment, _model())
    return PolicySampler(learner)(learner.initial_weights())


def test_a_failing_task_reward_names_the_task_seed_and_step():
    collector = GymCollector(RewardFails(), rollouts=2)
    with pytest.raises(SimulatorError, match=r"failed mid-rollout \(RewardFails task "
                                             r"\[0\.25, 0\.5\], seed \[1, 2\], step 0\): "
                                             r"KeyError: 'speed'") as info:
        collector.collect(_policy(RewardFails()), np.array([0.25, 0.5]), [1, 2])
    assert str(info.value).startswith("RewardFails.task_reward failed mid-rollout")


def test_a_hung_simulator_step_raises_after_the_time_limit():
    collector = GymCollector(PythonPoint(), rollouts=2, step_time_limit=0.5)
    policy = _policy(PythonPoint())
    PointEnv.hang_at = 2
    start = time.monotonic()
    with pytest.raises(SimulatorError, match=r"the simulator's step did not return within "
                                             r"0\.5 s \(PythonPoint task \[0\.25, 0\.5\], "
                                             r"seed \[1, 2\], step 2\)"):
        collector.collect(policy, np.array([0.25, 0.5]), [1, 2])
    assert time.monotonic() - start < 10
    PointEnv.hang_at = None  # the limit's timer is off again: a later collection runs
    collector = GymCollector(PythonPoint(), rollouts=2, step_time_limit=0.5)
    collector.collect(policy, np.array([0.25, 0.5]), [1, 2])
    time.sleep(0.7)  # no alarm left behind


def test_the_time_limit_puts_back_a_timer_and_handler_it_found():
    import signal
    fired = []
    mine = lambda *_: fired.append(True)
    previous = signal.signal(signal.SIGALRM, mine)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        collector = GymCollector(PythonPoint(), rollouts=2, step_time_limit=0.5)
        collector.collect(_policy(PythonPoint()), np.array([0.25, 0.5]), [1, 2])
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 20.0 < remaining <= 30.0  # what was left of the caller's timer
        assert signal.getsignal(signal.SIGALRM) is mine and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_hung_simulator_step_off_the_main_thread_raises_after_the_time_limit():
    # off the main thread no signal can interrupt the call: the collection stops
    # waiting for it (the simulator's thread is left to finish on its own)
    collector = GymCollector(PythonPoint(), rollouts=2, step_time_limit=0.5)
    policy = _policy(PythonPoint())
    PointEnv.hang_at, errors = 1, []

    def collect():
        try:
            collector.collect(policy, np.array([0.25, 0.5]), [1, 2])
        except SimulatorError as error:
            errors.append(error)
    thread = threading.Thread(target=collect)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert len(errors) == 1 and "did not return within 0.5 s" in str(errors[0])
    assert "seed [1, 2], step 1" in str(errors[0])


@pytest.mark.parametrize("limit, error, message", [
    (-1.0, ValueError, "GymCollector.step_time_limit must be > 0, got -1.0"),
    (0, ValueError, "GymCollector.step_time_limit must be > 0, got 0"),
    (float("nan"), ValueError, "GymCollector.step_time_limit must be > 0, got nan"),
    ("60", TypeError, "GymCollector.step_time_limit must be > 0, got '60' \\(str\\)")])
def test_the_time_limit_is_a_positive_number_or_none(limit, error, message):
    with pytest.raises(error, match=message):
        GymCollector(PythonPoint(), rollouts=1, step_time_limit=limit)
    assert GymCollector(PythonPoint(), rollouts=1, step_time_limit=None).step_time_limit \
        is None


def test_python_environments_refuse_in_graph_rollouts_and_unknown_ids():
    with pytest.raises(NotImplementedError, match="PythonPoint runs in Python: its "
                                                  "trajectories come from a "
                                                  "metalearn.rl.GymCollector"):
        PythonPoint().reset(None, 1, None)

    class Unknown(PythonPoint):
        env_id = "NoSuchEnvironment-v9"

    with pytest.raises(ValueError, match="Gymnasium cannot make 'NoSuchEnvironment-v9'"):
        GymCollector(Unknown(), rollouts=1)
    with pytest.raises(ValueError, match="rollouts must be a whole number >= 1, got 0"):
        GymCollector(PythonPoint(), rollouts=0)


@pytest.mark.parametrize("kind", ["velocity", "direction"])
def test_half_cheetah_task_rewards_from_the_mujoco_state(kind):
    """The task reward against the MuJoCo state: the forward velocity from the root's
    x position before and after each step, the control cost from the actions."""
    environment = HalfCheetahVelocity(horizon=4) if kind == "velocity" \
        else HalfCheetahDirection(horizon=4)
    goal = np.float32(1.3 if kind == "velocity" else -1.0)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1.5, 1.5, size=(4, 1, 6)).astype(np.float32)
    policy = lambda observations, seed: (actions[int(policy.t)], np.zeros(1, np.float32))
    policy.t = 0

    def stepping(observations, seed):
        result = policy(observations, seed)
        policy.t += 1
        return result

    collected = GymCollector(environment, rollouts=1).collect(stepping, goal, [3, 4])
    env = gymnasium.make("HalfCheetah-v5", ctrl_cost_weight=0.05)
    env.reset(seed=3)
    expected = []
    for t in range(4):
        before = float(env.unwrapped.data.qpos[0])
        env.step(np.clip(actions[t, 0], -1, 1))
        velocity = (float(env.unwrapped.data.qpos[0]) - before) / env.unwrapped.dt
        control = 0.05 * float(np.sum(np.clip(actions[t, 0], -1, 1) ** 2))
        expected.append((-abs(velocity - goal) if kind == "velocity" else goal * velocity)
                        - control)
    np.testing.assert_allclose(collected.trajectories.rewards[0], expected, rtol=1e-5,
                               atol=1e-6)
    assert collected.trajectories.observations.shape == (1, 4, 17)
    np.testing.assert_array_equal(collected.trajectories.actions[0], actions[:, 0])


def test_half_cheetah_collections_are_a_function_of_the_seed():
    """MuJoCo is deterministic given the seeds: two collectors (fresh simulators) give
    the same trajectories bit for bit, after other collections too; another seed
    gives others. What exact resume of a Python environment's run rests on."""
    environment = HalfCheetahVelocity(horizon=6)
    keras.utils.set_random_seed(2)
    model = gaussian_policy(metalearn.models.mlp((17,), hidden=(8,), outputs=6))
    learner = _learner(environment, model)
    policy = PolicySampler(learner)(learner.initial_weights())
    first, second = GymCollector(environment, rollouts=2), GymCollector(environment, rollouts=2)
    a = first.collect(policy, np.float32(1.0), [5, 6])
    second.collect(policy, np.float32(0.5), [1, 1])  # its simulators used before
    b = second.collect(policy, np.float32(1.0), [5, 6])
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
        assert np.array_equal(x, y)
    other = first.collect(policy, np.float32(1.0), [5, 7])
    assert not np.array_equal(other.trajectories.observations, a.trajectories.observations)


TINY = ["HalfCheetahVelocity.horizon = 10", "GymCollector.rollouts = 2",
        "Experiment.meta_batch_size = 2", "Loop.num_steps = 2", "Loop.checkpoint_every = 1",
        "mlp.hidden = (8,)", "evaluate.num_tasks = 2", "evaluate.batch_size = 2"]
"""experiments/rl/half_cheetah_vel_maml.gin shrunk to seconds."""


def test_the_half_cheetah_config_trains_and_evaluates_through_the_entry_points(tmp_path):
    """benchmarks/half_cheetah_maml.py on the shrunk config: MAML and the pretrained
    baseline each trained by the training loop (the sampler's collection gives every
    step its MuJoCo trajectories: checkpoints, summaries) and evaluated by
    metalearn.evaluate (returns after 0, 1, 2, 3 adaptation steps, 95 % intervals)."""
    import gin
    from benchmarks.half_cheetah_maml import run, table
    try:
        results = run(["experiments/rl/half_cheetah_vel_maml.gin"], TINY, str(tmp_path))
    finally:
        gin.clear_config()
    assert set(results["runs"]) == {"maml", "pretrained"}
    for name in ("maml", "pretrained"):
        workdir = tmp_path / name
        report = json.loads((workdir / "eval.json").read_text())
        assert report["checkpoint_step"] == 2 and report["num_tasks"] == 2
        assert sorted(report["results"]) == ["0", "1", "2", "3"]
        for figures in report["results"].values():
            assert np.isfinite(figures["return"]["mean"]) and figures["return"]["ci95"] > 0
        assert report["results"] == results["runs"][name]
        assert tf.train.latest_checkpoint(str(workdir / "checkpoints")).endswith("ckpt-2")
        tags = {value.tag for path in (workdir / "train").iterdir()
                for event in tf.compat.v1.train.summary_iterator(str(path))
                for value in event.summary.value}
        assert {"meta_loss", "meta_return"} <= tags
    # the pretrained run adapts with no inner step in training: no support collected
    assert "GradientDescent.steps = 0" in (tmp_path / "pretrained" / "config.gin").read_text()
    # the same tasks at each number of steps: the returns after 0 steps differ between
    # the two policies, the evaluation's episodes are the same
    assert results["runs"]["maml"]["0"] != results["runs"]["pretrained"]["0"]
    assert results["env_steps_per_second"] > 0
    assert table(results).splitlines()[0] == "| adaptation steps | maml | pretrained |"


@pytest.mark.parametrize("package", ["gymnasium", "mujoco"])
def test_a_missing_gymnasium_or_mujoco_names_the_rl_extra(package):
    """Without Gymnasium the environment refuses to be built; without MuJoCo the
    collector refuses to make it; both name the extra of setup.cfg and BUILD.md."""
    environment = HalfCheetahVelocity(horizon=3)
    with not_installed(package), pytest.raises(
            ImportError, match=r"install the rl extra: pip install -e '\.\[rl\]'") as info:
        if package == "gymnasium":
            HalfCheetahVelocity(horizon=3)
        else:
            GymCollector(environment, rollouts=1)
    assert ("needs Gymnasium" if package == "gymnasium" else "needs MuJoCo") in str(info.value)
    import configparser
    import os
    root = ROOT
    extras = configparser.ConfigParser()
    extras.read(os.path.join(root, "setup.cfg"))
    assert "gymnasium[mujoco]" in extras["options.extras_require"]["rl"]
    with open(os.path.join(root, "BUILD.md")) as f:
        assert "pip install -e '.[rl]'" in f.read()


def test_a_python_environment_run_on_several_replicas_is_refused_before_any_step(tmp_path):
    """Its batches are collected in the training process, on one replica: a strategy
    with several is refused, naming the sampler and the replicas, before any step or
    checkpoint (a stand-in strategy: only its number of replicas is read first)."""
    import gin
    from metalearn.training import build_experiment, parse_config, train

    class TwoReplicas:
        num_replicas_in_sync = 2

    try:
        parse_config(["experiments/rl/half_cheetah_vel_maml.gin"], TINY)
        experiment = build_experiment()
        with pytest.raises(ValueError, match="HalfCheetahVelocity makes its batches outside "
                                             "the step .* on one replica, not 2"):
            train(experiment, str(tmp_path / "run"), strategy=TwoReplicas())
    finally:
        gin.clear_config()
    assert not (tmp_path / "run" / "checkpoints").exists()


def _hanging_run(tmp_path, monkeypatch, params, on_hang=None):
    """The shrunk HalfCheetah config trained for 3 steps (checkpoints every 5) whose
    task reward hangs (sleeps a minute, once) after step 1 has run: in the collection of step
    2's batch. Returns ``(the exception, seconds the run took, its checkpoint dir)``."""
    import gin
    import signal  # noqa: F401
    from metalearn.training import build_experiment, parse_config, train
    try:
        parse_config(["experiments/rl/half_cheetah_vel_maml.gin"],
                     TINY + ["Loop.num_steps = 3", "Loop.checkpoint_every = 5", *params])
        experiment = build_experiment()
        reward = HalfCheetahVelocity.task_reward

        hung = []

        def hanging(self, task, rewards, info):
            if int(experiment.learner.meta_step.numpy()) >= 1 and not hung:
                hung.append(True)  # once: a run that outlives it fails in a minute
                if on_hang is not None:
                    on_hang()
                time.sleep(60)
            return reward(self, task, rewards, info)
        monkeypatch.setattr(HalfCheetahVelocity, "task_reward", hanging)
        start = time.monotonic()
        with pytest.raises(Exception) as info:
            train(experiment, str(tmp_path / "run"))
        return info.value, time.monotonic() - start, str(tmp_path / "run" / "checkpoints")
    finally:
        gin.clear_config()


def test_a_hung_simulator_ends_the_run_after_the_time_limit_with_a_checkpoint(
        tmp_path, monkeypatch):
    """The time limit raises SimulatorError out of the training loop, which first saves
    a checkpoint of the step reached (the batch being collected is redone on resume)."""
    error, seconds, checkpoints = _hanging_run(tmp_path, monkeypatch,
                                               ["GymCollector.step_time_limit = 0.5"])
    assert isinstance(error, SimulatorError), error
    assert re.search(r"HalfCheetahVelocity\.task_reward did not return within 0\.5 s "
                     r"\(HalfCheetahVelocity task [-0-9.e]+, seed \[-?\d+, -?\d+\], step 0\)",
                     str(error)), error
    assert seconds < 50  # not the minute's sleep
    assert tf.train.latest_checkpoint(checkpoints).endswith("ckpt-1")


def test_sigterm_during_a_hung_collection_stops_the_run_with_a_checkpoint(
        tmp_path, monkeypatch):
    """A stop signal while a batch is collected (here a simulator hung with no time
    limit) abandons the collection at once: checkpoint of the step reached, then
    TrainingInterrupted, as a SIGTERM during a step (exit status 143 from
    metalearn.train)."""
    import os
    import signal
    from metalearn.training.loop import TrainingInterrupted
    terminate = lambda: threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    error, seconds, checkpoints = _hanging_run(
        tmp_path, monkeypatch, ["GymCollector.step_time_limit = None"], on_hang=terminate)
    assert isinstance(error, TrainingInterrupted), error
    assert error.signal_number == signal.SIGTERM and error.step == 1
    assert error.checkpoint.endswith("ckpt-1") and seconds < 50
    assert tf.train.latest_checkpoint(checkpoints).endswith("ckpt-1")
