"""Reliability, round three (issue 32), the entry points and the data: results are
logged before any file is written and a failed write names the file; reports and
sweeps say what is incomplete; data caches are keyed on what they were made from;
decoders and gin name the file (and record, line, byte) at fault; ``evaluate --workdir``
names the workdir. Every case was seen to fail before its fix. The cases that are errors
have a row in docs/errors.md too (tests/validation_test.py, with the helpers shared
tests/run_fixtures.py: ``full_disk``, ``no_free_space``)."""

import contextlib
import csv
import errno
import io
import json
import logging
import os
import socket
import subprocess
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf

from metalearn import report as report_module
from metalearn.runs import files
from metalearn.runs.workdir import Workdir
from metalearn.studies import results, sweeps
from metalearn.tasks import MetaDataset
from metalearn.tasks.datasets import (clear_caches, cub, load_cub, load_image_folder,
                                      load_mini_imagenet, load_omniglot, load_tiered_imagenet)
from metalearn.tasks.datasets import images as image_files
from metalearn.training import build_experiment, parse_config
from tests import benchmark_fixtures as fixtures

from tests.run_fixtures import EVALUATE_SMALL, full_disk, no_free_space
from tests.run_fixtures import saved_run as saved_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    monkeypatch.setattr(entry_point, "restore", lambda *a, **k: pytest.fail("ran"))
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


def _sweep_run(root, name, lr, seed, status="finished", evaluate=False, outcome=None):
    """A run folder of a sweep of 100 steps: ``finished`` (metrics.json at step 100),
    ``unfinished`` (config.gin and a checkpoint at step 40), ``failed`` (the same and
    the sweep's record of its process's error)."""
    workdir = os.path.join(root, name)
    os.makedirs(workdir)
    record = {"name": name, "bindings": {"GradientDescent.learning_rate": lr,
                                         "Runtime.seed": seed},
              "num_steps": 100, "evaluate": evaluate}
    if status == "failed":
        record["outcome"] = {"status": "failed", "exit_code": 1}
    with open(os.path.join(workdir, "sweep_run.json"), "w") as f:
        json.dump(record, f)
    with open(os.path.join(workdir, "config.gin"), "w") as f:
        f.write(f"GradientDescent.learning_rate = {lr}\nRuntime.seed = {seed}\n")
    if status == "finished":
        with open(os.path.join(workdir, "metrics.json"), "w") as f:
            json.dump({"loss": 1.0 + float(seed), "step": 100, "replicas": 1}, f)
        if evaluate:
            with open(os.path.join(workdir, "eval.json"), "w") as f:
                json.dump({"checkpoint_step": 100, "results": {
                    "1": {"loss": {"mean": 0.5, "ci95": 0.1, "std": 1.0}}}}, f)
    else:
        os.makedirs(os.path.join(workdir, "checkpoints"))
        with open(os.path.join(workdir, "checkpoints", "checkpoint"), "w") as f:
            f.write('model_checkpoint_path: "ckpt-40"\n')
    return workdir


@pytest.fixture
def half_written_sweep(tmp_path):
    """A sweep of 2 rates x 2 seeds whose runs are: one finished, one unfinished
    (killed at step 40), one failed, one never started (no folder)."""
    root = str(tmp_path / "sweep")
    os.makedirs(root)
    names = ["lr=0.1,seed=0", "lr=0.1,seed=1", "lr=0.01,seed=0", "lr=0.01,seed=1"]
    with open(os.path.join(root, "sweep.json"), "w") as f:
        json.dump({"spec": {}, "runs": names, "evaluate": False}, f)
    _sweep_run(root, names[0], "0.1", "0")
    _sweep_run(root, names[1], "0.1", "1", "unfinished")
    _sweep_run(root, names[2], "0.01", "0", "failed")
    return root, names


def test_report_of_a_half_written_sweep_states_what_is_incomplete(half_written_sweep,
                                                                   tmp_path):
    root, names = half_written_sweep
    out = report_module.report([root], str(tmp_path / "out"), plots=False)
    states = {s.name: (s.status, s.detail) for s in out["incomplete"]}
    assert states == {names[1]: ("unfinished", "at step 40 of 100"),
                      names[2]: ("failed", "at step 40 of 100; exit code 1, see "
                                 f"{os.path.join(root, names[2], 'train.log')}"),
                      names[3]: ("never started", "no folder")}
    assert [(r["GradientDescent.learning_rate"], r["seeds"]) for r in out["rows"]] == [
        ("0.1", 1)]  # one seed's figures are one seed's
    table = (tmp_path / "out" / "table.md").read_text()
    assert "**INCOMPLETE: 3 of 4 runs are not finished (1 unfinished, 1 failed, 1 never " \
           "started)" in table
    for name in names[1:]:
        assert os.path.join(root, name) in table
    with open(tmp_path / "out" / "runs.csv") as f:
        rows = list(csv.reader(f))
    assert [r[2].split(":")[0] for r in rows[1:]] == ["finished", "unfinished", "failed",
                                                      "never started"]


