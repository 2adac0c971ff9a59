"""Outer update rules: how a meta-batch's result changes the meta-variables."""

from metalearn.outer.meta_optimizer import MetaOptimizer
from metalearn.outer.reptile import Reptile, SerialReptile

__all__ = ["MetaOptimizer", "Reptile", "SerialReptile"]
