"""The one check of a hyperparameter's range, shared by every piece that takes one.

Inner optimizers, learned hyperparameters, inner loops, heads, linear solvers and outer
guards declare each number they take with a :class:`Range` and call
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
from typing import Optional, Union

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

    def __str__(self) -> str:
        prefix = "a whole number " if self.whole else ""
        if self.low is not None and self.high is not None:
            return (f"{prefix}in {'(' if self.low_open else '['}{_text(self.low)}, "
                    f"{_text(self.high)}{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"{prefix}{'>' if self.low_open else '>='} {_text(self.low)}"
        if self.high is not None:
            return f"{prefix}{'<' if self.high_open else '<='} {_text(self.high)}"
        return f"{prefix}finite".strip()


POSITIVE = Range(0, low_open=True)
"""``> 0``: a learning rate, an epsilon, a regulariser, a scale."""
NON_NEGATIVE = Range(0)
"""``>= 0``: a damping, a weight decay."""
DECAY = Range(0, 1, high_open=True)
"""``[0, 1)``: a momentum, Adam's betas, RMSProp's rho."""
STEPS = Range(0, whole=True)
"""A whole number ``>= 0``: inner steps (0: no adaptation)."""
COUNT = Range(1, whole=True)
"""A whole number ``>= 1``: iterations, a batch size."""


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
