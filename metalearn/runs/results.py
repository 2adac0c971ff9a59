"""Gathering the results of runs: metrics, bindings, seed means and 95% intervals.

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

import numpy as np

from metalearn.runs.files import read_json, write_text

SEED_KEY = "Runtime.seed"

# Two-sided 95% quantiles of Student's t with 1..30 degrees of freedom.
_T_975 = (12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836, 2.446911851,
          2.364624252, 2.306004135, 2.262157163, 2.228138852, 2.200985160, 2.178812830,
          2.160368656, 2.144786688, 2.131449546, 2.119905299, 2.109815578, 2.100922040,
          2.093024054, 2.085963447, 2.079613845, 2.073873068, 2.068657610, 2.063898562,
          2.059538553, 2.055529439, 2.051830516, 2.048407142, 2.045229642, 2.042272456)
_Z_975 = 1.959963984540054


def t_quantile_975(dof: int) -> float:
    """The 97.5% quantile of Student's t with ``dof`` degrees of freedom."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    if dof <= len(_T_975):
        return _T_975[dof - 1]
    z = _Z_975  # Cornish-Fisher expansion; error < 1e-4 beyond 30 degrees of freedom
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


def seed_interval(values: Sequence[float]) -> Dict[str, float]:
    """Mean and 95% interval half-width across seeds: Student's t, since seeds are few
    (``t(n-1) * sample std / sqrt(n)``); ``ci95`` is NaN for a single value."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no values")
    if values.size == 1:
        return {"mean": float(values[0]), "ci95": math.nan, "n": 1}
    std = float(values.std(ddof=1))
    return {"mean": float(values.mean()), "n": int(values.size),
            "ci95": t_quantile_975(values.size - 1) * std / math.sqrt(values.size)}


@dataclasses.dataclass
class RunResult:
    """One run's bindings and result columns."""
    workdir: str
    name: str
    bindings: Dict[str, str]
    metrics: Dict[str, float]
    evals: Dict[str, Dict[str, Dict[str, Dict[str, float]]]]  # file -> steps -> metric


def is_run(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.gin")) or \
        os.path.isfile(os.path.join(path, "metrics.json"))


def find_runs(paths: Sequence[str]) -> List[str]:
    """Run directories: each path itself if it is one, else its run subdirectories."""
    runs = []
    for path in paths:
        if is_run(path):
            runs.append(path)
            continue
        found = sorted(p for p in glob.glob(os.path.join(path, "*")) if is_run(p))
        sweep = os.path.join(path, "sweep.json")
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
                                    "(no config.gin or metrics.json)")
        runs.extend(found)
    return runs


def config_bindings(path: str) -> Dict[str, str]:
    """``key -> value text`` of a saved gin config (continuation lines joined)."""
    with open(path) as f:
        return config_text_bindings(f.read())


def config_text_bindings(text: str) -> Dict[str, str]:
    """``key -> value text`` of gin config text as ``gin.config_str()`` writes it."""
    bindings: Dict[str, str] = {}
    key = None
    for line in text.splitlines(keepends=True):
        stripped = line.split("#", 1)[0].rstrip() if not line.lstrip().startswith(
            ("'", '"')) else line.rstrip()
        if not stripped.strip():
            continue
        if line[:1] in (" ", "\t") and key is not None:
            bindings[key] += " " + stripped.strip()
        elif "=" in stripped and not stripped.startswith(("import ", "include ")):
            key, value = (s.strip() for s in stripped.split("=", 1))
            bindings[key] = value
    return bindings


def load_run(workdir: str) -> RunResult:
    """Reads a run directory's ``sweep_run.json``, ``metrics.json`` and ``eval*.json``."""
    name, bindings = os.path.basename(os.path.normpath(workdir)), {}
    run_file = os.path.join(workdir, "sweep_run.json")
    if os.path.isfile(run_file):
        saved = read_json(run_file, "a sweep run record {\"name\", \"bindings\", ...}")
        try:
            name, bindings = str(saved["name"]), dict(saved["bindings"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{run_file} is not a sweep run record: expected an object "
                             f"with \"name\" and \"bindings\" ({error!r})") from None
    metrics: Dict[str, float] = {}
    metrics_file = os.path.join(workdir, "metrics.json")
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
    for path in sorted(glob.glob(os.path.join(workdir, "eval*.json"))):
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
    configs = {r.workdir: config_bindings(os.path.join(r.workdir, "config.gin"))
               for r in plain if os.path.isfile(os.path.join(r.workdir, "config.gin"))}
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


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a - 1.0 + 2 * m) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1.0 + 2 * m))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) (Numerical Recipes' ``betai``)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, dof: int) -> float:
    """Two-sided p-value of Student's t statistic ``t`` with ``dof`` degrees of freedom."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    if math.isinf(t):
        return 0.0
    return _incomplete_beta(dof / 2.0, 0.5, dof / (dof + t * t))


def paired_difference(a: Sequence[float], b: Sequence[float]) -> Dict[str, float]:
    """Paired comparison of two methods measured on the same episodes, in order.

    The per-episode differences ``a - b`` are averaged; their 95% interval is Student's
    t (``t(n-1) * sd / sqrt(n)``) and the p-value is the paired t-test's, two-sided
    (null: the same mean). Pairing removes the episodes' own difficulty from the
    comparison, so it resolves differences that two separate intervals cannot.

    Returns:
      ``{"mean_a", "mean_b", "difference", "ci95", "low", "high", "p_value", "n",
      "wins_a", "wins_b", "ties"}``.
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired values must be two equally long lists, got {a.shape} and "
                         f"{b.shape}")
    if a.size < 2:
        raise ValueError(f"need at least 2 paired episodes, got {a.size}")
    d = a - b
    mean, sd, n = float(d.mean()), float(d.std(ddof=1)), int(d.size)
    half = t_quantile_975(n - 1) * sd / math.sqrt(n)
    if sd == 0.0:
        p = 1.0 if mean == 0.0 else 0.0
    else:
        p = t_two_sided_p(mean / (sd / math.sqrt(n)), n - 1)
    return {"mean_a": float(a.mean()), "mean_b": float(b.mean()), "difference": mean,
            "ci95": half, "low": mean - half, "high": mean + half, "p_value": p, "n": n,
            "wins_a": int((d > 0).sum()), "wins_b": int((d < 0).sum()),
            "ties": int((d == 0).sum())}


def _eval_report(workdir: str, eval_file: str) -> Dict:
    path = eval_file if os.path.isabs(eval_file) else os.path.join(workdir, eval_file)
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
                 steps: Optional[str] = None, eval_file: str = "eval.json"
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
