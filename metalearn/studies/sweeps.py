"""Sweeps over gin bindings: axes, run directories, validation and resumable execution.

A sweep is a set of base gin files and bindings plus *axes*: each axis is a gin binding
key with a list of values. Plain axes combine as a cartesian product; a *zipped group*
of axes (equal lengths) advances together, contributing one factor to the product.
Seeds are an axis like any other (``Runtime.seed = [0, 1, 2]``).

Every run trains in its own workdir ``ROOT/<name>``, the name made of its bindings
(``GradientDescent.learning_rate=0.01,Runtime.seed=0``), as a separate
process (``python -m metalearn.sweep --execute=WORKDIR``: ``metalearn.train``'s calls,
then ``metalearn.evaluate``'s if asked); the workdir holds ``config.gin``,
``operative_config.gin``, ``sweep_run.json`` (the run's bindings, its config files
relative to the repository root, or absolute outside it, and its ``--module`` files),
``train.log`` and, evaluated, ``eval.json``. A run whose ``metrics.json`` reports the final step is skipped; any other
run is started again with the same command, which resumes from its latest checkpoint.

A sweep file is a gin file binding the configurable ``sweep``::

    sweep.gin_files = ['sinusoid/maml.gin']
    sweep.gin_params = ['Loop.num_steps = 5000']
    sweep.axes = {'GradientDescent.learning_rate': [0.001, 0.01, 0.1],
                  'Runtime.seed': [0, 1]}
    sweep.zipped = [{'GradientDescent.steps': [1, 5], 'evaluate.inner_steps': [(1,), (5,)]}]
    sweep.eval_params = ["Experiment.formulation = @MapFn()"]   # with --evaluate
    sweep.modules = ['my_rule.py']   # imported before gin parses, in every run too

Axis values in a sweep file are gin literals; a string starting with ``@`` or ``%`` is
written into the binding as is (a configurable reference or a macro), e.g.
``'Learner.adapter': ['@GradientDescent()', '@MetaSGD()']``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import itertools
import json
import os
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import gin

from metalearn.flags import resolve_gin_files
from metalearn.runs.experiment import build_experiment, parse_config
from metalearn import _ray, repository
from metalearn.repository import from_repository, portable
from metalearn.runs.files import read_json, write_json_results, write_text
from metalearn.runs.modules import UntrustedModulesError, canonical, import_modules
from metalearn.runs.gin_text import keyed_statements
from metalearn.runs.validation import check_tasks_and_outputs
from metalearn.runs.workdir import Workdir
from metalearn.studies.results import is_evaluated, is_finished, is_trained
from metalearn.training import evaluate, restore, train
from metalearn.training.evaluation import report_figures

_KEY = re.compile(r"^([\w.]+/)*[\w.]+\.\w+$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+\-]+")

Binding = Tuple[str, str]  # (gin key, value as gin text)


class SweepError(ValueError):
    """A sweep is malformed or one of its bindings does not configure a run."""


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a sweep.

    Attributes:
      name: the workdir's name, made of the bindings.
      bindings: the swept bindings, ``(key, gin value text)`` in axis order.
      workdir: where it trains.
      num_steps: its ``Loop.num_steps`` (a run is finished at that step).
    """
    name: str
    bindings: Tuple[Binding, ...]
    workdir: str
    num_steps: int = 0

    @property
    def gin_params(self) -> List[str]:
        return [f"{key} = {value}" for key, value in self.bindings]


def value_text(value: Any) -> str:
    """A Python value from a sweep file as gin text (``'@...'``/``'%...'`` kept raw)."""
    if isinstance(value, str) and value[:1] in ("@", "%"):
        return value
    return repr(value)


def _split_top_level(text: str) -> List[str]:
    """Splits ``a, (b, c), 'd,e'`` at the commas outside brackets and quotes."""
    items, depth, quote, current = [], 0, None, ""
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(current.strip())
            current = ""
            continue
        current += char
    if quote or depth:
        raise SweepError(f"unbalanced brackets or quotes in {text!r}")
    if current.strip():
        items.append(current.strip())
    return items


