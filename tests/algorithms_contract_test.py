"""Every learner, inner-loop piece and outer rule meets the contract of
metalearn.testing, and every pairing a composite can hold keeps its meta-gradient."""

import importlib
import inspect
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import adapters, heads, learners, outer
from metalearn.adapters import (AnnealOrder, ClipByGlobalNorm, GradientDescent,
                                GradientStep, Hypernetwork, ImplicitGradientDescent, InContext,
                                InnerAdam, InnerMomentum, InnerRMSProp, Learned,
                                LearnedRates, Mask, MetaSGD, MiniBatches,
                                PerStepLearningRates, PerStepWeights, Recompute,
                                WhileLoop)
from metalearn.testing import (WAYS, LearnerContract, OuterRuleContract, RegressionContract,
                               analytic_meta_gradient, classification_learner,
                               compiled_meta_gradient, contract_model, regression_learner,
                               synthetic_classification)


class TestMAML(LearnerContract):
    covers = (GradientDescent, GradientStep, metalearn.Learner, metalearn.MetaGradient)

    def make_learner(self):
        return classification_learner(GradientDescent(steps=2, learning_rate=0.1))


class TestMAMLClippedAndGuarded(TestMAML):
    """MAML under the outer guards: directions clipped to a global norm, an update
    applied only if finite."""
    covers = (outer.ClipDirections, outer.SkipNonFinite)

    def make_outer_rule(self):
        return outer.SkipNonFinite(outer.ClipDirections(
            metalearn.MetaGradient(keras.optimizers.Adam(learning_rate=0.01)), 10.0))


class TestFirstOrderMAML(LearnerContract):
    covers = (adapters.FirstOrder, adapters.Chain)

    def make_learner(self):
        return classification_learner(GradientDescent(steps=2, learning_rate=0.1,
                                                      first_order=True))


class TestANIL(LearnerContract):
    covers = (Mask,)

    def make_learner(self):
        return classification_learner(GradientDescent(
            steps=2, update=[Mask(("head",)), GradientStep(0.1)]))


class TestMetaSGD(LearnerContract):
    covers = (MetaSGD, LearnedRates)

    def make_learner(self):
        return classification_learner(MetaSGD(steps=1, learning_rate=0.1))


class TestLSLR(LearnerContract):
    covers = (PerStepLearningRates,)

    def make_learner(self):
        return classification_learner(PerStepLearningRates(steps=2, learning_rate=0.1))


class TestInnerMomentum(LearnerContract):
    covers = (InnerMomentum,)

    def make_learner(self):
        return classification_learner(GradientDescent(
            steps=2, update=InnerMomentum(0.1, momentum=0.5, nesterov=True)))


class TestInnerAdam(LearnerContract):
    covers = (InnerAdam,)

    def make_learner(self):
        return classification_learner(GradientDescent(
            steps=2, update=InnerAdam(Learned(0.05, "layer"), beta_1=Learned(0.8))))


class TestInnerRMSProp(LearnerContract):
    covers = (InnerRMSProp,)

    def make_learner(self):
        return classification_learner(GradientDescent(
            steps=2, update=InnerRMSProp(0.01, momentum=0.5, centered=True)))


class TestBOIL(LearnerContract):
    """Body-only inner loop: the head frozen in adaptation (an inverted Mask)."""
    covers = (Mask,)

    def make_learner(self):
        return classification_learner(GradientDescent(
            steps=2, update=[Mask(("head",), invert=True), GradientStep(0.3)]))


def _support_scaled_by_the_weights(weights, x, y, step):
    """Each inner step's support inputs scaled by a factor the current weights set (as a
    rollout of the current policy would depend on them)."""
    kernel = next(iter(weights.values()))
    return x * (1.0 + 0.1 * tf.tanh(tf.reduce_mean(kernel))), y


class TestSupportFromWeights(LearnerContract):
    """Support data made from each inner step's weights
    (tests/adapters/adapted_data_test.py checks the meta-gradient through it against
    finite differences)."""
    covers = (adapters.SupportFromWeights,)

    def make_learner(self):
        return classification_learner(GradientDescent(
            steps=2, learning_rate=0.3,
            wrappers=[adapters.SupportFromWeights(_support_scaled_by_the_weights)]))


