"""What the equal-budget benchmarks (benchmarks/neural_processes.py,
benchmarks/in_context.py) share: their flags (:func:`define_flags`), training a gin
file for a budget of CPU or wall seconds and evaluating it, one workdir per method and
seed, the tables over seeds with paired rows, a sampler's streaming rate, and their
entry point. Defines no flags on import.

The tables (:func:`method_table`, :func:`per_seed_table`, :func:`paired_table`) read
the evaluation files (``python -m metalearn.evaluate``'s JSON) of each method's seeds.
Every seed of every method is evaluated on the same test episodes (``evaluate.seed``
does not follow ``Runtime.seed``; the files' ``episodes`` digests are checked), so a
method's value on an episode can be averaged over its seeds: a method's row is the mean
over seeds with the 95% interval over the episodes of those seed-averaged values, beside
Student's t interval over the seeds' own means ("across seeds", none for one seed); the
per-seed rows give each seed's mean and interval; a paired row compares two methods
episode by episode on the seed-averaged values of the seeds both have.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import resource
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from metalearn.statistics import mean_and_interval, paired_difference, seed_interval

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


BUDGETS = ("wall", "cpu")


def train_and_evaluate(gin_file: str, workdir: str, seconds: int, log_every: int,
                       evaluations: Sequence[Sequence[str]], budget: str = "wall",
                       params: Sequence[str] = ()) -> None:
    """``python -m metalearn.train`` on ``gin_file`` (plus the gin bindings ``params``)
    for ``seconds``, then one ``python -m metalearn.evaluate`` per entry of
    ``evaluations`` (its extra flags).

    ``budget="wall"``: stopped with SIGTERM after ``seconds`` of wall time.
    ``budget="cpu"``: after ``seconds`` of the process's CPU time (a soft
    ``RLIMIT_CPU``: SIGXCPU), which other jobs on a shared machine do not shrink. Either
    way the step under way finishes and is checkpointed, and the process's own start-up
    (imports, tracing) counts."""
    if budget not in BUDGETS:
        raise ValueError(f"budget must be one of {BUDGETS}, got {budget!r}")
    env = dict(os.environ, PYTHONPATH=ROOT)
    command = [sys.executable, "-m", "metalearn.train", f"--gin_file={gin_file}",
               f"--workdir={workdir}", "--gin_param=Loop.num_steps=1000000",
               f"--gin_param=Loop.log_every={log_every}",
               "--gin_param=Loop.checkpoint_every=1000000",
               *[f"--gin_param={p}" for p in params]]
    if budget == "wall":
        subprocess.run(["timeout", "-s", "TERM", str(seconds), *command], cwd=ROOT, env=env)
    else:
        limit = (seconds, seconds + 600)  # the hard limit: room for the last step
        subprocess.run(command, cwd=ROOT, env=env, preexec_fn=lambda: resource.setrlimit(
            resource.RLIMIT_CPU, limit))
    for flags in evaluations:
        subprocess.run([sys.executable, "-m", "metalearn.evaluate", f"--workdir={workdir}",
                        *flags], cwd=ROOT, env=env, check=True)


def stream_rate(sampler, batches: int = 400, batch: int = 25) -> float:
    """Episodes per second that ``sampler.dataset(batch)`` streams, iterated as the
    training loop iterates it (after 20 warm-up batches)."""
    stream = iter(sampler.dataset(batch, seed=0))
    for _ in range(20):  # warm up the pipeline
        next(stream)
    start = time.perf_counter()
    for _ in range(batches):
        next(stream)
    return batches * batch / (time.perf_counter() - start)


SEED_BINDING = "Runtime.seed"
"""The experiments' seed (initial weights, training tasks), set per run by ``--seeds``."""


def define_flags(seconds: int, out: str, methods: Sequence[str], sampler_help: str) -> None:
    """Defines the benchmarks' shared flags: ``--seconds``, ``--budget``, ``--seeds``,
    ``--out``, ``--analyse_only``, ``--methods`` (default ``methods``) and
    ``--sampler_rate``."""
    from absl import flags
    flags.DEFINE_integer("seconds", seconds, "Meta-training budget of each method and seed "
                         "(CPU seconds of its process with --budget=cpu, else wall seconds).")
    flags.DEFINE_enum("budget", "cpu", BUDGETS, "cpu: a limit on the training process's "
                      "CPU time (RLIMIT_CPU), which a shared machine does not shrink; wall: "
                      "SIGTERM after --seconds of wall time.")
    flags.DEFINE_list("seeds", ["0"], f"The runs' {SEED_BINDING} values; each method and "
                      "seed trains into <out>/<method>/seed<seed>.")
    flags.DEFINE_string("out", out, "Folder of the workdirs.")
    flags.DEFINE_bool("analyse_only", False, "Only read the workdirs' evaluations.")
    flags.DEFINE_list("methods", list(methods), "Which to (re)train.")
    flags.DEFINE_bool("sampler_rate", False, sampler_help)


