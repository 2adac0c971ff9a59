"""Moved: the implicit-differentiation primitive is :mod:`metalearn.pieces.implicit_diff`
(one floor below adapters and heads, which both use it). This module re-exports it so
that ``from metalearn.adapters.implicit_diff import ...`` keeps working."""

from metalearn.pieces.implicit_diff import (Condition, ConjugateGradient,  # noqa: F401
                                            LinearSolver, Neumann, SolverInfo, Tensors,
                                            diagnostic_names, dot, implicit_solution)

__all__ = ["Condition", "ConjugateGradient", "LinearSolver", "Neumann", "SolverInfo",
           "Tensors", "diagnostic_names", "dot", "implicit_solution"]
