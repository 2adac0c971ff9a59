r"""Environment steps per second of the in-graph 2D navigation rollouts.

    PYTHONPATH=. python benchmarks/rl_rollouts.py

``metalearn.rl.rollout`` of ``PointNavigation`` (horizon 100) with the MAML paper's
policy (2-100-100-2 ReLU and a learned log std, ``gaussian_policy``), as one compiled
``tf.function``, with and without XLA: 20 rollouts of one task (what ``PolicyLearner``
samples per task and inner step) and 400 rollouts of 400 goals at once (20 tasks x 20,
the environment broadcasting per-rollout goals). Prints one JSON line.
"""

from __future__ import annotations

import json
import time

import keras
import tensorflow as tf

import metalearn  # noqa: F401
from metalearn import functional, models
from metalearn.rl import Gaussian, PointNavigation, gaussian_policy, rollout


def measure(num: int, jit_compile: bool, repeats: int = 10) -> float:
    """Environment steps per second of ``num`` rollouts at once."""
    keras.utils.set_random_seed(0)
    model = gaussian_policy(models.mlp((2,), hidden=(100, 100), outputs=2))
    environment, distribution = PointNavigation(), Gaussian()
    weights = functional.weights(model)
    policy = lambda obs, seed: distribution.sample(functional.call(model, weights, obs), seed)
    goals = tf.random.stateless_uniform([num, 2], [0, 0], -0.5, 0.5)
    run = tf.function(lambda seed: rollout(environment, goals, policy, num, seed).rewards,
                      jit_compile=jit_compile)
    run(tf.constant([0, 0], tf.int64)).numpy()  # trace and compile
    start = time.perf_counter()
    for i in range(repeats):
        run(tf.constant([i, 1], tf.int64)).numpy()
    return num * environment.horizon * repeats / (time.perf_counter() - start)


def main() -> None:
    results = {f"{num}_rollouts{'_xla' if xla else ''}": round(measure(num, xla))
               for num in (20, 400) for xla in (False, True)}
    print(json.dumps({"env_steps_per_second": results}))


if __name__ == "__main__":
    main()
