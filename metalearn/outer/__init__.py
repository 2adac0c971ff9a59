"""Outer rules: how a meta-batch's result moves the meta-variables.

:class:`OuterRule` is the interface (``build``, ``directions``, ``apply``, ``step``);
:class:`MetaGradient` (gradient descent on the meta-loss with any Keras optimizer),
:class:`Reptile`, :class:`SerialReptile`, :class:`EvolutionStrategies` (the
meta-gradient estimated from perturbed meta-losses, no backpropagation) are rules
(meta-RL's own, ``TRPO`` and ``ClippedRatio``, live with the policy learner they run
on, in :mod:`metalearn.rl`);
:class:`PCGrad` (gradient surgery across the batch's tasks, on each task's own
meta-gradient) is a rule; :class:`ClipDirections` and :class:`SkipNonFinite` are guards that wrap any rule;
:mod:`metalearn.outer.replicas` holds the cross-replica apply;
:mod:`metalearn.outer.persistent` truncated backpropagation and PES on an explicit
unroll; :class:`TruncatedUnroll` and :class:`PersistentES`
(:mod:`metalearn.outer.truncated`) carry a learner's inner trajectory (a learned
optimizer's included) across outer steps in segments, its state checkpointed with the
run.
"""

from metalearn.outer.evolution import EvolutionStrategies
from metalearn.outer.guards import NON_FINITE, ClipDirections, Guard, SkipNonFinite
from metalearn.outer.pcgrad import PCGrad
from metalearn.outer.reptile import Reptile, SerialReptile
from metalearn.outer.rule import MetaGradient, MetaOptimizer, OptimizerRule, OuterRule
from metalearn.outer.truncated import PersistentES, TruncatedUnroll

__all__ = ["ClipDirections", "EvolutionStrategies", "Guard",
           "MetaGradient", "MetaOptimizer", "NON_FINITE", "OptimizerRule", "OuterRule", "PCGrad",
           "PersistentES", "Reptile", "SerialReptile", "SkipNonFinite",
           "TruncatedUnroll"]

_MOVED = {"TRPO": "metalearn.rl.TRPO", "ClippedRatio": "metalearn.rl.ClippedRatio",
          "trpo": "metalearn.rl.trpo", "clipped": "metalearn.rl.clipped"}


def __getattr__(name: str):
    # the meta-RL rules moved up to metalearn.rl, above this floor: named, not imported
    if name in _MOVED:
        raise AttributeError(f"metalearn.outer.{name} moved to {_MOVED[name]} (the meta-RL "
                             "rules live with the PolicyLearner they run on; gin's "
                             "@TRPO() / @ClippedRatio() are unchanged)")
    raise AttributeError(f"module 'metalearn.outer' has no attribute {name!r}")
