"""Outer rules as pieces: every rule under every formulation (one that runs another's
graph op for op, once), one device and a strategy, XLA or not, equal to its per-task
reference in float64 (the shipped contract); guards as wrappers; a research subclass
gets its parent's gin bindings; moved keywords name their new spelling."""

import functools
import os
import re

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution
from metalearn.outer import (ClipDirections, EvolutionStrategies, MetaGradient, PCGrad,
                             PersistentES, Reptile, SerialReptile, SkipNonFinite,
                             TruncatedUnroll)
from metalearn.testing import (OuterRuleContract, evolution_estimate, task_adapted,
                               task_meta_gradient, values)
from metalearn.repository import ROOT

LR, EPSILON, MAX_NORM = 0.5, 0.5, 0.05


def _mean_meta_gradient(learner, episodes):
    grads = [task_meta_gradient(learner, episodes.task(i)) for i in range(episodes.num_tasks)]
    return [np.mean(g, axis=0) for g in zip(*grads)]


class TestMetaGradient(OuterRuleContract):
    covers = (MetaGradient,)

    def make_rule(self):
        return MetaGradient(keras.optimizers.SGD(LR))

    def reference_step(self, learner, episodes):
        grads = _mean_meta_gradient(learner, episodes)
        return {v.path: v.numpy() - LR * g for v, g in zip(learner.meta_variables, grads)}


class TestClipDirections(OuterRuleContract):
    covers = (ClipDirections,)

    def make_rule(self):
        return ClipDirections(MetaGradient(keras.optimizers.SGD(LR)), MAX_NORM)

    def reference_step(self, learner, episodes):
        grads = _mean_meta_gradient(learner, episodes)
        norm = np.sqrt(sum(np.sum(g ** 2) for g in grads))
        assert norm > MAX_NORM  # the guard clips here
        return {v.path: v.numpy() - LR * g * MAX_NORM / norm
                for v, g in zip(learner.meta_variables, grads)}


class TestReptile(OuterRuleContract):
    covers = (Reptile,)

    def make_rule(self):
        return Reptile(keras.optimizers.SGD(EPSILON))

    def reference_step(self, learner, episodes):
        adapted = [task_adapted(learner, episodes.task(i)) for i in range(episodes.num_tasks)]
        return {p: w + EPSILON * (np.mean([a[p] for a in adapted], axis=0) - w)
                for p, w in values(learner).items()}


class TestSerialReptile(OuterRuleContract):
    covers = (SerialReptile,)

    def make_rule(self):
        return SerialReptile(keras.optimizers.SGD(EPSILON))

    def reference_step(self, learner, episodes):
        weights = values(learner)
        for i in range(episodes.num_tasks):
            start = {p: tf.constant(w) for p, w in weights.items()}
            adapted = task_adapted(learner, episodes.task(i), start)
            weights = {p: w + EPSILON * (adapted[p] - w) for p, w in weights.items()}
        return weights


class TestEvolutionStrategies(OuterRuleContract):
    """A stochastic rule under the contract: with its seed fixed, one step (the learner's
    ``meta_step`` 0) draws known noise, and the reference computes the same antithetic
    differences one task at a time."""
    covers = (EvolutionStrategies,)

    def make_rule(self):
        return EvolutionStrategies(keras.optimizers.SGD(LR), population=2, sigma=0.1, seed=3)

    def reference_step(self, learner, episodes):
        estimate = evolution_estimate(learner, episodes, population=2, sigma=0.1, seed=3)
        return {v.path: v.numpy() - LR * g for v, g in zip(learner.meta_variables, estimate)}


# A carrying rule runs its segment through the formulation's per_task alone, which
# Batched runs as MapFn does: under "batched" its step is map_fn's op for op
# (test_batched_runs_a_carrying_rules_step_as_map_fn_does), so its cases leave it out.
CARRYING_FORMULATIONS = tuple(f for f in OuterRuleContract.formulations if f != "batched")