def seed_workdir(out: str, name: str, seed: int) -> str:
    """The workdir of method ``name`` at ``seed``: ``<out>/<name>/seed<seed>``."""
    return os.path.join(out, name, f"seed{seed}")


def parse_seeds(values: Sequence[str]) -> List[int]:
    """``--seeds`` as distinct integers, in order.

    Raises:
      ValueError: a value that is not an integer, a repeated one, or none."""
    seeds = []
    for value in values:
        try:
            seed = int(value)
        except ValueError:
            raise ValueError(f"--seeds takes integers, got {value!r}") from None
        if seed in seeds:
            raise ValueError(f"--seeds repeats {seed}")
        seeds.append(seed)
    if not seeds:
        raise ValueError("--seeds is empty: give at least one seed, e.g. --seeds=0")
    return seeds


def run_main(flags, methods: Sequence[str],
             run: Callable[[str, str, int, str, Sequence[str]], None],
             analyse: Callable[[str, Sequence[int]], str],
             sampler_rate: Callable[[], str]) -> None:
    """The benchmarks' ``main``: the sampler rate (``--sampler_rate``), or each of
    ``--methods`` (of ``methods``) trained at each of ``--seeds`` (unless
    ``--analyse_only``; the seeds outermost, so a machine's load changes over time
    reach every method alike) and the tables printed.

    ``run(name, workdir, seconds, budget, params)`` trains and evaluates one method in
    ``workdir`` with the gin bindings ``params`` (the seed's); ``analyse(out, seeds)``
    gives the tables.

    Raises:
      ValueError: a method not in ``methods``, bad ``--seeds``."""
    if flags.sampler_rate:
        print(sampler_rate())
        return
    unknown = [name for name in flags.methods if name not in methods]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; the methods are {list(methods)}")
    seeds = parse_seeds(flags.seeds)
    if not flags.analyse_only:
        for seed in seeds:
            for name in flags.methods:
                workdir = seed_workdir(flags.out, name, seed)
                os.makedirs(workdir, exist_ok=True)
                run(name, workdir, flags.seconds, flags.budget, [f"{SEED_BINDING} = {seed}"])
    print(analyse(flags.out, seeds))


# --- the tables over seeds -------------------------------------------------------------


@dataclasses.dataclass
class Measured:
    """One method's evaluations at one setting (e.g. a shot count), over its seeds.

    Attributes:
      seeds: the seeds evaluated, in order.
      steps: the meta-steps each seed's run reached (its checkpoint's step).
      values: ``{metric: [seeds, episodes] array}``, the per-episode values.
      digest: the evaluated episodes' digest, the same for every seed.
    """

    seeds: List[int]
    steps: List[int]
    values: Dict[str, np.ndarray]
    digest: str


def read_measured(out: str, name: str, seeds: Sequence[int], file: str,
                  metrics: Sequence[str], inner_steps: Optional[str] = None
                  ) -> Optional[Measured]:
    """The evaluation ``file`` of method ``name``'s seeds under ``out`` (the seeds
    without it left out; ``None`` if none has it): ``metrics`` of each episode after
    ``inner_steps`` (default: the most each file evaluated).

    Raises:
      ValueError: the seeds were evaluated on other episodes, or a metric is missing."""
    found, steps, values, digest = [], [], {m: [] for m in metrics}, None
    for seed in seeds:
        path = os.path.join(seed_workdir(out, name, seed), file)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            report = json.load(f)
        if digest is not None and report["episodes"] != digest:
            raise ValueError(f"{path}: other test episodes than {name}'s seed {found[0]}")
        digest = report["episodes"]
        key = inner_steps or max(report["per_task"], key=int)
        for metric in metrics:
            if metric not in report["per_task"][key]:
                raise ValueError(f"{path} has no {metric!r} after {key} inner steps; it has "
                                 f"{sorted(report['per_task'][key])}")
            values[metric].append(report["per_task"][key][metric])
        found.append(seed)
        steps.append(int(report["checkpoint_step"]))
    if not found:
        return None
    return Measured(found, steps, {m: np.asarray(v, np.float64) for m, v in values.items()},
                    digest)


def interval_text(mean: float, half: float, scale: float = 1.0, digits: int = 3,
                  unit: str = "") -> str:
    """``"mean ± half"`` scaled and rounded; ``"—"`` for a NaN half-width (one seed)."""
    if math.isnan(half):
        return "—"
    return f"{scale * mean:.{digits}f} ± {scale * half:.{digits}f}{unit}"


