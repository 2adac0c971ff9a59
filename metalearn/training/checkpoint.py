"""What a run checkpoints, and a trained run restored from its workdir."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf
from absl import logging

from metalearn import _compat
from metalearn.runs import files, validation
from metalearn.runs.experiment import Experiment, build_experiment, parse_config
from metalearn.runs.workdir import Workdir


class Progress:
    """The training loop's own state, checkpointed with the run so that a resumed run
    logs and reports exactly what an uninterrupted one would: the metric sums of the
    current logging window and of the whole run (float64, summed in step order), their
    step counts, and the number of skipped (non-finite) steps. Held as one JSON string
    variable (plain data: loading it runs no code)."""

    def __init__(self):
        with tf.device("/cpu:0"):  # host data, whatever the accelerator
            self.state = tf.Variable("", dtype=tf.string, trainable=False,
                                     name="progress")  # what the checkpoint holds
        self.reset()

    def reset(self) -> None:
        self.window: Dict[str, float] = {}
        self.window_steps = 0
        self.running: Dict[str, float] = {}
        self.running_steps = 0
        self.skipped_steps = 0

    def add(self, metrics: Dict[str, float]) -> None:
        """One finite step's metrics."""
        for totals in (self.window, self.running):
            for name, value in metrics.items():
                totals[name] = totals.get(name, 0.0) + value
        self.window_steps += 1
        self.running_steps += 1

    def means(self, running: bool) -> Dict[str, float]:
        totals, steps = (self.running, self.running_steps) if running else \
            (self.window, self.window_steps)
        return {name: (value / steps if steps else math.nan)
                for name, value in totals.items()}

    def end_window(self) -> None:
        self.window, self.window_steps = {}, 0

    def store(self) -> None:
        """Copies the Python-side state into the variable (before a save)."""
        self.state.assign(json.dumps({
            "window": self.window, "window_steps": self.window_steps,
            "running": self.running, "running_steps": self.running_steps,
            "skipped_steps": self.skipped_steps}))

    def load(self, source: str = "the checkpoint") -> None:
        """The state from the variable (after a restore); empty: from the start.

        Raises:
          ValueError: the variable holds no progress record; names ``source``.
        """
        text = self.state.numpy().decode("utf-8", "replace")
        self.reset()
        if text:
            try:
                saved = json.loads(text)
                self.window = {str(k): float(v) for k, v in saved["window"].items()}
                self.running = {str(k): float(v) for k, v in saved["running"].items()}
                self.window_steps = int(saved["window_steps"])
                self.running_steps = int(saved["running_steps"])
                self.skipped_steps = int(saved["skipped_steps"])
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                self.reset()
                raise ValueError(f"the training progress in {source} is not a progress "
                                 f"record ({error!r}): {text[:80]!r}") from None


CONFIG_VARIABLE = "config"
"""The checkpoint's copy of the run's gin config (``Experiment.config``): the config
travels with the weights, so a run whose ``config.gin`` was lost is still checked
against, and restored with, the config it was trained with."""

STATE_FILE = "checkpoint"  # TensorFlow's record of a folder's checkpoints
_PREFIX = re.compile(r"^ckpt-(\d+)(?:\.index|\.data-\d{5}-of-\d{5})$")
_RECORDED = re.compile(r'^\s*(?:model_checkpoint_path|all_model_checkpoint_paths)\s*:\s*'
                       r'"((?:[^"\\]|\\.)*)"\s*$')


class DamagedCheckpointError(ValueError):
    """A workdir has checkpoints, but none of them can be read back whole."""


class UnmatchedCheckpointError(ValueError):
    """A checkpoint and the config's objects differ: variables in one and not in the
    other."""


@dataclasses.dataclass
class CheckpointSearch:
    """What :func:`find_checkpoint` found in a checkpoint folder.

    Attributes:
      path: the newest intact checkpoint (``None``: there is none).
      intact: every intact checkpoint tried or recorded, oldest first.
      skipped: ``(checkpoint, why)`` of each damaged checkpoint passed over.
      state_problem: why the ``checkpoint`` state file could not be used (``None``: it
        could).
    """
    path: Optional[str]
    intact: List[str]
    skipped: List[Tuple[str, str]]
    state_problem: Optional[str]

    def describe(self) -> str:
        parts = ([f"the state file is {self.state_problem}"] if self.state_problem else []) \
            + [f"skipped {path}: {why}" for path, why in self.skipped]
        return "; ".join(parts)


