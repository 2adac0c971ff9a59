"""Bad checkpoints: damaged ones, ones of other pieces or layer sizes, a warm start
without the weights, a garbled training progress. Cases of docs/errors.md
(tests/bad_input.py)."""

import os

import keras
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.training import restore_weights
from metalearn.training.checkpoint import (DamagedCheckpointError, Progress,
                                           UnmatchedCheckpointError)
from tests.bad_input import Case, check, parametrize
from tests.run_fixtures import saved_run

TITLE = "Checkpoints"


def no_intact_checkpoint(tmp_path) -> None:
    saved_run(tmp_path / "run")
    os.remove(tmp_path / "run" / "checkpoints" / "ckpt-1.index")
    metalearn.restore(str(tmp_path / "run"))


def damaged_given_checkpoint(tmp_path) -> None:
    path = saved_run(tmp_path / "run")
    with open(path + ".data-00000-of-00001", "wb") as f:
        f.write(b"garbage")
    metalearn.restore(str(tmp_path / "run"), checkpoint=path)


def metasgd_into_maml(tmp_path) -> None:
    metasgd = saved_run(tmp_path / "metasgd", "experiments/sinusoid/metasgd.gin")
    saved_run(tmp_path / "maml")
    metalearn.restore(str(tmp_path / "maml"), checkpoint=metasgd)


def maml_into_metasgd(tmp_path) -> None:
    maml = saved_run(tmp_path / "maml")
    saved_run(tmp_path / "metasgd", "experiments/sinusoid/metasgd.gin")
    metalearn.restore(str(tmp_path / "metasgd"), checkpoint=maml)


def garbled_progress(tmp_path) -> None:
    progress = Progress()
    progress.state.assign("{'window': oops")
    progress.load("ckpt-7")


def warm_start_without_head(tmp_path) -> None:
    """A pre-training run's backbone has no classifier head: MAML's net does."""
    full = models.conv_net((4, 4, 1), outputs=3, filters=4, blocks=1)
    body = keras.Model(full.inputs, full.get_layer("head").input)
    holder = tf.Module()
    holder.model = body
    tf.train.Checkpoint(learner=holder).write(str(tmp_path / "pretrain" / "checkpoints" /
                                                  "ckpt-1"))
    restore_weights(models.conv_net((4, 4, 1), outputs=3, filters=4, blocks=1),
                    str(tmp_path / "pretrain" / "checkpoints" / "ckpt-1"))


def restored_into_other_sizes(tmp_path) -> None:
    saved_run(tmp_path / "run")
    metalearn.restore(str(tmp_path / "run"), gin_params=["mlp.hidden = (8,)"])


CASES = [
    Case("no intact checkpoint", "every checkpoint of a workdir damaged (index missing)",
         DamagedCheckpointError, "ckpt-1.index is missing", no_intact_checkpoint,
         lambda p: "Nothing was deleted", "each checkpoint and why"),
    Case("damaged checkpoint given", "`restore(workdir, checkpoint=<garbage data>)`",
         DamagedCheckpointError, "is damaged: it cannot be read", damaged_given_checkpoint,
         lambda p: str(p / "run" / "checkpoints" / "ckpt-1"), "the checkpoint"),
    Case("Meta-SGD checkpoint into a MAML config", "`restore(maml_run, "
         "checkpoint=<Meta-SGD checkpoint>)`", UnmatchedCheckpointError,
         "the checkpoint holds 4 variable(s) the config does not build (adapter ",
         metasgd_into_maml, None, "the variables by piece, name and shape"),
    Case("MAML checkpoint into a Meta-SGD config", "`restore(metasgd_run, "
         "checkpoint=<MAML checkpoint>)`", UnmatchedCheckpointError,
         "the config builds 4 variable(s) the checkpoint does not hold (adapter variable "
         "mlp_hidden0_kernel_lr (1, 4)", maml_into_metasgd, None,
         "the variables by piece, name and shape"),
    Case("garbled training progress", "a checkpoint whose `progress` is not JSON",
         ValueError, "the training progress in ckpt-7 is not a progress record",
         garbled_progress, None, "the checkpoint"),
    Case("warm start without the weights", "`restore_weights` (`WarmStart`) of a conv net "
         "from a run whose model has no `head`", UnmatchedCheckpointError,
         "no saved weights for 2 variable(s) of model 'conv_net': conv_net/head/kernel",
         warm_start_without_head, None, "each variable, and the saved ones"),
    Case("restore into other layer sizes", "`restore(run, gin_params=['mlp.hidden = (8,)'])` "
         "of a `(4,)` run", UnmatchedCheckpointError,
         "kernel of layer 'hidden0': (1, 4) in the checkpoint, (1, 8) in the config",
         restored_into_other_sizes, None, "the layers and shapes"),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
