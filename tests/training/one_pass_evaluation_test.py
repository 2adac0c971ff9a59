"""Evaluation after several numbers of inner steps from one run: ``evaluate(...,
inner_steps=(1, 3, 5))`` gives exactly the per-task figures of evaluating each count
on its own, for learners whose pieces allow one run (MAML, Meta-SGD, LSLR, ANIL, inner
Adam, a learned rule, recomputed mini-batch steps, a conv net with BatchNorm, MAML++,
Proto-MAML) and for those that run each count on its own (a ``WhileLoop``, Prototypical
Networks, a class of its own ``run_task``); one function is traced for all counts, and
one run of the most steps adapts each task."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution, models
from metalearn.adapters import (GradientDescent, GradientStep, InnerAdam, LearnedRates,
                                LearnedRule, Mask, MetaSGD, MiniBatches, PerStepWeights,
                                Recompute, WhileLoop)
from metalearn.tasks import FewShotClassification, Sinusoid
from metalearn.testing import softmax_xent
from metalearn.training import evaluation
from metalearn.training.evaluation import evaluate
from tests.bad_input import CLASSES, tiny_images

COUNTS = (1, 3, 5)


def _sinusoid_learner(adapter, cls=metalearn.Learner, **kwargs):
    keras.utils.set_random_seed(1)
    model = models.mlp((1,), hidden=(8, 8), outputs=1, activation="tanh", dtype="float64")
    return cls(model, adapter, loss="mse", **kwargs)


def _sinusoid():
    return Sinusoid(shots=5, queries=5, dtype="float64")


def _conv_learner(adapter, cls=metalearn.Learner, **kwargs):
    keras.utils.set_random_seed(1)
    model = models.conv_net((4, 4, 1), outputs=3, filters=4, blocks=1)
    return cls(model, adapter, loss=softmax_xent, metrics={"accuracy": "accuracy"}, **kwargs)


def _images():
    return FewShotClassification(tiny_images(), ways=3, shots=1, queries=2,
                                 train=CLASSES[:5], test=CLASSES[5:])


def _one_by_one(learner, sampler, counts, **kwargs):
    """The figures of evaluating each count on its own, as the whole report's."""
    reports = [evaluate(learner, sampler, inner_steps=(k,), **kwargs) for k in counts]
    return {key: {k: r[key][str(k)] for k, r in zip(counts, reports)}
            for key in ("per_task", "results")}


def _check_same(learner, sampler, counts=COUNTS, **kwargs):
    kwargs = dict(dict(num_tasks=6, batch_size=3), **kwargs)
    together = evaluate(learner, sampler, inner_steps=counts, **kwargs)
    alone = _one_by_one(learner, sampler, counts, **kwargs)
    assert list(together["results"]) == [str(k) for k in counts]
    assert together["inner_steps"] == list(counts)
    for k in counts:
        mine, theirs = together["per_task"][str(k)], alone["per_task"][k]
        assert list(mine) == list(theirs) and len(mine["loss"]) == kwargs["num_tasks"]
        for name in theirs:
            np.testing.assert_array_equal(mine[name], theirs[name], err_msg=f"{k} {name}")
        assert together["results"][str(k)] == alone["results"][k]
    return together


@pytest.mark.parametrize("adapter", [
    lambda: GradientDescent(2, 0.05),
    lambda: MetaSGD(2, 0.05),
    lambda: GradientDescent(2, update=[LearnedRates("layer_step", 0.05)]),  # LSLR, clamped
    lambda: GradientDescent(2, update=[Mask(("head",)), GradientStep(0.1)]),  # ANIL
    lambda: GradientDescent(2, first_order=True, update=InnerAdam(0.01)),
    lambda: GradientDescent(2, update=LearnedRule(0.01)),  # reads the step, not the count
    lambda: GradientDescent(2, 0.05, wrappers=[Recompute(), MiniBatches(2)]),
], ids=["maml", "meta_sgd", "lslr", "anil", "first_order_adam", "learned_rule",
        "recompute_mini_batches"])
def test_counts_from_one_run_give_each_counts_figures(adapter):
    learner = _sinusoid_learner(adapter())
    assert learner.pieces.step_prefix_reasons() == []
    _check_same(learner, _sinusoid())


def test_a_conv_net_with_batch_norm_and_maml_plus_plus():
    """BatchNorm in training mode on the queries; MAML++ (per-step BatchNorm copies,
    per-layer-and-step rates, the multi-step loss) measured after each count as a run of
    that count (an explicit count records no trajectory)."""
    learner = _conv_learner(GradientDescent(2, 0.1))
    assert learner.pieces.step_prefix_reasons() == []
    _check_same(learner, _images())
    plus = _conv_learner(GradientDescent(2, update=[LearnedRates("layer_step", 0.1)],
                                         wrappers=[PerStepWeights(("bn",))]),
                         cls=metalearn.MultiStepLossLearner, anneal_steps=10)
    assert plus.pieces.step_prefix_reasons() == []
    _check_same(plus, _images(), counts=(0, 1, 3))


def test_proto_maml_starts_each_count_from_its_prototypes():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(6, activation="relu", name="embedding"),
                              keras.layers.Dense(3, name="head")])
    learner = metalearn.ProtoMAML(model, GradientDescent(2, 0.1), ways=3,
                                  metrics={"accuracy": "accuracy"})
    assert learner.pieces.step_prefix_reasons() == []
    _check_same(learner, _images(), counts=(0, 2, 4))


