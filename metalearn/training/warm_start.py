"""Starting a run's model from another run's weights: a pre-trained backbone as the
start of any learner.

:func:`restore_weights` copies variables into a Keras model from a checkpoint written
by ``metalearn.train`` (the newest intact one of a workdir), matched by the variables'
Keras paths (``omniglot_conv_net/conv0/kernel``), which the checkpoint's object graph
records: the source and the target may be different learners (a
``ClassifierBaseline`` pre-training and a Prototypical Networks or MAML learner) as long
as their models name their layers alike. :class:`WarmStart` is the gin-configurable
form, called by the training loop when a run starts (not when it resumes: the run's own
checkpoint then holds the weights).
"""

from __future__ import annotations

import os
import re
from typing import Dict, Optional, Sequence, Tuple

import gin
import keras
import tensorflow as tf
from absl import logging

from metalearn import _compat
from metalearn.runs.workdir import Workdir
from metalearn.training.checkpoint import (UnmatchedCheckpointError, find_checkpoint,
                                           names_shown)


def checkpoint_path(source: str) -> str:
    """The checkpoint ``source`` names: a run's workdir (its newest intact checkpoint),
    a checkpoint folder, or a checkpoint prefix (``.../ckpt-2000``).

    Raises:
      FileNotFoundError: nothing there holds a checkpoint.
    """
    for folder in (Workdir(source).checkpoints, source):
        if os.path.isdir(folder):
            found = find_checkpoint(folder).path
            if found is not None:
                return found
    if os.path.isfile(source + ".index"):
        return source
    raise FileNotFoundError(f"no checkpoint in {source!r} (expected a metalearn.train "
                            f"workdir, its {Workdir.CHECKPOINTS}/ folder or a checkpoint prefix "
                            "such as .../ckpt-2000)")


def saved_model_variables(path: str, root: Sequence[str] = ("learner", "model")
                          ) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """The variables of the model a checkpoint holds at ``root`` (the learner's model
    by default), by Keras path: ``{path: (checkpoint key, shape)}``."""
    reader = tf.train.load_checkpoint(path)
    graph = _compat.trackable_object_graph()()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    node = 0
    for name in root:
        node = next((c.node_id for c in graph.nodes[node].children if c.local_name == name),
                    None)
        if node is None:
            raise ValueError(f"checkpoint {path} holds no {'/'.join(root)}: is it a "
                             "metalearn.train checkpoint?")
    shapes = reader.get_variable_to_shape_map()
    found: Dict[str, Tuple[str, Tuple[int, ...]]] = {}
    stack, seen = [node], set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        for attribute in graph.nodes[current].attributes:
            if attribute.name == "VARIABLE_VALUE":
                found[attribute.full_name] = (attribute.checkpoint_key,
                                              tuple(shapes[attribute.checkpoint_key]))
        stack.extend(child.node_id for child in graph.nodes[current].children)
    return found


def restore_weights(model: keras.Model, source: str, include: Sequence[str] = (".*",),
                    exclude: Sequence[str] = (),
                    rename: Sequence[Tuple[str, str]] = ()) -> Dict[str, str]:
    """Assigns ``model``'s variables (trainable ones and BatchNorm's moving statistics)
    from the model of another run's checkpoint, matched by Keras path.

    Args:
      model: the built Keras model to start from the saved weights.
      source: a ``metalearn.train`` workdir (its newest intact checkpoint), its
        checkpoint folder, or a checkpoint prefix.
      include, exclude: regular expressions (``re.search``) over ``model``'s variable
        paths: the variables restored are those ``include`` matches and ``exclude``
        does not (e.g. ``exclude=("head",)`` to keep a new classifier head).
      rename: ``(pattern, replacement)`` pairs (``re.sub``, in order) mapping a path of
        ``model`` to the saved model's, for models built under other names
        (``("^conv_net/", "omniglot_conv_net/")``).

    Returns:
      ``{path in model: path in the checkpoint}`` of every variable assigned.

    Raises:
      UnmatchedCheckpointError: a selected variable has no saved counterpart, or one of
        another shape; the message names each, and the saved paths. Nothing is
        assigned then.
      FileNotFoundError: ``source`` holds no checkpoint.
    """
    path = checkpoint_path(source)
    saved = saved_model_variables(path)
    selected = [v for v in model.variables
                if any(re.search(p, v.path) for p in include)
                and not any(re.search(p, v.path) for p in exclude)]
    if not selected:
        raise UnmatchedCheckpointError(
            f"include={tuple(include)!r}, exclude={tuple(exclude)!r} select none of model "
            f"{model.name!r}'s variables {[v.path for v in model.variables]}")
    matched, missing, mismatched = {}, [], []
    for variable in selected:
        name = variable.path
        for pattern, replacement in rename:
            name = re.sub(pattern, replacement, name)
        if name not in saved:
            missing.append(variable.path if name == variable.path else
                           f"{variable.path} (as {name})")
        elif saved[name][1] != tuple(variable.shape):
            mismatched.append(f"{variable.path} {tuple(variable.shape)} vs saved "
                              f"{name} {saved[name][1]}")
        else:
            matched[variable.path] = name
    if missing or mismatched:
        show = names_shown
        problems = []
        if missing:
            problems.append(f"no saved weights for {len(missing)} variable(s) of model "
                            f"{model.name!r}: {show(missing)}")
        if mismatched:
            problems.append(f"{len(mismatched)} of other shapes: {show(mismatched)}")
        raise UnmatchedCheckpointError(
            f"cannot start model {model.name!r} from {path}: " + "; ".join(problems) +
            f". The checkpoint's model holds {show(sorted(saved))}. Select the variables "
            "to restore with include/exclude (e.g. exclude=('head',)), or map names with "
            "rename.")
    reader = tf.train.load_checkpoint(path)
    for variable in selected:
        variable.assign(reader.get_tensor(saved[matched[variable.path]][0]))
    return matched


@gin.configurable
class WarmStart:
    """A run's model started from another run's weights (``Experiment.warm_start``):
    applied by the training loop when the run starts from nothing, never when it
    resumes from its own checkpoint. See :func:`restore_weights` for the arguments.

    Example (gin)::

        Experiment.warm_start = @WarmStart()
        WarmStart.source = 'runs/omniglot_min_pretrain'
    """

    def __init__(self, source: str = gin.REQUIRED, include: Sequence[str] = (".*",),
                 exclude: Sequence[str] = (), rename: Sequence[Tuple[str, str]] = ()):
        if source is gin.REQUIRED or not isinstance(source, str) or not source:
            raise ValueError(f"WarmStart.source must be a workdir or checkpoint path, got "
                             f"{source!r}")
        self.source = source
        self.include, self.exclude = tuple(include), tuple(exclude)
        self.rename = tuple(tuple(pair) for pair in rename)

    def __call__(self, learner) -> Dict[str, str]:
        """Restores ``learner.model``'s selected variables; returns what went where."""
        matched = restore_weights(learner.model, self.source, self.include, self.exclude,
                                  self.rename)
        logging.info("warm start: %d variables of %r from %s", len(matched),
                     learner.model.name, self.source)
        return matched


__all__ = ["WarmStart", "checkpoint_path", "restore_weights", "saved_model_variables"]
