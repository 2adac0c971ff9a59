"""A run directory and the one table of its file names.

Every module that reads or writes a file of a workdir asks a :class:`Workdir` for its
path (``Workdir(path).config``, ``.checkpoints``, ...); no other module spells a
workdir file name. What each holds::

    config.gin            the run's gin bindings (train writes it; restore reparses it)
    operative_config.gin  every value the run used
    metrics.json          the final meta-training metrics (the run is done at its step)
    checkpoints/          TensorFlow checkpoints (training/checkpoint.py)
    train/                TensorBoard summaries of meta-training
    .train.lock           one training process per workdir (runs/lock.py)
    eval.json             an evaluation report (metalearn.evaluate; any eval*.json)
    eval/<report>/        TensorBoard summaries of each evaluation report (eval/eval/)
    sweep_run.json        a sweep's record of this run (its bindings and config files)
    .sweep.lock           held by the sweep process that runs this run
    train.log             a sweep run's output
    report/               tables and plots (metalearn.report's default output)
    sweep.json            in a sweep's root folder: the sweep and its runs' order
"""

from __future__ import annotations

import glob
import os
from typing import List, Union


class Workdir:
    """A run directory (or a sweep's root folder): the paths of its files.

    The class attributes are the file names, for messages and flag defaults
    (``Workdir.CONFIG == "config.gin"``); the properties are the paths in this
    directory.

    Args:
      path: the directory (need not exist).
    """

    CONFIG = "config.gin"
    OPERATIVE_CONFIG = "operative_config.gin"
    METRICS = "metrics.json"
    CHECKPOINTS = "checkpoints"
    SUMMARIES = "train"
    TRAIN_LOCK = ".train.lock"
    EVALUATION = "eval.json"
    METAWORLD_EVALUATION = "metaworld.json"  # Meta-World's own evaluator's (not eval*.json)
    EVALUATIONS = "eval*.json"
    EVALUATION_SUMMARIES = "eval"
    SWEEP_RUN = "sweep_run.json"
    SWEEP_LOCK = ".sweep.lock"
    TRAIN_LOG = "train.log"
    REPORT = "report"
    SWEEP = "sweep.json"
    MODULES = "modules.json"

    def __init__(self, path: Union[str, "os.PathLike[str]"]):
        self.path = os.fspath(path)

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"Workdir({self.path!r})"

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def config(self) -> str:
        """``config.gin``: the run's gin bindings."""
        return self._file(self.CONFIG)

    @property
    def operative_config(self) -> str:
        """``operative_config.gin``: every value the run used."""
        return self._file(self.OPERATIVE_CONFIG)

    @property
    def metrics(self) -> str:
        """``metrics.json``: the final meta-training metrics."""
        return self._file(self.METRICS)

    @property
    def checkpoints(self) -> str:
        """``checkpoints/``: the run's checkpoints."""
        return self._file(self.CHECKPOINTS)

    @property
    def summaries(self) -> str:
        """``train/``: TensorBoard summaries of meta-training."""
        return self._file(self.SUMMARIES)

    @property
    def train_lock(self) -> str:
        """``.train.lock``: held by the process training in this workdir."""
        return self._file(self.TRAIN_LOCK)

    @property
    def sweep_run(self) -> str:
        """``sweep_run.json``: a sweep's record of this run."""
        return self._file(self.SWEEP_RUN)

    @property
    def sweep_lock(self) -> str:
        """``.sweep.lock``: held by the sweep process that runs this run."""
        return self._file(self.SWEEP_LOCK)

    @property
    def modules(self) -> str:
        """``modules.json``: the user's modules the run's config was parsed with."""
        return self._file(self.MODULES)

    @property
    def train_log(self) -> str:
        """``train.log``: a sweep run's output."""
        return self._file(self.TRAIN_LOG)

    @property
    def report(self) -> str:
        """``report/``: the default folder of tables and plots."""
        return self._file(self.REPORT)

    @property
    def sweep(self) -> str:
        """``sweep.json``: in a sweep's root folder, the sweep and its runs' order."""
        return self._file(self.SWEEP)

    def evaluation(self, name: str = EVALUATION) -> str:
        """An evaluation report's path: ``name`` in this workdir (an absolute ``name``
        as given)."""
        return self._file(name)

    def evaluation_summaries(self, name: str = EVALUATION) -> str:
        """``eval/<report>/``: TensorBoard summaries of the evaluation report ``name``
        (``eval/eval_5shot/`` for ``eval_5shot.json``), in this workdir wherever the
        report is written."""
        stem = os.path.splitext(os.path.basename(os.fspath(name)))[0]
        return self._file(os.path.join(self.EVALUATION_SUMMARIES, stem))

    def evaluations(self) -> List[str]:
        """Every evaluation report here (``eval*.json``), sorted."""
        return sorted(glob.glob(self._file(self.EVALUATIONS)))

    def require_run(self) -> "Workdir":
        """Checks that this is a run directory to restore (it has ``config.gin`` or
        ``checkpoints/``), before anything is written next to it.

        Returns:
          This workdir.

        Raises:
          NotADirectoryError: the path is a file (or below one); the message names it.
          FileNotFoundError: it does not exist, or holds neither file; the message
            names it and what it holds.
        """
        path = os.path.abspath(self.path)
        if os.path.exists(path) and not os.path.isdir(path):
            raise NotADirectoryError(f"workdir {path!r} is a file, not a run directory: "
                                     "give the folder metalearn.train wrote (with "
                                     f"{self.CONFIG} and {self.CHECKPOINTS}/)")
        if not os.path.isdir(path):
            above = os.path.dirname(path)
            while above and not os.path.exists(above):
                above = os.path.dirname(above)
            if above and not os.path.isdir(above):
                raise NotADirectoryError(f"workdir {path!r} is below the file {above!r}, "
                                         "not a run directory")
            raise FileNotFoundError(f"workdir {path!r} does not exist: give the folder "
                                    "metalearn.train wrote")
        if not (os.path.isfile(self.config) or os.path.isdir(self.checkpoints)):
            raise FileNotFoundError(f"workdir {path!r} is not a run directory: it has "
                                    f"neither {self.CONFIG} nor {self.CHECKPOINTS}/ (it "
                                    f"holds {sorted(os.listdir(path))[:10]})")
        return self

    def is_run(self) -> bool:
        """Whether this is a run directory (it has ``config.gin`` or ``metrics.json``)."""
        return os.path.isfile(self.config) or os.path.isfile(self.metrics)
