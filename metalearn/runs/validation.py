"""Checks before training: problems in the configuration, the data or the workdir are
reported before the first meta-step, naming the bad value, what was expected and where
it came from (the gin file and line that bound it).

Three parts:

* **Where a binding came from.** :func:`parse_config` records the gin files and bindings
  it parsed (:func:`record_sources`); when building the experiment fails, or a check
  here fails, :func:`raise_with_sources` adds the file and line of every binding of the
  configurable at fault whose parameter the message names. Gin's own errors for unknown
  configurables or parameters already carry the file and line.
* **The workdir's run.** :func:`check_workdir_config` compares the workdir's saved
  ``config.gin`` with the new run's: only run-length and logging bindings
  (:data:`RESUMABLE_BINDINGS`) and evaluation settings may differ, so a run can be
  extended by resuming; anything else raises :class:`ConfigChangeError` before anything
  in the workdir is touched, unless ``allow_config_change``.
* **The tasks and the model together.** :func:`check_tasks_and_outputs` draws one
  meta-training episode and one evaluation-split stream (which checks ways against the
  classes of each split and shots + queries against the examples per class), and runs
  the learner on it with no inner step to compare the model's output with the labels:
  ``ways`` logits for N-way classification, the targets' shape for regression.

:func:`check_before_training` runs the last two; the training loop calls it first.
"""

from __future__ import annotations

import os
import re
from typing import Dict, Iterable, List, Mapping, NoReturn, Optional, Sequence, Tuple

import gin
import tensorflow as tf

from metalearn import _compat
from metalearn import configurables as gin_plumbing
from metalearn.learners.learner import Learner, name_of
from metalearn.outer.rule import check_compiles
from metalearn.runs.gin_text import (Binding, GinIncludeError, Source,  # noqa: F401
                                     KeyedStatement, binding_sources, config_bindings,
                                     config_text_bindings, keyed_statements,
                                     substitute_macros)
from metalearn.repository import EXPERIMENTS_DIR
from metalearn.runs.workdir import Workdir
from metalearn.tasks.base import split_seed
from metalearn.tasks.episode import unmask

RESUMABLE_BINDINGS = ("Runtime.deterministic", "make_strategy.peer_timeout")
"""Bindings beside :data:`RESUMABLE_CONFIGURABLES` that may change when a run resumes: op
determinism (``--deterministic``) and how long a multi-worker task waits for its peers."""

RESUMABLE_CONFIGURABLES = ("evaluate", "Loop")
"""Configurables whose bindings may change when a run resumes: evaluation settings (they
do not affect meta-training) and every field of the training loop's settings
(:class:`~metalearn.runs.experiment.Loop`: how long it runs, how it logs and
checkpoints, what a non-finite step does)."""


OUTPUT_PARAMS = ("outputs", "units", "ways")
"""Parameters that set a model's output size or the number of classes: their bindings
are shown with an output-size error."""


class ConfigChangeError(ValueError):
    """The workdir holds a run of another config."""


class RunLengthError(ValueError):
    """A run resumed with ``Loop.num_steps`` below the step its checkpoint reached."""


_SOURCES: List[Binding] = []


class RoleOrderError(ValueError):
    """Role files (``experiments/setups/``, ``learners/``, ``budgets/``) combined so
    that one silently changes another's algorithm: a key a learner bound re-bound by a
    later learner, a setup after a learner, a budget that leaves part of an earlier one
    in force."""


ROLES = ("setups", "learners", "budgets")
"""The folders of experiments/ whose files have a role (experiments/README.md)."""

_ROLE_NAMES = {"setups": "setup", "learners": "learner", "budgets": "budget"}


def role_of(path: Optional[str]) -> Optional[str]:
    """``"setups"``, ``"learners"`` or ``"budgets"`` for a file of the repository's
    role folders (however it is given: a relative path, a link), else ``None``."""
    if not path:
        return None
    real, top = os.path.realpath(path), os.path.realpath(EXPERIMENTS_DIR)
    if os.path.commonpath([real, top]) != top:
        return None
    folder = os.path.relpath(real, top).split(os.sep)[0]
    return folder if folder in ROLES else None


def _unit(statement: KeyedStatement) -> Optional[Tuple[str, str]]:
    """``(role, file)`` of the outermost role file a statement comes from: a learner
    including another (reptile.gin on maml.gin) is one learner, a setup including its
    common file one setup."""
    for file in statement.files:
        role = role_of(file)
        if role is not None:
            return role, file
    return None


