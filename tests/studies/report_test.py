"""Results tables (hand-computed intervals across seeds) and the report's plots."""

import csv
import json
import math
import os

import gin
import numpy as np
import pytest

from metalearn import report
from metalearn import statistics
from metalearn.studies import results
from metalearn.training import build_experiment, evaluate, parse_config, train
from metalearn.repository import ROOT

SINUSOID = os.path.join(ROOT, "experiments", "sinusoid", "maml.gin")


def _fake_run(root, lr, seed, train_loss, eval_losses):
    name = f"lr={lr},seed={seed}"
    workdir = os.path.join(root, name)
    os.makedirs(workdir)
    with open(os.path.join(workdir, "sweep_run.json"), "w") as f:
        json.dump({"name": name, "bindings": {"GradientDescent.learning_rate": lr,
                                              "Runtime.seed": seed}}, f)
    with open(os.path.join(workdir, "metrics.json"), "w") as f:
        json.dump({"loss": train_loss, "step": 100, "replicas": 1}, f)
    with open(os.path.join(workdir, "eval.json"), "w") as f:
        json.dump({"results": {str(s): {"loss": {"mean": v, "ci95": 0.1, "std": 1.0}}
                               for s, v in eval_losses.items()}}, f)


def test_table_rows_and_intervals_by_hand(tmp_path):
    root = str(tmp_path)
    _fake_run(root, "0.01", "0", 1.0, {1: 0.5, 10: 0.2})
    _fake_run(root, "0.01", "1", 3.0, {1: 0.7, 10: 0.4})
    _fake_run(root, "0.1", "0", 2.0, {1: 1.0, 10: 0.1})
    _fake_run(root, "0.1", "1", 4.0, {1: 2.0, 10: 0.2})
    _fake_run(root, "0.1", "2", 3.0, {1: 3.0, 10: 0.3})
    runs = results.load_runs([root])
    assert len(runs) == 5
    columns = ["train/loss", "eval/loss@1", "eval/loss@10"]
    assert results.metric_columns(runs) == ["train/loss", "train/step"] + columns[1:]
    keys, rows = results.summarise(runs, columns)
    assert keys == ["GradientDescent.learning_rate"]
    assert [(r["GradientDescent.learning_rate"], r["seeds"]) for r in rows] == [
        ("0.01", 2), ("0.1", 3)]
    # lr 0.01, train loss {1, 3}: mean 2, sample std sqrt(2), t(1) = 12.7062
    assert rows[0]["train/loss"]["mean"] == 2.0
    assert math.isclose(rows[0]["train/loss"]["ci95"], 12.706204736 * math.sqrt(2) / math.sqrt(2))
    # lr 0.1, eval loss after 1 step {1, 2, 3}: mean 2, std 1, t(2) = 4.3027
    assert math.isclose(rows[1]["eval/loss@1"]["mean"], 2.0)
    assert math.isclose(rows[1]["eval/loss@1"]["ci95"], 4.302652730 / math.sqrt(3))
    # after 10 steps {0.1, 0.2, 0.3}: mean 0.2, std 0.1
    assert math.isclose(rows[1]["eval/loss@10"]["ci95"], 4.302652730 * 0.1 / math.sqrt(3))
    table = results.markdown_table(keys, rows, columns).splitlines()
    assert table[0] == ("| GradientDescent.learning_rate | seeds | train/loss | eval/loss@1 "
                        "| eval/loss@10 |")
    assert table[2] == "| 0.01 | 2 | 2 ± 12.7 | 0.6 ± 1.27 | 0.3 ± 1.27 |"
    assert table[3] == "| 0.1 | 3 | 3 ± 2.48 | 2 ± 2.48 | 0.2 ± 0.248 |"
    assert len(table) == 4


def test_t_quantiles():
    assert statistics.t_quantile_975(1) == 12.706204736
    # beyond the table: the expansion is within 1e-3 of the exact 2.0211 (40) and 1.9840 (100)
    assert abs(statistics.t_quantile_975(40) - 2.021075) < 1e-3
    assert abs(statistics.t_quantile_975(100) - 1.983972) < 1e-3
    assert math.isnan(statistics.seed_interval([1.0])["ci95"])


