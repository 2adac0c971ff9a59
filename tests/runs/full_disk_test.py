"""A disk that fills, or a file system with no free space: the results are logged before any
file is written and a failed write names the file (evaluation, training's final metrics,
a sweep's evaluation, a report's plots); a data cache that cannot be written is named
and the data still load. The helpers are shared with the entry points' other tests
(tests/run_fixtures.py: ``full_disk``, ``no_free_space``); the cases that are errors have
a row in docs/errors.md too (tests/training/bad_evaluation_test.py)."""

import contextlib
import errno
import logging
import os

import gin
import numpy as np
import pytest
import tensorflow as tf

from metalearn import report as report_module
from metalearn.runs import files
from metalearn.runs.workdir import Workdir
from metalearn.studies import sweeps
from metalearn.tasks.datasets import clear_caches, load_cub, load_omniglot
from metalearn.training import build_experiment, parse_config
from tests import benchmark_fixtures as fixtures

from tests.run_fixtures import EVALUATE_SMALL, full_disk, no_free_space
from tests.run_fixtures import saved_run as saved_checkpoint
from tests.run_fixtures import sweep_run


# --- a full disk ------------------------------------------------------------------


def saved_run(folder) -> str:
    """A workdir with config.gin and one checkpoint (step 1), no training."""
    saved_checkpoint(folder)
    gin.clear_config()
    return str(folder)


@pytest.fixture
def info_logs(caplog):
    caplog.set_level(logging.INFO)
    return caplog


def _no_space(error_info, path) -> str:
    message = str(error_info.value)
    assert error_info.value.errno == errno.ENOSPC
    assert repr(str(path)) in message and "No space left on device" in message, message
    return message


def test_evaluate_on_a_disk_that_fills_logs_the_figures_and_names_the_file(
        tmp_path, info_logs):
    from metalearn import evaluate as entry_point
    workdir = saved_run(tmp_path / "run")
    with full_disk("eval.json"), pytest.raises(OSError) as info:
        entry_point.run(workdir, gin_params=EVALUATE_SMALL)
    _no_space(info, Workdir(workdir).evaluation())
    logged = info_logs.text
    assert "1 inner steps: loss" in logged and "±" in logged  # the figures, not lost
    assert '"per_task"' in logged  # and the whole file's content, after the failure
    assert not os.path.exists(Workdir(workdir).evaluation())
    assert [f for f in os.listdir(workdir) if f.endswith(".tmp")] == []


def test_evaluate_on_a_full_disk_stops_before_the_work(tmp_path, monkeypatch):
    from metalearn import evaluate as entry_point
    workdir = saved_run(tmp_path / "run")
    monkeypatch.setattr("metalearn.training.restore", lambda *a, **k: pytest.fail("ran"))
    with no_free_space(), pytest.raises(OSError, match="No space left on device .*nothing "
                                        "was run") as info:
        entry_point.run(workdir)
    assert info.value.errno == errno.ENOSPC
    assert workdir in str(info.value)


def test_a_file_system_that_counts_no_blocks_is_not_called_full(tmp_path, monkeypatch):
    class Uncounted:  # what some network and FUSE file systems report
        f_frsize, f_blocks, f_bavail = 4096, 0, 0

    monkeypatch.setattr(os, "statvfs", lambda path: Uncounted())
    assert files.check_writable(str(tmp_path / "eval.json")) == str(tmp_path / "eval.json")


def test_train_s_final_metrics_on_a_disk_that_fills(tmp_path, info_logs):
    from metalearn.training import train
    parse_config(["experiments/sinusoid/maml.gin"],
                 ["mlp.hidden = (4,)", "Loop.num_steps = 2", "Loop.log_every = 1",
                  "Experiment.meta_batch_size = 2"])
    experiment = build_experiment()
    with full_disk("metrics.json"), pytest.raises(OSError) as info:
        train(experiment, str(tmp_path / "run"))
    _no_space(info, tmp_path / "run" / "metrics.json")
    assert "final meta-training metrics" in info_logs.text and '"loss":' in info_logs.text


