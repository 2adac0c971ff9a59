"""Bad sweeps and results: sweep axes and bindings, run files that are not JSON or not of
their structure, a report of no finished run. Cases of docs/errors.md
(tests/bad_input.py)."""

from metalearn import report
from metalearn.studies import results, sweeps
from tests.bad_input import Case, check, parametrize

TITLE = "Sweeps, results and reports"


def run_json(name, text):
    def run(tmp_path) -> None:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / name).write_text(text)
        results.load_run(str(tmp_path / "run"))
    return run


def sweep_run_without_keys(tmp_path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "sweep_run.json").write_text('{"name": "lr=0.1", "bindings": {}}')
    sweeps.train_and_evaluate(str(tmp_path / "run"))


def report_of_no_finished_run(tmp_path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.gin").write_text("Loop.num_steps = 10\n")
    report.report([str(tmp_path)], plots=False)


CASES = [
    Case("sweep axis given twice", "`--axis='Runtime.seed=[0, 1]' "
         "--axis='Runtime.seed=[2]'`", sweeps.SweepError, "--axis key 'Runtime.seed' is "
         "given twice", lambda p: sweeps.add_axes(
             {}, ["Runtime.seed=[0, 1]", "Runtime.seed=[2]"]), None, "the key"),
    Case("sweep axis without brackets", "`--axis='Runtime.seed=0,1'`", sweeps.SweepError,
         "must look like 'Configurable.parameter=[v1, v2]'",
         lambda p: sweeps.parse_axis("Runtime.seed=0,1"), None, "the axis"),
    Case("sweep axis without values", "`--axis='Runtime.seed=[]'`", sweeps.SweepError,
         "has no values", lambda p: sweeps.parse_axis("Runtime.seed=[]"), None,
         "the axis"),
    Case("sweep binding on a swept key", "`--gin_param=GradientDescent.learning_rate=0.1 "
         "--axis='GradientDescent.learning_rate=[0.01, 0.1]'`", sweeps.SweepError,
         "GradientDescent.learning_rate is both swept and bound",
         lambda p: sweeps.check_params_against_axes(sweeps.SweepSpec(
             gin_params=["GradientDescent.learning_rate=0.1"],
             axes={"GradientDescent.learning_rate": ["0.01", "0.1"]})),
         lambda p: "'GradientDescent.learning_rate=0.1' binds it, and the axis",
         "the key, the binding and the axis with its values"),
    Case("metrics.json that is not JSON", "a truncated `metrics.json`", ValueError,
         "is not valid JSON", run_json("metrics.json", '{"loss": 0.'),
         lambda p: str(p / "run" / "metrics.json"), "the file"),
    Case("metrics.json of no numbers", '`metrics.json` holding `{"loss": "low"}`',
         ValueError, "does not hold final metrics", run_json("metrics.json",
                                                             '{"loss": "low"}'),
         lambda p: str(p / "run" / "metrics.json"), "the file"),
    Case("evaluation report without results", '`eval.json` holding `{"num_tasks": 5}`',
         ValueError, "is not an evaluation report", run_json("eval.json",
                                                             '{"num_tasks": 5}'),
         lambda p: str(p / "run" / "eval.json"), "the file"),
    Case("sweep run record without a name", '`sweep_run.json` holding `{}`', ValueError,
         "is not a sweep run record", run_json("sweep_run.json", "{}"),
         lambda p: str(p / "run" / "sweep_run.json"), "the file"),
    Case("sweep run record without its settings", '`sweep_run.json` holding only '
         '`{"name", "bindings"}`, run by `--execute`', ValueError,
         "is not a sweep run record: it lacks ['num_steps'", sweep_run_without_keys,
         lambda p: str(p / "run" / "sweep_run.json"), "the file and the missing keys"),
    Case("report of runs none of which is finished", "`metalearn.report` of a folder "
         "whose run has `config.gin` and no `metrics.json`", report.IncompleteError,
         "no finished run under", report_of_no_finished_run,
         lambda p: f"unfinished: run ({p / 'run'}; at step 0)",
         "each run, its state and folder"),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
