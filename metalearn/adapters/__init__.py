"""Inner loops: how a model's weights are adapted to one task, built from pieces.

* the loop: :class:`GradientDescent` (and the front doors :class:`MetaSGD`,
  :class:`PerStepLearningRates`), :class:`ImplicitGradientDescent`,
  :class:`Hypernetwork`, :class:`NoAdaptation`;
* model-based, no inner loop (:mod:`metalearn.adapters.neural_process`):
  :class:`ConditionalNeuralProcess`, :class:`AttentiveNeuralProcess`,
  :class:`LatentNeuralProcess`; and :class:`InContext`
  (:mod:`metalearn.adapters.in_context`: a transformer over the support set and the
  queries);
* update transforms (:mod:`metalearn.adapters.updates`): :class:`GradientStep`,
  :class:`FirstOrder`, :class:`AnnealOrder`, :class:`Mask`, :class:`LearnedRates`,
  :class:`ClipByGlobalNorm`, :class:`Proximal`, :class:`Chain`; any hyperparameter
  :class:`Learned`;
* differentiable inner optimizers (:mod:`metalearn.adapters.optimizers`):
  :class:`InnerMomentum` (and Nesterov), :class:`InnerAdam`, :class:`InnerRMSProp`;
* a learned optimizer (:mod:`metalearn.adapters.learned_optimizer`): :class:`LearnedRule`
  (a small network per parameter element, meta-trained) and
  :class:`LearnedRuleOptimizer` (the same rule, frozen, as a Keras optimizer);
* step wrappers (:mod:`metalearn.adapters.wrappers`): :class:`PerStepWeights`,
  :class:`Recompute`, :class:`MiniBatches`, :class:`WhileLoop`,
  :class:`SupportFromWeights`.

The piece vocabulary they speak (:class:`Piece`, :class:`Capabilities`,
:class:`SplitLoss`, :data:`LossFn`, :data:`CallFn`) is :mod:`metalearn.pieces`', one floor
below; it stays importable from here.
"""

from metalearn.adapters.base import Adapter, NoAdaptation
from metalearn.adapters.gradient_descent import GradientDescent
from metalearn.adapters.hypernetwork import Hypernetwork
from metalearn.adapters.implicit import ImplicitGradientDescent
from metalearn.adapters.in_context import InContext
from metalearn.adapters.hyperparameters import Learned
from metalearn.adapters.neural_process import (AttentiveNeuralProcess,
                                              ConditionalNeuralProcess, LatentNeuralProcess,
                                              NeuralProcess)
from metalearn.adapters.learned_rates import MetaSGD, PerStepLearningRates
from metalearn.adapters.learned_optimizer import LearnedRule, LearnedRuleOptimizer
from metalearn.adapters.optimizers import InnerAdam, InnerMomentum, InnerRMSProp
from metalearn.adapters.updates import (AnnealOrder, Chain, ClipByGlobalNorm,
                                        FirstOrder, GradientStep, LearnedRates, Mask,
                                        Proximal, StepInfo, Update)
from metalearn.adapters.wrappers import (MiniBatches, PerStepWeights, Recompute, StepWrapper,
                                        SupportFromWeights, WhileLoop)
from metalearn.pieces import CallFn, Capabilities, LossFn, Piece, SplitLoss

__all__ = ["Adapter", "AnnealOrder", "AttentiveNeuralProcess", "CallFn", "Capabilities",
           "Chain", "ClipByGlobalNorm", "ConditionalNeuralProcess", "FirstOrder",
           "GradientDescent", "GradientStep", "Hypernetwork", "ImplicitGradientDescent", "InContext",
           "InnerAdam", "InnerMomentum", "InnerRMSProp", "LatentNeuralProcess", "Learned",
           "LearnedRates", "LearnedRule", "LearnedRuleOptimizer",
           "LossFn", "Mask", "MetaSGD", "MiniBatches", "NeuralProcess", "NoAdaptation",
           "PerStepLearningRates", "PerStepWeights", "Piece", "Proximal", "Recompute",
           "SplitLoss", "StepInfo", "StepWrapper", "SupportFromWeights", "Update",
           "WhileLoop"]
