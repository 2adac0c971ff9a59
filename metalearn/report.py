r"""Tables and plots of finished runs: a sweep's root or run directories.

    python -m metalearn.report runs/sweep_inner_lr            # writes runs/sweep_inner_lr/report/
    python -m metalearn.report runs/a runs/b --output_dir=runs/ab_report \
        --metrics='eval/loss@*'

Writes into the output directory:

- ``runs.csv``: one row per run (swept bindings, every result column);
- ``summary.csv`` and ``table.md``: one row per swept value, mean ± 95% interval across
  seeds (Student's t; the seed binding is ``--seed_key``);
- ``learning_curves.png``: meta-training loss against step (TensorBoard event files);
- ``inner_steps.png``: evaluation loss (accuracy if measured) against inner steps;
- ``sweep_<key>.png``: ``--plot_metric`` against each swept value;
- ``sinusoid_adaptation.png`` for sinusoid runs (``gaussian_process_adaptation.png``
  for Gaussian-process regression runs): a test task's curve before and after 1 and 10
  inner steps (the MAML paper's figure), or the predictive band of a learner without
  inner steps (a neural process), from the best group's first run.

Paired comparison of two runs evaluated on the same test episodes (the same
``evaluate.seed``, split, number of tasks and sampler; checked):

    python -m metalearn.report runs/maml runs/protonets --paired --paired_metric=accuracy

writes ``paired.json`` and ``paired.md``: the mean per-episode difference (first minus
second), its 95% interval and the paired t-test's p-value over the episodes.

Several evaluations in one figure (each run's metric against inner steps, mean ± the
95% interval over its test tasks, as ``metalearn.evaluate`` wrote them):

    python -m metalearn.report runs/maml runs/pretrained --evaluations_plot=returns.png \
        --evaluations_metric=return --labels=MAML,pretrained

writes the PNG and prints the figures as a Markdown table (a directory's
``--eval_file``, or an evaluation JSON file given directly).

Runs that are not finished (unfinished, running, failed, never started: a sweep's root
lists every run in ``sweep.json``) are left out of the figures and listed with their
folders under the table (``**INCOMPLETE: ...**``), in ``runs.csv``'s ``status`` column
and on stderr; the command then exits with status 3 (``--allow_incomplete``: 0). The
table is logged before any file is written (results first, then the file).

Plots need matplotlib (``pip install 'metalearn[report]'``). TensorBoard stays the live
view of running jobs (``tensorboard --logdir ROOT``).
"""

from __future__ import annotations

import glob
import io
import math
import os
import re
import sys
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from absl import app, flags

import metalearn  # imports nothing heavy here: main calls metalearn.import_all()
from metalearn import atomic
from metalearn.flags import SEED_KEY
from metalearn.runs.files import write_results
from metalearn.runs.workdir import Workdir

if TYPE_CHECKING:
    from metalearn.studies import results

flags.DEFINE_string("output_dir", None, "Where to write; default: report/ inside the "
                    "first directory given.")
flags.DEFINE_multi_string("metrics", [], "fnmatch patterns of the columns in the table "
                          "(default: every eval column and train/loss).")
flags.DEFINE_string("seed_key", SEED_KEY, "The binding averaged over.")
flags.DEFINE_string("plot_metric", None, "Column plotted against the swept values "
                    "(default: the last eval loss column, else train/loss).")
flags.DEFINE_bool("plots", True, "Write the plots (needs matplotlib).")
flags.DEFINE_bool("adaptation_plot", True, "For sinusoid and Gaussian-process runs, plot "
                  "a task before and after adaptation (restores a run).")
flags.DEFINE_bool("paired", False, "Compare two runs episode by episode on the same "
                  "test episodes (paired t-test) instead of the tables and plots.")
flags.DEFINE_string("paired_metric", "accuracy", "The per-episode metric compared.")
flags.DEFINE_string("paired_steps", None, "Inner steps of the compared values (default: "
                    "the last each run evaluated).")
flags.DEFINE_string("eval_file", Workdir.EVALUATION, "The evaluation file inside each run.")
flags.DEFINE_string("evaluations_plot", None, "Instead of the tables: plot each given "
                    "run's evaluation (--eval_file, or an evaluation JSON given directly) "
                    "against inner steps with its 95% intervals over the test tasks into "
                    "this PNG file, and print them as a table.")
