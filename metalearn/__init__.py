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
    metalearn.serving            adapt-then-predict exported as a SavedModel that loads
                                 without metalearn (export_saved_model)
    metalearn.keras              MetaModel: meta-training with keras.Model.fit (the
                                 meta-step as train_step, Keras' callbacks and saving)
    metalearn.restore(workdir)   a trained run, ready to adapt and predict

Command lines: ``python -m metalearn.train``, ``python -m metalearn.evaluate`` and
``python -m metalearn.export``.

A script's ``import metalearn`` imports all of the above at once (TensorFlow, Keras,
and every gin configurable registered). In a command line's process
(``python -m metalearn.<entry point>``) it imports nothing heavy, so that ``--help`` and
flag errors answer at once: the public names load on first read, and the entry point
calls :func:`import_all` when it starts its work.
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

import importlib as _importlib  # noqa: E402
from typing import TYPE_CHECKING as _TYPE_CHECKING  # noqa: E402
from typing import List as _List, Tuple as _Tuple  # noqa: E402

from metalearn import _quiet  # noqa: E402  (imports nothing heavy)

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

if _TYPE_CHECKING:  # the one list of what the package imports, in order (import_all)
    from metalearn import adapters, configurables, functional, heads, layers, models, tasks
    from metalearn import learners
    from metalearn.learners import (Adapted, ClassifierBaseline, EmbeddingLearner, Learner,
                                    MultiStepLossLearner, PrototypicalNetworks, ProtoMAML,
                                    accuracy)
    from metalearn.outer import MetaGradient, MetaOptimizer, Reptile, SerialReptile
    from metalearn import execution, outer, rl, runs, training
    from metalearn.training import Experiment, restore

__all__ = ["Adapted", "ClassifierBaseline", "EmbeddingLearner", "Experiment", "Learner",
           "MetaGradient", "MetaOptimizer", "MultiStepLossLearner", "PrototypicalNetworks",
           "ProtoMAML", "Reptile", "SerialReptile", "accuracy", "adapters", "execution",
           "functional", "heads", "import_all", "learners", "models", "outer", "restore",
           "rl", "runs", "tasks", "training"]

_loading = False  # import_all is under way
_loaded = False  # import_all has run


def _contents() -> _List[_Tuple[str, _Tuple[str, ...]]]:
    """``(module, names)`` of each import of the ``if _TYPE_CHECKING:`` block above, in
    its order, read from this file's source (nothing imported). The block is the one
    list of the package's contents: the readers that do not run the code (the API
    reference, IDEs, type checkers) read it as written, and :func:`import_all` imports
    what it names."""
    import ast
    with open(__file__, encoding="utf-8") as f:
        tree = ast.parse(f.read(), __file__)
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "_TYPE_CHECKING")
    found = []
    for node in block.body:
        if isinstance(node, ast.ImportFrom) and node.module == __name__:  # its modules
            found += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):  # names the package takes from a module
            found.append((node.module[len(__name__) + 1:],
                          tuple(alias.name for alias in node.names)))
    return found


def import_all() -> None:
    """Imports all of metalearn: in a command line's process (``python -m
    metalearn.train``, ...) TensorFlow first, with its GPU probe's lines left out of the
    output (:mod:`metalearn._quiet`), then every subpackage, so that gin knows every
    configurable, and binds the package's public names (``metalearn.Learner``, ...).
    Once per process; later calls return at once.

    A script's ``import metalearn`` calls it itself; an entry point calls it when it
    starts its work (after absl parsed the flags, before gin parses), so that ``--help``
    and flag errors never wait for TensorFlow. A public name first read before it (in a
    command line's process) calls it too."""
    global _loading, _loaded
    if _loading or _loaded:
        return
    if _quiet.is_entry_point():  # a script's import leaves its GPUs for it to choose
        _quiet.import_tensorflow_quietly()
    _loading = True
    try:
        for module, names in _contents():
            imported = _importlib.import_module(f"{__name__}.{module}")
            globals().update({name: getattr(imported, name) for name in names})
        _leave_autograph()
        _loaded = True
    finally:
        _loading = False


def _leave_autograph() -> None:
    """AutoGraph leaves metalearn's functions as written, as it does Keras': they build
    graph control flow with tf.while_loop / tf.cond, and converting them cost ~8 s of
    every process's first trace. Code metalearn calls inside a compiled step (a loss, a
    Learner subclass's override, a piece) then runs as written too, as under Keras 3."""
    from metalearn import _compat
    try:
        _compat.autograph_leaves_as_written(__name__)
    except _compat.PrivateAPIMoved as error:  # only the first trace is slower then
        _logging.getLogger(__name__).warning("%s", error)


def __getattr__(name: str) -> object:
    """A public name first read in a command line's process: :func:`import_all`, then
    the name (PEP 562). Only the names of ``__all__``; not while it imports."""
    if name in __all__ and not _loading:
        import_all()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))


__version__ = "0.3.0"

if not _quiet.is_entry_point():  # a script, the tests: everything now, as always
    import_all()
