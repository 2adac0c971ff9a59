"""metalearn: meta-learning on TensorFlow 2 and Keras 3.

The public surface (folders by role; docs/architecture.md has the whole picture)::

    metalearn.functional         the Keras seam: weights as tensors, forward with given
                                 weights, exact batch moments, batched layer rules
    metalearn.pieces             what adapters, heads and learners build on: Piece,
                                 Capabilities, SplitLoss, implicit differentiation
    metalearn.adapters           inner loops and their pieces: GradientDescent, update
                                 transforms (SGD, Mask, LearnedRates, ...), step wrappers
                                 (PerStepWeights, Recompute, MiniBatches), Hypernetwork,
                                 ImplicitGradientDescent; neural processes (CNP, ANP, NP)
    metalearn.heads              closed-form task solvers on embeddings (PrototypeHead)
    metalearn.Learner            model + adapter + loss (MultiStepLossLearner: MAML++;
                                 EmbeddingLearner, PrototypicalNetworks, ProtoMAML)
    metalearn.execution          how a meta-batch runs: formulations (MapFn, Unrolled,
                                 Batched, Accumulate, Auto) and the Runtime
    metalearn.outer              outer rules: MetaGradient, Reptile, SerialReptile,
                                 EvolutionStrategies; guards (ClipDirections, SkipNonFinite)
    metalearn.training           the one meta-step builder, the loop, evaluation
    metalearn.runs               experiments, the workdir and its files, checks
    metalearn.studies            sweeps and results over runs (above training)
    metalearn.statistics         95% intervals and the paired t-test
    metalearn.tasks              episodes and task samplers
    metalearn.rl                 meta-RL: in-graph environments (2D navigation, tabular
                                 MDPs), policies, DiCE, PolicyLearner
    metalearn.models             plain Keras model builders (conv nets, ResNet-12, WRN)
    metalearn.layers             Keras layers they need (DropBlock)
    metalearn.testing            the contract every piece meets, for research code
    metalearn.restore(workdir)   a trained run, ready to adapt and predict

Command lines: ``python -m metalearn.train`` and ``python -m metalearn.evaluate``.
"""

import os as _os

_os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# TensorFlow's own chatter out of the default output, ours in: its C++ INFO and WARNING
# lines unless TF_CPP_MIN_LOG_LEVEL is set (it takes effect when metalearn is imported
# before TensorFlow, as the entry points do); and its Python INFO lines ("Sharding
# callback duration: 14 microseconds" after every checkpoint), below. TensorFlow's
# errors stay; metalearn's own absl lines are not affected. The GPU probe's lines on a
# machine without CUDA ("Could not find cuda drivers", "failed call to cuInit"), which
# that setting does not hide, are left out of the command lines' output (_quiet).
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from metalearn import _quiet  # noqa: E402  (imports nothing heavy)

if _quiet.is_entry_point():  # python -m metalearn.train, .evaluate, ...
    _quiet.import_tensorflow_quietly()

import logging as _logging  # noqa: E402


class _QuietTensorFlow(_logging.Filter):
    """Drops INFO (and lower) records that TensorFlow's own modules log through absl or
    the ``tensorflow`` logger; warnings and errors pass, and so does everything else."""

    _PACKAGE = _os.sep + "tensorflow" + _os.sep

    def filter(self, record: _logging.LogRecord) -> bool:
        return record.levelno >= _logging.WARNING or self._PACKAGE not in record.pathname


from absl import logging as _absl_logging  # noqa: E402

_absl_logging.get_absl_handler().addFilter(_QuietTensorFlow())  # what absl prints
_logging.getLogger("tensorflow").addFilter(_QuietTensorFlow())

from metalearn import adapters, configurables, functional, heads, layers, models, tasks  # noqa: E402
from metalearn import learners  # noqa: E402
from metalearn.learners import (Adapted, ClassifierBaseline, EmbeddingLearner,  # noqa: E402
                                Learner, MultiStepLossLearner, PrototypicalNetworks, ProtoMAML,
                                accuracy)
from metalearn.outer import MetaGradient, MetaOptimizer, Reptile, SerialReptile  # noqa: E402
from metalearn import execution, outer, rl, runs, training  # noqa: E402
from metalearn.training import Experiment, restore  # noqa: E402
from metalearn import _compat  # noqa: E402

# AutoGraph leaves metalearn's functions as written, as it does Keras': they build graph
# control flow with tf.while_loop / tf.cond, and converting them cost ~8 s of every
# process's first trace. Code metalearn calls inside a compiled step (a loss, a Learner
# subclass's override, a piece) then runs as written too, as under Keras 3.
try:
    _compat.autograph_leaves_as_written(__name__)
except _compat.PrivateAPIMoved as _error:  # only the first trace is slower then
    _logging.getLogger(__name__).warning("%s", _error)

__version__ = "0.3.0"

__all__ = ["Adapted", "ClassifierBaseline", "EmbeddingLearner", "Experiment", "Learner", "MetaGradient",
           "MetaOptimizer", "execution",
           "MultiStepLossLearner", "PrototypicalNetworks", "ProtoMAML", "Reptile",
           "SerialReptile", "accuracy", "adapters", "functional", "heads", "learners",
           "models", "outer", "restore", "rl", "runs", "tasks", "training"]
