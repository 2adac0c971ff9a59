"""Every reach into a private Keras, gin or TensorFlow API is guarded and still works.

An upgrade that moves one of these APIs fails here, loudly, instead of silently changing
a result (e.g. second-order MAML through BatchNorm becoming a few percent wrong)."""

import ast
import importlib.util
import os
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


def _private_reaches(path):
    """Names of private modules or attributes a source file touches."""
    tree = ast.parse(open(path).read())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and (
                ".src" in node.module or node.module in ("gin.config_parser", "gin.utils")
                or node.module.startswith("gin") and any(
                    a.name in ("config_parser", "utils", "resource_reader")
                    for a in node.names)):
            found.append(node.module)
        if isinstance(node, ast.Attribute) and node.attr in (
                "__internal__", "_FILE_READERS", "_LOCATION_PREFIXES", "_learning_rate"):
            found.append(node.attr)
    return found


def test_no_module_but_compat_reaches_into_a_private_api():
    offenders = {}
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(".py") and name != "_compat.py":
                reaches = _private_reaches(path)
                if reaches:
                    offenders[os.path.relpath(path, PACKAGE)] = reaches
    assert not offenders, offenders


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