def check_key(key: str) -> str:
    """Returns ``key`` if it looks like a gin binding key (``[scope/]Name.param``)."""
    key = key.strip()
    if not _KEY.match(key):
        raise SweepError(f"axis key {key!r} is not a gin binding key such as "
                         "'GradientDescent.learning_rate'")
    return key


def parse_axis(text: str) -> Tuple[str, List[str]]:
    """Parses a command-line axis ``'Key.param=[v1, v2, ...]'`` into key and value texts.

    Values are gin text (``0.01``, ``'relu'``, ``(40, 40)``, ``@GradientDescent()``).
    """
    key, sep, values = text.partition("=")
    values = values.strip()
    if not sep or not (values.startswith("[") and values.endswith("]")):
        raise SweepError(f"axis {text!r} must look like 'Configurable.parameter=[v1, v2]'")
    items = _split_top_level(values[1:-1])
    if not items:
        raise SweepError(f"axis {text!r} has no values")
    return check_key(key), items


def add_axes(axes: Dict[str, List[str]], texts: Sequence[str], what: str = "--axis",
             taken: Sequence[str] = ()) -> Dict[str, List[str]]:
    """Adds the parsed axes ``texts`` to ``axes`` (and returns it).

    Raises:
      SweepError: a key given twice (among ``texts``, already in ``axes``, or in
        ``taken``, e.g. another kind of axis): one of its value lists would be dropped.
    """
    for text in texts:
        key, values = parse_axis(text)
        if key in axes or key in taken:
            earlier = axes.get(key)
            raise SweepError(f"{what} key {key!r} is given twice ({text!r}"
                             f"{f' and values {earlier}' if earlier else ''}): one list of "
                             "values would be dropped; give each key once, with all its "
                             "values")
        axes[key] = values
    return axes


@dataclasses.dataclass
class SweepSpec:
    """What a sweep runs: base gin files and bindings, product axes and zipped groups.

    Attributes:
      gin_files: gin files every run parses (paths, or paths under experiments/).
      gin_params: bindings every run applies after the files.
      axes: ``{key: [value text, ...]}``, combined as a cartesian product.
      zipped: groups of axes ``{key: [value text, ...]}`` of equal length; each group
        advances together and is one factor of the product.
      eval_params: bindings for the evaluations only (e.g. more shots, or
        ``Experiment.formulation = @MapFn()`` for a smaller evaluation graph).
      modules: the user's modules every run imports before gin parses (``.py`` files
        or dotted names; :mod:`metalearn.runs.modules`).
    """
    gin_files: List[str] = dataclasses.field(default_factory=list)
    gin_params: List[str] = dataclasses.field(default_factory=list)
    axes: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    zipped: List[Dict[str, List[str]]] = dataclasses.field(default_factory=list)
    eval_params: List[str] = dataclasses.field(default_factory=list)
    modules: List[str] = dataclasses.field(default_factory=list)

    def combinations(self) -> List[Tuple[Binding, ...]]:
        """Every run's bindings: the product of the axes and of the zipped groups."""
        seen: set = set()
        factors: List[List[Tuple[Binding, ...]]] = []
        groups = [{k: v} for k, v in self.axes.items()] + list(self.zipped)
        for group in groups:
            lengths = {key: len(values) for key, values in group.items()}
            for key in group:
                if key in seen:
                    raise SweepError(f"axis {key!r} is given twice")
                seen.add(check_key(key))
            if not group or min(lengths.values()) == 0:
                raise SweepError(f"empty axis in {group!r}")
            if len(set(lengths.values())) > 1:
                raise SweepError(f"zipped axes must have equal lengths, got {lengths}")
            factors.append([tuple((key, str(group[key][i])) for key in group)
                            for i in range(next(iter(lengths.values())))])
        return [sum(parts, ()) for parts in itertools.product(*factors)]

    def runs(self, root: str) -> List[Run]:
        """The runs, each in ``root/<name>`` (not yet validated: ``num_steps`` is 0)."""
        root = os.path.abspath(root)
        runs = [Run(run_name(b), b, os.path.join(root, run_name(b)))
                for b in self.combinations()]
        names = [r.name for r in runs]
        if len(set(names)) != len(names):
            raise SweepError(f"two runs share a workdir name: {names}")
        return runs

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def run_name(bindings: Sequence[Binding]) -> str:
    """A file-system-safe workdir name for a run's bindings (``run`` when none)."""
    if not bindings:
        return "run"
    name = ",".join(f"{key}={value}" for key, value in bindings)
    name = _UNSAFE.sub("_", name).strip("_.") or "run"
    if len(name) > 200:  # keep names legal; the hash keeps them distinct
        import hashlib
        name = name[:180] + "-" + hashlib.sha1(name.encode()).hexdigest()[:12]
    return name


