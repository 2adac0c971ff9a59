r"""CNP, attentive NP, NP (latent path) and MAML on sinusoids at the same wall time.

    PYTHONPATH=. python benchmarks/neural_processes.py --seconds=150 --out=runs/np_wall
    PYTHONPATH=. python benchmarks/neural_processes.py --out=runs/np_wall --analyse_only
    PYTHONPATH=. python benchmarks/neural_processes.py --sampler_rate

Each of experiments/sinusoid/{cnp,anp,np,maml}.gin is meta-trained (10-shot tasks) by
``python -m metalearn.train`` stopped with SIGTERM after ``--seconds`` of wall time
(``timeout -s TERM``: the step under way finishes and is checkpointed), then evaluated
by ``python -m metalearn.evaluate`` on the same 600 test tasks at 5 and 10 shots (the
evaluation files' ``episodes`` digests agree). Prints a markdown table of the query MSE
(of the predictive mean for the neural processes, from the prior's mean z for the
NP; after 10 inner steps for MAML) and
NLL with 95% intervals, the steps each run reached, and paired differences on the same
episodes (``metalearn.statistics.paired_difference``). The timings are those of
whatever else the machine runs: give it the cores to itself for a fair comparison.

``--sampler_rate`` measures instead the episodes per second that the Gaussian-process
task prior (``metalearn.tasks.GaussianProcess``) streams through ``tf.data`` in batches
of 25, as the training loop iterates it, at 5 and 10 shots (against the meta-step's
consumption, the tasks/s the training logs print).
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from benchmarks.wall_time import run_main, stream_rate, train_and_evaluate
from metalearn.statistics import paired_difference

flags.DEFINE_integer("seconds", 150, "Meta-training wall time of each method.")
flags.DEFINE_string("out", "runs/np_wall", "Folder of the three workdirs.")
flags.DEFINE_bool("analyse_only", False, "Only read the workdirs' evaluations.")
flags.DEFINE_list("methods", list(("cnp", "anp", "np", "maml")), "Which to (re)train.")
flags.DEFINE_bool("sampler_rate", False, "Measure the GP task prior's episodes/s.")
FLAGS = flags.FLAGS

METHODS = ("cnp", "anp", "np", "maml", "in_context")
SHOTS = (5, 10)


def run(name: str, seconds: int, out: str) -> None:
    train_and_evaluate(f"experiments/sinusoid/{name}.gin", os.path.join(out, name), seconds,
                       log_every=1000,
                       evaluations=[[f"--gin_param=Sinusoid.shots={shots}",
                                     f"--output=eval_{shots}shot.json"] for shots in SHOTS])


def per_task(report: dict, name: str):
    """``(mse values, nll values or None, steps key)`` of one evaluation."""
    if name == "maml":
        key = max(report["per_task"], key=int)
        return report["per_task"][key]["loss"], None, key
    nll = "nll" if name == "np" else "loss"  # the NP's loss is the negative ELBO
    return report["per_task"]["0"]["mse"], report["per_task"]["0"][nll], "0"


def analyse(out: str) -> str:
    lines = ["| method | steps reached | shots | query MSE | query NLL |",
             "| --- | --- | --- | --- | --- |"]
    values = {}
    for name in METHODS:
        for shots in SHOTS:
            path = os.path.join(out, name, f"eval_{shots}shot.json")
            if not os.path.exists(path):  # a method not run into this folder
                continue
            with open(path) as f:
                report = json.load(f)
            reached = report["checkpoint_step"]  # where SIGTERM stopped it
            mse, nll, key = per_task(report, name)
            values[name, shots] = (mse, report["episodes"])
            result = report["results"][key]
            mse_key, nll_key = ("loss", None) if nll is None else \
                ("mse", "nll" if name == "np" else "loss")
            mse_text = f"{result[mse_key]['mean']:.3f} ± {result[mse_key]['ci95']:.3f}"
            nll_text = (f"{result[nll_key]['mean']:.3f} ± {result[nll_key]['ci95']:.3f}"
                        if nll_key else "none (a point prediction)")
            steps = f" (after {key} inner steps)" if name == "maml" else ""
            lines.append(f"| {name}{steps} | {reached} | {shots} | {mse_text} | {nll_text} |")
    lines += ["", "| paired MSE difference (same episodes) | shots | a − b | 95% interval | "
              "p-value | episodes a better / b better |", "| --- | --- | --- | --- | --- | --- |"]
    for a, b in (("cnp", "maml"), ("anp", "maml"), ("np", "maml"), ("in_context", "maml"),
                 ("anp", "cnp"), ("np", "cnp"), ("in_context", "cnp")):
        for shots in SHOTS:
            if (a, shots) not in values or (b, shots) not in values:
                continue
            (mse_a, digest_a), (mse_b, digest_b) = values[a, shots], values[b, shots]
            if digest_a != digest_b:
                raise ValueError(f"{a} and {b} were evaluated on other episodes at "
                                 f"{shots} shots")
            d = paired_difference(mse_a, mse_b)
            lines.append(f"| {a} − {b} | {shots} | {d['difference']:.3f} | "
                         f"[{d['low']:.3f}, {d['high']:.3f}] | {d['p_value']:.2g} | "
                         f"{d['wins_b']} / {d['wins_a']} |")
    return "\n".join(lines)


def sampler_rate(batches: int = 400, batch: int = 25) -> str:
    from metalearn.tasks import GaussianProcess
    return "\n".join(f"GaussianProcess, {shots} shots + {shots} queries: "
                     f"{stream_rate(GaussianProcess(shots=shots), batches, batch):,.0f} "
                     "episodes/s" for shots in SHOTS)


def main(argv) -> None:
    del argv
    run_main(FLAGS, run, analyse, sampler_rate)


if __name__ == "__main__":
    app.run(main)
