"""Gathering the results of runs: metrics, bindings, seed means and 95% intervals.

Above training: it reads what runs wrote (through :class:`metalearn.runs.workdir.Workdir`)
and reports it with :mod:`metalearn.statistics`.

A run's results are flat columns: ``train/<metric>`` from ``metrics.json`` (the final
meta-training window) and ``<eval file>/<metric>@<inner steps>`` (the mean over test
tasks) from every ``eval*.json``. Its bindings are the swept ones a sweep saved in
``sweep_run.json``; for runs not made by a sweep, the bindings whose values differ
between the runs' ``config.gin`` files.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import io
import json
import math
import os
from typing import Dict, List, Optional, Sequence, Tuple

from metalearn.runs.files import read_json, write_text
from metalearn.runs.gin_text import config_bindings
from metalearn.runs.workdir import Workdir
from metalearn.statistics import paired_difference, seed_interval

SEED_KEY = "Runtime.seed"


@dataclasses.dataclass
class RunResult:
    """One run's bindings and result columns."""
    workdir: str
    name: str
    bindings: Dict[str, str]
    metrics: Dict[str, float]
    evals: Dict[str, Dict[str, Dict[str, Dict[str, float]]]]  # file -> steps -> metric


def is_run(path: str) -> bool:
    """Whether ``path`` is a run directory (see :meth:`Workdir.is_run`)."""
    return Workdir(path).is_run()


def find_runs(paths: Sequence[str]) -> List[str]:
    """Run directories: each path itself if it is one, else its run subdirectories."""
    runs = []
    for path in paths:
        if is_run(path):
            runs.append(path)
            continue
        found = sorted(p for p in glob.glob(os.path.join(path, "*")) if is_run(p))
        sweep = Workdir(path).sweep
        if os.path.isfile(sweep):  # keep the sweep's order
            saved = read_json(sweep, "a sweep record {\"runs\": [names], ...}")
            try:
                order = {str(name): i for i, name in enumerate(saved["runs"])}
            except (KeyError, TypeError) as error:
                raise ValueError(f"{sweep} is not a sweep record: expected an object with "
                                 f"a list \"runs\" ({error!r})") from None
            found.sort(key=lambda p: order.get(os.path.basename(p), len(order)))
        if not found:
            raise FileNotFoundError(f"{path!r} is neither a run directory nor holds any "
                                    f"(no {Workdir.CONFIG} or {Workdir.METRICS})")
        runs.extend(found)
    return runs


def load_run(workdir: str) -> RunResult:
    """Reads a run directory's ``sweep_run.json``, ``metrics.json`` and ``eval*.json``."""
    name, bindings = os.path.basename(os.path.normpath(workdir)), {}
    run_file = Workdir(workdir).sweep_run
    if os.path.isfile(run_file):
        saved = read_json(run_file, "a sweep run record {\"name\", \"bindings\", ...}")
        try:
            name, bindings = str(saved["name"]), dict(saved["bindings"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{run_file} is not a sweep run record: expected an object "
                             f"with \"name\" and \"bindings\" ({error!r})") from None
    metrics: Dict[str, float] = {}
    metrics_file = Workdir(workdir).metrics
    if os.path.isfile(metrics_file):
        values = read_json(metrics_file, "the final metrics {\"loss\": ..., \"step\": ...}")
        try:
            for key, value in values.items():
                if key != "replicas":
                    metrics[f"train/{key}"] = float(value)
        except (AttributeError, TypeError, ValueError) as error:
            raise ValueError(f"{metrics_file} does not hold final metrics: expected an "
                             f"object of numbers ({error!r})") from None
    evals = {}
    for path in Workdir(workdir).evaluations():
        stem = os.path.splitext(os.path.basename(path))[0]
        report = read_json(path, "an evaluation report {\"results\": ...}")
        try:
            evals[stem] = report["results"]
            for steps, by_metric in sorted(report["results"].items(),
                                           key=lambda s: int(s[0])):
                for metric, value in by_metric.items():
                    metrics[f"{stem}/{metric}@{steps}"] = float(value["mean"])
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"{path} is not an evaluation report: expected "
                             "{\"results\": {inner steps: {metric: {\"mean\": ...}}}} "
                             f"({error!r})") from None
    return RunResult(workdir, name, bindings, metrics, evals)


