"""metalearn.execution: Auto resolves the same way in training, evaluation and
meta_metrics; per-task figures are declared and checked in every formulation; the
meta-loss at given values of every meta-variable; formulation names and options."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution
from metalearn.adapters import GradientDescent, MetaSGD
from metalearn.tasks import Sinusoid
from metalearn.testing import mse, regression_episodes
from metalearn.repository import ROOT

ALL = ["map_fn", "unrolled", "batched", "accumulate", "auto"]


def _learner(cls=metalearn.Learner, adapter=None):
    keras.utils.set_random_seed(2)
    model = metalearn.models.mlp((2,), hidden=(4,), outputs=1, activation="tanh",
                                 dtype="float64")
    return cls(model, adapter or GradientDescent(2, 0.1), loss=mse)


def _record(monkeypatch):
    """Which concrete formulation's methods run (by name)."""
    seen = []
    for cls in (execution.MapFn, execution.Unrolled, execution.Batched, execution.Accumulate):
        for method in ("per_task", "metrics", "gradients", "adapted"):
            original = getattr(cls, method)

            def spy(self, *args, _original=original, _name=cls.name, **kwargs):
                seen.append(_name)
                return _original(self, *args, **kwargs)
            monkeypatch.setattr(cls, method, spy)
    return seen


def test_auto_resolves_identically_in_training_and_evaluation(monkeypatch, tmp_path):
    """0.2: the same "auto" ran accumulate in training but map_fn in evaluation."""
    seen = _record(monkeypatch)
    sampler = Sinusoid(shots=4, queries=4)
    experiment = metalearn.Experiment(
        learner=metalearn.Learner(metalearn.models.mlp((1,), hidden=(8,), outputs=1),
                                  GradientDescent(1, 0.01), loss="mse"),
        sampler=sampler, meta_batch_size=2,
        loop=metalearn.training.Loop(num_steps=1, log_every=1, checkpoint_every=1))
    metalearn.training.train(experiment, str(tmp_path))
    trained = set(seen)
    seen.clear()
    metalearn.training.evaluate(experiment.learner, sampler, num_tasks=4, batch_size=2,
                                formulation=experiment.formulation)
    evaluated = set(seen)
    seen.clear()
    experiment.learner.meta_metrics(next(iter(sampler.dataset(2, seed=0, num_steps=1))))
    assert trained == evaluated == set(seen) == {"accumulate"}  # on a CPU


@pytest.mark.parametrize("name", ALL)
def test_every_formulation_gives_the_same_metrics_and_meta_gradient(name):
    episodes = regression_episodes(tasks=3)
    learner = _learner()
    reference = learner.meta_metrics(episodes, formulation=execution.Unrolled())
    variables = learner.meta_variables
    grads, metrics = tf.function(lambda e: execution.formulation(name).gradients(
        learner, e, variables))(episodes)
    expected, _ = execution.Unrolled().gradients(learner, episodes, variables)
    for a, b in zip(grads, expected):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)
    found = tf.function(lambda e: learner.meta_metrics(
        e, formulation=execution.formulation(name)))(episodes)
    np.testing.assert_allclose(found["loss"], reference["loss"], rtol=1e-10)
    np.testing.assert_allclose(metrics["loss"], reference["loss"], rtol=1e-10)


# --- declared per-task figures ------------------------------------------------------

class ExtraFigure(metalearn.Learner):
    """Reports a figure it does not declare in metric_names."""

    def objective_of(self, run):
        return {**run.metrics, "query_norm": tf.norm(run.query_x)}


class DeclaredFigure(ExtraFigure):
    @property
    def metric_names(self):
        return super().metric_names + ["query_norm"]


@pytest.mark.parametrize("name", ["map_fn", "unrolled", "accumulate", "auto"])
def test_an_undeclared_figure_is_the_same_clear_error_in_every_formulation(name):
    """0.2: accumulate silently dropped it, map_fn raised TensorFlow's raw nest error."""
    learner = _learner(ExtraFigure)
    episodes = regression_episodes(tasks=2)
    message = (r"ExtraFigure.objective_of gives per-task figures \['loss', 'query_norm'\]"
               r", but the learner declares \['loss'\] \(metric_names\): not declared "
               r"\['query_norm'\]; override ExtraFigure.metric_names")
    with pytest.raises(ValueError, match=message):
        learner.meta_metrics(episodes, formulation=execution.formulation(name))
    with pytest.raises(ValueError, match=message):
        metalearn.training.make_meta_step(learner, metalearn.MetaGradient(), name)(episodes)


def test_an_error_inside_the_compiled_loop_leaves_no_state_behind():
    """tf.map_fn left the global variable scope's caching device set when the function
    it maps raised: every later variable made under a strategy failed (seen as 26
    unrelated failures later in the suite)."""
    with pytest.raises(ValueError, match="not declared"):
        metalearn.training.make_meta_step(_learner(ExtraFigure), metalearn.MetaGradient(),
                                          "map_fn")(regression_episodes(tasks=2))
    assert tf.compat.v1.get_variable_scope().caching_device is None
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        tf.Variable(1.0)


def test_batched_refuses_an_overridden_objective_of():
    with pytest.raises(ValueError, match=r"overrides objective_of\(\)"):
        _learner(ExtraFigure).meta_metrics(regression_episodes(tasks=2),
                                           formulation=execution.Batched())


def test_a_subclass_that_still_overrides_episode_metrics_is_refused_naming_objective_of():
    """episode_metrics is no longer an override point (the one task run does not call
    it): a subclass defining it would be silently ignored, so it is refused."""
    class Old(metalearn.Learner):
        def episode_metrics(self, episode, steps=None, weights=None):
            return {}

    with pytest.raises(TypeError, match="Old defines episode_metrics.*objective_of"):
        _learner(Old)
    with pytest.raises(AttributeError, match=r"run_task\(episode, steps, weights\)"):
        _learner(metalearn.Learner).episode_metrics


