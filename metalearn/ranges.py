"""The one check of a hyperparameter's range, shared by every piece that takes one.

Inner optimizers, learned hyperparameters, inner loops, heads, linear solvers, outer
rules and guards, environments, estimators and task priors declare each number they take with a :class:`Range` and call
:func:`check_range`; the error names the piece, the hyperparameter, the value and the
allowed range::

    HyperparameterRangeError: InnerAdam.beta_1 must be in [0, 1), got -1

A value that is not a number (a string, ``None``, a bool) is a ``TypeError`` naming the
same. NaN and infinities are in no range (an infinite upper bound is open).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Optional, Tuple, Union

import numpy as np

Number = Union[int, float]


class HyperparameterRangeError(ValueError):
    """A piece's hyperparameter is outside its allowed range (the message names the
    piece, the hyperparameter, the value and the range)."""


def _text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


@dataclasses.dataclass(frozen=True)
class Range:
    """The allowed values of a hyperparameter: ``[low, high]``, either end open
    (excluded) or absent (unbounded), optionally whole numbers only.

    ``str(range)`` is how the errors and docstrings state it: ``"> 0"``, ``">= 0"``,
    ``"in [0, 1)"``, ``"a whole number >= 1"``.
    """

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    whole: bool = False
    binds_learned: bool = False
    """Whether a meta-learned value of this hyperparameter given no bounds of its own
    is kept in this range (:meth:`inner_bounds`): set where leaving it breaks the rule
    (a decay of 1 or more diverges, an epsilon of 0 divides by zero), unset where a
    learned value may leave it (Meta-SGD's rates change sign)."""

    def __post_init__(self):
        if self.low is not None and self.high is not None and not self.low <= self.high:
            raise ValueError(f"Range low={self.low} must not be above high={self.high}")

    def __contains__(self, value: Number) -> bool:
        value = float(value)
        if not math.isfinite(value) or self.whole and not value.is_integer():
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        if self.high is not None and (value >= self.high if self.high_open
                                      else value > self.high):
            return False
        return True

    def inner_bounds(self) -> Tuple[Optional[float], Optional[float]]:
        """``(low, high)``, closed, that lie in this range: an open end moved inside by
        float32's spacing there (at least its smallest normal number), so that a value
        projected onto them is in range in float32 as in float64."""
        def inside(end: Optional[float], is_open: bool, direction: float):
            if end is None or not is_open:
                return end
            step = max(float(np.spacing(np.float32(end))), float(np.finfo(np.float32).tiny))
            return float(np.float32(end + direction * step))
        return inside(self.low, self.low_open, 1.0), inside(self.high, self.high_open, -1.0)

    def __str__(self) -> str:
        prefix = "a whole number " if self.whole else ""
        if self.low is not None and self.high is not None:
            return (f"{prefix}in {'(' if self.low_open else '['}{_text(self.low)}, "
                    f"{_text(self.high)}{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"{prefix}{'>' if self.low_open else '>='} {_text(self.low)}"
        if self.high is not None:
            return f"{prefix}{'<' if self.high_open else '<='} {_text(self.high)}"
        return prefix.strip() or "finite"


POSITIVE = Range(0, low_open=True)
"""``> 0``: a learning rate, an epsilon, a regulariser, a scale."""
NON_NEGATIVE = Range(0)
"""``>= 0``: a damping, a weight decay."""
DECAY = Range(0, 1, high_open=True, binds_learned=True)
"""``[0, 1)``: a momentum, Adam's betas, RMSProp's rho (a learned one kept in it)."""
EPSILON = Range(0, low_open=True, binds_learned=True)
"""``> 0``: an epsilon added to a denominator (a learned one kept above 0)."""
STEPS = Range(0, whole=True)
"""A whole number ``>= 0``: inner steps (0: no adaptation)."""
COUNT = Range(1, whole=True)
"""A whole number ``>= 1``: iterations, a batch size."""
WHOLE = Range(whole=True)
"""Any whole number: a seed."""
UNIT = Range(0, 1)
"""``[0, 1]``: a discount, GAE's lambda."""


def check_range(owner: str, name: str, value: Number, allowed: Range) -> Number:
    """``value`` if it lies in ``allowed`` (an ``int`` for a whole-number range, else a
    ``float``).

    Args:
      owner: the piece, as the user spells it (``"InnerAdam"``, ``"Learned"``).
      name: the hyperparameter (``"beta_1"``).

    Raises:
      TypeError: ``value`` is not a real number (a bool, a string, ``None``).
      HyperparameterRangeError: it is outside ``allowed`` (or not finite).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}.{name} must be {allowed}, got {value!r} "
                        f"({type(value).__name__})")
    shown = value.item() if hasattr(value, "item") else value  # a NumPy scalar
    if value not in allowed:
        raise HyperparameterRangeError(f"{owner}.{name} must be {allowed}, got {shown!r}")
    return int(value) if allowed.whole else float(value)
