"""Every reach into a private Keras, gin or TensorFlow API is guarded and still works,
and no module but ``metalearn/_compat.py`` reaches into another module's private names.

An upgrade that moves one of these APIs fails here, loudly, instead of silently changing
a result (e.g. second-order MAML through BatchNorm becoming a few percent wrong)."""

import ast
import importlib.util
import os
import re
import sys

import pytest
import tensorflow as tf

from metalearn import _compat

PACKAGE = os.path.join(os.path.dirname(__file__), "..", "metalearn")


@pytest.mark.parametrize("reach", _compat.every_reach(),
                         ids=lambda f: getattr(f, "__name__", "reach"))
def test_every_private_api_is_where_metalearn_expects_it(reach):
    reach()


def test_a_moved_api_names_itself():
    error = _compat._moved("keras.src.backend.tensorflow.nn", "keras", "9.9")
    assert isinstance(error, _compat.PrivateAPIMoved)
    assert "keras.src.backend.tensorflow.nn" in str(error) and "9.9" in str(error)


# A namedtuple's API is spelled with one underscore (to stay out of its fields' way).
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
# Modules and attributes private by their library's convention rather than by name.
PRIVATE_MODULES = ("keras.src", "tensorflow.python", "gin.config_parser", "gin.utils",
                   "gin.resource_reader")


def _private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _package_module(module, name):
    """Whether ``from module import name`` imports one of metalearn's own modules (such
    as ``metalearn._compat`` or ``metalearn._quiet``): a module private to the package is
    the package's to import, not a reach into another module's names."""
    return module == "metalearn" and os.path.exists(os.path.join(PACKAGE, name + ".py"))


def _own(node):
    """``self``, ``cls`` or ``super()``: the object whose class this module defines."""
    return (isinstance(node, ast.Name) and node.id in ("self", "cls")) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id == "super")


def private_reaches(source):
    """Where ``source`` (a module's text) reaches into another module's private names:
    ``(line, what)`` for each ``obj._x`` (or ``getattr(obj, "_x")``) on anything but
    ``self`` / ``cls`` / ``super()`` whose ``_x`` the module does not define itself (as a
    ``def``, a class, a name it assigns or ``self._x = ...``), each ``from m import _x``,
    each import of a library's internal modules (``keras.src``, ``tensorflow.python``,
    gin's parser) and each ``tf.__internal__``."""
    tree = ast.parse(source)
    defined = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and _own(node.value):
            defined.add(node.attr)
    found = []

    def reach(node, what):
        found.append((node.lineno, what))

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.startswith(PRIVATE_MODULES) or module == "gin" and any(
                    a.name in ("config_parser", "utils", "resource_reader")
                    for a in node.names):
                reach(node, f"from {module} import ...")
            for alias in node.names:
                if _private(alias.name) and not _package_module(module, alias.name):
                    reach(node, f"from {module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PRIVATE_MODULES):
                    reach(node, f"import {alias.name}")
        elif isinstance(node, ast.Attribute):
            if node.attr == "__internal__" or (
                    _private(node.attr) and not _own(node.value)
                    and node.attr not in defined and node.attr not in NAMEDTUPLE_API):
                reach(node, ast.unparse(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr", "delattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            name = node.args[1].value
            if isinstance(name, str) and _private(name) and not _own(node.args[0]) \
                    and name not in defined:
                reach(node, ast.unparse(node))
    return sorted(found)


def test_no_module_but_compat_reaches_into_a_private_name():
    offenders = {}
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(".py") and name != "_compat.py":
                with open(path) as f:
                    reaches = private_reaches(f.read())
                if reaches:
                    offenders[os.path.relpath(path, PACKAGE)] = reaches
    assert not offenders, offenders


@pytest.mark.parametrize("source, reached", [
    ("import keras\nloss = keras.losses.MeanSquaredError()\nloss._dtype = 'float64'\n",
     "loss._dtype"),
    ("def f(model):\n    return model.optimizer._learning_rate\n",
     "model.optimizer._learning_rate"),
    ("import gin\nreaders = gin.config._FILE_READERS\n", "gin.config._FILE_READERS"),
    ("def f(layer):\n    return getattr(layer, '_tracker')\n", "getattr(layer, '_tracker')"),
    ("from metalearn.adapters.gradient_descent import _MOVED\n",
     "from metalearn.adapters.gradient_descent import _MOVED"),
    ("from keras.src.backend.tensorflow import nn\n", "from keras.src.backend.tensorflow"),
    ("import tensorflow as tf\ncheck = tf.__internal__.distribute\n", "tf.__internal__"),
    # a private name of the module's own is not a reach, on whatever object it is read
    ("class A:\n    def __init__(self):\n        self._x = 1\n\n"
     "def f(a):\n    return a._x + a._helper()\n\ndef _helper():\n    pass\n", None),
    ("class A:\n    def f(self):\n        return self._inherited + super()._g()\n", None),
    ("def f(pair):\n    return pair._replace(x=1)\n", None),
    ("from metalearn import _compat\nrate = _compat.optimizer_learning_rate\n", None),
    ("from metalearn import _quiet\n_quiet.is_entry_point()\n", None),
    ("from metalearn import _not_a_module\n", "from metalearn import _not_a_module"),
])
def test_the_guard_flags_a_planted_reach(source, reached):
    found = private_reaches(source)
    if reached is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0][1].startswith(reached), found


def test_autograph_leaves_metalearn_as_written_and_still_converts_other_code(tmp_path):
    """metalearn's modules are called unconverted (a Python ``if`` on a tensor fails in
    them, as in Keras'); a module of the user's is still converted."""
    import metalearn  # noqa: F401  (its import puts the rule in)
    source = ("def magnitude(x):\n"
              "    if x > 0:\n"
              "        return x\n"
              "    return -x\n")
    modules = {}
    for name in ("metalearn._autograph_probe", "autograph_probe_of_the_user"):
        path = tmp_path / f"{name.replace('.', '_')}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(name, path)
        modules[name] = importlib.util.module_from_spec(spec)
        sys.modules[name] = modules[name]
        spec.loader.exec_module(modules[name])
    try:
        user = tf.function(lambda x: modules["autograph_probe_of_the_user"].magnitude(x))
        assert float(user(tf.constant(-2.0))) == 2.0  # converted: the if is a tf.cond
        ours = tf.function(lambda x: modules["metalearn._autograph_probe"].magnitude(x))
        with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
            ours(tf.constant(-2.0))
    finally:
        for name in modules:
            del sys.modules[name]


# The one test module that imports others: docs/errors.md's tables are gathered from the
# bad-input cases of each subject's tests/<subpackage>/bad_*_test.py (their cases, run
# there, not helpers).
GATHERER = ("validation_test.py", re.compile(r"^tests(\.[a-z]+)?(\.bad_\w+_test)?$"))


def test_no_test_module_imports_another_test_modules_helpers():
    """Shared helpers live in non-test modules (``tests/*_fixtures.py``, ``metalearn.testing``)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    paths = sorted(os.path.join(folder, name) for folder, _, names in os.walk(tests)
                   for name in names if name.endswith(".py"))
    assert any(os.path.dirname(p) != tests for p in paths)  # the subfolders are read
    offenders = []
    for path in paths:
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            modules = ([node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                       if isinstance(node, ast.ImportFrom) else
                       [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if not any(m.endswith("_test") for m in modules):
                continue
            name = os.path.relpath(path, tests)
            if name == GATHERER[0] and all(GATHERER[1].match(m) for m in modules):
                continue
            offenders.append((name, node.lineno))
    assert not offenders, offenders