flags.DEFINE_string("evaluations_metric", "loss", "The metric --evaluations_plot draws.")
flags.DEFINE_list("labels", [], "--evaluations_plot's legend, one label per run "
                  "(default: the folder names).")
flags.DEFINE_string("title", None, "--evaluations_plot's title.")
flags.DEFINE_bool("allow_incomplete", False, "Exit 0 when runs are not finished (they "
                  "are left out of the figures and listed either way); by default such "
                  "a report exits with status 3.")
FLAGS = flags.FLAGS


INCOMPLETE_EXIT = 3
"""``python -m metalearn.report``'s exit status when runs are not finished (the files
are written all the same, marked ``INCOMPLETE``); ``--allow_incomplete`` makes it 0."""


class IncompleteError(ValueError):
    """No run of a report is finished; ``.states`` holds each run's state."""

    def __init__(self, message: str, states):
        super().__init__(message)
        self.states = list(states)


def pyplot():
    """matplotlib's pyplot on a file backend, with a clear error when it is missing."""
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError("plots need matplotlib: pip install 'metalearn[report]' "
                          "(or run with --noplots)") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def read_scalars(logdir: str) -> Dict[str, Tuple[List[int], List[float]]]:
    """``tag -> (steps, values)`` of the scalar summaries in a TensorBoard directory."""
    import tensorflow as tf
    series: Dict[str, Dict[int, float]] = {}
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.HasField("tensor"):
                    number = float(tf.make_ndarray(value.tensor))
                elif value.HasField("simple_value"):
                    number = float(value.simple_value)
                else:
                    continue
                series.setdefault(value.tag, {})[int(event.step)] = number  # last wins
    return {tag: (sorted(points), [points[s] for s in sorted(points)])
            for tag, points in series.items()}


def default_columns(runs: Sequence[results.RunResult]) -> List[str]:
    from metalearn.studies import results  # imported when used: --help stays light
    columns = results.metric_columns(runs)
    evals = [c for c in columns if not c.startswith("train/")]
    return ["train/loss"] * ("train/loss" in columns) + evals


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _label(bindings: Dict[str, str], keys: Sequence[str]) -> str:
    return ", ".join(f"{_short(k)}={bindings.get(k, '')}" for k in keys) or "run"


