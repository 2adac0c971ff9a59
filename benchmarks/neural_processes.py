r"""CNP, attentive NP and MAML on sinusoids at the same meta-training wall time.

    PYTHONPATH=. python benchmarks/neural_processes.py --seconds=150 --out=runs/np_wall
    PYTHONPATH=. python benchmarks/neural_processes.py --out=runs/np_wall --analyse_only

Each of experiments/sinusoid/{cnp,anp,maml}.gin is meta-trained (10-shot tasks) by
``python -m metalearn.train`` stopped with SIGTERM after ``--seconds`` of wall time
(``timeout -s TERM``: the step under way finishes and is checkpointed), then evaluated
by ``python -m metalearn.evaluate`` on the same 600 test tasks at 5 and 10 shots (the
evaluation files' ``episodes`` digests agree). Prints a markdown table of the query MSE
(of the predictive mean for the neural processes; after 10 inner steps for MAML) and
NLL with 95% intervals, the steps each run reached, and paired differences on the same
episodes (``metalearn.statistics.paired_difference``). The timings are those of
whatever else the machine runs: give it the cores to itself for a fair comparison.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app, flags

from metalearn.statistics import paired_difference

flags.DEFINE_integer("seconds", 150, "Meta-training wall time of each method.")
flags.DEFINE_string("out", "runs/np_wall", "Folder of the three workdirs.")
flags.DEFINE_bool("analyse_only", False, "Only read the workdirs' evaluations.")
FLAGS = flags.FLAGS

METHODS = ("cnp", "anp", "maml")
SHOTS = (5, 10)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(name: str, seconds: int, out: str) -> None:
    workdir = os.path.join(out, name)
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run(["timeout", "-s", "TERM", str(seconds), sys.executable, "-m",
                    "metalearn.train", f"--gin_file=experiments/sinusoid/{name}.gin",
                    f"--workdir={workdir}", "--gin_param=Loop.num_steps=1000000",
                    "--gin_param=Loop.log_every=1000",
                    "--gin_param=Loop.checkpoint_every=1000000"], cwd=ROOT, env=env)
    for shots in SHOTS:
        subprocess.run([sys.executable, "-m", "metalearn.evaluate", f"--workdir={workdir}",
                        f"--gin_param=Sinusoid.shots={shots}",
                        f"--output=eval_{shots}shot.json"], cwd=ROOT, env=env, check=True)


def per_task(report: dict, name: str):
    """``(mse values, nll values or None, steps key)`` of one evaluation."""
    if name == "maml":
        key = max(report["per_task"], key=int)
        return report["per_task"][key]["loss"], None, key
    return report["per_task"]["0"]["mse"], report["per_task"]["0"]["loss"], "0"


def analyse(out: str) -> str:
    lines = ["| method | steps reached | shots | query MSE | query NLL |",
             "| --- | --- | --- | --- | --- |"]
    values = {}
    for name in METHODS:
        for shots in SHOTS:
            with open(os.path.join(out, name, f"eval_{shots}shot.json")) as f:
                report = json.load(f)
            reached = report["checkpoint_step"]  # where SIGTERM stopped it
            mse, nll, key = per_task(report, name)
            values[name, shots] = (mse, report["episodes"])
            result = report["results"][key]
            mse_text = f"{result['mse' if nll else 'loss']['mean']:.3f} ± " \
                       f"{result['mse' if nll else 'loss']['ci95']:.3f}"
            nll_text = (f"{result['loss']['mean']:.3f} ± {result['loss']['ci95']:.3f}"
                        if nll else "none (a point prediction)")
            steps = f" (after {key} inner steps)" if name == "maml" else ""
            lines.append(f"| {name}{steps} | {reached} | {shots} | {mse_text} | {nll_text} |")
    lines += ["", "| paired MSE difference (same episodes) | shots | a − b | 95% interval | "
              "p-value | episodes a better / b better |", "| --- | --- | --- | --- | --- | --- |"]
    for a, b in (("cnp", "maml"), ("anp", "maml"), ("anp", "cnp")):
        for shots in SHOTS:
            (mse_a, digest_a), (mse_b, digest_b) = values[a, shots], values[b, shots]
            if digest_a != digest_b:
                raise ValueError(f"{a} and {b} were evaluated on other episodes at "
                                 f"{shots} shots")
            d = paired_difference(mse_a, mse_b)
            lines.append(f"| {a} − {b} | {shots} | {d['difference']:.3f} | "
                         f"[{d['low']:.3f}, {d['high']:.3f}] | {d['p_value']:.2g} | "
                         f"{d['wins_b']} / {d['wins_a']} |")
    return "\n".join(lines)


def main(argv) -> None:
    del argv
    if not FLAGS.analyse_only:
        os.makedirs(FLAGS.out, exist_ok=True)
        for name in METHODS:
            run(name, FLAGS.seconds, FLAGS.out)
    print(analyse(FLAGS.out))


if __name__ == "__main__":
    app.run(main)