def test_a_sweep_s_evaluation_on_a_disk_that_fills(tmp_path, info_logs):
    workdir = saved_run(tmp_path / "run")
    files.write_json(Workdir(workdir).metrics, {"loss": 1.0, "step": 1})
    files.write_json(Workdir(workdir).sweep_run, {
        "name": "run", "num_steps": 1, "gin_files": ["experiments/sinusoid/maml.gin"],
        "gin_params": ["mlp.hidden = (4,)"], "bindings": {}, "evaluate": True,
        "eval_params": EVALUATE_SMALL})
    with full_disk("eval.json"), pytest.raises(OSError) as info:
        sweeps.train_and_evaluate(workdir)
    _no_space(info, Workdir(workdir).evaluation())
    assert "1 inner steps: loss" in info_logs.text


# --- caches and plots on a disk that fills ------------------------------------------


@contextlib.contextmanager
def replace_fails(prefix: str):
    """Inside, renaming a file onto one whose name starts with ``prefix`` (the last step
    of an atomic write) fails as on a full disk."""
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        if os.path.basename(str(dst)).startswith(prefix):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(src, dst, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "replace", replace)
        yield


def test_a_cache_that_cannot_be_written_names_its_file_and_the_data_still_load(
        tmp_path, monkeypatch, caplog):
    base = fixtures.write_cub(str(tmp_path / "data"), per_class=1)
    cache = tmp_path / "cache"
    clear_caches()
    built = load_cub(base, image_size=16, cache_dir=str(cache))  # the cache's names
    names = sorted(p.name for p in cache.glob("cub_*.npz"))
    for p in cache.glob("cub_*.npz"):
        p.unlink()
    clear_caches()
    with replace_fails(names[0]):
        loaded = load_cub(base, image_size=16, cache_dir=str(cache))
    np.testing.assert_array_equal(loaded["train"].images, built["train"].images)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(str(cache / names[0]) in m and "No space left on device" in m
               for m in warned), warned
    assert not list(cache.glob(".*tmp")) and not list(cache.glob("*.tmp"))


def test_an_omniglot_cache_that_cannot_be_written_names_its_file(tmp_path, caplog):
    import zipfile
    folder = tmp_path / "omniglot"
    folder.mkdir()
    png = tf.io.encode_png(np.full([4, 4, 1], 9, np.uint8)).numpy()
    with zipfile.ZipFile(folder / "images_background_small1.zip", "w") as zf:
        zf.writestr("images_background_small1/Greek/character01/0101_00.png", png)
    cache = tmp_path / "cache"
    with replace_fails("omniglot_"):
        clear_caches()
        data = load_omniglot(str(folder), archives=("images_background_small1",),
                             image_size=None, verify_checksums=False,
                             cache_dir=str(cache))
    assert data.images.shape[0] == 1
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(str(cache) in m and "omniglot_" in m and "No space left on device" in m
               for m in warned), warned


def test_a_report_plot_on_a_disk_that_fills_names_it_after_the_table(tmp_path,
                                                                     info_logs):
    root = tmp_path / "sweep"
    root.mkdir()
    sweep_run(str(root), "lr=0.1,seed=0", "0.1", "0", evaluate=True)
    sweep_run(str(root), "lr=0.1,seed=1", "0.1", "1", evaluate=True)
    out = tmp_path / "report"
    with replace_fails("inner_steps.png"), pytest.raises(OSError) as info:
        report_module.report([str(root)], output_dir=str(out), adaptation_plot=False)
    _no_space(info, out / "inner_steps.png")
    assert (out / "table.md").is_file() and "eval/loss@1" in info_logs.text  # the table first
    assert not list(out.glob(".*tmp")) and not (out / "inner_steps.png").exists()
