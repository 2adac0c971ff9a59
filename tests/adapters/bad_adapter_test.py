"""Bad adapters (the inner loops): steps and learning rates, iMAML, wrappers, neural
processes and ``InContext``, hyperparameters out of range, learned rules (their files,
the weights and network they were built for) and a task beyond the memory budget. Cases
of docs/errors.md (tests/bad_input.py)."""

import numpy as np
import tensorflow as tf

import metalearn
from metalearn.adapters import (AttentiveNeuralProcess, GradientDescent, LearnedRule,
                                LearnedRuleOptimizer, Mask, StepInfo)
from metalearn.adapters.learned_optimizer import RuleFileError, RuleMismatchError
from metalearn.functional import gaussian_nll
from metalearn.functional.memory import MemoryBudgetError
from metalearn.pieces import HyperparameterRangeError
from metalearn.tasks import pad_episodes
from metalearn.testing import softmax_cross_entropy, synthetic_classification
from tests.bad_input import SINUSOID, Case, check, gin_case, gin_only, parametrize

TITLE = "Adapters: inner loops, neural processes and learned rules"

IMAML = ["include 'experiments/sinusoid/imaml.gin'", "Loop.num_steps = 2",
         "Loop.log_every = 1"]

LEARNED_OPTIMIZER = ["include 'experiments/sinusoid/learned_optimizer.gin'",
                     "Loop.num_steps = 2", "Loop.log_every = 1"]


def _gauss_newton_with_opaque_loss():
    class OpaqueLoss(metalearn.Learner):
        def support_loss(self, weights, x, y):
            return super().support_loss(weights, x, y)

    model = metalearn.models.mlp((1,), hidden=(), outputs=1)
    learner = OpaqueLoss(model, metalearn.adapters.ImplicitGradientDescent(
        curvature="gauss_newton"), loss="mse")
    learner.adapt(tf.zeros([4, 1]), tf.zeros([4, 1]))


def _neural_process_steps():
    learner = metalearn.Learner(
        metalearn.models.mlp((9,), hidden=(), outputs=2, name="decoder"),
        metalearn.adapters.ConditionalNeuralProcess(
            metalearn.models.mlp((2,), hidden=(), outputs=8, name="encoder")),
        loss=metalearn.functional.gaussian_nll)
    learner.adapt(tf.zeros([3, 1]), tf.zeros([3, 1]), steps=1)


def _in_context_ways(padded: bool = True):
    learner = metalearn.Learner(metalearn.models.mlp((6,), hidden=(), outputs=4),
                                metalearn.adapters.InContext(ways=3, width=4, depth=1),
                                loss=softmax_cross_entropy)
    if not padded:  # a 5-way episode as it is
        learner.meta_metrics(synthetic_classification(0, tasks=1, ways=5))
    task = synthetic_classification(0, tasks=1).task(0)
    padded = pad_episodes([task], task.support_x.shape[0], task.query_x.shape[0], 5)
    learner.meta_metrics(padded)


def learned_rule_on_other_weights(tmp_path) -> None:
    rule = LearnedRule(0.01)
    metalearn.Learner(metalearn.models.mlp((2,), hidden=(3,), outputs=1),
                      GradientDescent(2, update=[Mask(("head",)), rule]), loss="mse")
    rule.update({"mlp/hidden0/kernel": tf.zeros([2, 3])},
                rule.init({"mlp/hidden0/kernel": tf.zeros([2, 3])}), {}, StepInfo(0, 2))


def learned_rule_optimizer_climbing(tmp_path) -> None:
    rule = LearnedRule(hidden=(4,))
    rule.create()
    LearnedRuleOptimizer(rule, learning_rate=-0.5)


def learned_rule_of_another_shape(tmp_path) -> None:
    saved = LearnedRule(hidden=(16,))
    saved.create()
    LearnedRule(hidden=(8,)).create("float32", saved.values())


def attentive_np_beyond_its_budget(tmp_path) -> None:
    encoder = metalearn.models.mlp((2,), hidden=(8,), outputs=8, name="encoder")
    decoder = metalearn.models.mlp((9,), hidden=(8,), outputs=2, name="decoder")
    learner = metalearn.Learner(decoder, AttentiveNeuralProcess(
        encoder, heads=2, memory_budget="1MiB"), loss=gaussian_nll)
    x = tf.zeros([2000, 1])
    learner.predict(learner.adapt(x, x), x)