def test_report_entry_point_exits_non_zero_on_an_incomplete_sweep(half_written_sweep,
                                                                  tmp_path):
    root, names = half_written_sweep
    command = [sys.executable, "-m", "metalearn.report", root, "--noplots",
               f"--output_dir={tmp_path / 'out'}"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == report_module.INCOMPLETE_EXIT, done.stderr[-2000:]
    assert "INCOMPLETE: 3 run(s) not finished" in done.stderr
    for name in names[1:]:
        assert os.path.join(root, name) in done.stderr
    assert (tmp_path / "out" / "table.md").is_file()  # written all the same


def test_allow_incomplete_exits_zero_and_still_lists_them(half_written_sweep, tmp_path,
                                                         capsys):
    root, names = half_written_sweep
    out = report_module.report([root], str(tmp_path / "out"), plots=False)
    assert report_module.console(out, allow_incomplete=True) == 0  # --allow_incomplete
    assert report_module.console(out) == report_module.INCOMPLETE_EXIT
    stderr = capsys.readouterr().err
    assert "INCOMPLETE: 3 run(s) not finished" in stderr
    assert os.path.join(root, names[3]) in stderr


def test_a_column_some_seeds_lack_is_marked(tmp_path):
    root = str(tmp_path)
    _sweep_run(root, "a", "0.1", "0", evaluate=False)
    _sweep_run(root, "b", "0.1", "1", evaluate=False)
    with open(os.path.join(root, "a", "eval.json"), "w") as f:
        json.dump({"results": {"1": {"loss": {"mean": 0.5, "ci95": 0.1, "std": 1}}}}, f)
    out = report_module.report([root], str(tmp_path / "out"), plots=False)
    assert "| 0.1 | 2 | 1.5 ± 6.35 | 0.5 (n=1) |" in out["table"]


def test_a_run_trained_but_not_evaluated_is_unfinished(tmp_path):
    workdir = _sweep_run(str(tmp_path), "a", "0.1", "0", evaluate=True)
    os.remove(os.path.join(workdir, "eval.json"))
    state = results.run_state(workdir)
    assert (state.status, state.detail) == ("unfinished", "trained, not evaluated")


def test_a_run_training_now_is_running_and_a_dead_holder_is_not(tmp_path):
    from metalearn.runs.lock import WorkdirLock
    workdir = _sweep_run(str(tmp_path), "a", "0.1", "0", "unfinished")
    with WorkdirLock(workdir):
        state = results.run_state(workdir)
        assert state.status == "running" and f"process {os.getpid()}" in state.detail
    assert results.run_state(workdir).status == "unfinished"  # released
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    with open(Workdir(workdir).train_lock, "w") as f:  # a killed trainer's record
        json.dump({"pid": int(dead), "host": socket.gethostname()}, f)
    assert results.run_state(workdir).status == "unfinished"


def test_no_finished_run_is_an_error_listing_them(tmp_path):
    _sweep_run(str(tmp_path), "a", "0.1", "0", "unfinished")
    with pytest.raises(report_module.IncompleteError, match="no finished run .*unfinished: "
                       "a .*at step 40 of 100"):
        report_module.report([str(tmp_path)], plots=False)


# --- data caches: keyed on what they were made from --------------------------------


def _rewrite_jpeg(file, value):
    image = np.full(tf.io.decode_jpeg(open(file, "rb").read()).shape, value, np.uint8)
    with open(file, "wb") as f:
        f.write(tf.io.encode_jpeg(image, quality=95).numpy())


def test_cub_cache_is_rebuilt_when_an_image_changes(tmp_path, monkeypatch):
    base = fixtures.write_cub(str(tmp_path / "data"), per_class=1)
    cache = str(tmp_path / "cache")
    first = load_cub(base, image_size=16, cache_dir=cache)
    image = os.path.join(base, "images", sorted(os.listdir(os.path.join(base, "images")))[0])
    image = os.path.join(image, os.listdir(image)[0])
    _rewrite_jpeg(image, 7)
    again = load_cub(base, image_size=16, cache_dir=cache)  # the in-memory cache
    clear_caches()  # a new process: only the files
    fresh = load_cub(base, image_size=16, cache_dir=cache)
    for second in (again, fresh):
        assert not np.array_equal(first["train"].images[0], second["train"].images[0])
        assert np.abs(second["train"].images[0].astype(int) - 7).max() <= 2
    assert len(list((tmp_path / "cache").glob("cub_*.npz"))) == 3  # rewritten, not added


def test_mini_imagenet_cache_is_rebuilt_when_a_split_file_changes(tmp_path, monkeypatch):
    data = str(tmp_path / "data")
    fixtures.write_mini_imagenet_csv(data, per_class=2, size=16)
    cache = str(tmp_path / "cache")
    first = load_mini_imagenet(data, image_size=16, cache_dir=cache)
    lines = open(os.path.join(data, "test.csv")).read().splitlines()
    # an image of the first test class and one of the second trade classes: other data,
    # the same file size, and still each image in one class
    (a, label_a), (b, label_b) = lines[1].split(","), lines[3].split(",")
    assert label_a != label_b
    lines[1], lines[3] = f"{a},{label_b}", f"{b},{label_a}"
    with open(os.path.join(data, "test.csv"), "w") as f:
        f.write("\n".join(lines) + "\n")
    os.utime(os.path.join(data, "test.csv"), ns=(1, 1))  # and a new time
    clear_caches()
    second = load_mini_imagenet(data, image_size=16, cache_dir=cache)
    assert not np.array_equal(first["test"].images, second["test"].images)
    np.testing.assert_array_equal(first["train"].images, second["train"].images)


def test_tiered_imagenet_cache_is_rebuilt_when_the_pickles_change(tmp_path, monkeypatch):
    data = str(tmp_path / "data")
    fixtures.write_tiered_imagenet(data, per_class=2)
    cache = str(tmp_path / "cache")
    first = load_tiered_imagenet(data, cache_dir=cache, strict=False)
    other = str(tmp_path / "other")
    fixtures.write_tiered_imagenet(other, per_class=1)
    for name in os.listdir(other):
        os.replace(os.path.join(other, name), os.path.join(data, name))
    clear_caches()
    second = load_tiered_imagenet(data, cache_dir=cache, strict=False)
    assert len(second["train"].images) == len(first["train"].images) // 2


def test_omniglot_cache_is_rebuilt_when_an_archive_changes(tmp_path, monkeypatch):
    import zipfile
    folder = tmp_path / "omniglot"
    folder.mkdir()

    def archive(value):
        png = tf.io.encode_png(np.full([4, 4, 1], value, np.uint8)).numpy()
        with zipfile.ZipFile(folder / "images_background_small1.zip", "w") as zf:
            for k in range(2):
                zf.writestr(f"images_background_small1/Greek/character01/0101_0{k}.png", png)

    options = dict(archives=("images_background_small1",), image_size=None,
                   verify_checksums=False, cache_dir=str(tmp_path / "cache"))
    archive(0)
    first = load_omniglot(str(folder), **options)
    archive(255)
    os.utime(folder / "images_background_small1.zip", ns=(1, 1))
    clear_caches()
    second = load_omniglot(str(folder), **options)
    assert first.images.max() == 1.0 and second.images.max() == 0.0  # inverted


def test_a_cache_inside_the_data_folder_is_still_served(tmp_path, monkeypatch):
    base = fixtures.write_cub(str(tmp_path / "data"), per_class=1)
    cache = os.path.join(base, "images", ".cache")  # a hidden folder among the sources
    load_cub(base, image_size=16, cache_dir=cache)
    clear_caches()
    monkeypatch.setattr(cub.image_files, "read_image_files",
                        lambda *a, **k: pytest.fail("decoded again"))
    load_cub(base, image_size=16, cache_dir=cache)


# --- decoders ----------------------------------------------------------------------


def _cmyk_jpeg(path, cmyk) -> None:
    from PIL import Image  # matplotlib's dependency: in the test extras
    buffer = io.BytesIO()
    Image.fromarray(cmyk, "CMYK").save(buffer, "JPEG", quality=95)
    with open(path, "wb") as f:
        f.write(buffer.getvalue())


@pytest.mark.parametrize("channels", [1, 3])
def test_a_cmyk_jpeg_is_decoded(tmp_path, channels):
    cmyk = np.zeros([8, 8, 4], np.uint8)
    cmyk[..., 0], cmyk[..., 3] = 200, 30  # cyan: red low, green and blue high
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        _cmyk_jpeg(tmp_path / name / "0.jpg", cmyk)
        tf.io.write_file(str(tmp_path / name / "1.png"),
                         tf.io.encode_png(np.full([8, 8, 3], 128, np.uint8)))
    data = load_image_folder(str(tmp_path), image_size=8, channels=channels)
    rgb = np.array([48, 225, 225])  # Pillow's own conversion: (49, 225, 225)
    expected = rgb if channels == 3 else [round(rgb @ [0.2989, 0.587, 0.114])]
    np.testing.assert_allclose(data.images[0].reshape(-1, channels).mean(0), expected,
                               atol=3)


@pytest.mark.parametrize("load", [
    lambda p: load_image_folder(str(p), image_size=100_000),
    lambda p: load_cub(str(p), image_size=100_000),
    lambda p: load_mini_imagenet(str(p), image_size=100_000),
    lambda p: load_tiered_imagenet(str(p), image_size=100_000),
    lambda p: load_omniglot(str(p), image_size=100_000),
    lambda p: MetaDataset(str(p), image_size=100_000),
    lambda p: load_image_folder(str(p), image_size=2.5),
], ids=["image_folder", "cub", "mini_imagenet", "tiered_imagenet", "omniglot",
        "meta_dataset", "fractional"])
def test_an_absurd_image_size_is_refused_before_any_allocation(tmp_path, load):
    (tmp_path / "cat").mkdir()
    tf.io.write_file(str(tmp_path / "cat" / "0.png"),
                     tf.io.encode_png(np.zeros([4, 4, 3], np.uint8)))
    (tmp_path / "CUB_200_2011").mkdir()
    with pytest.raises(ValueError, match=f"image_size must be a whole number of pixels "
                       f"from 1 to {image_files.MAX_IMAGE_SIZE}"):
        load(tmp_path)


def test_images_that_would_not_fit_in_memory_are_refused_first(tmp_path, monkeypatch):
    (tmp_path / "cat").mkdir()
    tf.io.write_file(str(tmp_path / "cat" / "0.png"),
                     tf.io.encode_png(np.zeros([4, 4, 3], np.uint8)))
    monkeypatch.setattr(os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096,
                                                     "SC_PHYS_PAGES": 100}[name])
    with pytest.raises(ValueError, match=r"1 images of 512x512x3 need 0\.0 GiB, more than "
                       r"this machine's 0\.0 GiB"):
        load_image_folder(str(tmp_path), image_size=512)


