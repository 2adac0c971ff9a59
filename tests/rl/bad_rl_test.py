"""Bad meta-RL input: policies that do not fit the environment, TRPO on a learner without
trajectories, Python simulators (``GymCollector``) that cannot be made, are not
installed, fail, hang, cannot take their task or are not collected, collection
workers that cannot be, Meta-World benchmarks that do not exist or are not
installed, and Meta-World's evaluator around RL². Cases of docs/errors.md
(tests/bad_input.py)."""

import time

import gin
import numpy as np
import tensorflow as tf

import metalearn
from metalearn.pieces import HyperparameterRangeError
from metalearn.rl import GymCollector, HalfCheetahVelocity, MetaWorld, PendulumGravity
from metalearn.training import build_experiment, parse_config
from tests.bad_input import (POINT_NAV, SINUSOID, Case, check, gin_case, parametrize,
                             run_gin)
from tests.run_fixtures import not_installed

TITLE = "Meta-RL: policies, TRPO and simulators"
RL2 = ["include 'experiments/rl/rl2_point_navigation.gin'", "Loop.num_steps = 2",
       "PointNavigation.horizon = 3", "RecurrentPolicyLearner.rollouts = 2",
       "Experiment.meta_batch_size = 1", "recurrent_policy.units = 4"]
METAWORLD = ["include 'experiments/rl/metaworld_ml1_reach_maml.gin'", "Loop.num_steps = 2",
             "MetaWorld.horizon = 3", "GymCollector.rollouts = 2",
             "Experiment.meta_batch_size = 1", "mlp.hidden = (4,)"]
PENDULUM = ["include 'experiments/rl/pendulum_gravity_maml.gin'", "Loop.num_steps = 2",
            "PendulumGravity.horizon = 3", "GymCollector.rollouts = 2",
            "Experiment.meta_batch_size = 1", "mlp.hidden = (4,)"]


def unknown_gymnasium_id(tmp_path) -> None:
    GymCollector(HalfCheetahVelocity(env_id="HalfCheetah-v99"), rollouts=1)


def mujoco_not_installed(tmp_path) -> None:
    environment = HalfCheetahVelocity(horizon=3)
    with not_installed("mujoco"):
        GymCollector(environment, rollouts=1)


def simulator_gives_nan(tmp_path) -> None:
    nan_policy = lambda observations, seed: (np.full([1, 6], np.nan, np.float32),
                                             np.zeros([1], np.float32))
    GymCollector(HalfCheetahVelocity(horizon=3), rollouts=1).collect(nan_policy, 1.5, [4, 2])


def task_reward_raises(tmp_path) -> None:
    class SpeedReward(HalfCheetahVelocity):
        def task_reward(self, task, reward, info):
            return -np.abs(info["x_speed"] - task)  # HalfCheetah's key is x_velocity
    policy = lambda observations, seed: (np.zeros([1, 6], np.float32),
                                         np.zeros([1], np.float32))
    GymCollector(SpeedReward(horizon=3), rollouts=1).collect(policy, 1.5, [4, 2])


def simulator_step_hangs(tmp_path) -> None:
    collector = GymCollector(HalfCheetahVelocity(horizon=3), rollouts=1,
                             step_time_limit=0.5)
    step, calls = collector.env.step, []

    def hanging(actions):  # the third step hangs
        calls.append(actions)
        if len(calls) == 3:
            time.sleep(60)
        return step(actions)
    collector.env.step = hanging
    policy = lambda observations, seed: (np.zeros([1, 6], np.float32),
                                         np.zeros([1], np.float32))
    collector.collect(policy, 1.5, [4, 2])


def metaworld_not_installed(tmp_path) -> None:
    with not_installed("metaworld"):
        MetaWorld("ML1", "reach-v3", horizon=3)


def metaworld_evaluator_around_rl2(tmp_path) -> None:
    environment = MetaWorld("ML1", "reach-v3", horizon=3)
    learner = metalearn.rl.RecurrentPolicyLearner(
        metalearn.rl.recurrent_policy(environment, units=4), environment,
        metalearn.rl.RecurrentTrial(2), rollouts=1)
    metalearn.rl.metaworld_evaluation(learner)


def ray_not_installed(tmp_path) -> None:
    with not_installed("ray"):
        GymCollector(PendulumGravity(horizon=3), rollouts=2, workers=2, ray_address="auto")


def simulator_time_limit_negative(tmp_path) -> None:
    GymCollector(HalfCheetahVelocity(horizon=3), rollouts=1, step_time_limit=-1.0)