def _step_of(path: str) -> int:
    match = re.search(r"ckpt-(\d+)$", path)
    return int(match.group(1)) if match else -1


def _recorded(directory: str) -> Tuple[List[str], Optional[str]]:
    """The checkpoints the state file records, newest first, and what is wrong with it."""
    state = os.path.join(directory, STATE_FILE)
    if not os.path.exists(state):
        return [], "missing"
    try:
        with open(state, encoding="utf-8") as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as error:
        return [], f"unreadable ({error})"
    if not lines:
        return [], "empty"
    names = []
    for line in lines:
        match = _RECORDED.match(line)
        if match is None and not line.lstrip().startswith(
                ("all_model_checkpoint_timestamps", "last_preserved_timestamp")):
            return [], f"garbled (line {line[:60]!r})"
        if match is not None:
            names.append(match.group(1))
    if not names:
        return [], "without any checkpoint recorded"
    paths = [name if os.path.isabs(name) else os.path.join(directory, name) for name in names]
    return sorted(set(paths), key=_step_of, reverse=True), None


def _on_disk(directory: str) -> List[str]:
    if not os.path.isdir(directory):
        return []
    prefixes = {os.path.join(directory, f"ckpt-{m.group(1)}")
                for m in map(_PREFIX.match, os.listdir(directory)) if m}
    return sorted(prefixes, key=_step_of, reverse=True)


def damage(path: str) -> Optional[str]:
    """Why the checkpoint ``path`` (a prefix, ``.../ckpt-30``) cannot be read back whole,
    or ``None`` when it can: its index file is there and readable, and every tensor it
    lists reads back from its data files (checksums verified)."""
    index = path + ".index"
    if not os.path.isfile(index):
        return f"its index file {index} is missing"
    try:
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)  # reads and verifies each tensor's checksum
    except Exception as error:  # noqa: BLE001  (any failure to read back is damage)
        message = getattr(error, "message", str(error)).strip().splitlines()
        return f"it cannot be read ({type(error).__name__}: {message[0] if message else ''})"
    return None


def find_checkpoint(directory: str) -> CheckpointSearch:
    """The newest intact checkpoint of a checkpoint folder: the one mechanism by which
    ``train`` (to resume), ``restore`` and ``evaluate`` find what to load.

    Candidates are the checkpoints the ``checkpoint`` state file records, newest first,
    then (the state file missing, empty or garbled, or every recorded checkpoint
    damaged) every ``ckpt-N`` whose files are on disk. A checkpoint whose files are on
    disk but that the state file does not record yet (a save cut short before it was
    recorded) is tried only after every recorded one. Damaged ones (see :func:`damage`)
    are passed over and reported in ``skipped``.

    Raises:
      DamagedCheckpointError: checkpoint files are there but none is intact; the
        message names each and why.
    """
    recorded, state_problem = _recorded(directory)
    candidates = recorded + [p for p in _on_disk(directory) if p not in recorded]
    skipped: List[Tuple[str, str]] = []
    for path in candidates:
        why = damage(path)
        if why is None:
            intact = [p for p in candidates if _step_of(p) < _step_of(path) and
                      p not in dict(skipped) and (p in recorded or not recorded)]
            intact = [p for p in intact if damage(p) is None]
            return CheckpointSearch(path, sorted(intact + [path], key=_step_of), skipped,
                                    state_problem)
        skipped.append((path, why))
    if skipped:
        raise DamagedCheckpointError(
            f"no intact checkpoint in {directory!r}, though checkpoint files are there: "
            + "; ".join(f"{p}: {why}" for p, why in skipped)
            + (f" (the state file is {state_problem})" if state_problem else "")
            + ". Nothing was deleted; restore the files from a copy, or move the folder "
            "away to start again.")
    return CheckpointSearch(None, [], [], state_problem)


def record_checkpoints(directory: str, paths: Sequence[str]) -> None:
    """Rewrites the ``checkpoint`` state file (atomically) to record ``paths`` (oldest
    first; the last is the latest): what ``tf.train.CheckpointManager`` reads, rotates
    and deletes from. Used to leave damaged checkpoints out of the rotation, so that no
    intact checkpoint is deleted before a newer intact one replaces it."""
    names = [os.path.relpath(p, directory) for p in paths]
    # with their times (the index file's), so that the manager rotates them as usual
    text = f"model_checkpoint_path: {json.dumps(names[-1])}\n" + "".join(
        f"all_model_checkpoint_paths: {json.dumps(name)}\n" for name in names) + "".join(
        f"all_model_checkpoint_timestamps: {os.path.getmtime(p + '.index'):.6f}\n"
        for p in paths) + "last_preserved_timestamp: 0.0\n"
    files.write_text(os.path.join(directory, STATE_FILE), text)