def _rule_file(tmp_path, change=None):
    """A saved rule's file, its members changed by ``change(members)``."""
    rule = LearnedRule(hidden=(4,))
    rule.create()
    path = tmp_path / "rule.npz"
    rule.save(str(path))
    if change is not None:
        with np.load(path, allow_pickle=False) as data:
            members = {k: data[k] for k in data.files}
        change(members)
        np.savez(path, **members)
    return str(path)


def truncated_rule_file(tmp_path) -> None:
    path = _rule_file(tmp_path)
    with open(path, "rb") as f:
        whole = f.read()
    with open(path, "wb") as f:
        f.write(whole[:len(whole) // 2])
    LearnedRule.load(path)


def rule_file_of_bad_json(tmp_path) -> None:
    LearnedRule.load(_rule_file(tmp_path, lambda m: m.update(
        __config__=np.array("{not json"))))


def rule_file_of_nan_weights(tmp_path) -> None:
    LearnedRule.load(_rule_file(tmp_path, lambda m: m.update(
        output_bias=np.array([0.0, np.nan]))))


CASES = [
    gin_case("mistyped inner steps", "GradientDescent.steps = 'two'", TypeError,
             "GradientDescent.steps must be a whole number >= 0, got 'two' (str)"),
    gin_case("negative inner steps", "GradientDescent.steps = -1", ValueError,
             "GradientDescent.steps must be a whole number >= 0, got -1"),
    gin_case("zero inner learning rate", "GradientDescent.learning_rate = 0.0", ValueError,
             "GradientDescent.learning_rate must be > 0, got 0.0"),
    gin_only("unknown iMAML curvature", "ImplicitGradientDescent.curvature = 'fisher'",
             ValueError, "curvature must be one of ('hessian', 'gauss_newton'), got 'fisher'",
             base=IMAML),
    Case("Gauss-Newton iMAML with an opaque support loss",
         "`ImplicitGradientDescent(curvature='gauss_newton')` in a `Learner` subclass that "
         "overrides `support_loss`", ValueError,
         "needs the support loss as model outputs and a loss of them",
         lambda p: _gauss_newton_with_opaque_loss(), None, "the loss and what to do"),
    Case("a meta-learned hyperparameter in iMAML's inner solve",
         "`ImplicitGradientDescent(update=GradientStep(Learned(0.1)))`", ValueError,
         "ImplicitGradientDescent's inner solve cannot meta-learn",
         lambda p: metalearn.Learner(
             metalearn.models.mlp((1,), hidden=(), outputs=1),
             metalearn.adapters.ImplicitGradientDescent(update=metalearn.adapters.GradientStep(
                 metalearn.adapters.Learned(0.1))), loss="mse"),
         None, "the variables and what to do"),
    Case("two wrappers that run the inner steps",
         "`GradientDescent(wrappers=[WhileLoop(), WhileLoop()])`", ValueError,
         "at most one wrapper may run the inner steps, got ['WhileLoop', 'WhileLoop']",
         lambda p: metalearn.adapters.GradientDescent(2, 0.1, wrappers=[
             metalearn.adapters.WhileLoop(), metalearn.adapters.WhileLoop()]), None,
         "the wrappers"),
    Case("recomputed steps in a while loop",
         "`GradientDescent(wrappers=[Recompute(), WhileLoop()])`", ValueError,
         "WhileLoop cannot run steps that hold a tf.custom_gradient (Recompute)",
         lambda p: metalearn.adapters.GradientDescent(2, 0.1, wrappers=[
             metalearn.adapters.Recompute(), metalearn.adapters.WhileLoop()]), None,
         "the pieces and what to do"),
    Case("neural process decoder of the wrong size",
         "`Learner(mlp((8,), outputs=2), ConditionalNeuralProcess(mlp((2,), outputs=8)))`",
         ValueError, "the decoder must read x + r = 9 values",
         lambda p: metalearn.Learner(
             metalearn.models.mlp((8,), hidden=(), outputs=2, name="decoder"),
             metalearn.adapters.ConditionalNeuralProcess(
                 metalearn.models.mlp((2,), hidden=(), outputs=8, name="encoder")),
             loss=metalearn.functional.gaussian_nll), None,
         "the encoder's and decoder's sizes"),
    Case("inner steps for a neural process", "`learner.adapt(x, y, steps=1)` with a "
         "`ConditionalNeuralProcess` (or `evaluate.inner_steps = (1,)`)", ValueError,
         "takes no inner steps (it reads the support set in one forward pass), got steps=1",
         lambda p: _neural_process_steps(), None, "the value and evaluate.inner_steps = (0,)"),
    Case("in-context adapter without ways or targets", "`InContext()`", ValueError,
         "InContext needs ways= (classification) or targets= (regression), exactly one",
         lambda p: metalearn.adapters.InContext(), None, "both values"),
    Case("in-context adapter given more ways than it was built for", "padded episodes of "
         "up to 5 ways for `InContext(ways=3)`", ValueError,
         "InContext was built for 3 ways (its read-out's logits); these padded episodes "
         "have up to 5 ways", lambda p: _in_context_ways(), None,
         "both counts and the ways= to build it with"),
    Case("in-context adapter given an unpadded episode of more ways", "5-way episodes for "
         "`InContext(ways=3)`", tf.errors.InvalidArgumentError,
         "InContext (built for 3 ways): support labels must be in 0 .. 2",
         lambda p: _in_context_ways(padded=False), None, "the ways it was built for"),
    Case("inner Adam's beta out of range", "`InnerAdam(beta_1=-1)`",
         HyperparameterRangeError, "InnerAdam.beta_1 must be in [0, 1), got -1",
         lambda p: metalearn.adapters.InnerAdam(beta_1=-1), None,
         "the piece, hyperparameter, value and range"),
    gin_case("negative inner momentum", "InnerMomentum.momentum = -0.9",
             HyperparameterRangeError, "InnerMomentum.momentum must be in [0, 1), got -0.9",
             base=SINUSOID + ["GradientDescent.learning_rate = None",
                              "GradientDescent.update = @InnerMomentum()"]),
    Case("learned value outside its bounds", "`Learned(0.5, low=0, high=0.1)`",
         HyperparameterRangeError, "Learned.initial must be in [0, 0.1], got 0.5",
         lambda p: metalearn.adapters.Learned(0.5, low=0, high=0.1), None,
         "the value and the bounds"),
    gin_case("momentum of a learned optimizer outside [0, 1)",
             "LearnedRule.betas = (0.5, 1.0)", HyperparameterRangeError,
             "LearnedRule.betas must be in [0, 1), got 1", base=LEARNED_OPTIMIZER),
    Case("a learned optimizer applied to weights it was not built for",
         "`rule.update` of `mlp/hidden0/kernel` by a `LearnedRule` built behind "
         "`Mask((\"head\",))`", RuleMismatchError,
         "LearnedRule was built for the weights ['mlp/head/kernel', 'mlp/head/bias'], not "
         "'mlp/hidden0/kernel'", learned_rule_on_other_weights, None,
         "the weight and those it was built for"),
    Case("a learned optimizer's network of another shape",
         "`LearnedRule(hidden=(8,)).create('float32', values)`, the values of a "
         "`hidden=(16,)` rule", RuleMismatchError,
         "LearnedRule array 'hidden_0_kernel' has shape (8, 16), this rule (hidden=(8,), "
         "8 features) needs (8, 8)", learned_rule_of_another_shape, None,
         "the array, both shapes, the hidden sizes"),
    Case("learned-rule Keras optimizer of a negative learning rate",
         "`LearnedRuleOptimizer(rule, learning_rate=-0.5)`", HyperparameterRangeError,
         "LearnedRuleOptimizer.learning_rate must be > 0, got -0.5",
         learned_rule_optimizer_climbing, None, "the value and the range"),
    Case("a model-based task beyond its memory budget", "`AttentiveNeuralProcess("
         "memory_budget='1MiB')` predicting 2000 targets from 2000 context points (by "
         "default the budget is the machine's memory)", MemoryBudgetError,
         "AttentiveNeuralProcess: 2000 context points, 2000 targets need an estimated",
         attentive_np_beyond_its_budget, lambda p: "the limit of 1.0 MiB",
         "the sizes, the estimate and the limit, before the work"),
    Case("truncated learned-rule file", "`LearnedRule.load(path)` of the first half of a "
         "saved `.npz`", RuleFileError, "cannot be read (BadZipFile: ",
         truncated_rule_file, lambda p: f"learned-rule file {str(p / 'rule.npz')!r}",
         "the file and what it should hold"),
    Case("learned-rule file whose configuration is not JSON", "`LearnedRule.load(path)` "
         "of a `.npz` whose `__config__` is `{not json`", RuleFileError,
         "its '__config__' member is not JSON", rule_file_of_bad_json,
         lambda p: f"learned-rule file {str(p / 'rule.npz')!r}",
         "the file, the text and the keys expected"),
    Case("learned-rule file of NaN weights", "`LearnedRule.load(path)` of a `.npz` whose "
         "`output_bias` holds a NaN", RuleFileError,
         "LearnedRule array 'output_bias' holds 1 non-finite value(s)",
         rule_file_of_nan_weights, lambda p: f"learned-rule file {str(p / 'rule.npz')!r}",
         "the file and the array"),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