# --- gin and flags -----------------------------------------------------------------


def test_a_non_utf8_byte_in_a_gin_file_is_named(tmp_path):
    included = tmp_path / "included.gin"
    included.write_bytes(b"Loop.num_steps = 2\n# caf\xe9\n")
    main = tmp_path / "main.gin"
    main.write_text(f"include 'experiments/sinusoid/maml.gin'\ninclude '{included}'\n")
    with pytest.raises(SyntaxError) as info:
        parse_config([str(main)])
    message = str(info.value)
    assert f'bad gin file "{included}", line 2, column 6: byte 0xe9 is not UTF-8' in message
    assert f'included from "{main}", line 2' in message


def test_a_non_utf8_byte_in_a_workdir_s_config_is_named(tmp_path):
    from metalearn.training import restore
    workdir = saved_run(tmp_path / "run")
    with open(Workdir(workdir).config, "ab") as f:
        f.write(b"# \xff\n")
    with pytest.raises(SyntaxError, match=f'bad gin file "{Workdir(workdir).config}", '
                       "line [0-9]+, column 3: byte 0xff"):
        restore(workdir)


@pytest.mark.parametrize("entry", ["evaluate", "restore"])
@pytest.mark.parametrize("kind", ["file", "below a file", "missing", "not a run"])
def test_evaluate_and_restore_name_a_workdir_that_is_not_a_run(tmp_path, kind, entry):
    from metalearn import evaluate, restore
    call = {"evaluate": evaluate.run, "restore": restore}[entry]
    (tmp_path / "afile").write_text("x")
    (tmp_path / "folder").mkdir()
    workdir = {"file": "afile", "below a file": "afile/run", "missing": "nothing",
               "not a run": "folder"}[kind]
    error = NotADirectoryError if kind in ("file", "below a file") else FileNotFoundError
    with pytest.raises(error, match=f"workdir '{tmp_path / workdir}' "):
        call(str(tmp_path / workdir))
    assert not (tmp_path / "nothing").exists()  # the output's folder was not made


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
    _sweep_run(str(root), "lr=0.1,seed=0", "0.1", "0", evaluate=True)
    _sweep_run(str(root), "lr=0.1,seed=1", "0.1", "1", evaluate=True)
    out = tmp_path / "report"
    with replace_fails("inner_steps.png"), pytest.raises(OSError) as info:
        report_module.report([str(root)], output_dir=str(out), adaptation_plot=False)
    _no_space(info, out / "inner_steps.png")
    assert (out / "table.md").is_file() and "eval/loss@1" in info_logs.text  # the table first
    assert not list(out.glob(".*tmp")) and not (out / "inner_steps.png").exists()
