"""The process baseline: starting training imports nothing heavy of its own.

TensorFlow itself (through its bundled Keras) already imports matplotlib, scipy, h5py
and PIL when they are installed (benchmarks/README.md, "The process baseline"); what
metalearn adds on top must be only gin and its own modules, and never TFDS or Ray,
which only some loaders and the sweep's Ray path need (imported where they are used).
"""

import json
import os
import subprocess
import sys

from tests import forked

HEAVY = ("tensorflow_datasets", "matplotlib", "scipy", "h5py", "PIL", "pandas", "ray",
         "sklearn", "jax", "torch")

_SCRIPT = """
import json, sys
import tensorflow
after_tf = set(sys.modules)
import metalearn.train
added = {m.split('.')[0] for m in set(sys.modules) - after_tf}
print(json.dumps({"added": sorted(added),
                  "present": sorted(m for m in %r if m in sys.modules)}))
""" % (HEAVY,)


def _run(script: str, fresh: bool = True) -> subprocess.CompletedProcess:
    """``script`` in a fresh Python process at the repository root (``fresh=False``:
    forked after TensorFlow's import, tests/forked.py, for a script that imports
    TensorFlow before what it checks)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    start = subprocess.run if fresh else forked.run
    return start([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                 cwd=root, check=True)


def test_importing_metalearn_train_adds_only_gin_and_metalearn():
    out = _run(_SCRIPT, fresh=False)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(found["added"]) <= {"gin", "metalearn"}, found
    assert "tensorflow_datasets" not in found["present"], found
    assert "ray" not in found["present"], found


# An entry point's process (`python -m metalearn.train`, faked: the package reads
# sys.orig_argv) imports the package root lazily; a public name loads everything.
_LAZY = """
import sys
sys.orig_argv = [sys.executable, "-m", "metalearn.train"]
import metalearn
before = sorted(m for m in ("tensorflow", "keras", "gin", "metalearn.training",
                            "metalearn.adapters") if m in sys.modules)
listed = {"Learner", "training", "restore"} <= set(dir(metalearn))
from metalearn import Learner  # the first public name read: everything loads
import gin
from tensorflow.python.autograph.core import config
gin.parse_config("GradientDescent.steps = 1")  # the configurables are registered
print("LAZY", before, listed, Learner is metalearn.learners.Learner,
      metalearn.restore is metalearn.training.restore,
      any(rule.matches("metalearn.adapters") for rule in config.CONVERSION_RULES
          if hasattr(rule, "matches")))
"""

_EXPLICIT = """
import sys
sys.orig_argv = [sys.executable, "-m", "metalearn.evaluate"]
import gin
import metalearn
metalearn.import_all()
gin.parse_config("GradientDescent.steps = 1")
print("EXPLICIT", "tensorflow" in sys.modules,
      set(metalearn.__all__) <= set(vars(metalearn)))
"""

_EAGER = """
import gin
import metalearn
gin.parse_config("GradientDescent.steps = 1")
print("EAGER", set(metalearn.__all__) <= set(vars(metalearn)))
"""


def test_an_entry_points_import_of_metalearn_is_lazy_and_a_public_name_loads_all():
    out = _run(_LAZY)
    assert "LAZY [] True True True True" in out.stdout, out.stdout + out.stderr[-2000:]


def test_import_all_registers_every_configurable():
    out = _run(_EXPLICIT)
    assert "EXPLICIT True True" in out.stdout, out.stdout + out.stderr[-2000:]


def test_a_scripts_import_of_metalearn_registers_every_configurable():
    """Outside the entry points ``import metalearn`` imports everything at once, as
    before: the public names are the package's own attributes, gin knows every
    configurable."""
    out = _run(_EAGER)
    assert "EAGER True" in out.stdout, out.stdout + out.stderr[-2000:]


_THREADS = """
import tensorflow as tf
from metalearn.training import build_experiment, parse_config
parse_config(["experiments/sinusoid/maml.gin"], ["Runtime.threads = (1, 1)"])
build_experiment()
print("THREADS", tf.config.threading.get_intra_op_parallelism_threads(),
      tf.config.threading.get_inter_op_parallelism_threads())