def check_roles(gin_files: Sequence[str] = (), gin_params: Sequence[str] = ()) -> None:
    """The rule the repository's own files obey (tests/experiments_test.py, and
    experiments/README.md), for role files however they are given (``--gin_file``s in
    any order, ``include`` lines of the user's files or ``--gin_param``s, a sweep's or
    an evaluation's files): setups before learners; no key a learner file bound is
    bound again by a later learner (a second learner may add bindings, as
    learners/es.gin adds to learners/maml.gin, never re-bind the first's); a later
    budget re-binds every key an earlier one bound (budgets/smoke.gin after a file that
    includes budgets/paper.gin replaces it whole; a budget that keeps part of another
    is a hybrid). A learner may re-bind a setup's defaults (the outer rule, the
    optimiser), and a budget a learner's sizes (budgets/smoke.gin shrinks any run). Files outside experiments/'s role folders, and ``--gin_param``
    bindings, may set anything: they are the user's own overrides.

    Raises:
      RoleOrderError: naming both files and the key (with its lines); for two budgets,
        every key of the earlier that the later leaves.
    """
    keyed = keyed_statements(gin_files, gin_params)
    units = [_unit(s) for s in keyed]
    order: List[Tuple[str, str]] = []  # the role files, in the order they begin
    keys: Dict[Tuple[str, str], Dict[str, Source]] = {}
    bound: Dict[str, Tuple[Tuple[str, str], Source]] = {}  # key -> (unit, source)

    def shared_key(later: Tuple[str, str], earlier: Tuple[str, str]) -> str:
        mine = [s for s, u in zip(keyed, units) if u == later]
        theirs = keys.get(earlier, {})
        shared = next((s for s in mine if s.key in theirs), None)
        return "" if shared is None else (
            f"; it re-binds {shared.key} ({shared.source}), bound by {earlier[1]!r} "
            f"({theirs[shared.key]})")

    for statement, unit in zip(keyed, units):
        if unit is None:
            continue
        role, file = unit
        if unit not in keys:
            learner = next((u for u in order if u[0] == "learners"), None)
            if role == "setups" and learner is not None:
                raise RoleOrderError(
                    f"setup file {file!r} comes after the learner file {learner[1]!r}: give "
                    "setups before learners (a setup parsed later re-binds what the learner "
                    f"chose, e.g. its outer rule){shared_key(unit, learner)}")
            order.append(unit)
            keys[unit] = {}
        keys[unit].setdefault(statement.key, statement.source)
        before = bound.get(statement.key)
        if before is not None and before[0] != unit and before[0][0] == "learners" \
                and role == "learners":
            raise RoleOrderError(
                f"learner file {file!r} re-binds {statement.key} "
                f"({statement.source}), which the learner file {before[0][1]!r} bound "
                f"({before[1]}): the config would silently mix two algorithms. Give one "
                "learner (a learner file may add to another, never re-bind it), and set a "
                "learner's value in a file of your own or by --gin_param")
        bound[statement.key] = (unit, statement.source)
    budgets = [u for u in order if u[0] == "budgets"]
    for earlier, later in zip(budgets, budgets[1:]):
        left = [k for k in keys[earlier] if k not in keys[later]]
        if left:
            more = f", nor {', '.join(left[1:])} ({len(left)} keys in all)" \
                if left[1:] else ""
            raise RoleOrderError(
                f"two budget files, {earlier[1]!r} and {later[1]!r}: the later does not "
                f"re-bind {left[0]} ({keys[earlier][left[0]]}){more}, so the run would be a "
                "hybrid of both budgets; give one budget (or a later one that re-binds all "
                "of the earlier, as budgets/smoke.gin does after budgets/paper.gin)")


def record_sources(gin_files: Sequence[str] = (), gin_params: Sequence[str] = ()) -> None:
    """Checks the syntax and includes of a config about to be parsed (see
    :func:`binding_sources` with ``strict``) and remembers where its bindings come from
    (gin's config is global, and so is this record)."""
    _SOURCES[:] = binding_sources(gin_files, gin_params, strict=True)