class TestClippedRecomputedMiniBatches(LearnerContract):
    covers = (ClipByGlobalNorm, Recompute, MiniBatches)

    def make_learner(self):
        return classification_learner(GradientDescent(
            steps=3, update=[ClipByGlobalNorm(5.0), GradientStep(0.1)],
            wrappers=[Recompute(), MiniBatches(3)]))


class TestLearnedRatesInAWhileLoop(LearnerContract):
    """Per-step learned rates (LSLR) indexed by the while loop's tensor step."""
    covers = (WhileLoop,)

    def make_learner(self):
        return classification_learner(PerStepLearningRates(3, 0.3, wrappers=[WhileLoop()]))


class TestHyperMAML(LearnerContract):
    """A generated head (residual, from per-class means), then gradient steps."""
    covers = (Hypernetwork,)

    def make_learner(self):
        keras.utils.set_random_seed(0)
        generator = keras.Sequential([keras.Input((WAYS * 6,)),
                                      keras.layers.Dense(16 * WAYS + WAYS, name="dense")],
                                     name="generator")
        return classification_learner(Hypernetwork(
            generator, generate=("head",), mode="residual",
            then=GradientDescent(steps=2, learning_rate=0.1)))


class TestMAMLPlusPlus(LearnerContract):
    """All MAML++ pieces together: LSLR, multi-step loss, derivative-order annealing,
    per-step BatchNorm weights."""
    covers = (AnnealOrder, PerStepWeights, metalearn.MultiStepLossLearner)

    def make_learner(self):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((6,)), keras.layers.Dense(16, name="hidden0"),
            keras.layers.BatchNormalization(name="bn0"), keras.layers.ReLU(name="relu0"),
            keras.layers.Dense(3, name="head")], name="bn_mlp")
        adapter = GradientDescent(steps=2, update=[AnnealOrder(2), LearnedRates(
            "layer_step", initial=0.1)], wrappers=[PerStepWeights(("bn0",))])
        return classification_learner(adapter, model,
                                      learner_class=metalearn.MultiStepLossLearner,
                                      anneal_steps=10)


class TestRegressionMAML(RegressionContract):
    """The contract on regression: MAML (second order) on linear tasks, MSE."""
    covers = (GradientDescent, metalearn.Learner)

    def make_learner(self):
        return regression_learner(GradientDescent(steps=2, learning_rate=0.05))


class TestRegressionMetaSGDAccumulated(RegressionContract):
    """Meta-SGD on regression, every batch run by the Accumulate formulation."""
    covers = (MetaSGD,)

    def make_learner(self):
        return regression_learner(MetaSGD(steps=1, learning_rate=0.05))

    def make_formulation(self):
        return metalearn.execution.Accumulate()


# --- every export has a contract case ---------------------------------------------

def _exported(module, base):
    return {obj for name in module.__all__ for obj in [getattr(module, name)]
            if inspect.isclass(obj) and issubclass(obj, base) and not inspect.isabstract(obj)
            and obj not in _ABSTRACT}


_ABSTRACT = {adapters.Piece, adapters.Adapter, adapters.Update, adapters.StepWrapper,
             heads.Head, learners.TaskInit, outer.OuterRule, outer.OptimizerRule, outer.Guard}


def test_every_exported_piece_learner_and_outer_rule_has_a_contract_case():
    tests = os.path.dirname(os.path.abspath(__file__))
    for folder, _, names in sorted(os.walk(tests)):  # the cases live in the test modules
        for name in sorted(names):
            if name.endswith("_test.py"):
                relative = os.path.relpath(os.path.join(folder, name[:-3]), tests)
                importlib.import_module("tests." + relative.replace(os.sep, "."))
    # a learner's contract or an outer rule's (OuterRuleContract) covers a class
    cases, stack = [], LearnerContract.__subclasses__() + OuterRuleContract.__subclasses__()
    while stack:
        case = stack.pop()
        cases.append(case)
        stack.extend(case.__subclasses__())
    covered = {cls for case in cases for cls in case.covers}
    exported = (_exported(adapters, adapters.Piece) | _exported(heads, adapters.Piece)
                | _exported(learners, (metalearn.Learner, adapters.Piece))
                | _exported(outer, outer.OuterRule))
    missing = sorted(cls.__name__ for cls in exported - covered)
    assert not missing, f"no contract case covers {missing}"
    assert len(exported) >= 25  # the test sees the exports


