"""Outer rules: how a meta-batch's result moves the meta-variables.

:class:`OuterRule` is the interface (``build``, ``directions``, ``apply``, ``step``);
:class:`MetaGradient` (gradient descent on the meta-loss with any Keras optimizer),
:class:`Reptile`, :class:`SerialReptile` and :class:`EvolutionStrategies` (the
meta-gradient estimated from perturbed meta-losses, no backpropagation) are rules;
:class:`ClipDirections` and :class:`SkipNonFinite` are guards that wrap any rule;
:mod:`metalearn.outer.replicas` holds the cross-replica apply;
:mod:`metalearn.outer.persistent` truncated backpropagation and PES on an explicit
unroll; :mod:`metalearn.outer.learned_optimizer` a learned optimizer's inner loop as such
an unroll, meta-trained by truncated backpropagation (``train_truncated``).
"""

from metalearn.outer.evolution import EvolutionStrategies
from metalearn.outer.guards import NON_FINITE, ClipDirections, Guard, SkipNonFinite
from metalearn.outer.reptile import Reptile, SerialReptile
from metalearn.outer.rule import MetaGradient, MetaOptimizer, OptimizerRule, OuterRule

__all__ = ["ClipDirections", "EvolutionStrategies", "Guard", "MetaGradient", "MetaOptimizer",
           "NON_FINITE", "OptimizerRule", "OuterRule", "Reptile", "SerialReptile", "SkipNonFinite"]
