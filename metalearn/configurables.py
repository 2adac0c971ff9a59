"""Registers the Keras pieces that gin files name (``@keras.optimizers.Adam()``...)."""

from __future__ import annotations

import os

import gin
import keras

_OPTIMIZERS = ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Lion")
_LOSSES = ("MeanSquaredError", "MeanAbsoluteError", "SparseCategoricalCrossentropy",
           "CategoricalCrossentropy", "BinaryCrossentropy", "Huber")
_SCHEDULES = ("CosineDecay", "ExponentialDecay", "PiecewiseConstantDecay")


def _register(module, names, gin_module):
    for name in names:
        target = getattr(module, name, None)
        if target is not None:
            try:
                gin.external_configurable(target, name=name, module=gin_module)
            except ValueError:  # registered already (module re-imported)
                pass


_register(keras.optimizers, _OPTIMIZERS, "keras.optimizers")
_register(keras.losses, _LOSSES, "keras.losses")
_register(keras.optimizers.schedules, _SCHEDULES, "keras.optimizers.schedules")

# Gin files include each other by their path from the repository root
# (`include 'experiments/omniglot/base.gin'`): found from the root as working directory,
# and from anywhere else through this search path.
REPOSITORY_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isdir(os.path.join(REPOSITORY_ROOT, "experiments")):
    gin.add_config_file_search_path(REPOSITORY_ROOT)
