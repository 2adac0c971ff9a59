"""Registers the Keras pieces that gin files name (``@keras.optimizers.Adam()``...)."""

from __future__ import annotations

import logging

import gin
import keras

from metalearn import _compat, repository

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
REPOSITORY_ROOT = repository.ROOT  # (the name kept importable)
if repository.has_experiments():
    gin.add_config_file_search_path(REPOSITORY_ROOT)


class _NotFoundFilter(logging.Filter):
    """Drops gin's ``Path not found`` error record: gin tries each search location in
    turn, and its package reader logs that error for every location it then passes
    over, also for an include it goes on to find in the next (the repository root).
    An include found nowhere still fails, with gin's error naming every location."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "Path not found: %s"


_NOT_FOUND_FILTER = _NotFoundFilter()


def _package_file_exists(path: str) -> bool:
    """gin's reader of config files inside Python packages, minus its crash on
    namespace packages: with the repository root on ``sys.path`` (``pip install -e``,
    ``PYTHONPATH``), ``include 'experiments/sinusoid/maml.gin'`` from another working
    directory makes gin look up the package ``experiments.sinusoid``, which has no
    origin, and gin raises ``TypeError`` instead of trying the next search path; and
    minus its error line for a location that is not a package (see
    :class:`_NotFoundFilter`)."""
    root = logging.getLogger()  # gin logs through the root logger
    root.addFilter(_NOT_FOUND_FILTER)
    try:
        return _SYSTEM_PATH_FILE_EXISTS(path)
    except TypeError:
        return False
    finally:
        root.removeFilter(_NOT_FOUND_FILTER)


_SYSTEM_PATH_FILE_EXISTS = _compat.system_path_file_exists()
_READERS = _compat.gin_file_readers()
for _i, (_reader, _exists) in enumerate(_READERS):
    if _exists is _SYSTEM_PATH_FILE_EXISTS:
        _READERS[_i] = (_reader, _package_file_exists)


def inherited(instance: object, owner: type, name: str, value):
    """``value``, or, where it is ``None`` and ``instance`` is of a subclass of
    ``owner``, what the gin configuration binds to ``name`` on the nearest class
    between them (``owner`` included) that has a binding.

    Gin binds parameters per configurable name, so a research subclass of a shipped
    configurable (``class Lookahead(MetaGradient)``) would silently take its default
    where a shipped config binds ``MetaGradient.optimizer``: this hands it the parent's
    binding instead. A reference such as ``@outer/keras.optimizers.Adam()`` is called
    (a new object).
    """
    if value is not None or type(instance) is owner:
        return value
    for cls in type(instance).__mro__[1:]:
        try:
            bound = gin.query_parameter(f"{cls.__name__}.{name}")
        except ValueError:  # not configurable, or nothing bound
            bound = None
        if bound is not None:
            if isinstance(bound, gin.config.ConfigurableReference):
                return bound.scoped_configurable_fn() if bound.evaluate else \
                    bound.scoped_configurable_fn
            return bound
        if cls is owner:
            break
    return value