def saved_config(path: str) -> Optional[str]:
    """The gin config a checkpoint carries (``None``: written before it did)."""
    reader = tf.train.load_checkpoint(path)
    key = f"{CONFIG_VARIABLE}/.ATTRIBUTES/VARIABLE_VALUE"
    if key not in reader.get_variable_to_shape_map():
        return None
    value = reader.get_tensor(key)
    return value.decode() if isinstance(value, bytes) else str(value)


def saved_step(path: str) -> Optional[int]:
    """The step a checkpoint holds (``None``: it holds none)."""
    reader = tf.train.load_checkpoint(path)
    key = "step/.ATTRIBUTES/VARIABLE_VALUE"
    if key not in reader.get_variable_to_shape_map():
        return None
    return int(reader.get_tensor(key))


def checkpoint_for(experiment: Experiment, step: tf.Variable,
                   progress: Optional[Progress] = None,
                   parts: Optional[Sequence[str]] = None) -> tf.train.Checkpoint:
    """What a run checkpoints: the step, the learner (model and adapter state), the
    meta-optimizer (its slots and iteration count), the run's gin config
    (:data:`CONFIG_VARIABLE`) and, when given, the training loop's :class:`Progress`.
    Nothing else is needed to resume exactly: the task streams are a function of the
    run's seed and the step.

    Args:
      parts: only these top-level parts (to read a checkpoint written before some
        part was checkpointed); ``None``: all.
    """
    with tf.device("/cpu:0"):
        config = tf.Variable(experiment.config, dtype=tf.string, trainable=False,
                             name="config")
    found = dict(step=step, learner=experiment.learner, config=config)
    # A rule's Keras optimizer is checkpointed as "optimizer" (as in metalearn 0.2); a
    # rule's own state (variables of the rule or its guards) as "outer_rule".
    rule = experiment.outer_rule
    optimizer = getattr(rule, "optimizer", None)
    if optimizer is not None:
        found["optimizer"] = optimizer
    if optimizer is None or rule.variables:
        found["outer_rule"] = rule
    if progress is not None:
        found["progress"] = progress.state
    if parts is not None:
        found = {name: value for name, value in found.items() if name in parts}
    checkpoint = tf.train.Checkpoint(**found)
    return checkpoint


def _keys(path: str) -> set:
    """A checkpoint's variable keys, bookkeeping aside."""
    return {name for name, _ in tf.train.list_variables(path)
            if not name.startswith(("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter"))}


def _paths(path: str, root: str) -> Dict[str, Tuple[int, ...]]:
    """Every variable under the checkpoint's top-level object ``root`` by its path of
    attribute names (``learner/adapter/rates/0``), read from the checkpoint's object
    graph (the same names whichever object the checkpoint's keys went through), with
    its shape."""
    reader = tf.train.load_checkpoint(path)
    shapes = reader.get_variable_to_shape_map()
    graph = _compat.trackable_object_graph()()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    nodes = graph.nodes
    start = next((c.node_id for c in nodes[0].children if c.local_name == root), None)
    found: Dict[str, Tuple[int, ...]] = {}
    seen: set = set()
    stack = [(start, root)] if start is not None else []
    while stack:
        node_id, prefix = stack.pop()
        if node_id in seen:
            continue
        seen.add(node_id)
        node = nodes[node_id]
        for attribute in node.attributes:
            if attribute.name == "VARIABLE_VALUE":
                found[prefix] = tuple(shapes.get(attribute.checkpoint_key, ()))
        for child in reversed(node.children):
            stack.append((child.node_id, f"{prefix}/{child.local_name}"))
    return found


def _live_names(root: object, name: str) -> Dict[str, str]:
    """The Keras path (``mlp/hidden0/kernel``) of each variable under ``root``, by its
    path of attribute names as :func:`_paths` walks a checkpoint of it (the same
    traversal of the same children, through ``tf.train.TrackableView``)."""
    view = tf.train.TrackableView(root)
    found: Dict[str, str] = {}
    seen: set = set()
    stack = [(root, name)]
    while stack:
        obj, prefix = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(getattr(obj, "path", None), str) and hasattr(obj, "shape"):
            found[prefix] = obj.path
        for child_name, child in reversed(list(view.children(obj).items())):
            stack.append((child, f"{prefix}/{child_name}"))
    return found


