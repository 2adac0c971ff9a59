"""Guards: wrappers around any outer rule, as optax wraps a transformation
(``apply_if_finite``, clipping), instead of flags on every rule.

A guard asks the rule it wraps for everything (state, directions, the step) and changes
only the update: :meth:`OuterRule.step` calls the outermost :meth:`apply`, which reaches
the wrapped rule's own through each guard in turn, once per update (serial Reptile
updates once per task).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import gin
import tensorflow as tf

from metalearn.execution import Formulation
from metalearn.learners.learner import Learner
from metalearn.outer import replicas
from metalearn.outer.rule import ApplyFn, Metrics, OuterRule
from metalearn.pieces import POSITIVE, check_range
from metalearn.tasks.episode import Episode

NON_FINITE = "non_finite"
"""The figure :class:`SkipNonFinite` adds: its flags vector."""


class Guard(OuterRule):
    """An outer rule around another: everything is the wrapped rule's except
    :meth:`apply`, which a guard overrides to change or withhold the update.

    Args:
      rule: the outer rule guarded.
    """

    def __init__(self, rule: OuterRule, name: Optional[str] = None):
        super().__init__(name=name)
        if not isinstance(rule, OuterRule):
            raise TypeError(f"{type(self).__name__}.rule must be a metalearn outer rule "
                            f"(MetaGradient(), Reptile(), ...), got {rule!r}")
        self.wrapped = rule

    @property
    def rule(self) -> OuterRule:
        return self.wrapped.rule

    @property
    def interleaves_updates(self) -> bool:  # type: ignore[override]
        return self.wrapped.interleaves_updates

    @property
    def xla_unsupported(self) -> Optional[str]:  # type: ignore[override]
        return self.wrapped.xla_unsupported

    @property
    def replicas_unsupported(self) -> Optional[str]:  # type: ignore[override]
        return self.wrapped.replicas_unsupported

    @property
    def optimizer(self) -> Any:
        """The wrapped rule's Keras optimizer, if it has one (checkpointed with it)."""
        return getattr(self.wrapped, "optimizer", None)

    def build(self, learner: Learner) -> None:
        self.wrapped.build(learner)

    def directions(self, learner, episodes, formulation):
        return self.wrapped.directions(learner, episodes, formulation)

    def apply(self, learner, directions, metrics):
        return self.wrapped.apply(learner, directions, metrics)

    def step(self, learner: Learner, episodes: Episode, formulation: Formulation,
             apply: Optional[ApplyFn] = None, jit_compile: bool = False) -> Metrics:
        return self.wrapped.step(learner, episodes, formulation, apply=apply or self.apply,
                                 jit_compile=jit_compile)


@gin.configurable
class ClipDirections(Guard):
    """The update's directions clipped by their global norm (``tf.clip_by_global_norm``),
    after their mean over replicas (the whole meta-batch's directions are clipped, not a
    replica's): what ``clipnorm`` was. (The inner loop's gradients are clipped by the
    update transform :class:`metalearn.adapters.ClipByGlobalNorm`.)

    Args:
      rule: the outer rule whose directions are clipped.
      max_norm: the largest global norm (> 0).
    """

    def __init__(self, rule: OuterRule = gin.REQUIRED, max_norm: float = gin.REQUIRED):
        super().__init__(rule)
        self.max_norm = check_range("ClipDirections", "max_norm", max_norm, POSITIVE)

    def apply(self, learner, directions, metrics):
        directions = replicas.mean(directions) if replicas.count() > 1 else list(directions)
        directions, _ = tf.clip_by_global_norm(directions, self.max_norm)
        return self.wrapped.apply(learner, directions, metrics)


def non_finite(loss: tf.Tensor, directions: Sequence[tf.Tensor]) -> tf.Tensor:
    """Which of the loss and the directions hold a NaN or an infinity: a float32 vector
    ``[1 + len(directions)]``, entry 0 counting the replicas whose loss is not finite,
    entry ``1 + i`` those whose direction ``i`` is not; summed over replicas, so every
    replica (and worker) sees the same vector and takes the same decision."""
    flags = [tf.logical_not(tf.reduce_all(tf.math.is_finite(loss)))]
    flags += [tf.logical_not(tf.reduce_all(tf.math.is_finite(d))) for d in directions]
    return replicas.total(tf.cast(tf.stack(flags), tf.float32))


@gin.configurable
class SkipNonFinite(Guard):
    """The update applied only if the meta-loss and every direction are finite on every
    replica, decided inside the compiled step (otherwise weights, optimizer slots and
    iteration count are left as they were). Adds :data:`NON_FINITE` to the figures: the
    :func:`non_finite` vector, all zero when the update was applied. Within one step
    (serial Reptile's updates, one per task) the flags add up, so an update after a
    non-finite one is withheld too.

    Args:
      rule: the outer rule guarded.
    """

    def __init__(self, rule: OuterRule = gin.REQUIRED):
        super().__init__(rule)

    def apply(self, learner, directions, metrics):
        flags = non_finite(metrics["loss"], directions)
        if NON_FINITE in metrics:  # an earlier update of the same step
            flags = flags + metrics[NON_FINITE]
        passed = {k: v for k, v in metrics.items() if k != NON_FINITE}
        replicas.run_if(tf.reduce_all(flags == 0),
                        lambda d: self.wrapped.apply(learner, d, passed), directions)
        return {**metrics, NON_FINITE: flags}


def guarded(rule: OuterRule, guard: type) -> bool:
    """Whether ``rule`` already holds a guard of type ``guard``."""
    while isinstance(rule, Guard):
        if isinstance(rule, guard):
            return True
        rule = rule.wrapped
    return False
