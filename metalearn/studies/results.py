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
import re
from typing import Dict, List, Optional, Sequence, Tuple

from metalearn.runs.files import read_json, write_results
from metalearn.runs.gin_text import config_bindings, substitute_macros
from metalearn.runs.lock import holder
from metalearn.runs.workdir import Workdir
from metalearn.training.checkpoint import STATE_FILE
from metalearn.flags import SEED_KEY  # --seed_key's default: defined there, light
from metalearn.statistics import paired_difference, seed_interval


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


FINISHED = "finished"
INCOMPLETE = ("unfinished", "running", "failed", "never started")
"""What a run that is not finished is: started and stopped before its end (killed, or
its machine lost), training now, failed (its process exited with an error), or never
started (a sweep lists it, its folder holds no run yet)."""


@dataclasses.dataclass(frozen=True)
class RunState:
    """Whether a run is finished, and if not, what it is.

    Attributes:
      workdir: its folder.
      name: its name (the sweep's, else the folder's).
      status: ``"finished"`` or one of :data:`INCOMPLETE`.
      detail: for an incomplete run, how far it got (``"at step 20 of 30"``, ``"exit
        code 1, see <train.log>"``).
    """
    workdir: str
    name: str
    status: str
    detail: str = ""

    @property
    def finished(self) -> bool:
        return self.status == FINISHED

    def __str__(self) -> str:
        return f"{self.status}: {self.name} ({self.workdir}" + \
            (f"; {self.detail})" if self.detail else ")")


