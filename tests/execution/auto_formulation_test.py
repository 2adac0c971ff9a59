"""The Auto formulation (metalearn.execution.Auto): the rule (a pure function) on its
decision table, the memory estimate from a model's shapes, the budget's parsing, and a
learner's batch that it resolves."""

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution, models
from metalearn.adapters import GradientDescent
from metalearn.execution import choose, estimate_step_bytes, parse_memory
from metalearn.functional.memory import activation_bytes
from metalearn.testing import (classification_learner, contract_model,
                               synthetic_classification)

MIB = 2 ** 20

# tasks, inner steps, second order, device, budget, task bytes, batched available -> mode
DECISIONS = [
    # CPU: accumulate whatever the budget (the leanest, and the fastest or level in
    # benchmarks/README.md at every B in 4-32, S in 1 and 5, both orders)
    (32, 1, True, "cpu", 8192 * MIB, 20 * MIB, True, "accumulate"),
    (32, 5, True, "cpu", 8192 * MIB, 40 * MIB, True, "accumulate"),  # CPU never batched
    (32, 1, True, "cpu", 150 * MIB, 20 * MIB, False, "accumulate"),
    (8, 1, False, "cpu", 8192 * MIB, 18 * MIB, False, "accumulate"),
    (32, 1, True, "gpu", 8192 * MIB, 20 * MIB, True, "batched"),     # GPU: batched first
    (32, 1, True, "gpu", 8192 * MIB, 20 * MIB, False, "map_fn"),     # ... where available
    (32, 1, True, "gpu", 1000 * MIB, 20 * MIB, True, "map_fn"),      # batched 1280 > 1000
    (32, 1, True, "gpu", 500 * MIB, 20 * MIB, True, "accumulate"),   # neither fits
    (8, 1, True, "gpu", 143 * MIB, 18 * MIB, False, "accumulate"),   # map_fn 144: short
    (8, 1, True, "gpu", 144 * MIB, 18 * MIB, False, "map_fn"),       # ... fits exactly
    (32, 1, True, "cpu", None, 20 * MIB, True, "accumulate"),        # no budget
    (32, 1, True, "gpu", None, 20 * MIB, True, "batched"),           # no budget: speed
    (32, 1, True, "gpu", 1, None, True, "batched"),                  # no estimate: speed
]


@pytest.mark.parametrize("tasks,steps,second,device,budget,task_bytes,batched,expected",
                         DECISIONS)
def test_decision_table(tasks, steps, second, device, budget, task_bytes, batched,
                        expected):
    choice = choose(tasks, steps, second, device, budget, task_bytes, batched)
    assert choice.mode == expected, choice.reason


def test_accumulate_estimate_counts_only_the_tasks_in_flight():
    for device in ("cpu", "gpu"):
        choice = choose(32, 1, True, device, 100 * MIB, 20 * MIB, parallel_iterations=2)
        assert (choice.mode, choice.estimate) == ("accumulate", 40 * MIB), device


def test_estimate_is_linear_in_steps_and_examples():
    # 5 support x 1 step x 5 (second order) + 75 query = 100 examples' activations
    assert estimate_step_bytes(1000, support=5, query=75, inner_steps=1,
                               second_order=True) == 100 * 1000
    assert estimate_step_bytes(1000, 5, 75, 10, True) == (5 * 10 * 5 + 75) * 1000
    assert estimate_step_bytes(1000, 5, 75, 10, False) == (5 * 10 + 75) * 1000
    assert estimate_step_bytes(1000, 5, 75, 0, True) == estimate_step_bytes(
        1000, 5, 75, 1, True)  # no inner loop: one forward of the support set


def test_activation_bytes_from_layer_shapes():
    # 1-40-40-1 MLP: Dense 40, ReLU folded into Dense, Dense 40, Dense 1 -> 81 floats
    assert activation_bytes(models.mlp()) == 81 * 4
    conv = models.omniglot_conv_net(outputs=5)
    # 4 blocks of conv, BatchNorm, ReLU on 14x14, 7x7, 4x4, 2x2 x 64; pool 64; head 5
    expected = 3 * 64 * (14 * 14 + 7 * 7 + 4 * 4 + 2 * 2) + 64 + 5
    assert activation_bytes(conv) == 4 * expected


def test_activation_bytes_of_a_subclassed_model_by_tracing():
    class Small(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x, training=False):
            return self.dense(x)

    model = Small()
    model(np.zeros((1, 2), np.float32))
    assert activation_bytes(model) is None  # no recorded shapes, no example shape
    assert activation_bytes(model, (2,)) >= 3 * 4


@pytest.mark.parametrize("value,expected", [
    (1024, 1024), ("1KiB", 1024), ("2GiB", 2 * 2 ** 30), ("512 MiB", 512 * MIB),
    ("1.5GB", 1_500_000_000), (None, None)])
def test_parse_memory(value, expected):
    assert parse_memory(value) == expected


@pytest.mark.parametrize("value", ["2 gigs", "", "-1GiB", 0, -5, True, "GiB"])
def test_bad_memory_budget_names_the_value(value):
    with pytest.raises(ValueError, match="memory_budget"):
        execution.Auto(memory_budget=value)


def test_learner_resolves_auto_to_accumulate_on_a_cpu():
    episodes = synthetic_classification(0, tasks=4, dtype=tf.float64)
    assert isinstance(execution.formulation(None), execution.Auto)  # the default
    for budget in (None, 1):
        learner = classification_learner(GradientDescent(2, 0.3), contract_model("float64"))
        auto = execution.Auto(memory_budget=budget)
        choice = auto.choice(learner, episodes)
        assert choice.mode == auto.resolve(learner, episodes).name == "accumulate", \
            choice.reason
        assert "cpu" in choice.reason
    reference = classification_learner(GradientDescent(2, 0.3), contract_model("float64"))
    grads = [metalearn.MetaGradient().directions(l, episodes, f)[0]
             for l, f in ((learner, auto), (reference, execution.Unrolled()))]
    for a, b in zip(*grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=1e-13)


def test_memory_budget_is_gin_bindable():
    with gin.unlock_config():
        gin.parse_config("Auto.memory_budget = '3MiB'")
    try:
        auto = gin.get_configurable(execution.Auto)()
        assert auto.memory_budget == 3 * MIB
    finally:
        gin.clear_config()
