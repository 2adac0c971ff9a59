"""What the LiteRT and ONNX exports share: which learners go to which format (checked
before anything is traced), the converters' packages, a SavedModel's serving signature
re-saved with fixed set sizes, and a version folder written whole.

Both formats are converted from the learner's SavedModel
(:func:`~metalearn.serving.export_saved_model`), written to a temporary folder first:

* ``litert``: :mod:`metalearn.serving.litert`. A gradient-free learner (no inner loop:
  Prototypical Networks, an ``EmbeddingLearner`` with ``NoAdaptation``) converts to
  LiteRT's builtin operators and runs in the ``ai-edge-litert`` interpreter. A
  gradient-based learner's inner loop holds gradient operators (``ReluGrad``,
  ``Conv2DBackpropFilter``, ...) that LiteRT has no builtin kernel for: it is refused
  unless ``select_tf_ops=True``, which writes them as Select TF ops; those run only in a
  LiteRT runtime linked with the Flex delegate (Android's
  ``tensorflow-lite-select-tf-ops``), which neither the ``ai-edge-litert`` wheel nor
  TensorFlow 2.21's ``tf.lite.Interpreter`` has. The set sizes are fixed.
* ``onnx``: :mod:`metalearn.serving.onnx`, through ``tf2onnx``, run by ``onnxruntime``:
  gradient-free learners only (ONNX has no operators for the gradient ops). The set
  sizes stay unknown unless fixed.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, Optional, Tuple

import tensorflow as tf

from metalearn import atomic
from metalearn.adapters import InContext, NeuralProcess, NoAdaptation
from metalearn.learners import Learner
from metalearn.tasks.episode import Episode
from metalearn.serving import saved_model
from metalearn.serving.saved_model import METADATA, UnsupportedExport

CONVERTED_FORMATS = ("litert", "onnx")
"""The formats converted from the SavedModel."""

GRADIENT_FREE_ADAPTERS = (NoAdaptation, NeuralProcess, InContext)
"""Adapters whose adaptation takes no gradient in the graph (a head's fit, an encoded
context): their learners convert to LiteRT builtins and to ONNX. Any other adapter
(``GradientDescent`` and the inner loops built on it) is gradient-based."""

EXTRA = "pip install 'metalearn[export]'"
"""How the converters' packages are installed (setup.cfg's ``export`` extra)."""

_PACKAGES = {"litert": ("ai_edge_litert",), "onnx": ("tf2onnx", "onnxruntime")}


class ConverterMissing(ImportError):
    """A format's converter or runtime package is not installed (the message names it
    and the extra that installs it)."""


def is_gradient_free(learner: Learner) -> bool:
    """Whether ``learner``'s adaptation takes no gradient in the graph (its adapter is
    one of :data:`GRADIENT_FREE_ADAPTERS`)."""
    return isinstance(getattr(learner, "adapter", None), GRADIENT_FREE_ADAPTERS)


def require_packages(format: str) -> None:
    """Checks that ``format``'s converter and runtime packages import.

    Raises:
      ConverterMissing: naming the package, the format and the extra to install.
    """
    for package in _PACKAGES.get(format, ()):
        try:
            importlib.import_module(package)
        except ImportError as error:
            raise ConverterMissing(f"--format={format} needs the {package} package, which "
                                   f"does not import ({error}): {EXTRA}") from None


def check_convertible(learner: Learner, format: str, select_tf_ops: bool = False) -> None:
    """Checks that ``learner`` can be converted to ``format`` (``litert`` or ``onnx``),
    before anything is traced: its SavedModel must be supported
    (:func:`~metalearn.serving.check_exportable`), and a gradient-based learner goes to
    LiteRT only with ``select_tf_ops`` and never to ONNX.

    Raises:
      ValueError: a format that is not converted.
      UnsupportedExport: the combination, naming the learner, its adapter and the
        format, and why.
    """
    if format not in CONVERTED_FORMATS:
        raise ValueError(f"{format!r} is not a converted format: one of "
                         f"{', '.join(CONVERTED_FORMATS)}")
    saved_model.check_exportable(learner, "saved_model")
    if is_gradient_free(learner):
        return
    name = saved_model.describe_learner(learner)
    if format == "onnx":
        raise UnsupportedExport(
            f"{name} cannot be exported to 'onnx': its inner loop takes gradients in the "
            "graph (ops such as ReluGrad), which ONNX has no operators for; 'onnx' takes "
            "the gradient-free learners (no inner loop: PrototypicalNetworks, "
            "EmbeddingLearner with NoAdaptation). Export it as 'saved_model', or as "
            "'litert' with select_tf_ops=True (--select_tf_ops)")
    if format == "litert" and not select_tf_ops:
        raise UnsupportedExport(
            f"{name} cannot be exported to 'litert' with builtin ops: its inner loop "
            "takes gradients in the graph (ops such as ReluGrad), which LiteRT has no "
            "builtin kernels for. select_tf_ops=True (--select_tf_ops) writes them as "
            "Select TF ops, which run only in a LiteRT runtime linked with the Flex "
            "delegate (not the ai-edge-litert Python package); or export 'saved_model'")


def check_exportable(learner: Learner, format: str = "saved_model",
                     select_tf_ops: bool = False) -> None:
    """Checks that ``learner`` can be exported to ``format``, any of
    :data:`~metalearn.serving.FORMATS`, before anything is traced
    (``metalearn.serving.check_exportable``): the SavedModel's check
    (:func:`metalearn.serving.saved_model.check_exportable`), and for ``litert`` and
    ``onnx`` :func:`check_convertible`'s.

    Raises:
      ValueError: an unknown format.
      UnsupportedExport: the learner, or the combination, naming them.
    """
    if format in CONVERTED_FORMATS:
        check_convertible(learner, format, select_tf_ops)
    else:
        saved_model.check_exportable(learner, format)


def set_size(value: Optional[int], name: str) -> Optional[int]:
    """``value`` checked as a set size (a positive integer) or ``None``.

    Raises:
      ValueError: naming ``name``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive number of examples, got {value!r}")
    return int(value)


