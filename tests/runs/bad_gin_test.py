"""Bad gin files and command lines, found while parsing (``parse_config``): unknown
configurables and parameters, syntax, includes, macros, bytes that are not UTF-8, gin
files that moved or are not found, and role files in the wrong order; each error names
the file and line. Cases of docs/errors.md (tests/bad_input.py)."""

from metalearn.flags import resolve_gin_files
from metalearn.repository import MovedGinFileError
from metalearn.runs import validation
from metalearn.runs.validation import RoleOrderError
from metalearn.training import build_experiment, parse_config
from tests.bad_input import Case, check, gin_case, parametrize

TITLE = "Gin files and command lines"


def gin_text(name, text, params=()):
    """Parses ``<tmp>/<name>`` holding ``text`` (and ``params``), then builds."""
    def run(tmp_path) -> None:
        (tmp_path / name).write_text(text.replace("<tmp>", str(tmp_path)))
        parse_config([str(tmp_path / name)], list(params))
        build_experiment()
    return run


def include_cycle(tmp_path) -> None:
    (tmp_path / "b.gin").write_text(f"Sinusoid.shots = 5\ninclude '{tmp_path}/a.gin'\n")
    gin_text("a.gin", "include '<tmp>/b.gin'\n")(tmp_path)


def non_utf8_gin_file(tmp_path) -> None:
    (tmp_path / "bad.gin").write_bytes(b"include 'experiments/sinusoid/maml.gin'\n"
                                       b"# caf\xe9\n")
    parse_config([str(tmp_path / "bad.gin")])


CASES = [
    gin_case("unknown configurable", "GradientDescnet.steps = 5", ValueError,
             "No configurable matching 'GradientDescnet'"),
    gin_case("unknown parameter", "Experiment.num_stepz = 5", ValueError,
             "doesn't have a parameter named 'num_stepz'"),
    Case("gin file not found", "`--gin_file=nowhere.gin`", FileNotFoundError,
         "gin file 'nowhere.gin' not found", lambda p: resolve_gin_files(["nowhere.gin"]),
         None, "the places looked in"),
    Case("gin file that moved", "`--gin_file=experiments/omniglot/base.gin`",
         MovedGinFileError, "moved to experiments/setups/omniglot_common.gin",
         lambda p: resolve_gin_files(["experiments/omniglot/base.gin"]), None,
         "the new path (CHANGELOG.md's table, as data)"),
    gin_case("bad gin syntax", "Loop.num_steps = = 5", SyntaxError,
             "bad gin syntax in gin file"),
    Case("bad gin syntax in an included file", "`include 'bad.gin'`, whose line 1 is "
         "`Sinusoid.shots = (5`", SyntaxError, "a bracket or quote opened on this line or "
         "before is not closed",
         lambda p: (p / "bad.gin").write_text("Sinusoid.shots = (5\n") and gin_text(
             "top.gin", "include '<tmp>/bad.gin'\n")(p),
         lambda p: f'"{p / "bad.gin"}", line 1', "both files and lines"),
    Case("bad gin syntax in a binding", "`--gin_param='Loop.num_steps = = 2'`",
         SyntaxError, "bad gin syntax in --gin_param 'Loop.num_steps = = 2'",
         gin_text("ok.gin", "include 'experiments/sinusoid/maml.gin'\n",
                  ["Loop.num_steps = = 2"]), None, "the binding"),
    Case("gin include cycle", "`a.gin` includes `b.gin`, which includes `a.gin`",
         validation.GinIncludeError, "a.gin' includes itself", include_cycle,
         lambda p: f'"{p / "b.gin"}", line 2', "each include's file and line"),
    Case("gin include not found", "`include 'nowhere.gin'`", OSError,
         "Unable to open file: nowhere.gin", gin_text("top.gin", "include 'nowhere.gin'\n"),
         lambda p: f'In file "{p / "top.gin"}", line 1', "gin file and line (gin's own)"),
    Case("gin include of a file that moved", "`include 'experiments/mini_imagenet/smoke.gin'`",
         MovedGinFileError, "moved to experiments/budgets/smoke.gin",
         gin_text("top.gin", "include 'experiments/mini_imagenet/smoke.gin'\n"),
         lambda p: f'In file "{p / "top.gin"}", line 1',
         "the new path, the include's file and line"),
    gin_case("gin macro never given a value", "Sinusoid.shots = %SHOTZ", ValueError,
             "gin macro %SHOTZ is used but never given a value"),
    Case("non-UTF-8 byte in a gin file", "`# caf\\xe9` (Latin-1) in `bad.gin`",
         SyntaxError, "line 2, column 6: byte 0xe9 is not UTF-8", non_utf8_gin_file,
         lambda p: f'bad gin file "{p / "bad.gin"}"', "the file, line, column and byte"),
    Case("a setup after a learner", "`--gin_file=experiments/learners/reptile.gin "
         "--gin_file=experiments/setups/sinusoid.gin`", RoleOrderError,
         "comes after the learner file 'experiments/learners/reptile.gin': give setups "
         "before learners", lambda p: parse_config(["experiments/learners/reptile.gin",
                                                    "experiments/setups/sinusoid.gin"]),
         None, "both files and the key the setup re-binds"),
    Case("a learner re-binding an earlier learner", "`--gin_file=experiments/setups/"
         "sinusoid.gin --gin_file=experiments/learners/reptile.gin "
         "--gin_file=experiments/learners/maml.gin`", RoleOrderError,
         "learner file 'experiments/learners/maml.gin' re-binds",
         lambda p: parse_config(["experiments/setups/sinusoid.gin",
                                 "experiments/learners/reptile.gin",
                                 "experiments/learners/maml.gin"]),
         None, "both files, the key and its lines"),
    Case("a budget leaving part of another", "`... --gin_file=experiments/budgets/smoke.gin "
         "--gin_file=experiments/budgets/cpu.gin`", RoleOrderError,
         "the later does not re-bind Loop.log_every",
         lambda p: parse_config(["experiments/setups/sinusoid.gin",
                                 "experiments/learners/maml.gin",
                                 "experiments/budgets/smoke.gin",
                                 "experiments/budgets/cpu.gin"]),
         None, "both files and every key left over"),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