def save_figure(figure, path: str) -> None:
    """Writes a matplotlib ``figure`` to ``path`` (PNG) atomically
    (:func:`metalearn.atomic.write`): a plot is whole or absent, and a failed write
    names the file and the reason."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    atomic.write(path, buffer.getvalue())


def plot_learning_curves(plt, runs, keys, seed_key, path, tag="meta_loss") -> bool:
    figure, axis = plt.subplots(figsize=(5, 3.5))
    colours, drawn = {}, False
    for run in runs:
        scalars = read_scalars(Workdir(run.workdir).summaries)
        if tag not in scalars:
            continue
        group = _label(run.bindings, keys)
        first = group not in colours
        colours.setdefault(group, f"C{len(colours) % 10}")
        axis.plot(*scalars[tag], color=colours[group], alpha=0.8, linewidth=1,
                  label=group if first else None)
        drawn = True
    if drawn:
        axis.set(xlabel="meta-step", ylabel="meta-training query loss", yscale="log",
                 title="learning curves (one line per seed)")
        axis.legend(fontsize=7)
        figure.tight_layout()
        save_figure(figure, path)
    plt.close(figure)
    return drawn


def plot_inner_steps(plt, runs, keys, seed_key, path) -> bool:
    from metalearn.studies import results
    _, rows = results.summarise(runs, [], seed_key)
    eval_files = sorted({f for r in runs for f in r.evals})
    if not eval_files:
        return False
    figure, axes = plt.subplots(1, len(eval_files), figsize=(5 * len(eval_files), 3.5),
                                squeeze=False)
    for axis, stem in zip(axes[0], eval_files):
        metric = "loss"
        for run in runs:
            if stem in run.evals and any("accuracy" in m for m in
                                         next(iter(run.evals[stem].values()))):
                metric = "accuracy"
        steps = sorted({int(s) for r in runs for s in r.evals.get(stem, {})})
        columns = [f"{stem}/{metric}@{s}" for s in steps]
        _, rows = results.summarise(runs, columns, seed_key)
        for row in rows:
            points = [(s, row[c]) for s, c in zip(steps, columns) if row[c] is not None]
            if not points:
                continue
            xs = [p[0] for p in points]
            means = [p[1]["mean"] for p in points]
            errors = [0 if math.isnan(p[1]["ci95"]) else p[1]["ci95"] for p in points]
            axis.errorbar(xs, means, yerr=errors, marker="o", capsize=3,
                          label=_label(row, keys))
        _steps_axis(axis, metric, f"{stem} (mean ± 95% CI)")
    _finish(plt, figure, path)
    return True


def _steps_axis(axis, metric: str, title: str) -> None:
    """Labels, title, scale (log for a loss) and legend of a metric-against-inner-steps
    plot."""
    axis.set(xlabel="inner steps", ylabel=metric)
    axis.set_title(title, fontsize=9)
    if metric == "loss":
        axis.set_yscale("log")
    axis.legend(fontsize=7)


def _finish(plt, figure, path: str) -> None:
    figure.tight_layout()
    save_figure(figure, path)
    plt.close(figure)


def _number(text: str) -> Optional[float]:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def plot_against_swept(plt, runs, keys, seed_key, metric, output_dir) -> List[str]:
    from metalearn.studies import results
    written = []
    for key in keys:
        others = [k for k in keys if k != key]
        _, rows = results.summarise(runs, [metric], seed_key)
        series: Dict[str, list] = {}
        for row in rows:
            if row[metric] is not None:
                series.setdefault(_label(row, others), []).append((row[key], row[metric]))
        numeric = all(_number(v) is not None for pts in series.values() for v, _ in pts)
        figure, axis = plt.subplots(figsize=(5, 3.5))
        for label, points in series.items():
            xs = [_number(v) if numeric else v for v, _ in points]
            axis.errorbar(xs, [s["mean"] for _, s in points], marker="o", capsize=3,
                          yerr=[0 if math.isnan(s["ci95"]) else s["ci95"] for _, s in points],
                          label=label if others else None)
        if numeric:
            values = [_number(v) for pts in series.values() for v, _ in pts]
            if min(values) > 0 and max(values) / min(values) >= 50:
                axis.set_xscale("log")
        axis.set(xlabel=key, ylabel=metric, title=f"{metric} (mean ± 95% CI over seeds)")
        if others:
            axis.legend(fontsize=7)
        figure.tight_layout()
        path = os.path.join(output_dir, f"sweep_{re.sub(r'[^A-Za-z0-9_.]+', '_', key)}.png")
        save_figure(figure, path)
        plt.close(figure)
        written.append(path)
    return written


ADAPTATION_PLOTS = {"Sinusoid": "sinusoid_adaptation.png",
                    "GaussianProcess": "gaussian_process_adaptation.png"}
"""The 1-d regression samplers :func:`plot_regression_adaptation` draws, by gin name,
and the file :func:`report` writes for a run of each."""


def regression_task(sampler, grid, seed: int = 0):
    """``(support_x [shots, 1], support_y [shots, 1], the task's curve on grid [g])`` of
    one test task of a 1-d regression sampler (``None`` for another sampler): a
    sinusoid's amplitude and phase, or a Gaussian-process draw (its length scale and
    variance from the sampler's ranges, the function drawn jointly at the support
    points and on the grid, the support points observed with the sampler's noise)."""
    import numpy as np
    from metalearn.tasks import GaussianProcess, Sinusoid
    rng = np.random.default_rng(seed)
    if isinstance(sampler, Sinusoid):
        amplitude, phase = rng.uniform(*sampler.amplitude), rng.uniform(*sampler.phase)
        support_x = rng.uniform(*sampler.x_range, size=(sampler.shots, 1))
        return support_x, amplitude * np.sin(support_x - phase), \
            amplitude * np.sin(grid[:, 0] - phase)
    if isinstance(sampler, GaussianProcess):
        length_scale, variance = rng.uniform(*sampler.length_scale), \
            rng.uniform(*sampler.variance)
        support_x = rng.uniform(*sampler.x_range, size=(sampler.shots, 1))
        x = np.concatenate([support_x[:, 0], grid[:, 0]])
        kernel = variance * np.exp(-0.5 * (x[:, None] - x[None]) ** 2 / length_scale ** 2)
        kernel += sampler.jitter * np.eye(len(x))
        f = np.linalg.cholesky(kernel) @ rng.normal(size=len(x))
        support_y = f[:sampler.shots, None] + sampler.noise * rng.normal(
            size=(sampler.shots, 1))
        return support_x, support_y, f[sampler.shots:]
    return None


def plot_regression_adaptation(plt, workdir: str, path: str, steps=(1, 10),
                               seed=0) -> bool:
    """The MAML paper's figure for a 1-d regression run (sinusoid or Gaussian-process
    tasks, :func:`regression_task`): one test task's curve, the meta-learned initial
    prediction, the predictions after 1 and 10 inner steps, and the support points.
    For a learner without inner steps (a neural process, ``adapter.steps == 0``) the
    prediction from the support set, and for a Gaussian prediction its mean and the
    band of two scales around it. ``False`` (nothing drawn) for other tasks."""
    import numpy as np
    import tensorflow as tf
    from metalearn.functional import Gaussian
    from metalearn.training import restore

    experiment = restore(workdir)
    sampler, learner = experiment.sampler, experiment.learner
    grid = np.linspace(*sampler.x_range, 200)[:, None] if hasattr(sampler, "x_range") \
        else None
    task = regression_task(sampler, grid, seed) if grid is not None else None
    if task is None:
        return False
    support_x, support_y, truth = task
    as_tensor = lambda a: tf.constant(a, sampler.dtype)
    figure, axis = plt.subplots(figsize=(5, 3.5))
    axis.plot(grid, truth, "k-", label="ground truth")
    if learner.adapter.inner_steps == 0:  # model-based: reads the support set
        steps = (0,)
    else:
        initial = learner.predict(learner.initial_weights(), as_tensor(grid))
        axis.plot(grid, np.asarray(initial), ":", label="pre-update")
    for count in steps:
        adapted = learner.adapt(as_tensor(support_x), as_tensor(support_y), steps=count)
        prediction = learner.predict(adapted, as_tensor(grid))
        label = f"{count} grad step{'s' * (count > 1)}" if count else "prediction"
        if isinstance(prediction, Gaussian):  # a predictive distribution: its band
            mean, scale = (np.asarray(t)[:, 0] for t in prediction)
            axis.fill_between(grid[:, 0], mean - 2 * scale, mean + 2 * scale, alpha=0.25,
                              label="mean ± 2 scale")
            prediction = prediction.mean
        axis.plot(grid, np.asarray(prediction), "--", label=label)
    axis.plot(support_x, support_y, "^", color="C3", label=f"{sampler.shots} points used")
    axis.set(xlabel="x", ylabel="y")
    run = "/".join(os.path.normpath(workdir).split(os.sep)[-2:])  # e.g. cnp/seed0
    axis.set_title(f"one test task, {run}", fontsize=7)
    axis.legend(fontsize=7)
    figure.tight_layout()
    save_figure(figure, path)
    plt.close(figure)
    return True


def evaluation_curves(paths: Sequence[str], metric: str,
                      eval_file: str = Workdir.EVALUATION
                      ) -> List[Tuple[str, List[int], List[float], List[float]]]:
    """``(path, inner steps, means, 95% intervals)`` of ``metric`` in each run's
    evaluation (:func:`metalearn.studies.results.read_evaluation`), steps in
    increasing order.

    Raises:
      ValueError: an evaluation without ``metric`` (naming the metrics it has).
    """
    from metalearn.studies import results
    curves = []
    for path in paths:
        evaluation = results.read_evaluation(path, eval_file)
        steps = sorted(evaluation["results"], key=int)
        missing = [s for s in steps if metric not in evaluation["results"][s]]
        if missing:
            raise ValueError(f"{evaluation['path']!r} has no {metric!r} after "
                             f"{missing} inner steps; it has "
                             f"{sorted(evaluation['results'][missing[0]])}")
        figures = [evaluation["results"][s][metric] for s in steps]
        curves.append((path, [int(s) for s in steps], [float(f["mean"]) for f in figures],
                       [float(f["ci95"]) for f in figures]))
    return curves


def plot_evaluations(paths: Sequence[str], path: str, metric: str = "loss",
                     labels: Sequence[str] = (), eval_file: str = Workdir.EVALUATION,
                     title: Optional[str] = None) -> Dict[str, object]:
    """One figure of several runs' evaluations: ``metric`` against inner steps, each
    run's mean with its 95% interval over the test tasks (as ``metalearn.evaluate``
    reports them), written to ``path`` (PNG); log scale for a loss.

    Args:
      paths: run directories (their ``eval_file``) or evaluation JSON files.
      labels: the legend, one per path (default: the folder or file names).

    Returns:
      ``{"table": Markdown (a row per run, a column per inner step, mean ± interval),
      "files": [path]}``.
    """
    labels = list(labels) or [os.path.basename(os.path.normpath(
        p if os.path.isdir(p) else os.path.dirname(p) or p)) for p in paths]
    if len(labels) != len(paths):
        raise ValueError(f"{len(labels)} labels {list(labels)} for {len(paths)} runs: "
                         "give one per run")
    curves = evaluation_curves(paths, metric, eval_file)
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(5, 3.5))
    for label, (_, steps, means, errors) in zip(labels, curves):
        axis.errorbar(steps, means, yerr=errors, marker="o", capsize=3, label=label)
    every = sorted({s for _, steps, _, _ in curves for s in steps})
    axis.set_xticks(every)
    _steps_axis(axis, metric, title or f"{metric} (mean ± 95% CI over test tasks)")
    _finish(plt, figure, path)
    rows = [f"| run | {' | '.join(f'{s} step' + 's' * (s != 1) for s in every)} |",
            "|---" * (len(every) + 1) + "|"]
    for label, (_, steps, means, errors) in zip(labels, curves):
        by_step = {s: f"{m:.3g} ± {e:.2g}" for s, m, e in zip(steps, means, errors)}
        rows.append(f"| {label} | " + " | ".join(by_step.get(s, "") for s in every) + " |")
    return {"table": "\n".join(rows) + "\n", "files": [path]}