def _described(path: str, shape: Tuple[int, ...], names: Dict[str, str]) -> str:
    """A variable as a user knows it: ``kernel of layer 'hidden0' (1, 4)`` for a model's,
    ``adapter variable mlp_hidden0_kernel_lr (1, 4)`` for a piece's; a variable only in
    the checkpoint by its attributes (``layer 2``: the model's third operation)."""
    parts = path.split("/")
    part = parts[1] if len(parts) > 1 else path
    shape_text = str(tuple(shape))
    if path in names:
        keras_path = names[path].split("/")
        if part == "model" and len(keras_path) >= 2:
            return f"{keras_path[-1]} of layer {keras_path[-2]!r} {shape_text}"
        return f"{part} variable {names[path]} {shape_text}"
    rest = "/".join(parts[2:])
    rest = re.sub(r"_(?:operations|layers)/(\d+)", r"layer \1", rest)
    rest = "/".join(p.lstrip("_") for p in rest.split("/")
                    if p not in ("_functional", "_variables", "hyperparameters"))
    return f"{part} {rest} {shape_text}"


PARTS = ("step", "learner", "optimizer", "outer_rule", "config", "progress")


def load(experiment: Experiment, step: tf.Variable, path: str,
         progress: Optional[Progress] = None,
         into: Optional[tf.train.Checkpoint] = None) -> tf.train.Checkpoint:
    """Loads the checkpoint ``path`` into the experiment's variables (and ``progress``),
    after checking that the checkpoint and the config have the same variables: a
    checkpoint of a Meta-SGD run restored into a MAML config (learned rates that would
    be dropped), or the reverse (rates that would keep their initial values), raises
    naming them, before any variable is overwritten.

    Args:
      into: the checkpoint object to restore (the training loop's, whose save counter
        then carries on); used when the file holds all of its parts.

    Returns:
      The checkpoint object restored (of the parts the file holds).

    Raises:
      UnmatchedCheckpointError: variables in the checkpoint that the config does not
        build, or the reverse.
    """
    saved = {key.split("/", 1)[0] for key in _keys(path)}
    # the outer rule's state: its Keras optimizer's and its own variables, if it has
    # them (a rule without an optimizer is saved whole), as checkpoint_for saves them
    rule = experiment.outer_rule
    own = ["optimizer"] if getattr(rule, "optimizer", None) is not None else []
    if not own or rule.variables:
        own.append("outer_rule")
    unused = {"optimizer", "outer_rule"} - set(own)
    parts = [name for name in PARTS if name in ("step", "learner", *own)
             or (name in saved and name not in unused
                 and (name != "progress" or progress is not None))]
    if progress is not None and "progress" not in parts:
        progress.reset()  # written before the loop's progress was checkpointed
    whole = [name for name in PARTS if name not in unused
             and (name != "progress" or progress is not None)]
    checkpoint = into if into is not None and parts == whole else \
        checkpoint_for(experiment, step, progress, parts=parts)
    _check_matched(experiment, path)
    status = checkpoint.restore(path)
    status.assert_existing_objects_matched()
    if progress is None:
        status.expect_partial()
    return checkpoint


def names_shown(names: Sequence[str], limit: int = 8) -> str:
    """The first ``limit`` of ``names`` and how many more: for error messages."""
    return ", ".join(names[:limit]) + (
        f" and {len(names) - limit} more" if len(names) > limit else "")