def load_runs(paths: Sequence[str]) -> List[RunResult]:
    """Every run under ``paths``; runs without saved sweep bindings get the config
    bindings that differ between them."""
    runs = [load_run(p) for p in find_runs(paths)]
    plain = [r for r in runs if not r.bindings]
    configs = {r.workdir: config_bindings(Workdir(r.workdir).config)
               for r in plain if os.path.isfile(Workdir(r.workdir).config)}
    if len(configs) > 1:
        keys = sorted(set().union(*configs.values()))
        differ = [k for k in keys if len({c.get(k) for c in configs.values()}) > 1]
        for run in plain:
            config = configs.get(run.workdir, {})
            run.bindings = {k: config.get(k, "(default)") for k in differ}
    return runs


def swept_keys(runs: Sequence[RunResult]) -> List[str]:
    keys: List[str] = []
    for run in runs:
        keys += [k for k in run.bindings if k not in keys]
    return keys


def metric_columns(runs: Sequence[RunResult], patterns: Optional[Sequence[str]] = None
                   ) -> List[str]:
    """Result columns present in any run (in first-seen order), optionally only those
    matching one of the ``fnmatch`` patterns."""
    import fnmatch
    columns: List[str] = []
    for run in runs:
        columns += [c for c in run.metrics if c not in columns]
    if patterns:
        columns = [c for c in columns if any(fnmatch.fnmatch(c, p) for p in patterns)]
    return columns


def summarise(runs: Sequence[RunResult], columns: Sequence[str], seed_key: str = SEED_KEY
              ) -> Tuple[List[str], List[Dict[str, object]]]:
    """Groups runs by their bindings other than ``seed_key``; mean and 95% interval of
    each column across a group's seeds.

    Returns:
      The group keys, and one row per group (in first-seen order): the group's binding
      values, ``"seeds"`` (runs in the group) and ``column -> seed_interval(...)``.
    """
    keys = [k for k in swept_keys(runs) if k != seed_key]
    groups: Dict[Tuple[str, ...], List[RunResult]] = {}
    for run in runs:
        groups.setdefault(tuple(run.bindings.get(k, "") for k in keys), []).append(run)
    rows = []
    for values, members in groups.items():
        row: Dict[str, object] = dict(zip(keys, values))
        row["seeds"] = len(members)
        for column in columns:
            present = [m.metrics[column] for m in members if column in m.metrics]
            row[column] = seed_interval(present) if present else None
        rows.append(row)
    return keys, rows


def _format(value: float) -> str:
    return "nan" if not math.isfinite(value) else f"{value:.3g}"