def _sweep_spec(gin_files: Sequence[str] = (), gin_params: Sequence[str] = (),
               axes: Optional[Mapping[str, Sequence[Any]]] = None,
               zipped: Sequence[Mapping[str, Sequence[Any]]] = (),
               eval_params: Sequence[str] = (), modules: Sequence[str] = ()) -> SweepSpec:
    """The sweep a sweep file declares (``sweep.axes = {...}``); see the module doc."""
    as_texts = lambda group: {check_key(k): [value_text(v) for v in values]
                              for k, values in dict(group).items()}
    for name, group in [("axes", axes or {})] + [("zipped", g) for g in zipped]:
        if not isinstance(group, Mapping):
            raise SweepError(f"sweep.{name} must be a dict {{key: [values]}}, got {group!r}")
        for key, values in group.items():
            if not isinstance(values, (list, tuple)):
                raise SweepError(f"sweep axis {key!r} must be a list of values, "
                                 f"got {values!r}")
    return SweepSpec(list(gin_files), list(gin_params), as_texts(axes or {}),
                     [as_texts(g) for g in zipped], list(eval_params), list(modules))


with gin.unlock_config():  # importable even after a config was parsed (and locked)
    sweep_spec = gin.configurable("sweep")(_sweep_spec)


def load_sweep_file(path: str) -> SweepSpec:
    """Reads a sweep file (gin syntax, binding only ``sweep.*``)."""
    gin.clear_config()
    try:
        gin.parse_config_file(path)
        return sweep_spec()
    finally:
        gin.clear_config()


def _resolve(gin_files: Sequence[str]) -> List[str]:
    """The gin files as absolute paths (found as ``metalearn.train`` finds them)."""
    return [os.path.abspath(f) for f in resolve_gin_files(gin_files)]


def _check(files: Sequence[str], params: Sequence[str], tasks: bool = False) -> int:
    """Parses and builds one config; returns its ``num_steps``. With ``tasks``, also
    draws a task and checks the model's outputs against it, as training would first."""
    parse_config(files, params)
    try:
        experiment = build_experiment()
        if tasks:
            check_tasks_and_outputs(experiment)
        return experiment.loop.num_steps
    finally:
        gin.clear_config()


def _short_key(key: str) -> str:
    """``[scope/]Name.param`` with the configurable's short name, as gin_text keys it."""
    scope, _, rest = key.rpartition("/")
    selector, _, param = rest.rpartition(".")
    return f"{scope + '/' if scope else ''}{selector.rsplit('.', 1)[-1]}.{param}"


def check_params_against_axes(spec: SweepSpec) -> None:
    """Refuses a binding of the sweep's ``gin_params`` (``--gin_param``,
    ``sweep.gin_params``) on a key an axis varies: every run applies its axis value
    after the ``gin_params``, so the ``--gin_param`` would be silently dropped.

    Raises:
      SweepError: naming the key, the binding and the axis with its values.
    """
    swept = {_short_key(k): (k, values, "--axis or sweep.axes")
             for k, values in spec.axes.items()}
    swept.update({_short_key(k): (k, values, "--zip or sweep.zipped")
                  for group in spec.zipped for k, values in group.items()})
    for param in spec.gin_params:
        try:
            statements = keyed_statements((), [param])
        except Exception:  # noqa: BLE001  (bad syntax: the base config's check names it)
            continue
        for statement in statements:
            if statement.source.filename is not None or statement.key not in swept:
                continue  # bound in an included file (a base file may bind a swept key)
            key, values, source = swept[statement.key]
            raise SweepError(
                f"{key} is both swept and bound: --gin_param (or sweep.gin_params) "
                f"{param.strip()!r} binds it, and the axis {key!r} ({source}) varies it "
                f"over {values}. Each run applies its axis value last, so the --gin_param "
                "would be silently dropped: remove it, or remove the axis")


