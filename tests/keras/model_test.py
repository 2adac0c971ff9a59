"""metalearn.keras.MetaModel: ``fit`` is the meta-step, step for step; a killed fit
resumes through ``BackupAndRestore`` to the uninterrupted result; validation metrics
drive ``EarlyStopping`` and reach TensorBoard; ``keras.saving`` round trip."""

import functools
import glob

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn.keras import MetaModel
from metalearn.training import build_experiment, make_meta_step, parse_config

SAMPLER = metalearn.tasks.Sinusoid(shots=5)
TASKS, STEPS, PER_EPOCH = 4, 6, 2  # meta-batch, meta-steps, steps per epoch


def _learner_and_rule():
    """Sinusoid MAML (second order, one inner step) on a tiny MLP, the same initial
    weights at every call."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    learner = metalearn.Learner(model, adapter=metalearn.adapters.GradientDescent(
        steps=1, learning_rate=0.01, first_order=False),
        loss=keras.losses.MeanSquaredError())
    return learner, metalearn.MetaGradient(keras.optimizers.Adam(1e-2))


def _state(learner, rule):
    return [np.asarray(v) for v in [*learner.meta_variables, learner.meta_step,
                                    *rule.optimizer.variables]]


@functools.lru_cache(maxsize=None)
def _reference():
    """``make_meta_step`` applied STEPS times to the stream MetaModel.episodes gives:
    the state after, and each step's loss."""
    learner, rule = _learner_and_rule()
    step = make_meta_step(learner, rule, "map_fn", skip_non_finite=True)
    losses = [float(step(batch)["loss"])
              for batch in SAMPLER.dataset(TASKS, seed=0, num_steps=STEPS)]
    return _state(learner, rule), losses


def _model(**kwargs):
    model = MetaModel(*_learner_and_rule(), formulation="map_fn", **kwargs)
    model.compile()
    return model


def _assert_state_equal(model, expected):
    got = _state(model.learner, model.outer_rule)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_fit_equals_make_meta_step_step_for_step():
    expected, losses = _reference()
    model = _model()
    history = model.fit(model.episodes(SAMPLER, TASKS, seed=0), epochs=STEPS // PER_EPOCH,
                        steps_per_epoch=PER_EPOCH, verbose=0)
    _assert_state_equal(model, expected)
    assert int(model.learner.meta_step.numpy()) == STEPS
    # an epoch's loss: the mean of its steps' losses, as make_meta_step gave them
    windows = np.reshape(losses, (-1, PER_EPOCH)).mean(axis=1)
    np.testing.assert_allclose(history.history["loss"], windows, rtol=1e-5)
    assert history.history["skipped_steps"] == [0.0] * (STEPS // PER_EPOCH)


class _Kill(keras.callbacks.Callback):
    """Raises after ``after`` batches of the fit: a process killed mid-way."""

    def __init__(self, after):
        super().__init__()
        self.after, self.seen = after, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.after:
            raise RuntimeError("killed")


def test_backup_and_restore_resumes_a_killed_fit_to_the_uninterrupted_result(tmp_path):
    expected, _ = _reference()
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    epochs = STEPS // PER_EPOCH
    model = _model()
    with pytest.raises(RuntimeError, match="killed"):  # mid-way through the 2nd epoch
        model.fit(model.episodes(SAMPLER, TASKS, seed=0), epochs=epochs,
                  steps_per_epoch=PER_EPOCH, callbacks=[backup, _Kill(PER_EPOCH + 1)],
                  verbose=0)
    assert int(model.learner.meta_step.numpy()) == PER_EPOCH + 1
    resumed = _model()  # a new process: fresh weights, restored from the backup
    history = resumed.fit(resumed.episodes(SAMPLER, TASKS, seed=0), epochs=epochs,
                          steps_per_epoch=PER_EPOCH, callbacks=[backup], verbose=0)
    assert len(history.history["loss"]) == epochs - 1  # from the 2nd epoch on
    assert int(resumed.learner.meta_step.numpy()) == STEPS
    _assert_state_equal(resumed, expected)


def test_early_stopping_on_a_validation_metric_and_tensorboard(tmp_path):
    model = _model(eval_inner_steps=(1, 3))
    stop = keras.callbacks.EarlyStopping(monitor="val_loss_3_steps", mode="min", patience=0,
                                         min_delta=1e9)  # no epoch improves by that
    board = keras.callbacks.TensorBoard(str(tmp_path / "logs"))
    history = model.fit(model.episodes(SAMPLER, TASKS, seed=0), epochs=10,
                        steps_per_epoch=1, verbose=0, callbacks=[stop, board],
                        validation_data=SAMPLER.dataset(TASKS, split="validation",
                                                        num_steps=2))
    assert len(history.history["val_loss_3_steps"]) == 2  # stopped after the 2nd epoch
    assert stop.stopped_epoch == 1
    assert set(history.history) == {"loss", "skipped_steps", "val_loss_1_steps",
                                    "val_loss_3_steps"}
    # validation is evaluation's measure: the mean over its tasks of meta_metrics
    report = model.evaluate(SAMPLER.dataset(TASKS, split="validation", num_steps=2),
                            verbose=0, return_dict=True)
    per_task = [model.learner.meta_metrics(batch, 3, formulation="map_fn")["loss"]
                for batch in SAMPLER.dataset(TASKS, split="validation", num_steps=2)]
    np.testing.assert_allclose(report["loss_3_steps"], np.mean(np.concatenate(per_task)),
                               rtol=1e-5)
    for part in ("train", "validation"):
        assert glob.glob(str(tmp_path / "logs" / part / "events.out.tfevents.*")), part


def test_save_and_load_round_trip(tmp_path):
    parse_config(["experiments/sinusoid/maml.gin"],
                 ["Experiment.meta_batch_size = 2", "Sinusoid.shots = 3"])
    experiment = build_experiment()
    model = MetaModel.from_experiment(experiment)
    model.compile()
    model.fit(model.episodes(experiment.sampler, 2, seed=experiment.seed), epochs=1,
              steps_per_epoch=2, verbose=0)
    path = str(tmp_path / "maml.keras")
    model.save(path)
    gin.clear_config()
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, MetaModel) and loaded.learner is not model.learner
    assert int(loaded.learner.meta_step.numpy()) == 2
    _assert_state_equal(loaded, _state(model.learner, model.outer_rule))
    gin.clear_config()


def test_what_cannot_be_saved_or_given_is_named(tmp_path):
    learner, rule = _learner_and_rule()
    model = MetaModel(learner, rule)
    with pytest.raises(NotImplementedError, match="MetaModel.from_experiment"):
        model.get_config()
    with pytest.raises(ValueError, match=r"imports modules \['os'\]"):
        MetaModel.from_config({"gin_config": "import os\n"})
    with pytest.raises(TypeError, match=r"\['loss'\]"):
        model.compile(loss="mse")
    with pytest.raises(TypeError, match="metalearn.Learner, got 3"):
        MetaModel(3, rule)
    with pytest.raises(ValueError, match="eval_inner_steps"):
        MetaModel(learner, rule, eval_inner_steps=[1.5])
    model.compile()
    with pytest.raises(TypeError, match="batches of episodes"):
        model.fit(tf.data.Dataset.from_tensors(tf.zeros([2])), steps_per_epoch=1, verbose=0)