"""


def test_experiment_threads_sizes_the_pools_before_the_runtime_starts():
    out = _run(_THREADS, fresh=False)
    assert "THREADS 1 1" in out.stdout, out.stdout + out.stderr[-2000:]


# --- floors: docs/architecture.md's table, checked on every module's imports -----------

FLOORS = {
    "metalearn._compat": 0, "metalearn.repository": 0, "metalearn.statistics": 0,
    "metalearn.atomic": 0, "metalearn.ranges": 0, "metalearn._quiet": 0,
    "metalearn.functional": 1, "metalearn.tasks": 1, "metalearn.models": 1,
    "metalearn.layers": 1, "metalearn.configurables": 1, "metalearn.flags": 1,
    "metalearn._ray": 1,
    "metalearn.pieces": 2,
    "metalearn.adapters": 3, "metalearn.heads": 3,
    "metalearn.execution": 4, "metalearn.learners": 4,
    "metalearn.outer": 5,
    "metalearn.rl": 6, "metalearn.runs": 6,
    "metalearn.training": 7, "metalearn": 7,
    "metalearn.studies": 8, "metalearn.testing": 8, "metalearn.serving": 8,
    "metalearn.keras": 8,
    "metalearn.train": 9, "metalearn.evaluate": 9, "metalearn.sweep": 9,
    "metalearn.report": 9, "metalearn.export": 9,
}
"""The one copy of the floor table in code: a module's floor is its longest dotted
prefix's (``"metalearn"``, the package's public surface, is the root module only).
A module may import its own floor and the floors below; docs/architecture.md's table
says the same (checked below)."""

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _modules(root: str = ROOT):
    """``{dotted name: file}`` of every module of the metalearn package."""
    found = {}
    for folder, _, names in os.walk(os.path.join(root, "metalearn")):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                found[dotted[:-len(".__init__")] if dotted.endswith(".__init__")
                      else dotted] = path
    return found


def _imports(path: str, modules) -> list:
    """``(line, module)`` of every metalearn module ``path`` imports, at any depth (an
    import inside a function counts: it is a dependency all the same), except under
    ``if TYPE_CHECKING:``."""
    import ast
    tree = ast.parse(open(path).read(), path)
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            skipped |= {id(n) for child in node.body for n in ast.walk(child)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:  # `from metalearn.runs import files`: the module
                full = f"{node.module}.{alias.name}"
                found.append((node.lineno, full if full in modules else node.module))
    return [(line, name) for line, name in found
            if name == "metalearn" or name.startswith("metalearn.")]


def floor_of(module: str):
    """The floor of a dotted module name, or ``None`` when the table has none."""
    if module == "metalearn":
        return FLOORS["metalearn"]
    parts = module.split(".")
    for end in range(len(parts), 1, -1):
        floor = FLOORS.get(".".join(parts[:end]))
        if floor is not None:
            return floor
    return None


def import_problems(root: str = ROOT):
    """Every module without a floor, every import from a higher floor and every import
    circle of the metalearn package under ``root``, as messages."""
    modules = _modules(root)
    problems = [f"{m} has no floor: add it to FLOORS in tests/imports_test.py and to "
                "docs/architecture.md's table" for m in sorted(modules) if floor_of(m) is None]
    graph = {}
    for module, path in sorted(modules.items()):
        graph[module] = set()
        for line, imported in _imports(path, modules):
            if imported == module:
                continue
            graph[module].add(imported)
            mine, theirs = floor_of(module), floor_of(imported)
            if None not in (mine, theirs) and theirs > mine:
                problems.append(f"{os.path.relpath(path, root)}:{line}: {module} (floor "
                                f"{mine}) imports {imported} (floor {theirs}), a higher floor")
    # Circles: depth-first search; each circle reported once, from its smallest module.
    state, stack, circles = {}, [], set()

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == "open":
                circle = stack[stack.index(imported):]
                start = circle.index(min(circle))
                circles.add(tuple(circle[start:] + circle[:start]))
            elif imported in graph and imported not in state:
                visit(imported)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    problems += [f"import circle: {' -> '.join(c + (c[0],))}" for c in sorted(circles)]
    return problems


def test_no_import_circle_and_no_import_from_a_higher_floor():
    assert import_problems() == []


def test_the_package_root_imports_no_higher_floor():
    """The root's contents are imports under ``TYPE_CHECKING``, which the check above
    skips, imported by ``import_all`` (``metalearn._contents()``): the same rule."""
    import metalearn
    contents = metalearn._contents()
    assert contents[0] == ("adapters", ()) and ("training", ("Experiment", "restore")) \
        in contents, contents
    modules = [f"metalearn.{module}" for module, _ in contents]
    assert [m for m in modules if floor_of(m) > FLOORS["metalearn"]] == []


def _package(tmp_path, files):
    for name, text in files.items():
        path = tmp_path / "metalearn" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


def test_the_check_finds_a_planted_upward_import_and_circle(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "runs/__init__.py": "",
        "runs/a.py": "def f():\n    from metalearn.training import loop\n",
        "training/__init__.py": "",
        "training/loop.py": "from metalearn.training import step\n",
        "training/step.py": "import metalearn.training.loop\n",
        "elsewhere.py": "",
    })
    problems = import_problems(root)
    assert any("runs/a.py:2: metalearn.runs.a (floor 6) imports metalearn.training.loop "
               "(floor 7)" in p for p in problems), problems
    assert "import circle: metalearn.training.loop -> metalearn.training.step -> " \
           "metalearn.training.loop" in problems, problems
    assert any(p.startswith("metalearn.elsewhere has no floor") for p in problems), problems
    assert len(problems) == 3, problems


def test_the_architecture_table_gives_the_same_floors():
    import re
    text = open(os.path.join(ROOT, "docs", "architecture.md")).read()
    documented = {}
    for floor, cell in re.findall(r"^\| (\d+) \| ([^|]*) \|", text, flags=re.M):
        for path in re.findall(r"`(metalearn/[^`]*)`", cell):
            documented[path] = int(floor)
    for module, floor in FLOORS.items():
        path = module.replace(".", "/")
        spellings = ["metalearn/__init__.py"] if module == "metalearn" else \
            [path + "/", path + ".py"]
        found = [documented[s] for s in spellings if s in documented]
        assert found == [floor], (module, floor, found)


def test_the_modules_moved_above_training_name_their_new_path():
    import pytest
    for name in ("sweeps", "results"):
        with pytest.raises(ImportError, match=f"metalearn.studies.{name}"):
            exec(f"from metalearn.runs import {name}", {})
    from metalearn.runs import cluster  # the others import as before
    assert callable(cluster.wait_for_peers)