def method_cells(measured: Measured, metric: str, scale: float = 1.0, digits: int = 3,
                 unit: str = "") -> Tuple[str, str]:
    """``(mean over seeds ± 95% over the episodes of the seed-averaged values, mean ±
    Student's t 95% over the seeds' means)`` of one metric."""
    values = measured.values[metric]
    episodes = mean_and_interval(values.mean(axis=0))
    seeds = seed_interval(values.mean(axis=1))
    return (interval_text(episodes["mean"], episodes["ci95"], scale, digits, unit),
            interval_text(seeds["mean"], seeds["ci95"], scale, digits, unit))


def steps_text(measured: Measured) -> str:
    """The steps each seed reached, ``"1,180"`` or ``"1,180 / 1,212"``."""
    return " / ".join(f"{s:,}" for s in measured.steps)


def per_seed_table(rows: Sequence[Tuple[str, str, Measured, Sequence[Optional[str]]]],
                   headers: Sequence[str], setting: str, scale: float = 1.0,
                   digits: int = 3, unit: str = "") -> List[str]:
    """Markdown lines, one row per method, setting and seed: for each ``(label,
    setting's value, measured, metrics)`` of ``rows`` and each seed, that seed's mean and
    95% interval over the episodes of each metric (one per header; ``None``: "none")."""
    lines = [f"| method | seed | steps reached | {setting} | " + " | ".join(headers) + " |",
             "| --- " * (4 + len(headers)) + "|"]
    for label, value, measured, metrics in rows:
        for i, seed in enumerate(measured.seeds):
            cells = []
            for metric in metrics:
                if metric is None:
                    cells.append("none")
                    continue
                result = mean_and_interval(measured.values[metric][i])
                cells.append(interval_text(result["mean"], result["ci95"], scale, digits,
                                           unit))
            lines.append(f"| {label} | {seed} | {measured.steps[i]:,} | {value} | "
                         + " | ".join(cells) + " |")
    return lines


def paired_table(entries: Dict[Tuple[str, str], Measured], pairs: Sequence[Tuple[str, str]],
                 settings: Sequence[str], metric: Callable[[str], str], what: str,
                 setting: str, lower_is_better: bool, scale: float = 1.0,
                 digits: int = 3) -> List[str]:
    """Markdown lines: for each pair ``(a, b)`` of methods and each setting where both
    were evaluated, ``a − b`` on the same episodes (the values averaged over the seeds
    both have; ``metric(name)`` is the method's metric): the mean difference, its 95%
    interval, the paired t-test's p-value, the episodes and the seeds on which each
    is better (lower is better if ``lower_is_better``).

    Raises:
      ValueError: the two were evaluated on other episodes."""
    lines = [f"| paired {what} difference (same episodes) | {setting} | seeds | a − b | "
             "95% interval | p-value | episodes a better / b better | "
             "seeds a better / b better |", "| --- " * 8 + "|"]
    for a, b in pairs:
        for value in settings:
            if (a, value) not in entries or (b, value) not in entries:
                continue
            first, second = entries[a, value], entries[b, value]
            if first.digest != second.digest:
                raise ValueError(f"{a} and {b} were evaluated on other episodes "
                                 f"({setting} {value})")
            seeds = [s for s in first.seeds if s in second.seeds]
            if not seeds:
                continue
            x = first.values[metric(a)][[first.seeds.index(s) for s in seeds]]
            y = second.values[metric(b)][[second.seeds.index(s) for s in seeds]]
            d = paired_difference(x.mean(axis=0), y.mean(axis=0))
            by_seed = x.mean(axis=1) - y.mean(axis=1)
            better = (by_seed < 0) if lower_is_better else (by_seed > 0)
            worse = (by_seed > 0) if lower_is_better else (by_seed < 0)
            a_wins, b_wins = (d["wins_b"], d["wins_a"]) if lower_is_better else \
                (d["wins_a"], d["wins_b"])
            # below float64's range the t-test's p-value underflows to 0
            p_value = f"{d['p_value']:.2g}" if d["p_value"] > 0 else "< 1e-300"
            lines.append(
                f"| {a} − {b} | {value} | {len(seeds)} | {scale * d['difference']:.{digits}f} | "
                f"[{scale * d['low']:.{digits}f}, {scale * d['high']:.{digits}f}] | "
                f"{p_value} | {a_wins} / {b_wins} | "
                f"{int(better.sum())} / {int(worse.sum())} |")
    return lines


INTERVALS_NOTE = (
    "Rows: the mean over the seeds; its interval is 95% over the test episodes of each "
    "episode's value averaged over the seeds (every seed is evaluated on the same "
    "episodes); \"across seeds\": Student's t 95% over the seeds' means (— for one "
    "seed). Paired rows: on the seed-averaged values of the seeds both methods have.")
"""What the printed tables' intervals are (printed under them)."""