def fix_set_sizes(source: str, target: str, support_size: Optional[int],
                  query_size: Optional[int]) -> Dict[str, Any]:
    """Re-saves ``source``'s ``serving_default`` signature at ``target`` with the support
    and query set sizes fixed (``None``: left unknown); the weights are ``source``'s.

    Returns:
      ``{name: {"shape", "dtype"}}`` of the inputs as saved.
    """
    loaded = tf.saved_model.load(source)
    serve = loaded.signatures["serving_default"]
    given = serve.structured_input_signature[1]
    sizes = {"support_x": support_size, "support_y": support_size, "query_x": query_size}
    specs = [tf.TensorSpec([sizes[n], *given[n].shape[1:]], given[n].dtype, name=n)
             for n in ("support_x", "support_y", "query_x")]

    def fixed(support_x, support_y, query_x):
        return serve(support_x=support_x, support_y=support_y, query_x=query_x)

    module = tf.Module()
    module.loaded = loaded  # tracks the weights
    module.serve = tf.function(fixed, input_signature=specs, autograph=False)
    with saved_model.absl_level_kept():
        tf.saved_model.save(module, target, signatures={
            "serving_default": module.serve.get_concrete_function()})
    return {s.name: {"shape": s.shape.as_list(), "dtype": s.dtype.name} for s in specs}


def saved_metadata(path: str) -> Dict[str, Any]:
    """The ``metadata.json`` of the SavedModel at ``path``."""
    with open(os.path.join(path, METADATA)) as f:
        return json.load(f)