def report(paths: Sequence[str], output_dir: Optional[str] = None,
           metrics: Sequence[str] = (), seed_key: str = SEED_KEY,
           plot_metric: Optional[str] = None, plots: bool = True,
           adaptation_plot: bool = True) -> Dict[str, object]:
    """Writes the CSVs, the Markdown table and the plots of the runs under ``paths``.

    Runs that are not finished (unfinished, running, failed, never started: see
    :func:`metalearn.studies.results.run_state`) are left out of the figures and
    listed, with their folders, under the table (``**INCOMPLETE: ...**``) and in
    ``runs.csv`` (its ``status`` column); the table is logged before any file is
    written.

    Returns:
      ``{"table": markdown, "files": [written paths], "rows": summary rows,
      "incomplete": [RunState of each run not finished]}``.

    Raises:
      IncompleteError: no run is finished (the message lists each run's state).
    """
    from metalearn.studies import results
    states = results.run_states(paths)
    incomplete = [state for state in states if not state.finished]
    if len(incomplete) == len(states):
        raise IncompleteError(f"no finished run under {list(paths)}: " + "; ".join(
            str(state) for state in incomplete), incomplete)
    runs = results.load_runs(paths, [state.workdir for state in states if state.finished])
    output_dir = output_dir or Workdir(paths[0]).report
    os.makedirs(output_dir, exist_ok=True)
    columns = results.metric_columns(runs, metrics) if metrics else default_columns(runs)
    if not columns:
        raise ValueError(f"no result columns match {list(metrics)}; available: "
                         f"{results.metric_columns(runs)}")
    keys, rows = results.summarise(runs, columns, seed_key)
    table = results.markdown_table(keys, rows, columns) + results.incomplete_text(states)
    files = [os.path.join(output_dir, name) for name in ("table.md", "runs.csv",
                                                         "summary.csv")]
    write_results(files[0], table, table, "report table")  # the table logged first
    results.write_runs_csv(files[1], runs, results.metric_columns(runs), incomplete)
    results.write_summary_csv(files[2], keys, rows, columns)
    if plots:
        plt = pyplot()
        path = os.path.join(output_dir, "learning_curves.png")
        if plot_learning_curves(plt, runs, keys, seed_key, path):
            files.append(path)
        path = os.path.join(output_dir, "inner_steps.png")
        if plot_inner_steps(plt, runs, keys, seed_key, path):
            files.append(path)
        evals = [c for c in columns if "/loss@" in c and not c.startswith("train/")]
        metric = plot_metric or (evals[-1] if evals else columns[0])
        if keys:
            files += plot_against_swept(plt, runs, keys, seed_key, metric, output_dir)
        if adaptation_plot:
            best = min((r for r in rows if r.get(metric)), key=lambda r: r[metric]["mean"],
                       default=None)
            chosen = next((run for run in runs if best is not None and all(
                run.bindings.get(k) == best[k] for k in keys)), runs[0])
            config = Workdir(chosen.workdir).config
            text = open(config).read() if os.path.isfile(config) else ""
            name = next((f for s, f in ADAPTATION_PLOTS.items() if s in text), None)
            if name is not None:
                path = os.path.join(output_dir, name)
                if plot_regression_adaptation(plt, chosen.workdir, path):
                    files.append(path)
    return {"table": table, "files": files, "rows": rows, "incomplete": incomplete}