def task_the_simulator_cannot_take(tmp_path) -> None:
    policy = lambda observations, seed: (np.zeros([1, 1], np.float32),
                                         np.zeros([1], np.float32))
    GymCollector(PendulumGravity(horizon=3), rollouts=1).collect(policy, -1.0, [4, 2])


def python_environment_in_the_step(tmp_path) -> None:
    parse_config(["experiments/rl/half_cheetah_vel_maml.gin"],
                 ["HalfCheetahVelocity.horizon = 3", "mlp.hidden = (4,)",
                  "Experiment.meta_batch_size = 1"])
    try:
        experiment = build_experiment()
        episodes = experiment.sampler.sample(tf.constant([0, 0], tf.int64), 1)
        experiment.learner.meta_metrics(episodes, formulation="unrolled")
    finally:
        gin.clear_config()


CASES = [
    gin_case("policy outputs that do not fit the actions", "PolicyLearner.model = @mlp()",
             ValueError, "outputs 2 values (shape [1, 2]), but a Gaussian policy over "
             "PointNavigation's 2 continuous actions needs 4", base=POINT_NAV),
    gin_case("policy learner without rollouts", "GradientDescent.wrappers = []", ValueError,
             "holds no Rollouts wrapper", base=POINT_NAV),
    gin_case("exact rollouts of an environment that cannot list them",
             "PolicyLearner.rollouts = 'exact'", ValueError,
             "rollouts='exact' needs an environment that enumerates", base=POINT_NAV),
    gin_case("RL² with a gradient inner loop",
             "RecurrentPolicyLearner.adapter = @GradientDescent()", TypeError,
             "its adapter must be a metalearn.rl.RecurrentTrial, got GradientDescent",
             base=RL2),
    gin_case("RL² with a feed-forward policy", "RecurrentPolicyLearner.model = @mlp()",
             ValueError, "RecurrentTrial unrolls a recurrent step, a model [inputs, "
             "hidden] -> [outputs, hidden']; 'mlp' has 1 inputs",
             base=RL2 + ["mlp.input_shape = (6,)", "mlp.outputs = 4"]),
    Case("TRPO on a learner without trajectories", "`Experiment.outer_rule = @TRPO()` with "
         "a supervised `Learner`", TypeError,
         "TRPO needs a learner whose trajectories can be collected",
         lambda p: run_gin(p, SINUSOID + ["Experiment.outer_rule = @TRPO()"]), None,
         "the learner's class and the PolicyLearner it needs, before the first step"),
    Case("unknown Gymnasium environment id", "`HalfCheetahVelocity(env_id='HalfCheetah-v99')`"
         " given to a `GymCollector`", ValueError, "Gymnasium cannot make 'HalfCheetah-v99'",
         unknown_gymnasium_id, None, "the environment class, the id and Gymnasium's reason"),
    Case("MuJoCo not installed", "a `GymCollector` of `HalfCheetahVelocity` without the "
         "`mujoco` package (or `HalfCheetahVelocity()` without `gymnasium`)", ImportError,
         "HalfCheetahVelocity (HalfCheetah-v5) needs MuJoCo: install the rl extra: pip "
         "install -e '.[rl]'", mujoco_not_installed, None, "the extra to install"),
    Case("simulator failing mid-rollout", "a policy whose actions make the simulator's "
         "reward NaN (or a simulator that raises)", metalearn.rl.SimulatorError,
         "the simulator gave non-finite observations or rewards mid-rollout "
         "(HalfCheetahVelocity task 1.5, seed [4, 2], step 0)", simulator_gives_nan, None,
         "the task, the seed and the step"),
    Case("task reward failing mid-rollout", "a `PythonEnvironment` whose `task_reward` "
         "raises (here reads a key the simulator's `info` lacks)",
         metalearn.rl.SimulatorError, "SpeedReward.task_reward failed mid-rollout "
         "(SpeedReward task 1.5, seed [4, 2], step 0): KeyError: 'x_speed'",
         task_reward_raises, None, "the call, the task, the seed, the step and the error"),
    Case("simulator step hung", "a simulator whose `step` does not return within "
         "`GymCollector.step_time_limit` (here 0.5 s; default 300)",
         metalearn.rl.SimulatorError, "the simulator's step did not return within 0.5 s "
         "(HalfCheetahVelocity task 1.5, seed [4, 2], step 2): raise "
         "GymCollector.step_time_limit if it is only slow", simulator_step_hangs, None,
         "the call, the task, the seed and the step; training saves a checkpoint of the "
         "step reached first"),
    Case("simulator time limit not positive", "`GymCollector.step_time_limit = -1.0`",
         HyperparameterRangeError, "GymCollector.step_time_limit must be > 0, got -1.0",
         simulator_time_limit_negative, None, "the value and the range (`None`: no limit)"),
    Case("a task the simulator cannot take", "a task `PythonEnvironment.set_task` refuses "
         "(here `PendulumGravity`'s gravity -1.0 given to `GymCollector.collect`)",
         ValueError, "PendulumGravity.set_task cannot take the task -1.0: ValueError: the "
         "gravity must be a finite number > 0, got -1.0 (PendulumGravity task -1.0, seed "
         "[4, 2], step 0)", task_the_simulator_cannot_take, None,
         "the method, the task, its error, the seed and the step"),
    gin_case("gravity range not positive", "PendulumGravity.gravity_range = (0.0, 5.0)",
             ValueError, "PendulumGravity.gravity_range must be (low, high) with 0 < low "
             "<= high, got (0.0, 5.0)", base=PENDULUM),
    Case("collection workers not a whole number >= 1", "`GymCollector.workers = 0`",
         HyperparameterRangeError, "GymCollector.workers must be a whole number >= 1, got 0",
         lambda p: GymCollector(PendulumGravity(horizon=3), rollouts=2, workers=0), None,
         "the value and the range"),
    Case("more collection workers than rollouts", "`GymCollector.workers = 3` with "
         "`GymCollector.rollouts = 2`", ValueError, "GymCollector.workers must be at most "
         "rollouts (2): each worker steps one copy or more, got 3",
         lambda p: GymCollector(PendulumGravity(horizon=3), rollouts=2, workers=3), None,
         "the value and the rollouts"),
    Case("Ray not installed", "`GymCollector.ray_address = 'auto'` without the `ray` "
         "package", ImportError, "GymCollector(ray_address=...) needs Ray: pip install "
         "'metalearn[ray]'", ray_not_installed, None, "the part and the install command"),
    Case("collection's Ray address empty", "`GymCollector.ray_address = ''`", ValueError,
         "GymCollector.ray_address must be a Ray address ('auto', 'host:6379' or 'local') "
         "or None, got ''",
         lambda p: GymCollector(PendulumGravity(horizon=3), rollouts=2, ray_address=""),
         None, "the value and the addresses Ray takes"),
    Case("a Python environment's episodes without collection", "episodes of "
         "`HalfCheetahVelocity` given to the learner as sampled (not through "
         "`collect_episodes`)", NotImplementedError,
         "HalfCheetahVelocity runs in Python: its trajectories come from a "
         "metalearn.rl.GymCollector", python_environment_in_the_step, None,
         "`GymCollector`, `collect_episodes`"),
    gin_case("unknown Meta-World environment", "MetaWorld.env_name = 'reach-v2'",
             ValueError, "MetaWorld.env_name must be a Meta-World v3 environment for ML1 "
             "(e.g. 'reach-v3', 'push-v3', 'pick-place-v3'; all 50: "
             "metaworld.ML1.ENV_NAMES), got 'reach-v2'", base=METAWORLD),
    gin_case("unknown Meta-World benchmark", "MetaWorld.benchmark = 'ML5'", ValueError,
             "MetaWorld.benchmark must be one of ('ML1', 'ML10', 'ML45'), got 'ML5'",
             base=METAWORLD),
    gin_case("Meta-World horizon past its episode length", "MetaWorld.horizon = 600",
             HyperparameterRangeError, "MetaWorld.horizon must be a whole number in [1, "
             "500], got 600", base=METAWORLD),
    Case("Meta-World not installed", "`MetaWorld()` without the `metaworld` package",
         ImportError, "MetaWorld needs Meta-World (metaworld>=3.1): pip install -e "
         "'.[rl]' (or: pip install 'metaworld>=3.1')", metaworld_not_installed, None,
         "the install command"),
    Case("Meta-World's evaluator around RL²", "`metaworld_evaluation` (or "
         "`python -m metalearn.evaluate --metaworld`, `MetaWorldAgent`) of a "
         "`RecurrentPolicyLearner`", TypeError, "MetaWorldAgent adapts a policy's weights "
         "with the learner's inner loop on its adaptation episodes; RecurrentPolicyLearner "
         "(RL²) adapts in a recurrent policy's hidden state, which reads the previous "
         "reward at every step, and Meta-World's evaluation episodes give an agent no "
         "rewards: evaluate it with python -m metalearn.evaluate (without --metaworld)",
         metaworld_evaluator_around_rl2, None,
         "the learner and the evaluation to use instead, before any simulator starts"),
    gin_case("TRPO without a trust region", "TRPO.max_kl = 0.0", HyperparameterRangeError,
             "TRPO.max_kl must be > 0, got 0.0",
             base=POINT_NAV + ["Experiment.outer_rule = @TRPO()"]),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
