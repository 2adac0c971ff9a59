"""``MetaModel``: meta-training with ``keras.Model.fit``.

Its ``train_step`` is the library's one meta-step, the step
:func:`metalearn.training.make_meta_step` compiles and the training loop takes (built by
:func:`metalearn.training.build_meta_step`, traced inside Keras' ``train_function``); its
``test_step`` is evaluation's measure of a batch of episodes
(:meth:`metalearn.Learner.meta_metrics`: each task adapted on its support set, measured
on its queries). Keras' callbacks (the progress bar, ``TensorBoard``,
``BackupAndRestore``, ``EarlyStopping`` on a validation metric) work as on any model.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

import gin
import keras
import numpy as np
import tensorflow as tf

from metalearn import execution
from metalearn.learners.learner import Learner
from metalearn.outer.guards import NON_FINITE
from metalearn.outer.rule import OuterRule
from metalearn.runs import gin_text
from metalearn.runs.experiment import Experiment, build_experiment
from metalearn.tasks.base import TaskSampler
from metalearn.tasks.episode import Episode
from metalearn.training.step import build_meta_step

SKIPPED = "skipped_steps"
"""The training metric that counts the steps whose update was withheld (a non-finite
meta-loss or direction, with ``skip_non_finite``)."""


def _episodes(data: Any) -> Episode:
    """The batch of episodes in what Keras hands a step: the dataset's element, or
    ``(episodes,)`` where Keras packed it as ``x``."""
    if isinstance(data, (tuple, list)) and not isinstance(data, Episode) and len(data) == 1:
        data = data[0]
    if not isinstance(data, Episode):
        raise TypeError(
            f"MetaModel takes batches of episodes (metalearn.tasks.Episode, from a task "
            f"sampler's dataset: MetaModel.episodes(sampler, ...) or sampler.dataset(...))"
            f", got {type(data).__name__}: {data!r:.200}")
    return data


def _counts(eval_inner_steps: Union[None, int, Sequence[int]]) -> Optional[List[int]]:
    if eval_inner_steps is None:
        return None
    counts = [eval_inner_steps] if isinstance(eval_inner_steps, (int, np.integer)) \
        else list(eval_inner_steps)
    bad = [c for c in counts if isinstance(c, bool) or not isinstance(c, (int, np.integer))
           or c < 0]
    if not counts or bad:
        raise ValueError(f"MetaModel.eval_inner_steps must be a whole number of inner "
                         f"steps >= 0 or a non-empty list of them, got {eval_inner_steps!r}")
    return list(dict.fromkeys(int(c) for c in counts))


@keras.saving.register_keras_serializable(package="metalearn")
class MetaModel(keras.Model):
    """A learner and an outer rule as a ``keras.Model``: ``fit`` meta-trains.

    ``fit`` takes a dataset of batches of episodes (a task sampler's;
    :meth:`episodes` gives the training stream that resumes where the learner's
    ``meta_step`` is, so that a fit resumed by ``BackupAndRestore`` draws the tasks an
    uninterrupted one would), with ``steps_per_epoch`` (the stream is endless);
    ``validation_data`` a finite one (``sampler.dataset(..., split="validation",
    num_steps=k)``). Each training step is the meta-step of
    :func:`~metalearn.training.make_meta_step` with the same arguments, so ``fit``
    gives the weights ``make_meta_step`` gives, step for step. The metrics are Keras
    running means over the epoch of the step's figures (``loss``, the learner's
    metrics, the adapter's; over the finite steps only, with ``skip_non_finite``, whose
    skipped steps are counted as ``skipped_steps``); validation's are the means over
    every validation task of :meth:`~metalearn.Learner.meta_metrics` after the
    adapter's inner steps (``val_loss``, ...) or after each of ``eval_inner_steps``
    (``val_loss_5_steps``, ...).

    What is saved (``save_weights``, ``BackupAndRestore``, ``model.save``): every
    variable of the learner (the model's weights, every piece's state, the step
    counter ``meta_step``) and of the outer rule (its Keras optimizer, as the model's
    ``optimizer``, and its own variables): the state a metalearn checkpoint holds.
    ``model.save(...)`` / ``keras.saving.load_model`` need the model's config, which
    only a MetaModel built from a gin experiment has (:meth:`from_experiment`: the
    config is the experiment's gin text); a hand-built one saves and loads its weights
    (``save_weights``, ``load_weights`` into a MetaModel built by the same code).

    One replica: under a ``tf.distribute`` strategy of several, train with
    :func:`metalearn.training.train` or ``make_meta_step(..., strategy=...)``.

    Args:
      learner: the learner to meta-train (:class:`metalearn.Learner`).
      outer_rule: the outer rule (:mod:`metalearn.outer`: ``MetaGradient(optimizer)``,
        ``Reptile(optimizer)``, ...).
      formulation: how the tasks of a batch run (:mod:`metalearn.execution`), in
        training and validation; ``None``: ``Auto()``.
      jit_compile: compile the meta-step with XLA (as ``make_meta_step``'s; Keras'
        ``jit_compile`` is set from it).
      skip_non_finite: withhold an update whose meta-loss or direction is not finite
        (as the training loop does; ``make_meta_step``'s argument).
      eval_inner_steps: the inner steps validation adapts for: ``None`` (the adapter's
        own), a count, or a list of counts (each a metric suffix ``_<count>_steps``).
      name: the Keras model's name.
    """

    def __init__(self, learner: Learner, outer_rule: OuterRule,
                 formulation: Union[None, str, execution.Formulation] = None,
                 jit_compile: bool = False, skip_non_finite: bool = True,
                 eval_inner_steps: Union[None, int, Sequence[int]] = None,
                 name: Optional[str] = None):
        if not isinstance(learner, Learner):
            raise TypeError(f"MetaModel.learner must be a metalearn.Learner, got "
                            f"{learner!r}")
        if not isinstance(outer_rule, OuterRule):
            raise TypeError(f"MetaModel.outer_rule must be a metalearn outer rule "
                            f"(MetaGradient(), Reptile(), ...: metalearn.outer), got "
                            f"{outer_rule!r}")
        super().__init__(name=name)
        replicas = self.distribute_strategy.num_replicas_in_sync
        if replicas > 1:
            raise ValueError(
                f"MetaModel trains on one replica, not the {replicas} of "
                f"{type(self.distribute_strategy).__name__}: train on several with "
                "metalearn.training.train or make_meta_step(..., strategy=...)")
        self.learner = learner
        self.outer_rule = outer_rule
        self.formulation = execution.formulation(formulation)
        self.skip_non_finite = bool(skip_non_finite)
        self.eval_inner_steps = _counts(eval_inner_steps)
        # the one builder of the meta-step (checks, the rule's build): what
        # make_meta_step compiles, compiled here inside Keras' train_function
        self._meta_step = build_meta_step(learner, outer_rule, self.formulation,
                                          jit_compile=bool(jit_compile),
                                          skip_non_finite=self.skip_non_finite)
        self.meta_jit_compile = bool(jit_compile)
        self.optimizer = getattr(outer_rule, "optimizer", None)  # Keras saves it
        self.gin_config: Optional[str] = None  # from_experiment's: the model's config
        # Running means of the step's figures; a figure without one passes through.
        train_names = list(learner.metric_names)
        train_names += [n for n in learner.pieces.gradient_metrics if n not in train_names]
        self._train_means = {n: keras.metrics.Mean(name=n) for n in train_names}
        self._skipped = keras.metrics.Sum(name=SKIPPED) if self.skip_non_finite else None
        counts = self.eval_inner_steps
        # (named apart from the training means: Keras reads results by name)
        self._test_means = {
            self._test_name(n, c): keras.metrics.Mean(name="test_" + self._test_name(n, c))
            for c in (counts or [None]) for n in learner.metric_names}
        self.built = True

    # --- construction from a gin experiment, and Keras' config ---------------------

    @classmethod
    def from_experiment(cls, experiment: Experiment,
                        eval_inner_steps: Union[None, int, Sequence[int]] = None,
                        name: Optional[str] = None) -> "MetaModel":
        """A MetaModel of a gin experiment (:func:`metalearn.training.build_experiment`):
        its learner, outer rule, formulation and XLA choice (``Runtime.jit_compile``);
        its gin text (``experiment.config``) is the model's Keras config, so that
        ``model.save`` and ``keras.saving.load_model`` work. Its sampler, meta-batch
        size and seed are the caller's to give :meth:`episodes`."""
        if not isinstance(experiment, Experiment):
            raise TypeError(f"MetaModel.from_experiment needs a metalearn Experiment "
                            f"(metalearn.training.build_experiment()), got {experiment!r}")
        model = cls(experiment.learner, experiment.outer_rule, experiment.formulation,
                    jit_compile=experiment.runtime.jit_compile,
                    eval_inner_steps=eval_inner_steps, name=name)
        model.gin_config = experiment.config or None
        return model

    def get_config(self) -> Dict[str, Any]:
        """The experiment's gin text and the model's own arguments; only for a
        MetaModel built by :meth:`from_experiment` (a learner and an outer rule have
        no Keras config of their own).

        Raises:
          NotImplementedError: a hand-built MetaModel, naming its learner.
        """
        if not self.gin_config:
            raise NotImplementedError(
                f"MetaModel {self.name!r} over {type(self.learner).__name__} "
                f"{self.learner.name!r} and {type(self.outer_rule).__name__} has no Keras "
                "config: metalearn learners and outer rules are not Keras-serializable. "
                "model.save / keras.saving.load_model are supported for a MetaModel built "
                "from a gin experiment (MetaModel.from_experiment(build_experiment())); "
                "otherwise save its weights (model.save_weights) and load them "
                "(model.load_weights) into a MetaModel built by the same code")
        return {"name": self.name, "gin_config": self.gin_config,
                "eval_inner_steps": self.eval_inner_steps}

    @classmethod
    def from_config(cls, config: Dict[str, Any], custom_objects: Any = None) -> "MetaModel":
        """Rebuilds a MetaModel from :meth:`get_config`: parses its gin text (which
        clears gin's current config) and builds the experiment. Gin text that imports
        modules is refused (loading a file runs no code the file names): rebuild such
        a model in code and load its weights."""
        text = config.get("gin_config")
        if not isinstance(text, str) or not text:
            raise ValueError(f"MetaModel's config needs the experiment's gin text under "
                             f"'gin_config', got keys {sorted(config)}")
        imports = [s for s in gin_text.statements(text, "<MetaModel config>")
                   if type(s).__name__ == "ImportStatement"]
        if imports:
            names = [getattr(s, "module", str(s)) for s in imports]
            raise ValueError(
                f"MetaModel's saved gin config imports modules {names}: a saved model "
                "runs no code it names when loaded. Import them, build the experiment "
                "from its gin files in code and load the weights (model.load_weights)")
        gin.clear_config()
        gin.parse_config(text)
        return cls.from_experiment(build_experiment(),
                                   eval_inner_steps=config.get("eval_inner_steps"),
                                   name=config.get("name"))

    # --- Keras' compile, and the data -------------------------------------------------

    def compile(self, steps_per_execution: int = 1, run_eagerly: bool = False,
                **given: Any) -> None:
        """Keras' ``compile`` with what a MetaModel takes: ``steps_per_execution``,
        ``run_eagerly``. The loss and metrics are the learner's, the optimizer the outer
        rule's and XLA the constructor's ``jit_compile``.

        Raises:
          TypeError: any other argument, named.
        """
        if given:
            raise TypeError(
                f"MetaModel.compile takes steps_per_execution and run_eagerly only, got "
                f"{sorted(given)}: the loss and metrics are the learner's, the optimizer "
                "the outer rule's, XLA MetaModel(jit_compile=...)")
        super().compile(optimizer=self.optimizer, jit_compile=self._meta_step.jit_compile,
                         steps_per_execution=steps_per_execution, run_eagerly=run_eagerly)

    def episodes(self, sampler: TaskSampler, meta_batch_size: int, seed: int = 0,
                 split: str = "train") -> tf.data.Dataset:
        """The endless stream of training batches, from the learner's ``meta_step``
        as it is when iteration starts (Keras' ``fit`` starts it after its callbacks'
        ``on_train_begin``, where ``BackupAndRestore`` restores the step): step ``s``
        gets the batch ``sampler.dataset(meta_batch_size, seed)`` gives at ``s``,
        which the training loop takes at that step too."""
        if not isinstance(sampler, TaskSampler):
            raise TypeError(f"MetaModel.episodes needs a metalearn task sampler "
                            f"(metalearn.tasks), got {sampler!r}")
        step = self.learner.meta_step
        start = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).map(
            lambda _: step.read_value())  # read when iteration starts, not now
        return start.flat_map(lambda first: sampler.dataset(
            int(meta_batch_size), seed=seed, split=split, start_step=first))

    # --- the steps ---------------------------------------------------------------------

    @staticmethod
    def _test_name(name: str, count: Optional[int]) -> str:
        return name if count is None else f"{name}_{count}_steps"

    @property
    def metrics(self) -> List[keras.metrics.Metric]:
        """The running means of training and validation (reset by Keras each epoch)."""
        found = [*self._train_means.values(), *self._test_means.values()]
        return found + ([self._skipped] if self._skipped is not None else [])

    def train_step(self, data: Any) -> Dict[str, tf.Tensor]:
        """One meta-step on a batch of episodes (``make_meta_step``'s step): the
        running means of its figures so far this epoch."""
        figures = dict(self._meta_step.in_replica(_episodes(data)))
        flags = figures.pop(NON_FINITE, None)
        finite = tf.constant(True) if flags is None else tf.reduce_all(flags == 0)
        weight = tf.cast(finite, tf.float32)
        logs = {}
        for name, value in figures.items():
            mean = self._train_means.get(name)
            if mean is None:  # a figure of the rule's own: this step's value
                logs[name] = value
                continue
            value = tf.cast(value, tf.float32)
            mean.update_state(tf.where(finite, value, tf.zeros_like(value)),
                              sample_weight=weight)
        if self._skipped is not None:
            self._skipped.update_state(1.0 - weight)
        for mean in [*self._train_means.values(), self._skipped]:
            if mean is not None:
                logs[mean.name] = mean.result()
        return logs

    def test_step(self, data: Any) -> Dict[str, tf.Tensor]:
        """Evaluation of a batch of episodes: each task adapted on its support set and
        measured on its queries (:meth:`metalearn.Learner.meta_metrics`, as
        :func:`metalearn.training.evaluate` measures), the running means over every
        task so far."""
        episodes = _episodes(data)
        counts = self.eval_inner_steps
        figures = self.learner.meta_metrics(episodes, counts,
                                            formulation=self.formulation.for_evaluation())
        by_count = figures if counts is not None else {None: figures}
        for count, values in by_count.items():
            for name, value in values.items():
                mean = self._test_means.get(self._test_name(name, count))
                if mean is not None:
                    mean.update_state(tf.cast(value, tf.float32))
        return {name: mean.result() for name, mean in self._test_means.items()}

    def predict_step(self, data: Any) -> Any:
        """Not a MetaModel's: adapt and predict with the learner."""
        raise NotImplementedError(
            "MetaModel.predict is not supported: adapt to a task and predict with the "
            "learner (model.learner.adapt(support_x, support_y), then "
            "model.learner.predict(adapted, query_x)), or export it "
            "(metalearn.serving.export_saved_model)")

    def call(self, inputs: Any, training: bool = False) -> Any:
        """Not a MetaModel's: adapt and predict with the learner."""
        raise NotImplementedError(
            "calling a MetaModel is not supported: adapt to a task and predict with "
            "model.learner (adapt, then predict)")

    # --- what is saved -----------------------------------------------------------------

    def _state(self) -> List[Any]:
        """Every variable of the learner and the outer rule that Keras does not save
        itself (the rule's Keras optimizer is the model's ``optimizer``), in a fixed
        order: what a metalearn checkpoint holds of them."""
        root = tf.train.Checkpoint(learner=self.learner, outer_rule=self.outer_rule)
        view = tf.train.TrackableView(root)  # holds a weak reference to root
        skipped = set()
        if self.optimizer is not None:
            skipped = {id(v) for v in self.optimizer.variables}
            skipped |= {id(getattr(v, "value", None)) for v in self.optimizer.variables}
        found, seen = [], set()
        for obj in view.descendants():
            if not isinstance(obj, (tf.Variable, keras.Variable)):
                continue
            inner = obj.value if isinstance(obj, keras.Variable) else obj
            if id(obj) in skipped or id(inner) in skipped or id(inner) in seen:
                continue
            seen.add(id(inner))
            found.append(obj)
        return found

    def save_own_variables(self, store: Any) -> None:
        """Keras' hook: every variable of :meth:`_state`, by position."""
        for index, variable in enumerate(self._state()):
            store[str(index)] = np.asarray(variable.numpy())

    def load_own_variables(self, store: Any) -> None:
        """Keras' hook: the variables :meth:`save_own_variables` wrote.

        Raises:
          ValueError: a file of another learner or outer rule (a different number of
            variables, or a variable of another shape), before any is assigned.
        """
        state = self._state()
        if len(store.keys()) != len(state):
            raise ValueError(
                f"the saved MetaModel state has {len(store.keys())} variables, this "
                f"model's learner and outer rule have {len(state)}: the file is of "
                "another learner or outer rule")
        values = [store[str(i)] for i in range(len(state))]
        for variable, value in zip(state, values):
            if tuple(np.shape(value)) != tuple(variable.shape):
                name = getattr(variable, "path", None) or variable.name
                raise ValueError(
                    f"the saved MetaModel state's value for {name} has shape "
                    f"{np.shape(value)}, the model's {tuple(variable.shape)}: "
                    "the file is of another learner or outer rule")
        for variable, value in zip(state, values):
            variable.assign(value)