def _json_or_none(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _step(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def is_trained(workdir: str, num_steps: int) -> bool:
    """Whether ``metrics.json`` in ``workdir`` reports step ``num_steps`` (or later)."""
    metrics = _json_or_none(Workdir(workdir).metrics)
    return isinstance(metrics, dict) and _step(metrics.get("step")) >= num_steps


def is_evaluated(workdir: str, num_steps: int, output: str = Workdir.EVALUATION) -> bool:
    """Whether the evaluation file in ``workdir`` is of the final checkpoint."""
    report = _json_or_none(Workdir(workdir).evaluation(output))
    return isinstance(report, dict) and _step(report.get("checkpoint_step")) >= num_steps


def is_finished(workdir: str, num_steps: int, evaluate: bool) -> bool:
    """The one rule for a sweep's run being finished, read from its files alone (the
    sweep's skip and outcome, :func:`run_state`, ``metalearn.report``): ``metrics.json``
    reports ``num_steps`` and, if the sweep evaluates, ``eval.json`` is of that step.
    How its process exited does not count: a run stopped after writing them (a sweep's
    SIGTERM, exit -15) is finished; one that exited 0 without them is not."""
    return is_trained(workdir, num_steps) and (not evaluate or
                                               is_evaluated(workdir, num_steps))


def _checkpoint_step(workdir: str) -> Optional[int]:
    """The step of the latest checkpoint the state file records (``ckpt-<step>``)."""
    try:
        with open(os.path.join(Workdir(workdir).checkpoints, STATE_FILE)) as f:
            first = f.readline()
    except OSError:
        return None
    found = re.search(r"ckpt-(\d+)", first)
    return int(found.group(1)) if found else None


def run_state(workdir: str, name: Optional[str] = None) -> RunState:
    """What the run in ``workdir`` is (see :class:`RunState`).

    A sweep's run (``sweep_run.json``) is finished when its files are complete
    (:func:`is_finished`, whatever exit code the sweep recorded); a run of
    ``metalearn.train`` when it has ``metrics.json`` (written at its end). Otherwise it
    is running if a live process holds its training lock, failed if the sweep recorded
    its process's error, never started if its folder holds no run, else unfinished.
    """
    name = name or os.path.basename(os.path.normpath(workdir))
    folder = Workdir(workdir)
    if not os.path.isdir(workdir):
        return RunState(workdir, name, "never started", "no folder")
    record = _json_or_none(folder.sweep_run)
    record = record if isinstance(record, dict) else {}
    name = str(record.get("name", name))
    steps = _step(record.get("num_steps"))
    if steps >= 0:
        trained = is_trained(workdir, steps)
        finished = is_finished(workdir, steps, bool(record.get("evaluate")))
    else:
        trained = finished = os.path.isfile(folder.metrics)
    if finished:
        return RunState(workdir, name, FINISHED)
    reached = _checkpoint_step(workdir)
    progress = ("trained, not evaluated" if trained else
                f"at step {reached if reached is not None else 0}"
                f"{f' of {steps}' if steps >= 0 else ''}")
    running = holder(workdir)
    if running is not None:
        return RunState(workdir, name, "running", f"{progress}; process "
                        f"{running.get('pid')} on {running.get('host')!r}")
    outcome = record.get("outcome")
    if isinstance(outcome, dict) and outcome.get("status") == "failed":
        return RunState(workdir, name, "failed", f"{progress}; exit code "
                        f"{outcome.get('exit_code')}, see {folder.train_log}")
    if not (os.path.isfile(folder.config) or os.path.isdir(folder.checkpoints) or trained):
        return RunState(workdir, name, "never started", "nothing trained in its folder")
    return RunState(workdir, name, "unfinished", progress)


def run_states(paths: Sequence[str]) -> List[RunState]:
    """Every run under ``paths``, finished or not: each path that is a run, else its run
    folders and, in a sweep's root, every run its ``sweep.json`` lists (in the sweep's
    order; those without a folder are ``"never started"``).

    Raises:
      FileNotFoundError: a path is neither a run nor holds runs, nor a sweep's root.
    """
    states: List[RunState] = []
    for path in paths:
        if is_run(path):
            states.append(run_state(path))
            continue
        sweep = Workdir(path).sweep
        names: List[str] = []
        if os.path.isfile(sweep):
            saved = read_json(sweep, "a sweep record {\"runs\": [names], ...}")
            try:
                names = [str(name) for name in saved["runs"]]
            except (KeyError, TypeError) as error:
                raise ValueError(f"{sweep} is not a sweep record: expected an object with "
                                 f"a list \"runs\" ({error!r})") from None
        found = sorted(os.path.basename(p) for p in glob.glob(os.path.join(path, "*"))
                       if is_run(p) or os.path.isfile(Workdir(p).sweep_run))
        names += [n for n in found if n not in names]
        if not names:
            raise FileNotFoundError(f"{path!r} is neither a run directory nor holds any "
                                    f"(no {Workdir.CONFIG} or {Workdir.METRICS})")
        states += [run_state(os.path.join(path, n), n) for n in names]
    return states


def incomplete_text(states: Sequence[RunState]) -> str:
    """A Markdown section listing the runs that are not finished (``""`` if none)."""
    missing = [s for s in states if not s.finished]
    if not missing:
        return ""
    counts = ", ".join(f"{sum(s.status == kind for s in missing)} {kind}"
                       for kind in INCOMPLETE if any(s.status == kind for s in missing))
    return (f"\n**INCOMPLETE: {len(missing)} of {len(states)} runs are not finished "
            f"({counts}); the table holds the {len(states) - len(missing)} finished "
            "runs only.**\n\n" + "".join(f"- {s}\n" for s in missing))


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


def load_runs(paths: Sequence[str], workdirs: Optional[Sequence[str]] = None
              ) -> List[RunResult]:
    """Every run under ``paths`` (or the run folders ``workdirs``); runs without saved
    sweep bindings get the config bindings that differ between them."""
    runs = [load_run(p) for p in (find_runs(paths) if workdirs is None else workdirs)]
    plain = [r for r in runs if not r.bindings]
    configs = {r.workdir: substitute_macros(config_bindings(Workdir(r.workdir).config))
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
    """A Markdown table: one row per group, ``mean ± ci95`` across seeds (``(n=k)``
    after a value that only ``k`` of the group's seeds have)."""
    header = list(keys) + ["seeds"] + list(columns)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header)
             + " |"]
    for row in rows:
        cells = [str(row[k]) for k in keys] + [str(row["seeds"])]
        for column in columns:
            stat = row[column]
            fewer = "" if stat is None or stat["n"] == row["seeds"] else \
                f" (n={stat['n']})"  # a column some seeds lack: never read as all seeds
            if stat is None:
                cells.append("")
            elif stat["n"] == 1:
                cells.append(_format(stat["mean"]) + fewer)
            else:
                cells.append(f"{_format(stat['mean'])} ± {_format(stat['ci95'])}{fewer}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_runs_csv(path: str, runs: Sequence[RunResult], columns: Sequence[str],
                   incomplete: Sequence[RunState] = ()) -> None:
    """One row per run: workdir, name, status, every swept binding and every column;
    then a row (status and detail) per run that is not finished."""
    keys = swept_keys(runs)
    f = io.StringIO()
    writer = csv.writer(f)
    writer.writerow(["workdir", "name", "status"] + keys + list(columns))
    for run in runs:
        writer.writerow([run.workdir, run.name, FINISHED] +
                        [run.bindings.get(k, "") for k in keys] +
                        [run.metrics.get(c, "") for c in columns])
    for state in incomplete:
        writer.writerow([state.workdir, state.name, f"{state.status}: {state.detail}"] +
                        [""] * (len(keys) + len(columns)))
    write_results(path, f.getvalue(), None, "runs table")


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
    write_results(path, f.getvalue(), None, "summary table")


# --- paired comparison of two runs on the same test episodes -------------------------


def read_evaluation(path: str, eval_file: str = Workdir.EVALUATION,
                    per_task: bool = False) -> Dict:
    """The evaluation report of a run directory (its ``eval_file``) or of an evaluation
    JSON file given directly, with ``"path"`` added.

    Args:
      per_task: require the per-episode values (``"per_task"``, for paired tests).

    Raises:
      FileNotFoundError: naming the file and the command that writes it.
      ValueError: the file is not an evaluation report (``{"results": {inner steps:
        {metric: {"mean", "ci95"}}}}``), or lacks ``per_task`` when required.
    """
    file = path if os.path.isfile(path) else Workdir(path).evaluation(eval_file)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"evaluation file {file!r} not found; write it with "
                                f"python -m metalearn.evaluate --workdir={path}")
    with open(file) as f:
        try:
            report = json.load(f)
        except ValueError as error:
            raise ValueError(f"evaluation file {file!r} is not JSON ({error})") from None
    if not isinstance(report, dict) or not isinstance(report.get("results"), dict):
        raise ValueError(f"evaluation file {file!r} is not an evaluation report: expected "
                         "{\"results\": {inner steps: {metric: {\"mean\", \"ci95\"}}}}")
    if per_task and "per_task" not in report:
        raise ValueError(f"evaluation file {file!r} has no per-episode values "
                         "('per_task'): evaluate the run again with this version")
    report["path"] = file
    return report


def _eval_report(workdir: str, eval_file: str) -> Dict:
    return read_evaluation(workdir, eval_file, per_task=True)


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
