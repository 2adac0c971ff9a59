"""Registers the Keras pieces that gin files name (``@keras.optimizers.Adam()``...)."""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Dict, Mapping, Optional

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
# (`include 'experiments/setups/omniglot.gin'`): found from the root as working directory,
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


MOVED: Dict[str, Dict[str, str]] = {}
"""Keywords that moved, by configurable name: ``{old keyword: the message naming its new
spelling}`` (filled by :func:`moved_keywords`; read by ``metalearn.runs.validation``
for a gin binding that gin refuses at parse time)."""

MOVED_MESSAGE = "{owner}({name}=...) moved in metalearn 0.3: use {new} (CHANGELOG.md, 'Migration')"


def moved_keywords(table: Mapping[str, str], message: str = MOVED_MESSAGE):
    """Class decorator: keywords of the constructor that moved elsewhere.

    A Python call passing one raises ``TypeError`` naming its new spelling (``message``,
    formatted with ``owner``, ``name``, ``new``). The constructor's signature as gin
    reads it stays strict, so gin refuses an unknown or moved binding when the config is
    parsed, before anything is built; :data:`MOVED` lets that error name the new
    spelling too.
    """
    def decorate(cls):
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            for name in kwargs:
                if name in table:
                    raise TypeError(message.format(owner=type(self).__name__, name=name,
                                                   new=table[name]))
            init(self, *args, **kwargs)

        # the constructor's own signature for gin (which binds by it): positional
        # arguments are then known as given, and unknown bindings refused at parse time
        __init__.__signature__ = inspect.signature(init)
        cls.__init__ = __init__
        MOVED.setdefault(cls.__name__, {}).update(
            {name: message.format(owner=cls.__name__, name=name, new=new)
             for name, new in table.items()})
        return cls
    return decorate


MEMBER_MESSAGE = "{owner}.{name} moved in metalearn 0.3: use {new} (CHANGELOG.md, 'Migration')"


def moved_members(table: Mapping[str, str], message: str = MEMBER_MESSAGE):
    """Class decorator: public members (methods, properties) that moved elsewhere.

    Reading one on an instance raises ``AttributeError`` naming its new spelling
    (``message``, formatted with ``owner``, ``name``, ``new``), and constructing a
    subclass that still defines one raises ``TypeError``: an override of a member the
    class no longer calls would otherwise be silently ignored.
    """
    def decorate(cls):
        def __getattr__(self, name: str):
            if name in table:
                raise AttributeError(message.format(owner=type(self).__name__, name=name,
                                                    new=table[name]))
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            defined = [name for name in table if hasattr(type(self), name)]
            if defined:
                raise TypeError("; ".join(
                    f"{type(self).__name__} defines {name}, which {cls.__name__} no longer "
                    f"calls: " + message.format(owner=cls.__name__, name=name,
                                                new=table[name]) for name in defined))
            init(self, *args, **kwargs)

        __init__.__signature__ = inspect.signature(init)
        cls.__init__ = __init__
        cls.__getattr__ = __getattr__
        return cls
    return decorate


def moved_binding(configurable: str, parameter: str) -> Optional[str]:
    """The message naming the new spelling of ``configurable.parameter`` if that keyword
    moved, else ``None`` (``configurable`` may carry a module or scope prefix)."""
    return MOVED.get(configurable.rsplit(".", 1)[-1].rsplit("/", 1)[-1], {}).get(parameter)