def test_learners_that_cannot_run_their_counts_at_once_run_each_on_its_own():
    """A WhileLoop keeps no trajectory; Prototypical Networks have no inner loop (and
    fit their head in their own adapt_and_measure): each count is its own run, in the
    same one function, with the same figures."""
    looped = _sinusoid_learner(GradientDescent(2, 0.05, wrappers=[WhileLoop()]))
    assert any("WhileLoop" in r for r in looped.pieces.step_prefix_reasons())
    _check_same(looped, _sinusoid())
    keras.utils.set_random_seed(1)
    embedding = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(),
                                  keras.layers.Dense(5, name="embedding")])
    protonets = metalearn.PrototypicalNetworks(embedding, ways=3,
                                               metrics={"accuracy": "accuracy"})
    assert "PrototypicalNetworks overrides adapt_and_measure()" in \
        protonets.pieces.step_prefix_reasons()
    _check_same(protonets, _images(), counts=(0,))
    _check_same(protonets, _images(), counts=(0, 1))


class OwnRun(metalearn.Learner):
    """A learner of its own run_task (one count at a time, as it was written)."""

    def run_task(self, episode, steps=None, weights=None, resume=None, measure=True):
        assert not isinstance(steps, (list, tuple))
        return super().run_task(episode, steps, weights, resume, measure)


def test_a_learner_that_runs_its_own_tasks_is_given_one_count_at_a_time():
    learner = _sinusoid_learner(GradientDescent(2, 0.05), cls=OwnRun)
    assert learner.pieces.step_prefix_reasons() == ["OwnRun overrides run_task()"]
    _check_same(learner, _sinusoid())


@pytest.mark.parametrize("formulation", ["batched", "map_fn", "unrolled"])
def test_every_formulation_gives_each_counts_figures(formulation):
    learner = _sinusoid_learner(GradientDescent(2, 0.05))
    _check_same(learner, _sinusoid(), formulation=execution.formulation(formulation))


def test_one_function_is_traced_for_all_counts_and_one_run_adapts(monkeypatch):
    """Three counts: one tf.function traced once, and 5 inner steps traced per task
    (not 1 + 3 + 5); a learner that runs each count on its own still traces one
    function."""
    made = []

    class Recorded:  # evaluation's tf, its tf.function recorded
        def __getattr__(self, name):
            return getattr(tf, name)

        @staticmethod
        def function(fn, **kwargs):
            made.append(tf.function(fn, **kwargs))
            return made[-1]

    monkeypatch.setattr(evaluation, "tf", Recorded())
    learner = _sinusoid_learner(GradientDescent(2, 0.05))
    update = learner.adapter.update
    steps = []
    original = update.update
    monkeypatch.setattr(update, "update", lambda *a: steps.append(1) or original(*a))
    evaluate(learner, _sinusoid(), num_tasks=6, batch_size=3, inner_steps=COUNTS)
    assert [f.experimental_get_tracing_count() for f in made] == [1]
    assert len(steps) == max(COUNTS)  # the body of Accumulate's loop, traced once
    made.clear()
    looped = _sinusoid_learner(GradientDescent(2, 0.05, wrappers=[WhileLoop()]))
    evaluate(looped, _sinusoid(), num_tasks=6, batch_size=3, inner_steps=COUNTS)
    assert [f.experimental_get_tracing_count() for f in made] == [1]


def test_a_run_trained_unrolled_evaluates_with_a_graph_of_one_task(monkeypatch):
    """Unrolled copies the work of every task into the graph: built for a training
    step's few tasks, it made the main job's evaluation (25 tasks x 10 inner steps)
    trace 14 s of a 15 s evaluation. Evaluation asks the formulation what it evaluates
    with (``Formulation.for_evaluation``): the inner steps of one task are traced once,
    and the figures are the same."""
    learner = _sinusoid_learner(GradientDescent(2, 0.05))
    unrolled = execution.Unrolled()
    assert isinstance(unrolled.for_evaluation(), execution.MapFn)
    assert all(f.for_evaluation() is f for f in (execution.MapFn(), execution.Batched(),
                                                   execution.Accumulate()))
    update = learner.adapter.update
    steps = []
    original = update.update
    monkeypatch.setattr(update, "update", lambda *a: steps.append(1) or original(*a))
    report = evaluate(learner, _sinusoid(), num_tasks=6, batch_size=3, inner_steps=COUNTS,
                      formulation=unrolled)
    assert len(steps) == max(COUNTS)  # not 3 tasks x 5 steps
    monkeypatch.setattr(update, "update", original)
    mapped = evaluate(learner, _sinusoid(), num_tasks=6, batch_size=3, inner_steps=COUNTS,
                      formulation=execution.MapFn())
    assert report["per_task"] == mapped["per_task"]


def test_run_task_given_counts_gives_each_counts_run():
    learner = _sinusoid_learner(GradientDescent(2, 0.05))
    episode = next(iter(_sinusoid().dataset(1, seed=3, num_steps=1))).task(0)
    runs = learner.run_task(episode, (3, 0, 3, 1))
    assert list(runs) == [3, 0, 1]
    for k, run in runs.items():
        alone = learner.run_task(episode, k)
        assert run.steps == k and run.trajectory is None
        for name in alone.metrics:
            np.testing.assert_array_equal(run.metrics[name], alone.metrics[name])
        np.testing.assert_array_equal(run.predictions, alone.predictions)
    for bad in ((-1, 2), (1.5,), ()):
        with pytest.raises(ValueError, match="whole numbers of inner steps >= 0"):
            learner.run_task(episode, bad)