def markdown_table(keys: Sequence[str], rows: Sequence[Dict[str, object]],
                   columns: Sequence[str]) -> str:
    """A Markdown table: one row per group, ``mean ± ci95`` across seeds."""
    header = list(keys) + ["seeds"] + list(columns)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header)
             + " |"]
    for row in rows:
        cells = [str(row[k]) for k in keys] + [str(row["seeds"])]
        for column in columns:
            stat = row[column]
            if stat is None:
                cells.append("")
            elif stat["n"] == 1:
                cells.append(_format(stat["mean"]))
            else:
                cells.append(f"{_format(stat['mean'])} ± {_format(stat['ci95'])}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_runs_csv(path: str, runs: Sequence[RunResult], columns: Sequence[str]) -> None:
    """One row per run: workdir, name, every swept binding and every column."""
    keys = swept_keys(runs)
    f = io.StringIO()
    writer = csv.writer(f)
    writer.writerow(["workdir", "name"] + keys + list(columns))
    for run in runs:
        writer.writerow([run.workdir, run.name] + [run.bindings.get(k, "") for k in keys]
                        + [run.metrics.get(c, "") for c in columns])
    write_text(path, f.getvalue())


def write_summary_csv(path: str, keys: Sequence[str], rows: Sequence[Dict[str, object]],
                      columns: Sequence[str]) -> None:
    """One row per group: bindings, seeds, and ``<column>``/``<column> ci95`` pairs."""
    f = io.StringIO()
    writer = csv.writer(f)
    writer.writerow(list(keys) + ["seeds"] + [h for c in columns
                                               for h in (c, f"{c} ci95")])
    for row in rows:
        cells = [row[k] for k in keys] + [row["seeds"]]
        for column in columns:
            stat = row[column]
            cells += ["", ""] if stat is None else [stat["mean"], stat["ci95"]]
        writer.writerow(cells)
    write_text(path, f.getvalue())


# --- paired comparison of two runs on the same test episodes -------------------------


def _eval_report(workdir: str, eval_file: str) -> Dict:
    path = Workdir(workdir).evaluation(eval_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"evaluation file {path!r} not found; write it with "
                                f"python -m metalearn.evaluate --workdir={workdir}")
    with open(path) as f:
        try:
            report = json.load(f)
        except ValueError as error:
            raise ValueError(f"evaluation file {path!r} is not JSON ({error})") from None
    if not isinstance(report, dict) or "per_task" not in report:
        raise ValueError(f"evaluation file {path!r} has no per-episode values "
                         "('per_task'): evaluate the run again with this version")
    report["path"] = path
    return report


def compare_runs(workdir_a: str, workdir_b: str, metric: str = "accuracy",
                 steps: Optional[str] = None, eval_file: str = Workdir.EVALUATION
                 ) -> Dict[str, object]:
    """Paired comparison of two runs' evaluations on the same test episodes.

    Both ``eval_file``s must come from ``evaluate`` with the same seed, split and
    number of tasks, on the same episodes (their ``episodes`` digests agree: same data,
    ways, shots and queries); otherwise the comparison would not be paired and this
    raises, naming both files.

    Args:
      workdir_a, workdir_b: the two runs (or paths of their evaluation files).
      metric: the per-episode metric compared (``"accuracy"``, ``"loss"``).
      steps: the inner-step count of each (default: the last one each evaluated).
      eval_file: the evaluation file name inside each workdir.

    Returns:
      :func:`paired_difference`'s fields (``a`` minus ``b``), plus ``metric``,
      ``steps_a``, ``steps_b``, ``files`` and the shared ``seed``, ``split``.
    """
    reports = [_eval_report(w, eval_file) for w in (workdir_a, workdir_b)]
    for key in ("seed", "split", "num_tasks", "episodes"):
        values = [r.get(key) for r in reports]
        if values[0] != values[1]:
            raise ValueError(f"not the same test episodes: {key} is {values[0]!r} in "
                             f"{reports[0]['path']!r} and {values[1]!r} in "
                             f"{reports[1]['path']!r}; evaluate both with the same "
                             "evaluate.seed, split, num_tasks and tasks")
    chosen, series = [], []
    for report in reports:
        per_task = report["per_task"]
        key = steps if steps is not None else max(per_task, key=int)
        if key not in per_task or metric not in per_task[key]:
            raise ValueError(f"{report['path']!r} has no per-episode {metric!r} after "
                             f"{key} inner steps (it has steps {sorted(per_task)} and "
                             f"metrics {sorted(next(iter(per_task.values()), {}))})")
        chosen.append(key)
        series.append([float(v) for v in per_task[key][metric]])
    result: Dict[str, object] = dict(paired_difference(*series))
    result.update(metric=metric, steps_a=chosen[0], steps_b=chosen[1],
                  files=[r["path"] for r in reports], seed=reports[0].get("seed"),
                  split=reports[0].get("split"))
    return result


def paired_markdown(result: Dict[str, object], name_a: str, name_b: str) -> str:
    """A short markdown table of :func:`compare_runs`'s result."""
    metric = result["metric"]
    scale = 100.0 if metric == "accuracy" else 1.0
    unit = " (points)" if metric == "accuracy" else ""
    fmt = lambda v: f"{scale * float(v):.2f}"  # noqa: E731
    return ("| | " + name_a + " | " + name_b + f" | difference{unit} | 95% interval | "
            "p-value | episodes (a better / b better / tied) |\n"
            "| --- | --- | --- | --- | --- | --- | --- |\n"
            f"| {metric} | {fmt(result['mean_a'])} | {fmt(result['mean_b'])} | "
            f"{fmt(result['difference'])} | [{fmt(result['low'])}, {fmt(result['high'])}] | "
            f"{float(result['p_value']):.3g} | {result['n']} ({result['wins_a']} / "
            f"{result['wins_b']} / {result['ties']}) |\n")