def test_plots_need_matplotlib_with_a_clear_error(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install 'metalearn\[report\]'"):
        report.pyplot()


def test_report_of_real_runs_writes_tables_and_plots(tmp_path):
    small = ["Loop.num_steps = 6", "Loop.log_every = 2",
             "Loop.checkpoint_every = 6", "Experiment.meta_batch_size = 2",
             "mlp.hidden = (8,)", "evaluate.num_tasks = 4", "evaluate.batch_size = 2",
             "evaluate.inner_steps = (1, 3)"]
    root = str(tmp_path / "runs")
    for lr in ("0.01", "0.1"):
        for seed in ("0", "1"):
            workdir = os.path.join(root, f"lr{lr}_seed{seed}")  # plain runs, not a sweep
            parse_config([SINUSOID], small + [f"GradientDescent.learning_rate = {lr}",
                                              f"Runtime.seed = {seed}"])
            experiment = build_experiment()
            train(experiment, workdir)
            result = evaluate(experiment.learner, experiment.sampler)
            with open(os.path.join(workdir, "eval.json"), "w") as f:
                json.dump(result, f)
    gin.clear_config()
    out = report.report([root], output_dir=str(tmp_path / "report"))
    names = sorted(os.path.basename(p) for p in out["files"])
    assert names == ["inner_steps.png", "learning_curves.png", "runs.csv",
                     "sinusoid_adaptation.png", "summary.csv",
                     "sweep_GradientDescent.learning_rate.png", "table.md"]
    for path in out["files"]:
        assert os.path.getsize(path) > 100, path
    # the bindings that differ between the runs' config.gin files are the swept ones
    assert [r["GradientDescent.learning_rate"] for r in out["rows"]] == ["0.01", "0.1"]
    assert [r["seeds"] for r in out["rows"]] == [2, 2]
    for row, lr in zip(out["rows"], ("0.01", "0.1")):
        losses = []
        for seed in ("0", "1"):
            with open(os.path.join(root, f"lr{lr}_seed{seed}", "eval.json")) as f:
                losses.append(json.load(f)["results"]["3"]["loss"]["mean"])
        assert math.isclose(row["eval/loss@3"]["mean"], np.mean(losses))
        assert math.isclose(row["eval/loss@3"]["ci95"],
                            12.706204736 * np.std(losses, ddof=1) / math.sqrt(2))
    with open(tmp_path / "report" / "runs.csv") as f:
        assert len(list(csv.reader(f))) == 5
    curves = report.read_scalars(os.path.join(root, "lr0.01_seed0", "train"))
    assert curves["meta_loss"][0] == [2, 4, 6]


def test_evaluations_plot_draws_several_runs_with_their_task_intervals(tmp_path, monkeypatch):
    """--evaluations_plot: each run's metric against inner steps with the interval its
    evaluation reports (over the test tasks), from a run directory or a JSON file; the
    table holds the plotted figures; the legend comes from --labels."""
    evaluations = {"maml": {0: (-40.0, 2.5), 1: (-13.0, 1.25)},
                   "oracle": {0: (-3.5, 0.125), 1: (-3.75, 0.25), 2: (-4.0, 0.5)}}
    paths = []
    for name, figures in evaluations.items():
        os.makedirs(tmp_path / name)
        with open(tmp_path / name / "eval.json", "w") as f:
            json.dump({"results": {str(s): {"return": {"mean": m, "ci95": c, "std": 1.0},
                                            "loss": {"mean": 1.0, "ci95": 0.1}}
                                   for s, (m, c) in figures.items()}}, f)
        paths.append(str(tmp_path / name))
    paths[1] = os.path.join(paths[1], "eval.json")  # a file given directly
    drawn = []
    real_errorbar = report.pyplot().Axes.errorbar

    def errorbar(axis, x, y, yerr=None, **kwargs):
        drawn.append((kwargs.get("label"), list(x), list(y), list(yerr)))
        return real_errorbar(axis, x, y, yerr=yerr, **kwargs)

    monkeypatch.setattr(report.pyplot().Axes, "errorbar", errorbar)
    png = str(tmp_path / "returns.png")
    out = report.plot_evaluations(paths, png, "return", ["MAML", "oracle"])
    assert drawn == [("MAML", [0, 1], [-40.0, -13.0], [2.5, 1.25]),
                     ("oracle", [0, 1, 2], [-3.5, -3.75, -4.0], [0.125, 0.25, 0.5])]
    assert out["files"] == [png] and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert out["table"].splitlines()[0] == "| run | 0 steps | 1 step | 2 steps |"
    assert "| MAML | -40 ± 2.5 | -13 ± 1.2 |  |" in out["table"]
    assert "| oracle | -3.5 ± 0.12 | -3.75 ± 0.25 | -4 ± 0.5 |" in out["table"]
    with pytest.raises(ValueError, match="1 labels"):
        report.plot_evaluations(paths, png, "return", ["MAML"])
    with pytest.raises(ValueError, match="no 'accuracy'.*it has \\['loss', 'return'\\]"):
        report.plot_evaluations(paths, png, "accuracy")
    with pytest.raises(FileNotFoundError, match="not found; write it with python -m metalearn.evaluate --workdir="):
        report.plot_evaluations([str(tmp_path / "missing")], png, "return")