def validate(spec: SweepSpec, runs: Sequence[Run]) -> List[Run]:
    """Parses and builds every run's experiment, and checks its tasks against its
    model's outputs (:func:`metalearn.runs.validation.check_tasks_and_outputs`),
    before anything trains.

    Returns:
      The runs with ``num_steps`` filled in.

    Raises:
      SweepError: naming the base config or the binding that fails, with gin's message;
        or a ``gin_params`` binding on a key an axis varies
        (:func:`check_params_against_axes`).
    """
    files = _resolve(spec.gin_files)
    import_modules(spec.modules)
    try:
        _check(files, spec.gin_params)
    except Exception as error:  # noqa: BLE001  (any failure is the base config's)
        raise SweepError(f"the sweep's base config ({files}, {spec.gin_params}) does not "
                         f"build: {type(error).__name__}: {error}") from error
    check_params_against_axes(spec)
    if spec.eval_params:
        try:
            _check(files, spec.gin_params + spec.eval_params)
        except Exception as error:  # noqa: BLE001
            raise SweepError(f"the evaluation bindings {spec.eval_params} do not build: "
                             f"{type(error).__name__}: {error}") from error
    checked = []
    for run in runs:
        try:
            steps = _check(files, spec.gin_params + run.gin_params, tasks=True)
        except Exception as error:  # noqa: BLE001
            culprit = None
            for param in run.gin_params:  # name the first binding failing on its own
                try:
                    _check(files, spec.gin_params + [param], tasks=True)
                except Exception:  # noqa: BLE001
                    culprit = param
                    break
            what = f"binding {culprit!r}" if culprit else \
                f"the combination {run.gin_params}"
            raise SweepError(f"{what} of run {run.name!r} does not build: "
                             f"{type(error).__name__}: {error}") from error
        checked.append(dataclasses.replace(run, num_steps=steps))
    return checked


def _is_done(run: Mapping[str, Any]) -> bool:
    """Whether the run's files are complete (:func:`results.is_finished`, the rule
    ``metalearn.report`` reads too)."""
    return is_finished(run["workdir"], int(run["num_steps"]), bool(run["evaluate"]))


def train_and_evaluate(workdir: str, modules: Sequence[str] = (),
                       trust_workdir: bool = False) -> None:
    """Trains the run described by ``workdir/sweep_run.json`` (resuming from its latest
    checkpoint) unless it is finished, then evaluates it if asked and not done yet.

    This is what each run's process does (``python -m metalearn.sweep --execute=WORKDIR``):
    the same calls as ``metalearn.train`` followed by ``metalearn.evaluate``, in one
    process. The record is data: the modules it names are imported only if among
    ``modules`` (the sweep passes its own as ``--module``) or with ``trust_workdir``.

    Raises:
      UntrustedModulesError: the record (or the workdir) names modules not given.
    """
    path = Workdir(workdir).sweep_run
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no {Workdir.SWEEP_RUN} in {workdir!r}: is it a run folder of a "
                                "sweep?")
    run = read_json(path, "a sweep run record")
    keys = ("num_steps", "gin_files", "gin_params", "bindings", "evaluate", "eval_params")
    missing = [k for k in keys if k not in run] if isinstance(run, dict) else list(keys)
    if missing:
        raise ValueError(f"{path} is not a sweep run record: it lacks {missing}; the sweep "
                         "writes it (rerun python -m metalearn.sweep on its root)")
    steps = int(run["num_steps"])
    named = run.get("modules", [])  # a record from before modules were recorded names none
    if not isinstance(named, list) or not all(isinstance(m, str) for m in named):
        raise ValueError(f"{path} is not a sweep run record: 'modules' must be a list of "
                         f"module files and names, got {named!r}")
    given = {canonical(m) for m in modules}
    refused = [m for m in named if canonical(m) not in given]
    if refused and not trust_workdir:
        raise UntrustedModulesError(
            f"sweep run record {path} names code to import: {refused}. A workdir is data: "
            "nothing it names is imported unless you ask for it. If you trust it, give "
            f"each on the command line ({' '.join(f'--module={m}' for m in refused)}), or "
            "pass --trust_workdir to import whatever it names")
    if not is_trained(workdir, steps):  # gin files recorded by repository.portable
        parse_config([from_repository(f) for f in run["gin_files"]],
                     list(run["gin_params"]) + [f"{key} = {value}" for key, value in
                                                run["bindings"].items()],
                     modules=named)
        metrics = train(build_experiment(), workdir)
        print("final metrics: " + json.dumps(metrics, sort_keys=True), flush=True)
    if run["evaluate"] and not is_evaluated(workdir, steps):
        experiment = restore(workdir, gin_params=run["eval_params"],
                             modules=list(named) + list(modules),
                             trust_workdir=trust_workdir)
        report = evaluate(experiment.learner, experiment.sampler)
        report["checkpoint_step"] = experiment.restored_step
        print("evaluation: " + json.dumps(report["results"], sort_keys=True), flush=True)
        write_json_results(Workdir(workdir).evaluation(), report, report_figures(report),
                           "evaluation")  # results first, then the file