class TestTruncatedUnroll(OuterRuleContract):
    """The carried-trajectory rule's first segment (horizon 2 inner steps, truncation
    1): the meta-gradient of each task's query loss after one inner step, by hand."""
    covers = (TruncatedUnroll,)
    formulations = CARRYING_FORMULATIONS

    def make_rule(self):
        return TruncatedUnroll(keras.optimizers.SGD(LR), horizon=2, truncation=1)

    def reference_step(self, learner, episodes):
        grads = []
        for i in range(episodes.num_tasks):
            with tf.GradientTape() as tape:
                loss = learner.run_task(episodes.task(i), steps=1).metrics["loss"]
            grads.append(tape.gradient(loss, learner.meta_variables))
        return {v.path: v.numpy() - LR * np.mean([g[k] for g in grads], axis=0)
                for k, v in enumerate(learner.meta_variables)}


class TestPersistentES(OuterRuleContract):
    """PES's first segment (horizon 2, truncation 1): ``xi = eps``, so ES's estimate
    on a loop of one inner step, computed by hand."""
    covers = (PersistentES,)
    formulations = CARRYING_FORMULATIONS

    def make_rule(self):
        return PersistentES(keras.optimizers.SGD(LR), horizon=2, truncation=1,
                            population=2, sigma=0.1, seed=3)

    def reference_step(self, learner, episodes):
        estimate = evolution_estimate(learner, episodes, population=2, sigma=0.1, seed=3,
                                      inner_steps=1)
        return {v.path: v.numpy() - LR * g for v, g in zip(learner.meta_variables, estimate)}


@pytest.mark.parametrize("case", [TestTruncatedUnroll, TestPersistentES])
def test_batched_runs_a_carrying_rules_step_as_map_fn_does(case, monkeypatch):
    """Why the carrying rules' cases leave "batched" out: traced under Batched, their
    step asks the formulation only to check the learner, resolve itself and run
    per_task, and each per_task is MapFn's with the options "map_fn" names (Batched's
    per_task hands over to it): the calls the step makes under "map_fn", so the same
    graph, op for op."""
    asked, handed = [], []

    class Asked(execution.Batched):
        def __getattribute__(self, name):
            if not name.startswith("__"):
                asked.append(name)
            return super().__getattribute__(name)

    map_fn_per_task = execution.MapFn.per_task

    def per_task(formulation, *args, **kwargs):
        handed.append(repr(formulation))
        return map_fn_per_task(formulation, *args, **kwargs)

    monkeypatch.setattr(execution.MapFn, "per_task", per_task)
    contract = case()
    step = metalearn.training.make_meta_step(contract.make_learner(), contract.make_rule(),
                                             Asked(), skip_non_finite=True)
    step.get_concrete_function(contract.make_episodes())
    assert set(asked) == {"check", "resolve", "per_task"}, asked
    assert handed == [repr(execution.formulation("map_fn"))] * asked.count("per_task")
    assert handed


@functools.lru_cache(maxsize=None)  # once per process: the class registers with gin once
def _tutorial_rule():
    """The rule of docs/tutorials/outer_rule.md, as the page defines it."""
    path = os.path.join(ROOT, "docs", "tutorials", "outer_rule.md")
    with open(path) as f:
        block = re.findall(r"^```python\n(.*?)^```", f.read(), re.MULTILINE | re.DOTALL)[0]
    namespace = {"__name__": "tutorial_outer_rule"}
    with gin.unlock_config():
        exec(compile(block, path, "exec"), namespace)
    return namespace["Lookahead"]


class TestTutorialLookahead(OuterRuleContract):
    """The tutorial's rule, with its own state (slow weights), under the contract."""

    def make_rule(self):
        return _tutorial_rule()(keras.optimizers.SGD(LR), alpha=0.5, sync_every=1)

    def reference_step(self, learner, episodes):
        grads = _mean_meta_gradient(learner, episodes)
        return {v.path: v.numpy() - 0.5 * LR * g
                for v, g in zip(learner.meta_variables, grads)}


