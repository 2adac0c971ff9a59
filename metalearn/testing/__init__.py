"""The contract every learner and inner-loop piece meets, shipped for research code.

A new algorithm gets the whole contract by writing one small test class::

    from metalearn.testing import LearnerContract, classification_learner

    class TestMyAdapter(LearnerContract):
        covers = (MyAdapter,)
        def make_learner(self):
            return classification_learner(MyAdapter(steps=2))

(:class:`RegressionContract` and :func:`regression_learner` for a regression learner;
the ``episodes`` and ``training_episodes`` hooks for other tasks, or a learner trained
on whole-class batches), and checks its meta-gradient against finite differences in float64 with
:func:`assert_meta_gradient_matches_finite_differences` (built of
:func:`analytic_meta_gradient`, :func:`finite_difference_variables` and
:func:`relative_error`; :func:`finite_difference_gradient` for a function of weights);
models too large for that along random directions with
:func:`finite_difference_directions`; an inner optimizer against a Keras one step by
step with :func:`keras_optimizer_trajectory`. An outer rule gets its contract the same way
(:class:`OuterRuleContract`: one step under every formulation, one device and a
strategy, XLA or not, equal to the rule's per-task reference in float64; a stochastic
rule with its seed fixed: :func:`evolution_estimate` is evolution strategies' reference;
a piece under a carried trajectory: :func:`carried_segment_gradients`, a truncated
segment's gradient against finite differences from the carried state).
Nothing here imports pytest.
"""

from metalearn.testing.contract import (DIM, QUERIES, SHOTS, WAYS, LearnerContract,
                                        RegressionContract, classification_learner,
                                        contract_model, regression_learner,
                                        softmax_cross_entropy, synthetic_classification,
                                        synthetic_regression, uninformative_support)
from metalearn.testing.outer import (OuterRuleContract, carried_segment_gradients,
                                     evolution_estimate, evolution_noise, task_adapted,
                                     task_meta_gradient, two_replicas, values)
from metalearn.testing.reference import (analytic_meta_gradient,
                                         assert_meta_gradient_matches_finite_differences,
                                         compiled_meta_gradient,
                                         finite_difference_directions,
                                         finite_difference_gradient,
                                         finite_difference_variables, flat,
                                         keras_optimizer_trajectory, relative_error)
from metalearn.testing.tasks import (assert_sampler_is_seeded_and_stateless, image_episodes,
                                     mse, regression_episodes, small_learner, softmax_xent)

__all__ = ["DIM", "LearnerContract", "RegressionContract", "OuterRuleContract",
           "carried_segment_gradients", "evolution_estimate", "evolution_noise", "task_adapted",
           "task_meta_gradient", "two_replicas", "values", "QUERIES", "SHOTS", "WAYS", "analytic_meta_gradient",
           "assert_meta_gradient_matches_finite_differences",
           "assert_sampler_is_seeded_and_stateless", "classification_learner",
           "compiled_meta_gradient", "contract_model", "finite_difference_directions",
           "finite_difference_gradient", "finite_difference_variables", "flat",
           "image_episodes", "mse", "regression_episodes", "relative_error", "small_learner",
           "softmax_cross_entropy", "softmax_xent", "synthetic_classification",
           "synthetic_regression", "regression_learner",
           "uninformative_support"]
