"""metalearn: meta-learning on TensorFlow 2 and Keras 3.

The public surface::

    metalearn.Learner            model + adapter + loss (MultiStepLossLearner: MAML++)
    metalearn.PrototypicalNetworks, ProtoMAML   learners starting from class prototypes
    metalearn.adapters           inner loops (GradientDescent, ...)
    metalearn.MetaOptimizer      outer updates (Reptile: no outer gradient)
    metalearn.tasks              episodes and task samplers
    metalearn.models             plain Keras model builders
    metalearn.functional         weights as tensors; forward with given weights
    metalearn.training           the meta-step, training loop, evaluation
    metalearn.restore(workdir)   a trained run, ready to adapt and predict

Command lines: ``python -m metalearn.train`` and ``python -m metalearn.evaluate``.
"""

import os as _os

_os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from metalearn import adapters, configurables, functional, models, tasks  # noqa: E402
from metalearn.learners import Learner, MultiStepLossLearner, accuracy  # noqa: E402
from metalearn.meta_optimizers import MetaOptimizer, Reptile  # noqa: E402
from metalearn.prototypical import PrototypicalNetworks, ProtoMAML  # noqa: E402
from metalearn import training  # noqa: E402
from metalearn.training import Experiment, restore  # noqa: E402

__version__ = "0.1.0"

__all__ = ["Experiment", "Learner", "MetaOptimizer", "MultiStepLossLearner",
           "PrototypicalNetworks", "ProtoMAML", "Reptile", "accuracy", "adapters",
           "functional", "models", "restore", "tasks", "training"]
