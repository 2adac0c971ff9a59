"""Meta-learned hyperparameters of update transforms.

Any hyperparameter of a transform (a rate, Adam's betas, a momentum, epsilon) is either
a number or :class:`Learned`: then the transform creates ``keras.Variable``s for it in
its ``build`` (one per weight, per inner step, per element, ... as ``per`` says), lists
them as meta-variables and reads them inside the inner loop, so the outer step trains
them with the initial weights. Meta-SGD is ``GradientStep(Learned(0.01, "element"))``;
MAML++'s LSLR ``GradientStep(Learned(0.01, "layer_step"))``.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Union

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn.pieces import HyperparameterRangeError, Range, check_range, clamp_step
from metalearn.functional import Weights

PER = ("scalar", "layer", "step", "layer_step", "element")
FINITE = Range()


@gin.configurable
class Learned:
    """A meta-learned hyperparameter.

    Args:
      initial: its initial value: in the range of the hyperparameter it stands for (a
        learning rate ``> 0``, a momentum or beta in ``[0, 1)``, as the piece's docstring
        states; checked when the piece is built) and in ``[low, high]``.
      per: ``"scalar"`` (one value for every weight and step), ``"layer"`` (one per
        adapted weight tensor), ``"step"`` (one per inner step), ``"layer_step"`` (one
        per weight tensor and step) or ``"element"`` (one per element of each weight).
        With more inner steps at test time than it was built for, the last step's value
        is reused.
      low, high: if set, bounds the value never leaves: after every outer update a
        Keras optimizer makes (every :class:`~metalearn.outer.OptimizerRule`) the
        variables are projected back onto ``[low, high]`` (their ``constraint``), and
        where they are used they are clipped to it. At a bound the clip passes the
        gradient on, so a value the outer step pushed onto a bound moves back inside
        when the meta-gradient says so (it is never stuck outside, with no gradient).
        ``low`` must be below ``high``. For a hyperparameter whose range binds
        learned values (a momentum, beta or rho in ``[0, 1)``, an epsilon ``> 0``:
        where leaving the range breaks the rule; ``Range.binds_learned``) an unset end
        is the range's and a set one must lie in the range; others (learning rates:
        Meta-SGD's may change sign) are free where unset.
    """

    def __init__(self, initial: float = gin.REQUIRED, per: str = "scalar",
                 low: Optional[float] = None, high: Optional[float] = None):
        if initial is gin.REQUIRED:
            raise ValueError("Learned needs an initial value")
        if per not in PER:
            raise ValueError(f"Learned per must be one of {PER}, got {per!r}")
        low = None if low is None else check_range("Learned", "low", low, FINITE)
        high = None if high is None else check_range("Learned", "high", high, FINITE)
        if low is not None and high is not None and not low < high:
            raise HyperparameterRangeError(f"Learned low={low:g} must be below "
                                           f"high={high:g}")
        self.initial = check_range("Learned", "initial", initial, self.bounds(low, high))
        self.per = per
        self.low, self.high = low, high

    @staticmethod
    def bounds(low: Optional[float], high: Optional[float]) -> Range:
        """``[low, high]`` as a :class:`~metalearn.pieces.Range` (an end ``None``:
        unbounded)."""
        return Range(low, high)

    def project(self, value: tf.Tensor) -> tf.Tensor:
        """``value`` clipped to ``[low, high]`` (itself when unbounded)."""
        if self.low is None and self.high is None:
            return value
        return tf.clip_by_value(value, -np.inf if self.low is None else self.low,
                                np.inf if self.high is None else self.high)

    def __repr__(self) -> str:
        bounds = "".join(f", {n}={v:g}" for n, v in (("low", self.low), ("high", self.high))
                         if v is not None)
        return f"Learned({self.initial:g}, per={self.per!r}{bounds})"


Value = Union[float, Learned]


def variable_name(path: str, suffix: str) -> str:
    """A Keras variable name for state belonging to weight ``path`` (no ``/`` allowed)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", path) + "_" + suffix


