r"""Seconds to the first result, as a newcomer meets them: a command line started in a
fresh process, timed to its first progress line and to the evaluation's first figure.

    python -m benchmarks.first_result --jobs=sinusoid,omniglot --rounds=2 \
        --trees=.,/tmp/before

For each round, each job and each checkout in ``--trees`` (alternating, so that a load
on the machine falls on every tree alike), and each state of the decoded-data cache in
``--caches``, in a fresh temporary workdir:

* ``python -m metalearn.train --gin_file=<job's file> --gin_param=Loop.num_steps=<N>``:
  the time from the command's start to its first ``step`` line (data prepared, the step
  traced and run) and to its exit;
* ``python -m metalearn.evaluate --workdir=<that run>``: the time to its first figure
  (``... inner steps: ...``) and to its exit.

The loaders keep decoded arrays in a per-user folder by default (``METALEARN_CACHE_DIR``,
:func:`metalearn.tasks.datasets.default_cache_dir`); the benchmark gives each round, job
and tree a temporary one of its own, never the user's: ``cold`` runs with it empty (a
newcomer's very first run: the training decodes the data and keeps them; its evaluation
finds them kept), ``warm`` then runs again with what the cold run kept (every later run).
A checkout without the default cache decodes in both. ``--first_line_only`` stops each
training at its first line and skips the evaluation: more rounds of that line in the
same time.

The jobs: ``sinusoid`` is the README's main command shortened to ``--steps`` meta-steps
(its evaluation is the main job's: 600 tasks after 1, 5 and 10 inner steps);
``omniglot`` is ProtoNets on the minimal Omniglot split (``../shared/data/omniglot``),
5-way 1-shot, 600 test tasks. Each checkout runs its own code (its folder first on
``PYTHONPATH``, the command run from it). Prints one JSON line per run, then a table of
the medians (and ranges) per job, tree and cache state.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Mapping, Optional, Sequence

from absl import app, flags

JOBS = {
    "sinusoid": "experiments/sinusoid/maml.gin",
    "omniglot": "experiments/omniglot/minimal/protonets_5way_1shot.gin",
}
CACHES = ("cold", "warm")
CACHE_DIR_ENV = "METALEARN_CACHE_DIR"  # metalearn.tasks.datasets.base.CACHE_DIR_ENV

flags.DEFINE_list("jobs", list(JOBS), f"Jobs to time, of {sorted(JOBS)}.")
flags.DEFINE_list("trees", ["."], "Checkouts of metalearn to compare (the first is 'this').")
flags.DEFINE_integer("rounds", 2, "Rounds; each runs every job in every tree once per "
                     "cache state.")
flags.DEFINE_integer("steps", 200, "Meta-steps of each training run.")
flags.DEFINE_bool("first_line_only", False, "Stop each training at its first step line "
                  "and skip the evaluation: more rounds of the first line in the time.")
flags.DEFINE_list("caches", list(CACHES), "States of the decoded-data cache to time, in "
                  "order: 'cold' (an empty folder), 'warm' (what the cold run kept).")
FLAGS = flags.FLAGS

STEP_LINE = re.compile(r"\] step \d+/\d+ ")
FIGURE_LINE = re.compile(r"^\d+ inner steps: ")


def timed(command: Sequence[str], cwd: str, marker: "re.Pattern[str]",
          env: Optional[Mapping[str, str]] = None,
          stop: bool = False) -> Dict[str, Optional[float]]:
    """Runs ``command`` in ``cwd`` with its folder first on ``PYTHONPATH`` (and ``env``
    added to the environment): seconds from the start to the first output line matching
    ``marker`` (``None`` if none) and to the exit (``None`` where ``stop`` ended the
    command at that line). Raises ``RuntimeError`` with the output's tail if the command
    fails."""
    env = dict(os.environ, **(env or {}), PYTHONPATH=os.path.abspath(cwd))
    start = time.perf_counter()
    first: Optional[float] = None
    lines: List[str] = []
    with subprocess.Popen(list(command), cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as process:
        for line in process.stdout:
            lines.append(line)
            if first is None and marker.search(line):
                first = time.perf_counter() - start
                if stop:
                    process.terminate()
                    break
        code = process.wait()
    total = time.perf_counter() - start
    if code != 0 and not (stop and first is not None):
        raise RuntimeError(f"{' '.join(command)} exited with {code}:\n"
                           + "".join(lines[-30:]))
    return {"first_s": None if first is None else round(first, 2),
            "total_s": None if stop and first is not None else round(total, 2)}


def run_job(job: str, tree: str, steps: int, cache_dir: str, cache: str = "cold",
            first_line_only: bool = False) -> Dict[str, object]:
    """One job in one checkout: training, then evaluation, each in a fresh process, with
    ``cache_dir`` as the loaders' default cache folder (``cache`` names its state);
    ``first_line_only`` stops the training at its first line and skips the evaluation."""
    env = {CACHE_DIR_ENV: cache_dir}
    with tempfile.TemporaryDirectory(prefix="first_result_") as folder:
        workdir = os.path.join(folder, "run")
        train = timed([sys.executable, "-m", "metalearn.train", f"--gin_file={JOBS[job]}",
                       f"--workdir={workdir}", f"--gin_param=Loop.num_steps={steps}"],
                      tree, STEP_LINE, env, stop=first_line_only)
        evaluate = {"first_s": None, "total_s": None} if first_line_only else timed(
            [sys.executable, "-m", "metalearn.evaluate", f"--workdir={workdir}"], tree,
            FIGURE_LINE, env)
    return {"job": job, "tree": tree, "cache": cache, "steps": steps,
            "train_first_line_s": train["first_s"], "train_s": train["total_s"],
            "evaluate_first_figure_s": evaluate["first_s"], "evaluate_s": evaluate["total_s"]}


def run_round(job: str, tree: str, steps: int, caches: Sequence[str],
              first_line_only: bool = False) -> List[Dict[str, object]]:
    """``job`` in ``tree`` once per cache state of ``caches``, all with one temporary
    cache folder, empty at first: ``cold`` runs wherever it comes, ``warm`` after it."""
    with tempfile.TemporaryDirectory(prefix="first_result_cache_") as cache_dir:
        return [run_job(job, tree, steps, cache_dir, cache, first_line_only)
                for cache in caches]


def table(rows: Sequence[Dict[str, object]]) -> str:
    """Medians per job, tree and cache state, with their range (min-max) where there are
    several runs, as a Markdown table."""
    keys = ("train_first_line_s", "train_s", "evaluate_first_figure_s", "evaluate_s")
    lines = ["| job | tree | cache | runs | " + " | ".join(keys) + " |",
             "| --- " * (4 + len(keys)) + "|"]
    for job in dict.fromkeys(r["job"] for r in rows):
        for tree in dict.fromkeys(r["tree"] for r in rows):
            for cache in dict.fromkeys(r.get("cache", "-") for r in rows):
                mine = [r for r in rows if r["job"] == job and r["tree"] == tree
                        and r.get("cache", "-") == cache]
                if not mine:
                    continue
                cells = []
                for key in keys:
                    values = [r[key] for r in mine if r[key] is not None]
                    cell = f"{statistics.median(values):.1f}" if values else "-"
                    if len(values) > 1:
                        cell += f" ({min(values):.1f}-{max(values):.1f})"
                    cells.append(cell)
                lines.append(f"| {job} | {tree} | {cache} | {len(mine)} | "
                             + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    unknown = sorted(set(FLAGS.jobs) - set(JOBS))
    if unknown:
        raise app.UsageError(f"--jobs: unknown {unknown}; known: {sorted(JOBS)}")
    if sorted(set(FLAGS.caches)) != sorted(FLAGS.caches) or \
            not set(FLAGS.caches) <= set(CACHES) or FLAGS.caches[:1] == ["warm"]:
        raise app.UsageError(f"--caches: {CACHES} or 'cold' alone, got {FLAGS.caches}")
    rows = []
    for round_ in range(FLAGS.rounds):
        for job in FLAGS.jobs:
            for tree in FLAGS.trees:
                for row in run_round(job, tree, FLAGS.steps, FLAGS.caches,
                                     FLAGS.first_line_only):
                    row = {"round": round_ + 1, **row}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    print(table(rows))


if __name__ == "__main__":
    app.run(main)