def write_version(path: str, files: Dict[str, bytes], metadata: Dict[str, Any]) -> str:
    """Writes ``files`` and ``metadata.json`` as the version folder ``path``, whole: in a
    folder beside it, then renamed (a folder already there was checked empty or to be
    overwritten)."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    partial = os.path.join(parent, f".{os.path.basename(path)}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        os.makedirs(partial)
        for name, content in files.items():
            with open(os.path.join(partial, name), "wb") as f:
                f.write(content)
        atomic.write(os.path.join(partial, METADATA),
                     json.dumps(metadata, indent=2, sort_keys=True) + "\n")
        if os.path.isdir(path):
            shutil.rmtree(path)
        os.replace(partial, path)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return path


def converted_metadata(saved: Dict[str, Any], format: str, file: str,
                       inputs: Dict[str, Any], extra: Dict[str, Any]) -> Dict[str, Any]:
    """The SavedModel's metadata made a converted export's: its format, its file, its
    inputs as converted and the serving signature alone, plus ``extra``."""
    metadata = dict(saved, format=format, file=file, inputs=inputs)
    metadata["signatures"] = {"serving_default": saved["signatures"]["serving_default"]}
    output = dict(saved["outputs"]["predictions"])
    output["shape"] = [inputs["query_x"]["shape"][0], *output["shape"][1:]]
    metadata["outputs"] = {"predictions": output}
    metadata["set_sizes"] = {"support": inputs["support_x"]["shape"][0],
                             "query": inputs["query_x"]["shape"][0]}
    metadata.update(extra)
    return metadata


def first_lines(error: BaseException, count: int = 3) -> str:
    """The first ``count`` lines of a converter's error that say something."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return " / ".join(lines[:count])[:600]


def convert(learner: Learner, format: str, step: Callable[[], bytes]) -> bytes:
    """Runs a converter (``step``), its failure re-raised as
    :class:`~metalearn.serving.UnsupportedExport` naming the learner and the format."""
    try:
        with saved_model.absl_level_kept():  # the converters save SavedModels too
            return step()
    except Exception as error:  # the converters raise their own types
        raise UnsupportedExport(
            f"{saved_model.describe_learner(learner)} failed "
            f"to convert to {format!r}: {type(error).__name__}: {first_lines(error)}"
        ) from error



def prepare(learner: Learner, format: str, directory: str, version: int, overwrite: bool,
            example: Optional[Episode], support_size: Optional[int],
            query_size: Optional[int], select_tf_ops: bool = False
            ) -> Tuple[str, Optional[int], Optional[int]]:
    """What a conversion checks before any work, in this order: the learner and the
    format (:func:`check_convertible`), the packages, the version folder, the set sizes,
    an example given.

    Returns:
      The version folder, and the set sizes checked.
    """
    check_convertible(learner, format, select_tf_ops)
    require_packages(format)
    path = saved_model.check_target(directory, version, overwrite)
    support_size = set_size(support_size, "support_size")
    query_size = set_size(query_size, "query_size")
    if example is None:
        raise ValueError(f"export_{format} needs an example episode (no task axis) for "
                         "the inputs' feature shapes and dtypes")
    return path, support_size, query_size


def from_saved_model(learner: Learner, format: str, example: Episode,
                     inner_steps: Optional[int], support_size: Optional[int],
                     query_size: Optional[int], converter: Callable[[str], bytes]
                     ) -> Tuple[bytes, Dict[str, Any], Dict[str, Any]]:
    """Exports ``learner``'s SavedModel to a temporary folder, re-saves it with the set
    sizes given (:func:`fix_set_sizes`) and runs ``converter`` on that folder.

    Returns:
      The converted model, the SavedModel's metadata and the inputs as converted.

    Raises:
      UnsupportedExport: the converter failed (:func:`convert`).
    """
    with tempfile.TemporaryDirectory() as work:
        saved = saved_model.export_saved_model(learner, os.path.join(work, "saved"),
                                               inner_steps=inner_steps, example=example)
        fixed = os.path.join(work, "fixed")
        inputs = fix_set_sizes(saved, fixed, support_size, query_size)
        model = convert(learner, format, lambda: converter(fixed))
        return model, saved_metadata(saved), inputs