def sources_for(configurables: Iterable[str], message: str, params: Iterable[str] = (),
                bindings: Optional[Sequence[Binding]] = None) -> List[Source]:
    """Where the bindings of ``configurables`` (by name, e.g. ``"GradientDescent"``, or
    named in ``message``) whose parameter (or quoted value) ``message`` names were
    made, and those of any configurable's parameters in ``params``; the last binding of
    each key, and only keys gin still binds (the record may be older than gin's
    config)."""
    bindings = _SOURCES if bindings is None else bindings
    names, params = set(configurables), set(params)
    latest: Dict[Tuple[str, str, str], Source] = {}
    for binding in bindings:
        name = binding.selector.rsplit(".", 1)[-1]
        about = name in names or re.search(rf"(?<!\w){re.escape(name)}\b", message)
        named = about and re.search(rf"(?<!\w){re.escape(binding.param)}\b", message)
        # e.g. int('two') fails naming the value only: "invalid literal ...: 'two'"
        value = binding.source.text.split("=", 1)[-1].split("#", 1)[0].strip()
        quoted = about and len(value) > 2 and value[0] in "'\"" and value in message
        if named or quoted or binding.param in params:
            latest[(binding.scope, binding.selector, binding.param)] = binding.source
    return [source for key, source in latest.items() if _is_bound(*key)]


def _is_bound(scope: str, selector: str, param: str) -> bool:
    try:
        gin.query_parameter(f"{scope + '/' if scope else ''}{selector}.{param}")
        return True
    except (ValueError, KeyError):
        return False


def raise_with_sources(error: BaseException, configurables: Sequence[str] = (),
                       params: Sequence[str] = ()) -> NoReturn:
    """Re-raises ``error`` (same type) with the gin file and line of each binding it is
    about appended: bindings of ``configurables`` and of any configurable that gin's
    message names (``In call to configurable 'X'``) whose parameter the message names,
    and bindings of any parameter in ``params``."""
    message = str(error)
    macro = re.search(r"No bindings specified for '([\w.]+)/gin\.macro'", message)
    if macro:  # gin's message is the whole config; say which macro and where it is used
        name = macro.group(1)
        uses = "".join(f"\n  Used in {b.source}" for b in _SOURCES
                       if re.search(rf"%{re.escape(name)}(?!\w)", b.source.text))
        raise type(error)(f"gin macro %{name} is used but never given a value (a line "
                          f"'{name} = ...' in a gin file, or --gin_param='{name} = ...')"
                          f"{uses}") from None
    unknown = re.search(r"Configurable '([\w./]+)' doesn't have a parameter named '(\w+)'",
                        message)
    moved = unknown and gin_plumbing.moved_binding(unknown.group(1), unknown.group(2))
    if moved:  # a keyword that moved: say where to (gin's message says where it is)
        raise ValueError(f"{moved}\n{message}") from None
    names = list(configurables) + re.findall(r"In call to configurable '([\w.]+)'", message)
    sources = [s for s in sources_for(names, message, params) if str(s) not in message]
    if not sources:
        raise error
    _compat.augment_exception_message_and_reraise(
        error, "".join(f"\n  Bound in {s}" for s in sources))


# --- the workdir ----------------------------------------------------------------


def _resumable(key: str) -> bool:
    unscoped = key.rsplit("/", 1)[-1]
    configurable = unscoped.rsplit(".", 1)[0]
    return unscoped in RESUMABLE_BINDINGS or \
        configurable.rsplit(".", 1)[-1] in RESUMABLE_CONFIGURABLES


def config_differences(saved: Mapping[str, str], new: Mapping[str, str]
                       ) -> List[Tuple[str, Optional[str], Optional[str]]]:
    """``(key, saved value, new value)`` of every binding that differs (``None``: not
    bound), leaving out the bindings allowed to change on resumption. Macros are
    substituted first (:func:`substitute_macros`): a binding differs when what it
    resolves to does."""
    saved, new = substitute_macros(saved), substitute_macros(new)
    keys = sorted(set(saved) | set(new))
    return [(k, saved.get(k), new.get(k)) for k in keys
            if saved.get(k) != new.get(k) and not _resumable(k)]


def _differences_text(differences, saved_where: str, new_where: str) -> str:
    return "\n".join(f"  {key}: {'(not bound)' if old is None else old} {saved_where}, "
                     f"{'(not bound)' if new is None else new} {new_where}"
                     for key, old, new in differences)