def _check_matched(experiment: Experiment, path: str) -> None:
    import tempfile
    with tempfile.TemporaryDirectory(prefix="metalearn_paths_") as folder:
        expected = _paths(tf.train.Checkpoint(learner=experiment.learner).write(
            os.path.join(folder, "paths")), "learner")
    saved = _paths(path, "learner")
    missing, extra = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
    reshaped = sorted(p for p in set(expected) & set(saved) if expected[p] != saved[p])
    if not (missing or extra or reshaped):
        return
    names = _live_names(experiment.learner, "learner")
    show = names_shown
    text = []
    if reshaped:
        shown = [f"{_described(p, saved[p], names).rsplit(' (', 1)[0]}: {saved[p]} in the "
                 f"checkpoint, {expected[p]} in the config" for p in reshaped]
        text.append(f"{len(reshaped)} variable(s) have other shapes ({show(shown)}; "
                    "layers are matched by their position in the model)")
    if extra:
        text.append(f"the checkpoint holds {len(extra)} variable(s) the config does not "
                    f"build ({show([_described(p, saved[p], names) for p in extra])}): "
                    "restoring would drop them")
    if missing:
        text.append(f"the config builds {len(missing)} variable(s) the checkpoint does not "
                    f"hold ({show([_described(p, expected[p], names) for p in missing])}): "
                    "they would keep their initial values")
    raise UnmatchedCheckpointError(
        f"checkpoint {path} does not match the config's learner (another architecture "
        "or other pieces): " + "; ".join(text) +
        ". Restore it with the config it was trained with (the workdir's config.gin), or "
        "with a learner of the same pieces and layer sizes (e.g. MetaSGD for a Meta-SGD "
        "run).")


def restore(workdir: str, gin_params: Sequence[str] = (),
            checkpoint: Optional[str] = None, modules: Sequence[str] = (),
            trust_workdir: bool = False) -> Experiment:
    """Rebuilds a run's experiment from its workdir and loads its newest intact
    checkpoint.

    The config is the workdir's ``config.gin``, or, when that file is lost, the copy
    the checkpoint carries (:data:`CONFIG_VARIABLE`).

    Args:
      workdir: a directory written by ``metalearn.train``.
      gin_params: bindings applied on top of the run's saved config (e.g. a different
        number of shots for evaluation).
      checkpoint: a specific checkpoint path; defaults to the newest intact one in the
        workdir (:func:`find_checkpoint`: a damaged latest checkpoint is passed over,
        with a warning naming it and why).
      modules: the user's modules (``--module``): imported first, and those the workdir
        records (``modules.json``) or its config imports are imported only if given
        here (a workdir is data).
      trust_workdir: import whatever the workdir names (``--trust_workdir``).

    Returns:
      The experiment, whose ``.learner`` holds the trained weights and whose
      ``.sampler`` (and ``.config``) describe the data and preprocessing of the run.

    Raises:
      NotADirectoryError: ``workdir`` is a file, or below one (the message names it).
      FileNotFoundError: ``workdir`` does not exist or is not a run directory (the
        message names it and what it holds); no checkpoint, or no config.
      DamagedCheckpointError: checkpoints, none intact (or ``checkpoint`` damaged).
      UnmatchedCheckpointError: the checkpoint's variables and the config's differ
        (the message names them by layer and shape).
      UntrustedModulesError: the workdir names modules not given in ``modules``
        (listed, with how to allow them); nothing is imported.
      ConfigChangeError: the workdir's ``config.gin`` was edited after its checkpoint
        was written (a binding other than the loop's and evaluation's settings differs
        from the config the checkpoint carries): the message names each binding, as
        ``train`` does; ``gin_params`` apply on top and are not compared.
    """
    directory = Workdir(workdir).require_run().checkpoints
    if checkpoint is not None:
        why = damage(checkpoint)
        if why is not None:
            raise DamagedCheckpointError(f"checkpoint {checkpoint} is damaged: {why}")
        path = checkpoint
    else:
        path = find_checkpoint_logged(directory)
    config = saved_config(path) if path is not None else None
    own = path is not None and os.path.abspath(os.path.dirname(path)) == \
        os.path.abspath(directory)
    if own:  # config.gin edited since: refused, as train refuses (before any loading)
        validation.check_config_unedited(workdir, config)
    if path is None and not os.path.isfile(Workdir(workdir).config):
        parse_config(workdir=workdir, gin_params=gin_params, modules=modules,
                     trust_workdir=trust_workdir)  # names the missing file
    parse_config(workdir=workdir, gin_params=gin_params, saved_config=config,
                 modules=modules, trust_workdir=trust_workdir)
    experiment = build_experiment()
    if path is None:
        raise FileNotFoundError(f"no checkpoint in {directory!r}")
    step = experiment.learner.meta_step
    load(experiment, step, path)
    experiment.restored_step = int(step.numpy())
    experiment.restored_from = path
    return experiment


def find_checkpoint_logged(directory: str) -> Optional[str]:
    """:func:`find_checkpoint`'s path, with a warning for whatever it passed over."""
    search = find_checkpoint(directory)
    if search.skipped or (search.state_problem not in (None, "missing")):
        logging.warning("checkpoints in %s: %s; using %s", directory, search.describe(),
                        search.path)
    return search.path