def paired_report(workdir_a: str, workdir_b: str, output_dir: Optional[str] = None,
                  metric: str = "accuracy", steps: Optional[str] = None,
                  eval_file: str = Workdir.EVALUATION) -> Dict[str, object]:
    """Writes ``paired.json`` and ``paired.md`` comparing two runs on the same test
    episodes (:func:`metalearn.studies.results.compare_runs`: ``a`` minus ``b``).

    Returns:
      ``{"table": markdown, "files": [written paths], "result": the comparison}``.
    """
    from metalearn.studies import results
    import json
    result = results.compare_runs(workdir_a, workdir_b, metric, steps, eval_file)
    names = [os.path.basename(os.path.normpath(w)) for w in (workdir_a, workdir_b)]
    table = results.paired_markdown(result, *names)
    output_dir = output_dir or Workdir(workdir_a).report
    os.makedirs(output_dir, exist_ok=True)
    files = [os.path.join(output_dir, "paired.md"), os.path.join(output_dir, "paired.json")]
    write_results(files[0], table, table, "paired comparison")  # the table logged first
    write_results(files[1], json.dumps({"a": workdir_a, "b": workdir_b, **result},
                                       indent=2, sort_keys=True) + "\n", None,
                  "paired comparison")
    return {"table": table, "files": files, "result": result}