def check_run_length(num_steps: int, checkpoint: Optional[str], step: Optional[int]
                     ) -> None:
    """Raises before anything is written when a run would resume past its end.

    Resuming with ``Loop.num_steps`` equal to the checkpoint's step runs no step and
    reads the finished run's metrics back; below it, a resumed run would run nothing,
    report the checkpoint's metrics as those of a shorter run and record the shorter
    length in ``config.gin``: refused (a checkpoint is never rewound).

    Args:
      num_steps: the new run's ``Loop.num_steps``.
      checkpoint: the checkpoint the run would resume from (``None``: a new run).
      step: the step that checkpoint holds.

    Raises:
      RunLengthError: ``num_steps`` is below ``step``; the message names both, the
        checkpoint and what to do.
    """
    if checkpoint is None or step is None or num_steps >= step:
        return
    raise RunLengthError(
        f"Loop.num_steps = {num_steps} is below step {step}, which the run's checkpoint "
        f"{checkpoint} has reached: resuming would run no step and rewrite the run's "
        f"length. Nothing was written. To train on, set Loop.num_steps above {step}; to "
        f"evaluate this run use metalearn.evaluate; to train {num_steps} steps from the "
        "start use another --workdir.")


def check_config_unedited(workdir: str, saved_config: Optional[str]) -> None:
    """Raises if the workdir's ``config.gin`` was edited after its checkpoint was
    written: what ``restore`` and ``evaluate`` check before they load weights, as
    :func:`check_workdir_config` does before ``train`` resumes (the same bindings may
    differ: the loop's settings, evaluation settings, :data:`RESUMABLE_BINDINGS`).

    Args:
      saved_config: the config the checkpoint carries (``None``: a checkpoint written
        before checkpoints carried it; nothing to compare).

    Raises:
      ConfigChangeError: a binding differs; the message names each with both values.
    """
    path = Workdir(workdir).config
    if not saved_config or not os.path.isfile(path):
        return
    differences = config_differences(config_text_bindings(saved_config),
                                     config_bindings(path))
    if not differences:
        return
    raise ConfigChangeError(
        f"{path} was changed after the run's checkpoint was written; the checkpoint's "
        f"weights were trained with its own copy of the config, which differs in\n"
        f"{_differences_text(differences, 'in the checkpoint', f'in {path}')}\n"
        "Loading them into the edited config would give another model. Undo the edit "
        f"(the checkpoint's values are above), or give a deliberate change as a binding "
        "(gin_params, --gin_param), which applies on top of the run's config.")


def check_workdir_config(workdir: str, config: str, allow_config_change: bool = False,
                         saved_config: Optional[str] = None) -> None:
    """Raises unless ``workdir`` is new or holds a run of the same config.

    Args:
      workdir: the run directory.
      config: the new run's gin config (``gin.config_str()``).
      allow_config_change: resume anyway (the differences are logged).
      saved_config: the config the workdir's newest checkpoint carries; the run's
        config whatever file is lost (``config.gin`` is compared when there is none).

    Raises:
      ConfigChangeError: the workdir's ``config.gin`` differs from ``config`` in a
        binding other than :data:`RESUMABLE_BINDINGS` and evaluation settings; the
        message names each binding with both values.
    """
    path = Workdir(workdir).config
    if saved_config:
        saved = config_text_bindings(saved_config)
        if not os.path.isfile(path):
            path = f"the config its checkpoint carries ({Workdir.CONFIG} is missing)"
        else:
            path = f"{path} (as its checkpoint carries it)"
    elif os.path.isfile(path):
        saved = config_bindings(path)
    else:
        return
    differences = config_differences(saved, config_text_bindings(config))
    if not differences:
        return
    lines = _differences_text(differences, "in the workdir", "now")
    if allow_config_change:
        from absl import logging
        logging.warning("resuming %s with a changed config (allow_config_change):\n%s",
                        workdir, lines)
        return
    raise ConfigChangeError(
        f"workdir {workdir!r} holds a run of another config: {path} differs in\n{lines}\n"
        f"Only the loop's settings (Loop.*), evaluation settings (evaluate.*) and "
        f"{', '.join(RESUMABLE_BINDINGS)} may change when a run resumes. Use another --workdir, or pass --allow_config_change "
        "(train(..., allow_config_change=True)) to resume this run with the new config.")


# --- tasks and model outputs -----------------------------------------------------


def _evaluation_split() -> str:
    try:
        return str(gin.query_parameter("evaluate.split"))
    except ValueError:  # not bound: evaluate's default
        return "test"