@pytest.mark.parametrize("name", ["map_fn", "accumulate"])
def test_a_declared_figure_is_reported(name):
    learner = _learner(DeclaredFigure)
    episodes = regression_episodes(tasks=2)
    metrics = metalearn.training.make_meta_step(learner, metalearn.MetaGradient(),
                                                name)(episodes)
    expected = np.mean([np.linalg.norm(episodes.query_x[i]) for i in range(2)])
    np.testing.assert_allclose(metrics["query_norm"], expected, rtol=1e-10)


# --- the meta-loss at given values of every meta-variable -----------------------------

def test_objective_at_given_values_of_every_meta_variable():
    """Model weights and a learned hyperparameter (Meta-SGD's rates) perturbed without
    assigning: equal to assigning them, variables untouched, and differentiable."""
    learner = _learner(adapter=MetaSGD(steps=1, learning_rate=0.1))
    episodes = regression_episodes(tasks=3)
    variables = learner.meta_variables
    assert any(v.path.endswith("_lr") for v in variables), [v.path for v in variables]
    before = [v.numpy() for v in variables]
    rng = np.random.default_rng(0)
    moved = [b + 0.05 * rng.standard_normal(b.shape) for b in before]
    values = [tf.constant(m) for m in moved]
    with tf.GradientTape() as tape:
        tape.watch(values)
        loss = tf.reduce_mean(metalearn.learners.objective(learner, values, episodes)["loss"])
    grads = tape.gradient(loss, values)
    for variable, old in zip(variables, before):
        np.testing.assert_array_equal(variable.numpy(), old)
    for variable, value in zip(variables, moved):
        variable.assign(value)
    np.testing.assert_allclose(float(loss), float(learner.meta_loss(episodes)), rtol=1e-12)
    expected, _ = execution.Unrolled().gradients(learner, episodes, variables)
    for a, b in zip(grads, expected):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)


def test_objective_checks_its_values():
    learner = _learner()
    episodes = regression_episodes(tasks=2)
    with pytest.raises(ValueError, match="one value per meta-variable"):
        metalearn.learners.objective(learner, [], episodes)
    values = [tf.zeros([3], tf.float64) for _ in learner.meta_variables]
    with pytest.raises(ValueError, match="has shape \\[3\\], the variable"):
        metalearn.learners.objective(learner, values, episodes)
    values = [tf.zeros(v.shape, tf.float32) for v in learner.meta_variables]
    with pytest.raises(ValueError, match="is float32, the variable"):
        metalearn.learners.objective(learner, values, episodes)


# --- names and options ----------------------------------------------------------------

def test_formulation_names_and_bad_values():
    assert isinstance(execution.formulation(None), execution.Auto)
    assert isinstance(execution.formulation("map_fn"), execution.MapFn)
    with pytest.raises(ValueError, match="unknown formulation 'loop'"):
        execution.formulation("loop")
    with pytest.raises(TypeError, match="formulation must be"):
        execution.formulation(3)
    with pytest.raises(ValueError, match="MapFn.parallel_iterations must be a whole number"):
        execution.MapFn(parallel_iterations=0)
    with pytest.raises(ValueError, match="memory_budget must be bytes or a size"):
        execution.Auto(memory_budget="2 gigs")


def test_runtime_checks_its_values():
    with pytest.raises(ValueError, match="Runtime.threads must be"):
        execution.Runtime(threads=(1,))
    with pytest.raises(ValueError, match="Runtime.dtype_policy"):
        execution.Runtime(dtype_policy="float33")
    with pytest.raises(TypeError, match="Runtime.seed must be an integer"):
        execution.Runtime(seed=1.5)


# --- the one task run: what the formulations may read of a learner --------------------

def _attributes_read_of(path, name="learner"):
    """The attributes read on the name ``name`` anywhere in the module at ``path``."""
    import ast
    tree = ast.parse(open(path).read(), path)
    return sorted({node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                   and isinstance(node.value, ast.Name) and node.value.id == name})


def test_the_formulations_read_five_learner_members_and_write_no_pipeline():
    """The formulations run the learner's task run and read nothing else of it: the
    five members of execution.TaskLearner. No module outside the learners splits an
    episode itself, and the class-name policing of 0.3 is gone."""
    root = os.path.join(ROOT, "metalearn")
    read = _attributes_read_of(os.path.join(root, "execution", "formulations.py"))
    assert read == ["metric_names", "model", "pieces", "run_task", "run_tasks"], read
    protocol = [n for n in vars(execution.TaskLearner) if not n.startswith("_")]
    assert sorted(protocol) == read
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if name.endswith(".py") and os.sep + "learners" + os.sep not in path:
                assert "learner.split(" not in open(path).read(), path
    for gone in ("overridden", "PER_TASK_METHODS", "batched_unavailable"):
        assert not hasattr(execution, gone), gone


def test_a_learner_without_a_resumable_loop_is_refused_a_carried_run_by_name():
    """The latent NP (and any adapter that is not a GradientDescent loop) cannot be
    continued across outer steps: the carried-trajectory rules refuse it by name."""
    learner = _learner(adapter=metalearn.adapters.NoAdaptation())
    with pytest.raises(TypeError, match="run_task.resume=.... carries a GradientDescent "
                                        "inner loop across outer steps; the learner's "
                                        "adapter is NoAdaptation"):
        learner.run_task(regression_episodes(tasks=1).task(0),
                         resume=metalearn.learners.Resume.start_of(2))