def main(argv) -> None:
    if len(argv) < 2:
        raise app.UsageError("give run directories or sweep roots: "
                             "python -m metalearn.report runs/sweep_inner_lr")
    metalearn.import_all()  # TensorFlow and the configurables: a run may be restored
    if FLAGS.evaluations_plot:
        out = plot_evaluations(argv[1:], FLAGS.evaluations_plot, FLAGS.evaluations_metric,
                               FLAGS.labels, FLAGS.eval_file, FLAGS.title)
        sys.stdout.write(out["table"])
        print(f"wrote {FLAGS.evaluations_plot}")
        return
    if FLAGS.paired:
        if len(argv) != 3:
            raise app.UsageError("--paired compares exactly two run directories")
        out = paired_report(argv[1], argv[2], FLAGS.output_dir, FLAGS.paired_metric,
                            FLAGS.paired_steps, FLAGS.eval_file)
        sys.stdout.write(out["table"])
        for path in out["files"]:
            print(f"wrote {path}")
        return
    try:
        out = report(argv[1:], FLAGS.output_dir, FLAGS.metrics, FLAGS.seed_key,
                     FLAGS.plot_metric, FLAGS.plots, FLAGS.adaptation_plot)
    except IncompleteError as error:
        print(f"INCOMPLETE: {error}", file=sys.stderr)
        sys.exit(INCOMPLETE_EXIT)
    status = console(out, FLAGS.allow_incomplete)
    if status:
        sys.exit(status)


def console(out: Dict[str, object], allow_incomplete: bool = False) -> int:
    """Prints :func:`report`'s table and files, and what is incomplete (on stderr).

    Returns:
      The exit status: :data:`INCOMPLETE_EXIT` if runs are not finished (unless
      ``allow_incomplete``), else 0.
    """
    sys.stdout.write(out["table"])
    for path in out["files"]:
        print(f"wrote {path}")
    if not out["incomplete"]:
        return 0
    print(f"INCOMPLETE: {len(out['incomplete'])} run(s) not finished, left out of the "
          "figures:\n" + "".join(f"  {state}\n" for state in out["incomplete"]),
          file=sys.stderr, end="")
    return 0 if allow_incomplete else INCOMPLETE_EXIT


if __name__ == "__main__":
    app.run(main)