def _expected_classes(sampler, labels: tf.Tensor, split: str = "train"
                      ) -> Tuple[Tuple[int, ...], str]:
    """The numbers of classes the model's output may have on ``split``, and why (a
    sampler whose splits differ, e.g. ``WholeClassBatches``, says so through
    ``classes_per_batch(split)``)."""
    per_split = getattr(sampler, "classes_per_batch", None)
    if callable(per_split):
        return per_split(split)
    ways = getattr(sampler, "ways", None)
    name = type(sampler).__name__
    if ways is not None:
        ways = tuple(int(w) for w in (ways if isinstance(ways, (tuple, list)) else (ways,)))
        return ways, f"{name}.ways={ways[0] if len(ways) == 1 else ways}"
    data = getattr(sampler, "data", None)
    if data is not None and hasattr(data, "num_classes"):
        return (int(data.num_classes),), f"the {data.num_classes} classes of {name}'s data"
    return (), ""


def supervised(learner) -> bool:
    """Whether ``learner``'s task loss is the supervised one (``Learner.task_loss``, which
    compares predictions with targets), so that the checks before training may compare
    the model's outputs and the loss's kind with the tasks' targets. A class that
    overrides ``task_loss`` owns that contract instead."""
    return getattr(type(learner), "task_loss", None) is Learner.task_loss


def check_outputs(learner, episode, sampler, split: str = "train") -> None:
    """Runs ``learner`` with no inner step on one task and compares its predictions on
    the query set with the query labels.

    Integer labels (classification): the output must be ``[queries, N]`` with N the
    sampler's ``ways`` (at least the largest choice when ways vary) or the data's
    number of classes, and above every label. Float targets (regression): the output
    must have the targets' shape (trailing size-1 axes aside).

    ``split`` is the split the episode comes from.

    A learner whose class overrides ``task_loss`` (a loss that is not a supervised
    comparison of predictions with targets: a policy-gradient loss on rolled-out
    trajectories, a likelihood) replaces this check with its own: its loss says what fits
    (:func:`supervised`).

    Raises:
      ValueError: naming the model, its output shape and what the tasks need.
    """
    if not supervised(learner):
        return
    run = learner.run_task(episode, steps=0, measure=False)
    support_x, adapted, predictions = run.support_x, run.adapted, run.predictions
    query_y, support_y = unmask(run.query_y)[0], unmask(run.support_y)[0]  # padded
    shape = tuple(predictions.shape)
    target = tuple(tf.convert_to_tensor(query_y).shape)
    model = getattr(getattr(learner, "model", None), "name", "the model")
    where = f"{type(learner).__name__} (model {model!r})"
    if tf.as_dtype(tf.convert_to_tensor(query_y).dtype).is_integer:
        ways, why = _expected_classes(sampler, query_y, split)
        if len(shape) != len(target) + 1 or shape[:-1] != target:
            raise ValueError(f"{where} predicts shape {list(shape)} for {target[0]} query "
                             f"examples; a classifier must give [examples, classes] logits "
                             f"({list(target) + ['classes']})")
        classes = shape[-1]
        highest = int(tf.reduce_max(query_y)) + 1 if tf.size(query_y) else 0
        if len(ways) == 1 and classes != ways[0]:
            raise ValueError(f"{where} outputs {classes} classes (shape {list(shape)}) but "
                             f"the tasks have {ways[0]} ({why}): the model's output size "
                             f"must equal the number of ways, e.g. a head of {ways[0]} units")
        if len(ways) > 1 and classes < max(ways):
            raise ValueError(f"{where} outputs {classes} classes (shape {list(shape)}) but "
                             f"tasks have up to {max(ways)} ({why})")
        if classes < highest:
            raise ValueError(f"{where} outputs {classes} classes (shape {list(shape)}) but "
                             f"the query labels go up to {highest - 1}")
        return
    squeeze = lambda s: tuple(s[:len(s) - next((i for i, d in enumerate(reversed(s))
                                                 if d != 1), len(s))])
    if shape != target and squeeze(shape) != squeeze(target):
        raise ValueError(f"{where} predicts shape {list(shape)} but the query targets of "
                         f"{type(sampler).__name__} have shape {list(target)}: the model's "
                         "output must match the targets (e.g. its number of outputs)")
    support = tuple(tf.convert_to_tensor(support_y).shape)
    on_support = tuple(learner.predict(adapted, support_x).shape)
    if on_support != support and squeeze(on_support) != squeeze(support):
        raise ValueError(f"{where} predicts shape {list(on_support)} but the support "
                         f"targets of {type(sampler).__name__} have shape {list(support)}")


CLASSIFICATION_LOSSES = ("SparseCategoricalCrossentropy", "CategoricalCrossentropy",
                         "BinaryCrossentropy", "sparse_categorical_crossentropy",
                         "categorical_crossentropy", "binary_crossentropy")
