"""The floor below adapters, heads and learners: what they all build on.

* :mod:`metalearn.pieces.piece`: the piece vocabulary, :class:`Piece` (a part of an inner
  loop, a head, a task initialiser; what a composite needs is computed over its parts),
  :class:`Capabilities`, :class:`Pieces` (pieces held as one: a learner's), the path selection every piece uses (:func:`select_paths`,
  :func:`check_patterns`), :func:`clamp_step` (an inner-step index that is an int or a
  tensor), and what a learner hands an adapter: :data:`LossFn`, :data:`CallFn`,
  :class:`SplitLoss`;
* :mod:`metalearn.pieces.implicit_diff`: the implicit-differentiation primitive
  :func:`implicit_solution` and its linear solvers :class:`ConjugateGradient`,
  :class:`Neumann` (iMAML's inner solve, the SVM and logistic heads);
* :mod:`metalearn.ranges` (floor 0, re-exported here): the one check of a
  hyperparameter's range, :func:`check_range` with a :class:`Range` (``POSITIVE``,
  ``DECAY``, ...), used by every piece, environment, estimator and rule that takes a
  number; :class:`HyperparameterRangeError` names the piece, the
  hyperparameter, the value and the range.

The same names are importable from :mod:`metalearn.adapters` (and
``metalearn.adapters.base``, ``metalearn.adapters.implicit_diff``) as before.
"""

from metalearn.pieces.implicit_diff import (ConjugateGradient, LinearSolver, Neumann,
                                            implicit_solution)
from metalearn.pieces.piece import (CallFn, Capabilities, LossFn, Piece, Pieces, SplitLoss,
                                    check_patterns, clamp_step, select_paths)
from metalearn.ranges import (COUNT, DECAY, EPSILON, NON_NEGATIVE, POSITIVE, STEPS,
                                     HyperparameterRangeError, Range, check_range)

__all__ = ["COUNT", "DECAY", "EPSILON", "NON_NEGATIVE", "POSITIVE", "STEPS", "CallFn", "Capabilities",
           "ConjugateGradient", "HyperparameterRangeError", "LinearSolver", "LossFn",
           "Neumann", "Piece", "Pieces", "Range", "SplitLoss", "check_patterns",
           "check_range", "clamp_step", "implicit_solution", "select_paths"]