# --- every pairing a composite can hold ----------------------------------------------

THEN = {
    "maml": lambda: GradientDescent(2, 0.1),
    "first_order": lambda: GradientDescent(2, 0.1, first_order=True),
    "anneal": lambda: GradientDescent(2, update=[AnnealOrder(3), GradientStep(0.1)]),
    "anil": lambda: GradientDescent(2, update=[Mask(("head",)), GradientStep(0.1)]),
    "meta_sgd": lambda: MetaSGD(2, 0.1),
    "lslr": lambda: PerStepLearningRates(2, 0.1),
    "per_step": lambda: GradientDescent(2, 0.1, wrappers=[PerStepWeights(("hidden0/bias",))]),
    "recompute": lambda: GradientDescent(2, 0.1, wrappers=[Recompute()]),
    "mini_batches": lambda: GradientDescent(2, 0.1, wrappers=[MiniBatches(3)]),
    "while_loop": lambda: GradientDescent(2, 0.1, wrappers=[WhileLoop()]),
    "clip": lambda: GradientDescent(2, update=[ClipByGlobalNorm(1.0), GradientStep(0.1)]),
    "implicit": lambda: ImplicitGradientDescent(3, 0.1, regularization=2.0, cg_steps=3),
    "momentum": lambda: GradientDescent(2, update=InnerMomentum(Learned(0.1, "layer"), 0.5)),
    "adam": lambda: GradientDescent(2, update=InnerAdam(0.05, epsilon=1e-4)),
    "rmsprop": lambda: GradientDescent(2, update=InnerRMSProp(0.01, momentum=0.5)),
    "boil": lambda: GradientDescent(2, update=[Mask(("head",), invert=True),
                                               GradientStep(0.1)]),
    # no inner loop: the generated head's outputs are the embedding the transformer reads
    "in_context": lambda: InContext(ways=WAYS, width=4, depth=1, heads=2),
}


def _hypernetwork(then):
    keras.utils.set_random_seed(0)
    generator = keras.Sequential([keras.Input((WAYS * 6,), dtype="float64"),
                                  keras.layers.Dense(16 * WAYS + WAYS, name="dense",
                                                     dtype="float64")], name="generator")
    model = contract_model(dtype="float64")
    return classification_learner(Hypernetwork(generator, generate=("head",), then=then),
                                  model)


@pytest.mark.parametrize("then", sorted(THEN))
def test_hypernetwork_then_every_adapter(then):
    """The composite's learner: every meta-variable gets a non-zero meta-gradient, no
    per-task weight is meta-learned, the learner's counter reaches every part, and the
    compiled loop over tasks (map_fn, in one ``tf.function``) gives the per-task
    (unrolled) meta-gradient, the reference run eagerly (the same values, cheaper than
    tracing it) on the same learner."""
    episodes = synthetic_classification(0, tasks=2, dtype=tf.float64)
    learner = _hypernetwork(THEN[then]())
    assert all(p.meta_step is learner.meta_step for p in learner.adapter.parts())
    per_task = set(learner.pieces.task_paths(learner.initial_weights()))
    assert per_task and not per_task & {v.path for v in learner.meta_variables}
    results = {  # both raise on a None gradient
        "map_fn": compiled_meta_gradient(learner, episodes,
                                         formulation=metalearn.execution.MapFn()),
        "unrolled": analytic_meta_gradient(learner, episodes,
                                           formulation=metalearn.execution.Unrolled())}
    for grads in results.values():
        assert all(np.any(g) for g in grads.values()), [p for p, g in grads.items()
                                                       if not np.any(g)]
    for path, want in results["unrolled"].items():
        np.testing.assert_allclose(results["map_fn"][path], want, rtol=1e-10, atol=1e-14)
