"""Outer rules: how a meta-batch's result moves the meta-variables.

:class:`OuterRule` is the interface (``build``, ``directions``, ``apply``, ``step``);
:class:`MetaGradient` (gradient descent on the meta-loss with any Keras optimizer),
:class:`Reptile`, :class:`SerialReptile`, :class:`EvolutionStrategies` (the
meta-gradient estimated from perturbed meta-losses, no backpropagation) and
:class:`TRPO` (meta-RL's trust region: conjugate gradient on the KL's Hessian-vector
products, a line search) and :class:`ClippedRatio` (PPO / ProMP: epochs of the clipped
likelihood ratio on one collected batch) are rules;
:class:`PCGrad` (gradient surgery across the batch's tasks, on each task's own
meta-gradient) is a rule; :class:`ClipDirections` and :class:`SkipNonFinite` are guards that wrap any rule;
:mod:`metalearn.outer.replicas` holds the cross-replica apply;
:mod:`metalearn.outer.persistent` truncated backpropagation and PES on an explicit
unroll; :class:`TruncatedUnroll` and :class:`PersistentES`
(:mod:`metalearn.outer.truncated`) carry a learner's inner trajectory (a learned
optimizer's included) across outer steps in segments, its state checkpointed with the
run.
"""

from metalearn.outer.clipped import ClippedRatio
from metalearn.outer.evolution import EvolutionStrategies
from metalearn.outer.guards import NON_FINITE, ClipDirections, Guard, SkipNonFinite
from metalearn.outer.pcgrad import PCGrad
from metalearn.outer.reptile import Reptile, SerialReptile
from metalearn.outer.rule import MetaGradient, MetaOptimizer, OptimizerRule, OuterRule
from metalearn.outer.trpo import TRPO
from metalearn.outer.truncated import PersistentES, TruncatedUnroll

__all__ = ["ClipDirections", "ClippedRatio", "EvolutionStrategies", "Guard",
           "MetaGradient", "MetaOptimizer", "NON_FINITE", "OptimizerRule", "OuterRule", "PCGrad",
           "PersistentES", "Reptile", "SerialReptile", "SkipNonFinite", "TRPO",
           "TruncatedUnroll"]
