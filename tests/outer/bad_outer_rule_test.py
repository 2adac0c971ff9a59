"""Bad outer rules: the outer optimizer's learning rate, evolution strategies, truncated
and persistent unrolls, names and keywords that moved, a rule that cannot be compiled
with XLA. Cases of docs/errors.md (tests/bad_input.py)."""

from metalearn.pieces import HyperparameterRangeError
from tests.bad_input import POINT_NAV, Case, check, gin_case, parametrize, run_gin

TITLE = "Outer rules"

SINUSOID_ES = ["include 'experiments/sinusoid/maml_es.gin'", "Loop.num_steps = 2",
               "Loop.log_every = 1"]

SINUSOID_TRUNCATED = ["include 'experiments/sinusoid/maml.gin'",
                      "include 'experiments/learners/truncated.gin'", "INNER_STEPS = 4",
                      "HORIZON = 4", "TRUNCATION = 2", "Loop.num_steps = 2",
                      "Loop.log_every = 1"]

SINUSOID_PES = [line for line in SINUSOID_TRUNCATED if "truncated.gin" not in line] + [
    "include 'experiments/learners/pes.gin'"]  # one outer-rule learner (check_roles)


CASES = [
    gin_case("negative outer learning rate", "keras.optimizers.Adam.learning_rate = -0.001",
             ValueError, "the optimizer's learning_rate must be > 0, got -0.001 (Adam)"),
    gin_case("zero noise scale of evolution strategies", "EvolutionStrategies.sigma = 0.0",
             ValueError, "EvolutionStrategies.sigma (the noise scale) must be > 0, got 0.0",
             base=SINUSOID_ES),
    gin_case("empty population of evolution strategies",
             "EvolutionStrategies.population = 0", ValueError,
             "EvolutionStrategies.population (antithetic pairs) must be a whole number >= 1, "
             "got 0", base=SINUSOID_ES),
    gin_case("the old outer rule's name", "Experiment.outer_rule = @MetaOptimizer()",
             TypeError, "MetaOptimizer is MetaGradient since metalearn 0.3"),
    gin_case("clipping as an outer rule's keyword", "MetaGradient.clipnorm = 1.0", ValueError,
             "MetaGradient(clipnorm=...) moved in metalearn 0.3: use a guard: "
             "ClipDirections"),
    gin_case("truncation longer than the horizon", "TruncatedUnroll.truncation = 8",
             ValueError, "TruncatedUnroll: truncation (8 steps) is longer than the horizon "
             "(4 steps)", base=SINUSOID_TRUNCATED),
    gin_case("truncation not dividing the horizon", "PersistentES.truncation = 3",
             ValueError, "PersistentES: truncation (3 steps) must divide the horizon "
             "(4 steps) into whole segments", base=SINUSOID_PES),
    gin_case("zero noise scale of persistent ES", "PersistentES.sigma = 0.0",
             HyperparameterRangeError, "PersistentES.sigma (the noise scale) must be > 0, "
             "got 0.0", base=SINUSOID_PES),
    gin_case("noise reuse without persistence", "PersistentES.noise_reuse = True",
             ValueError, "PersistentES: noise_reuse=True keeps each pair's noise for the "
             "whole horizon and needs persistent=True; got persistent=False",
             base=SINUSOID_PES + ["PersistentES.persistent = False"]),
    gin_case("empty population of persistent ES", "PersistentES.population = 0",
             HyperparameterRangeError, "PersistentES.population (antithetic pairs) must be "
             "a whole number >= 1, got 0", base=SINUSOID_PES),
    Case("truncated unroll of a loop without steps", "`Experiment.outer_rule = "
         "@TruncatedUnroll()` with `Learner.adapter = @NoAdaptation()`", TypeError,
         "TruncatedUnroll carries a GradientDescent inner loop across outer steps; the "
         "learner's adapter is NoAdaptation",
         lambda p: run_gin(p, SINUSOID_TRUNCATED + ["Learner.adapter = @NoAdaptation()"]),
         None, "the rule and the adapter, before the first step"),
    Case("TRPO compiled with XLA", "`Experiment.outer_rule = @TRPO()` with "
         "`Runtime.jit_compile = True`", ValueError, "TRPO cannot be compiled with XLA",
         lambda p: run_gin(p, POINT_NAV + ["Experiment.outer_rule = @TRPO()",
                                           "Runtime.jit_compile = True"]), None,
         "the rule and the reason, before the first step"),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