REGRESSION_LOSSES = ("MeanSquaredError", "MeanAbsoluteError", "Huber",
                     "mean_squared_error", "mean_absolute_error", "huber")


def check_loss_and_metrics(learner, episode) -> None:
    """The learner's loss and metrics fit the task kind (integer labels: classification;
    float targets: regression), and give one value per query example (or a scalar),
    not a broadcast ``[N, N]`` or a wrong length: checked once, on one task, before the
    numbers they would average are reported (the shapes by the learner's own check,
    :func:`metalearn.learners.learner.check_loss_shapes`).

    Raises:
      ValueError: naming the loss or metric, the task kind, and the shapes.
    """
    loss = getattr(learner, "loss", None)
    metrics = dict(getattr(learner, "metrics", {}) or {})
    if loss is None or not supervised(learner):
        return
    run = learner.run_task(episode, steps=0, measure=False)
    padded_y = run.query_y
    query_y = tf.convert_to_tensor(unmask(padded_y)[0])
    classification = tf.as_dtype(query_y.dtype).is_integer
    kind = "classification (integer labels)" if classification else \
        "regression (float targets)"
    where = f"{type(learner).__name__}"
    for label, fn in [("loss", loss)] + [(f"metric {k!r}", v) for k, v in metrics.items()]:
        name = name_of(fn)
        if classification and name in REGRESSION_LOSSES:
            raise ValueError(f"{where} {label} {name} is a regression loss, but the tasks "
                             f"are {kind}: use e.g. "
                             "keras.losses.SparseCategoricalCrossentropy(from_logits=True)")
        if not classification and (name in CLASSIFICATION_LOSSES or name == "accuracy"):
            raise ValueError(f"{where} {label} {name} is for classification, but the tasks "
                             f"are {kind} (targets of dtype {query_y.dtype.name}): use a "
                             "regression loss or metric, e.g. "
                             "keras.losses.MeanSquaredError()")
    learner.query_metrics(padded_y, run.predictions)


def check_tasks_and_outputs(experiment) -> None:
    """Draws one meta-training task and, for a classification sampler whose evaluation
    split has classes, checks that split (:meth:`TaskSampler.check_split`: ways against
    classes, shots + queries against examples per class; the stream is not built),
    then :func:`check_outputs` on that task.

    Errors name the gin binding that caused them where the config bound it.
    """
    sampler, learner = experiment.sampler, experiment.learner
    name = type(sampler).__name__
    try:
        # the stream's first batch of one task, drawn eagerly: no stream to build
        # (tracing its sampling and making its iterator took seconds on image data)
        batch = sampler.sample_at(split_seed(experiment.seed, "train"),
                                  tf.constant(0, tf.int64), 1, "train")
        split = _evaluation_split()
        num_classes = getattr(sampler, "num_classes", None)
        if split != "train" and callable(num_classes) and num_classes(split) > 0:
            sampler.check_split(split)
    except (ValueError, TypeError, FileNotFoundError) as error:
        raise_with_sources(error, [name, "load_omniglot", "load_mnist"])
    try:
        batch.check_tasks()
    except ValueError as error:
        raise_with_sources(ValueError(f"{name}: {error}"), [name])
    try:
        check_outputs(learner, batch.task(0), sampler)
    except ValueError as error:
        raise_with_sources(error, [name], params=OUTPUT_PARAMS)
    try:
        check_loss_and_metrics(learner, batch.task(0))
    except ValueError as error:
        raise_with_sources(error, ["Learner"], params=("loss", "metrics"))


def check_before_training(experiment, workdir: str, allow_config_change: bool = False,
                          saved_config: Optional[str] = None) -> None:
    """Everything that can be checked before the first meta-step, in the order that
    loses nothing: the workdir's config (before any file in it is written), then the
    tasks and the model's outputs (see :func:`check_tasks_and_outputs`).

    Raises:
      ConfigChangeError: the workdir holds a run of another config.
      ValueError, FileNotFoundError: bad tasks, data or model outputs; an outer rule
        that cannot be compiled with XLA under ``Runtime.jit_compile = True``.
    """
    check_workdir_config(workdir, experiment.config or gin.config_str(),
                         allow_config_change, saved_config=saved_config)
    check_compiles(experiment.outer_rule, experiment.runtime.jit_compile)
    check_tasks_and_outputs(experiment)