def pcgrad_by_hand(grads):
    """PCGrad's projection in NumPy, written from the paper (fixed order)."""
    flat = [np.concatenate([g.ravel() for g in task]) for task in grads]
    projected = []
    for i, g in enumerate(flat):
        g = g.copy()
        for j, other in enumerate(flat):
            if j != i and g @ other < 0:
                g -= (g @ other) / (other @ other) * other
        projected.append(g)
    mean, at, out = np.mean(projected, axis=0), 0, []
    for g in grads[0]:
        out.append(mean[at:at + g.size].reshape(g.shape))
        at += g.size
    return out


class TestPCGrad(OuterRuleContract):
    """Gradient surgery on each task's meta-gradient; on two replicas every replica
    gathers every task's gradient, so the update is the whole batch's."""
    covers = (PCGrad,)

    def make_rule(self):
        return PCGrad(keras.optimizers.SGD(LR))

    def reference_step(self, learner, episodes):
        grads = [task_meta_gradient(learner, episodes.task(i))
                 for i in range(episodes.num_tasks)]
        flat = [np.concatenate([g.ravel() for g in task]) for task in grads]
        assert min(a @ b for a in flat for b in flat) < 0, "no conflict to project"
        return {v.path: v.numpy() - LR * d
                for v, d in zip(learner.meta_variables, pcgrad_by_hand(grads))}


class PerReplicaNormalised(MetaGradient):
    """A planted rule that is silently per-replica: the meta-gradient normalised to
    unit norm over the tasks it sees (its replica's), where the whole batch's was meant."""

    def directions(self, learner, episodes, formulation):
        gradients, metrics = formulation.gradients(learner, episodes, learner.meta_variables)
        norm = tf.linalg.global_norm(gradients)
        return [g / norm for g in gradients], metrics


class PlantedPerReplica(OuterRuleContract):
    formulations = ("map_fn",)

    def make_rule(self):
        return PerReplicaNormalised(keras.optimizers.SGD(LR))

    def reference_step(self, learner, episodes):
        grads = _mean_meta_gradient(learner, episodes)
        norm = np.sqrt(sum(np.sum(g ** 2) for g in grads))
        return {v.path: v.numpy() - LR * g / norm
                for v, g in zip(learner.meta_variables, grads)}


def test_the_strategy_case_fails_a_rule_that_sees_only_its_replicas_tasks():
    """The contract's strategy case runs on two replicas (two logical CPUs): a rule whose
    update depends on the split of tasks across replicas passes on one device and fails
    there (on one replica, as it ran before, it passed)."""
    case = PlantedPerReplica()
    case.test_every_formulation()
    with pytest.raises(AssertionError, match="PerReplicaNormalised under map_fn"):
        case.test_every_formulation_under_a_strategy()
    case._check(jit_compile=False, strategy=tf.distribute.MirroredStrategy(["/cpu:0"]))


# --- guards -----------------------------------------------------------------------

def test_skip_non_finite_withholds_the_update_and_reports_flags():
    contract = TestMetaGradient()
    learner = contract.make_learner()
    episodes = contract.make_episodes()
    query_y = episodes.query_y.numpy()
    query_y[2] = np.nan
    poisoned = episodes._replace(query_y=tf.constant(query_y))
    rule = SkipNonFinite(MetaGradient(keras.optimizers.SGD(LR)))
    before = values(learner)
    metrics = metalearn.training.make_meta_step(learner, rule, "map_fn")(poisoned)
    flags = metrics[metalearn.outer.NON_FINITE].numpy()
    assert flags[0] == 1 and flags[1:].all()
    for path, value in values(learner).items():
        np.testing.assert_array_equal(value, before[path])
    assert int(rule.optimizer.iterations.numpy()) == 0


def test_a_guard_is_not_added_twice():
    rule = SkipNonFinite(MetaGradient())
    learner = TestMetaGradient().make_learner()
    step = metalearn.training.make_meta_step(learner, rule, skip_non_finite=True)
    metrics = step(TestMetaGradient().make_episodes())
    assert metrics[metalearn.outer.NON_FINITE].shape == (1 + len(learner.meta_variables),)