class HyperparameterSet(tf.Module):
    """The hyperparameters of one transform: numbers, and the variables of the learned
    ones (created by :meth:`build` for the adapted weights and the number of steps;
    tracked, so checkpoints save them)."""

    def __init__(self):
        super().__init__(name="hyperparameters")
        self.values: Dict[str, Value] = {}
        self._paths: List[str] = []
        self._steps = 0
        self._variables: Dict[str, List[keras.Variable]] = {}

    def declare(self, owner: str, name: str, value: Value, allowed: Range) -> Value:
        """Records hyperparameter ``name`` of piece ``owner`` and checks it is in
        ``allowed`` (:func:`~metalearn.pieces.check_range`): a number, or a
        :class:`Learned` one's initial value; a :class:`Learned` one is
        bounded to ``allowed`` where the range binds learned values."""
        if isinstance(value, Learned):
            check_range(owner, name, value.initial, allowed)
            if allowed.binds_learned:
                value = self._bounded(owner, name, value, allowed)
        else:
            value = check_range(owner, name, value, allowed)
        self.values[name] = value
        return value

    @staticmethod
    def _bounded(owner: str, name: str, value: "Learned", allowed: Range) -> "Learned":
        """``value`` with each end it leaves unset taken from ``allowed`` (inside an open
        end); an end it sets must lie in ``allowed``."""
        low, high = allowed.inner_bounds()
        for end, given in (("low", value.low), ("high", value.high)):
            if given is not None:
                check_range(owner, f"{name} (Learned.{end})", given, allowed)
        return Learned(value.initial, value.per,
                       low=low if value.low is None else value.low,
                       high=high if value.high is None else value.high)

    def learned(self, name: str) -> bool:
        return isinstance(self.values[name], Learned)

    def build(self, weights: Weights, steps: int, suffixes: Dict[str, str]) -> None:
        self._paths, self._steps = list(weights), int(steps)
        self._variables = {}
        for name, value in self.values.items():
            if not isinstance(value, Learned):
                continue
            if value.per in ("step", "layer_step") and steps < 1:
                raise ValueError(f"per-step {name} needs steps >= 1, got {steps}")
            suffix = suffixes.get(name, name)
            dtype = next(iter(weights.values())).dtype.name if weights else "float32"
            if value.per in ("scalar", "step"):
                shape = () if value.per == "scalar" else (steps,)
                variables = [keras.Variable(np.full(shape, value.initial), dtype=dtype,
                                            trainable=True, name=suffix)]
            else:
                variables = [keras.Variable(
                    np.full({"layer": (), "layer_step": (steps,),
                             "element": tuple(weights[p].shape)}[value.per], value.initial),
                    dtype=weights[p].dtype.name, trainable=True,
                    name=variable_name(p, suffix)) for p in self._paths]
            if value.low is not None or value.high is not None:
                for variable in variables:  # applied by Keras after each update
                    variable.constraint = value.project
            self._variables[name] = variables

    @property
    def meta_variables(self) -> List[keras.Variable]:
        return [v for variables in self._variables.values() for v in variables]

    def by_path(self, name: str) -> Dict[str, keras.Variable]:
        """A per-weight learned hyperparameter's variables by weight path."""
        return dict(zip(self._paths, self._variables.get(name, [])))

    def value(self, name: str, path: str, step: Any, dtype: tf.DType) -> tf.Tensor:
        """Hyperparameter ``name`` for weight ``path`` at inner step ``step`` (an int, or a
        scalar integer tensor when the steps run in a ``tf.while_loop``)."""
        value = self.values[name]
        if not isinstance(value, Learned):
            return tf.constant(value, dtype)
        if name not in self._variables:
            raise RuntimeError(f"learned {name} is not built: build the adapter first "
                               "(a Learner does)")
        variables = self._variables[name]
        if value.per in ("scalar", "step"):
            variable = variables[0]
        else:
            if path not in self._paths:
                raise KeyError(f"no learned {name} for weight {path!r}: it was built for "
                               f"{self._paths}")
            variable = variables[self._paths.index(path)]
        result = tf.cast(variable, dtype)
        if value.per in ("step", "layer_step"):
            result = result[clamp_step(step, self._steps - 1)]
        return value.project(result)  # identity inside the bounds and at them