_ACTIVE: Dict[int, subprocess.Popen] = {}
_ACTIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()


def _call(args: Sequence[str], log_path: str, pass_fds: Sequence[int] = ()) -> int:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (repository.ROOT, env.get("PYTHONPATH")) if p)
    with open(log_path, "a") as log:
        with _ACTIVE_LOCK:  # no new run once the sweep is stopping
            if _STOPPING.is_set():
                return -1
            process = subprocess.Popen([sys.executable, *args], stdout=log,
                                       stderr=subprocess.STDOUT, env=env,
                                       pass_fds=tuple(pass_fds))
            _ACTIVE[process.pid] = process
        try:
            return process.wait()
        finally:
            with _ACTIVE_LOCK:
                _ACTIVE.pop(process.pid, None)


def terminate_active() -> None:
    """Terminates the run processes this process started (on interruption)."""
    with _ACTIVE_LOCK:
        processes = list(_ACTIVE.values())
    for process in processes:
        if process.poll() is None:
            process.terminate()


def execute_run(run: Dict[str, Any]) -> Dict[str, Any]:
    """Trains (and evaluates) one run in its own process unless it is done; safe to call
    on any machine that sees the workdir (also a Ray worker).

    Args:
      run: ``name``, ``bindings`` (``[(key, value text)]``), ``workdir``, ``num_steps``,
        ``gin_files``, ``gin_params``, ``evaluate``, ``eval_params`` (and ``modules``);
        saved as the workdir's ``sweep_run.json``.

    The workdir's lock file is held by this call and inherited by the run's process, so
    a second sweep never trains a run that another (even orphaned) process trains.

    Returns:
      ``{"name", "status", "pid"}``: status ``"done"`` (nothing to do), ``"ran"``,
      ``"failed"`` (with ``"log"``, ``"exit_code"`` and ``"workdir"``; the outcome is
      recorded in ``sweep_run.json`` too, for ``metalearn.report``) or ``"locked"``
      (with ``"workdir"``); ``pid``, the process that ran this call. ``"ran"`` or
      ``"failed"`` is what the run's files say
      (:func:`metalearn.studies.results.is_finished`), whatever the process's exit code.
    """
    workdir = run["workdir"]
    os.makedirs(workdir, exist_ok=True)
    lock = os.open(Workdir(workdir).sweep_lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return {"name": run["name"], "status": "locked", "pid": os.getpid(),
                    "workdir": workdir}
        saved = dict(run, bindings=dict(run["bindings"]))
        write_text(Workdir(workdir).sweep_run, json.dumps(saved, indent=2))
        if _is_done(saved):
            return {"name": run["name"], "status": "done", "pid": os.getpid()}
        log = Workdir(workdir).train_log
        # the run's modules asked for on its command line (its record is data)
        code = _call(["-m", "metalearn.sweep", "--alsologtostderr",
                      f"--execute={workdir}",
                      *[f"--module={m}" for m in run.get("modules", ())]],
                     log, pass_fds=(lock,))
        # Finished is what its files say, not its exit code: a run the sweep stopped
        # (SIGTERM, -15) after its last write is finished; one exiting 0 without them not.
        status = "ran" if _is_done(saved) else "failed"
        # The outcome, for metalearn.report (a rerun's record replaces it).
        write_text(Workdir(workdir).sweep_run, json.dumps(
            dict(saved, outcome={"status": status, "exit_code": code}), indent=2))
        if status == "failed":
            return {"name": run["name"], "status": "failed", "log": log, "pid": os.getpid(),
                    "workdir": workdir, "exit_code": code}
        return {"name": run["name"], "status": "ran", "pid": os.getpid()}
    finally:
        os.close(lock)


def run_sweep(spec: SweepSpec, root: str, parallel: int = 2, evaluate: bool = False,
              ray_address: Optional[str] = None,
              ray_cpus_per_run: float = 1.0,
              log: Callable[[str], None] = print) -> List[Dict[str, Any]]:
    """Validates every run, then trains (and evaluates) those not finished yet.

    Args:
      spec: the sweep.
      root: the sweep's directory; each run trains in ``root/<run name>``.
      parallel: runs at once as local processes (ignored with Ray).
      evaluate: evaluate each run after training, as ``metalearn.evaluate`` does, with
        ``spec.eval_params`` (writes ``eval.json``).
      ray_address: run each run as a Ray task on this cluster (``"auto"``, an address
        ``"host:6379"``, or ``"local"`` to start a local instance); ``None``: local
        processes. The root must be on a file system every node sees.
      ray_cpus_per_run: CPUs Ray reserves per run.
      log: where progress lines go.

    Returns:
      Each run's result, as :func:`execute_run` returns it.

    Raises:
      SweepError: a binding does not configure a run (before anything runs).
    """
    if int(parallel) < 1:
        raise SweepError(f"parallel must be >= 1, got {parallel}")
    runs = validate(spec, spec.runs(root))
    files = [portable(f) for f in _resolve(spec.gin_files)]  # from any directory
    modules = import_modules(spec.modules)  # as recorded: files by absolute path
    os.makedirs(os.path.abspath(root), exist_ok=True)
    write_text(Workdir(root).sweep,
               json.dumps({"spec": dict(spec.to_json(), gin_files=files, modules=modules),
                           "runs": [r.name for r in runs],
                           "evaluate": bool(evaluate)}, indent=2))
    log(f"sweep of {len(runs)} runs in {os.path.abspath(root)}")
    payloads = [dict(name=r.name, bindings=list(r.bindings), workdir=r.workdir,
                     num_steps=r.num_steps, gin_files=files,
                     gin_params=list(spec.gin_params), evaluate=bool(evaluate),
                     eval_params=list(spec.eval_params),
                     modules=modules) for r in runs]
    if ray_address:
        results = _run_on_ray(payloads, ray_address, ray_cpus_per_run)
    else:
        def one(payload):
            result = execute_run(payload)
            log(f"{result['status']:>6}  {payload['name']}")
            return result
        pool = ThreadPoolExecutor(max_workers=int(parallel))
        try:
            results = list(pool.map(one, payloads))
        except BaseException:  # interrupted (Ctrl-C, SIGTERM): stop the runs, keep results
            _STOPPING.set()
            pool.shutdown(wait=False, cancel_futures=True)
            terminate_active()
            raise
        finally:
            pool.shutdown(wait=True)
            _STOPPING.clear()
    return results


def _run_on_ray(payloads, address, cpus_per_run):
    ray, started = _ray.connect(address, "--ray_address")
    try:
        remote = ray.remote(num_cpus=cpus_per_run, max_retries=0)(execute_run)
        return ray.get([remote.remote(p) for p in payloads])
    finally:
        if started:
            ray.shutdown()