def test_a_guard_needs_a_rule():
    with pytest.raises(TypeError, match="must be a metalearn outer rule"):
        SkipNonFinite(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="max_norm must be > 0, got 0"):
        ClipDirections(MetaGradient(), 0)


# --- a research subclass gets the shipped bindings ------------------------------------

@gin.configurable
class ResearchRule(MetaGradient):
    """A research rule written as a subclass of the shipped gradient rule."""


def test_a_subclass_trains_with_the_optimizer_the_shipped_config_binds(tmp_path):
    metalearn.training.parse_config(
        ["experiments/sinusoid/maml.gin"],
        ["Experiment.outer_rule = @ResearchRule()", "keras.optimizers.Adam.learning_rate = 0.02",
         "Loop.num_steps = 2", "Experiment.meta_batch_size = 2"])
    try:
        experiment = metalearn.training.build_experiment()
        optimizer = experiment.outer_rule.optimizer
        assert isinstance(experiment.outer_rule, ResearchRule)
        assert isinstance(optimizer, keras.optimizers.Adam)
        assert float(optimizer.learning_rate.numpy()) == pytest.approx(0.02)
        metalearn.training.train(experiment, str(tmp_path))
        assert int(optimizer.iterations.numpy()) == 2
    finally:
        gin.clear_config()


def test_a_subclass_given_an_optimizer_keeps_it():
    with gin.unlock_config():
        gin.parse_config("MetaGradient.optimizer = @keras.optimizers.SGD()")
    try:
        optimizer = keras.optimizers.RMSprop(0.1)
        assert ResearchRule(optimizer).optimizer is optimizer
        assert isinstance(ResearchRule().optimizer, keras.optimizers.SGD)
    finally:
        gin.clear_config()


# --- moved names --------------------------------------------------------------------

@pytest.mark.parametrize("keyword, new", [
    ("task_batching", "Experiment.formulation"), ("memory_budget", r"Auto\(memory_budget"),
    ("parallel_iterations", r"MapFn\(parallel_iterations"), ("zero_init", "ZeroInit")])
def test_learner_moved_keywords_name_the_new_spelling(keyword, new):
    model = metalearn.models.mlp((1,), hidden=(), outputs=1)
    with pytest.raises(TypeError, match=f"Learner\\({keyword}=...\\) moved.*{new}"):
        metalearn.Learner(model, loss="mse", **{keyword: "map_fn"})


@pytest.mark.parametrize("keyword, new", [
    ("meta_optimizer", "Experiment.outer_rule"), ("seed", "Runtime.seed"),
    ("jit_compile", "Runtime.jit_compile"), ("num_steps", "Loop.num_steps"),
    ("on_non_finite", "Loop.on_non_finite")])
def test_experiment_moved_keywords_name_the_new_spelling(keyword, new):
    learner = metalearn.Learner(metalearn.models.mlp((1,), hidden=(), outputs=1), loss="mse")
    with pytest.raises(TypeError, match=f"Experiment\\({keyword}=...\\) moved.*{new}"):
        metalearn.Experiment(learner=learner, sampler=metalearn.tasks.Sinusoid(),
                             **{keyword: 1})


def test_old_outer_rule_spellings_name_the_new_ones():
    with pytest.raises(TypeError, match="MetaOptimizer is MetaGradient"):
        metalearn.MetaOptimizer(keras.optimizers.Adam())
    with pytest.raises(TypeError, match=r"ClipDirections\(MetaGradient"):
        MetaGradient(keras.optimizers.Adam(), clipnorm=1.0)
    with pytest.raises(TypeError, match=r"ClipDirections\(Reptile"):
        Reptile(clipnorm=1.0)


def test_make_meta_step_refuses_a_keras_optimizer():
    learner = TestMetaGradient().make_learner()
    with pytest.raises(TypeError, match="needs a metalearn outer rule"):
        metalearn.training.make_meta_step(learner, keras.optimizers.Adam())
