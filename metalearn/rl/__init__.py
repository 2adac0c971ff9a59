"""Meta-reinforcement learning: in-graph environments, policies, estimators and the
learner that samples trajectories inside the compiled step.

* :mod:`metalearn.rl.environments`: :class:`Environment` (a task sampler with
  TensorFlow dynamics), :class:`PointNavigation` (the MAML paper's 2D navigation),
  :class:`TabularMDP` (small MDPs and bandits, exactly enumerable), :func:`rollout`.
* :mod:`metalearn.rl.policies`: :class:`Gaussian`, :class:`Categorical`,
  :func:`gaussian_policy`.
* :mod:`metalearn.rl.estimators`: :func:`discounted_returns`, :func:`gae`,
  :class:`LinearFeatureBaseline`, :class:`ValueNetworkBaseline`, :func:`magic_box`,
  :class:`DiCE`, :class:`NaiveSurrogate`, :class:`LVC` (ProMP's low variance curvature
  estimator).
* :mod:`metalearn.rl.gym`: Python environments (Gymnasium, MuJoCo):
  :class:`PythonEnvironment` (tasks that reach the reward, or the simulator before
  each reset: ``set_task``), :class:`HalfCheetahVelocity`, :class:`HalfCheetahDirection`,
  :class:`PendulumGravity` (a gravity per task), :class:`GymCollector` (Gymnasium's
  vector API; ``workers`` processes; ``collect_trials`` for a policy with a state,
  :class:`TrialPolicy`), :class:`GymCollection` (the batches a Python environment
  gives the training loop), :func:`collect_episodes`.
* :mod:`metalearn.rl.metaworld`: Meta-World v3 (ML1, ML10, ML45) as a Python
  environment, :class:`MetaWorld` (its train and test task sets, ``success`` a metric),
  and its own evaluator on a trained learner: :class:`MetaWorldAgent` (its
  ``MetaLearningAgent`` protocol), :func:`metaworld_evaluation`.
* :mod:`metalearn.rl.learner`: :class:`PolicyLearner`, :class:`Rollouts`,
  :class:`Collected` (trajectories collected ahead of the step, replayed),
  :func:`mean_return` and :func:`success_rate` (its metrics).
* :mod:`metalearn.rl.recurrent`: RL², a recurrent policy whose hidden state carries
  over a trial of episodes (no gradient inner loop): :class:`RecurrentPolicyLearner`,
  :class:`RecurrentTrial` (the adapter), :func:`recurrent_policy`,
  :class:`RecurrentSampler` (its trials collected on a Python environment).
* meta-RL's own outer rules, which run on a :class:`PolicyLearner` only:
  :mod:`metalearn.rl.trpo` (:class:`TRPO`, the MAML paper's trust region) and
  :mod:`metalearn.rl.clipped` (:class:`ClippedRatio`, PPO / ProMP).

The package is one floor, above the outer rules (:mod:`metalearn.outer`), whose
interface its rules implement.
"""

from metalearn.rl.environments import (MDP, Environment, PointNavigation, TabularMDP,
                                       Trajectories, rollout)
from metalearn.rl.estimators import (LVC, Batch, DiCE, LinearFeatureBaseline,
                                     NaiveSurrogate, ValueNetworkBaseline,
                                     discounted_returns, gae, magic_box)
from metalearn.rl.gym import (GymCollection, GymCollector, HalfCheetahDirection,
                              HalfCheetahVelocity, PendulumGravity, PythonEnvironment,
                              SimulatorError, collect_episodes)
from metalearn.rl.learner import (Collected, PolicyLearner, PolicySampler, Rollouts,
                                  TrialPolicy, mean_return, success_rate)
from metalearn.rl.metaworld import MetaWorld, MetaWorldAgent, metaworld_evaluation
from metalearn.rl.policies import Categorical, Gaussian, LogStd, gaussian_policy
from metalearn.rl.recurrent import (RecurrentPolicyLearner, RecurrentSampler,
                                    RecurrentTrial, recurrent_policy, trial_input_size)
from metalearn.rl.trpo import TRPO, TrustRegion
from metalearn.rl.clipped import ClippedRatio

__all__ = ["MDP", "Batch", "Categorical", "ClippedRatio", "Collected", "DiCE", "Environment", "Gaussian",
           "GymCollection", "GymCollector", "HalfCheetahDirection", "HalfCheetahVelocity",
           "LVC", "LinearFeatureBaseline", "LogStd", "MetaWorld", "MetaWorldAgent",
           "NaiveSurrogate", "PendulumGravity",
           "PointNavigation",
           "PolicyLearner", "PolicySampler", "PythonEnvironment", "RecurrentPolicyLearner",
           "RecurrentSampler", "RecurrentTrial", "Rollouts",
           "SimulatorError", "TRPO", "TabularMDP", "Trajectories", "TrialPolicy", "TrustRegion",
           "ValueNetworkBaseline",
           "collect_episodes",
           "discounted_returns", "gae", "gaussian_policy", "magic_box", "mean_return",
           "metaworld_evaluation", "recurrent_policy", "rollout", "success_rate",
           "trial_input_size"]
