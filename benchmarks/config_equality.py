r"""Checks that the runnable gin files of experiments/ configure the same experiments as
those of another git revision (e.g. after moving bindings between files).

    PYTHONPATH=. python benchmarks/config_equality.py --base=main    # ~5 minutes on 2 cores

For every runnable file present in both trees (a file outside setups/, learners/,
budgets/ and sweeps/ whose header does not say "Not run on its own"), each tree is
parsed (with this checkout's ``metalearn``) and compared two ways:

* bindings: every binding with macros substituted (``Loop.num_steps = %NUM_STEPS`` with
  ``NUM_STEPS = 60000`` reads as ``60000``), macro definitions and bindings equal to the
  configurable's default left out; a difference in a binding that the built experiment
  never reads (gin's operative config) is reported apart, as cosmetic;
* what is built: the classes of learner, adapter, sampler, outer rule and formulation,
  the loop's step counts, the meta-batch size, the outer optimiser's config, and a hash
  of the names, shapes and initial values of every meta-variable.

Prints one JSON line: counts, and the files whose build or used bindings differ.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import inspect
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLES = ("setups", "learners", "budgets", "sweeps")


def runnable_files(root: str):
    """The runnable gin files under ``root/experiments``, relative to ``root``."""
    found = []
    for path in sorted(glob.glob(os.path.join(root, "experiments", "**", "*.gin"),
                                 recursive=True)):
        rel = os.path.relpath(path, root)
        if rel.split(os.sep)[1] in ROLES or os.path.basename(rel) in ("smoke.gin",
                                                                       "resnet12.gin"):
            continue
        with open(path) as f:
            header = "".join(line for line in f if line.startswith("#"))
        if "Not run on its own" not in header:
            found.append(rel)
    return found


def _worker(files):
    """In the tree given as working directory: bindings, operative keys, fingerprint."""
    import gin
    import numpy as np
    from gin import config
    import metalearn  # noqa: F401
    from metalearn.training import build_experiment, parse_config

    def resolve(value, macros):
        if isinstance(value, config.ConfigurableReference):
            if value.configurable.selector == "gin.macro":
                return resolve(macros[value.scopes[-1]], macros)
            return "@" + "/".join(list(value.scopes) + [value.configurable.selector]) + \
                ("()" if value.evaluate else "")
        if isinstance(value, (list, tuple)):
            return type(value)(resolve(v, macros) for v in value)
        if isinstance(value, dict):
            return {k: resolve(v, macros) for k, v in value.items()}
        return value

    def defaults(fn):
        found = {}
        for target in ([c.__init__ for c in reversed(fn.__mro__)] if inspect.isclass(fn)
                       else [fn]):
            try:
                parameters = inspect.signature(target).parameters.values()
            except (TypeError, ValueError):
                continue
            found.update({p.name: p.default for p in parameters
                          if p.default is not inspect.Parameter.empty})
        return found

    result = {}
    for path in files:
        parse_config([path], [])
        macros = {scope: params.get("value") for (scope, selector), params in
                  config._CONFIG.items() if selector == "gin.macro"}
        bindings = {}
        for (scope, selector), params in config._CONFIG.items():
            if selector == "gin.macro":
                continue
            known = defaults(config._REGISTRY[selector].wrapped)
            for param, value in params.items():
                value = resolve(value, macros)
                if param in known and type(known[param]) == type(value):
                    try:
                        if known[param] == value:
                            continue
                    except Exception:  # noqa: BLE001  (an uncomparable default)
                        pass
                bindings[f"{scope + '/' if scope else ''}{selector}.{param}"] = repr(value)
        experiment = build_experiment()
        variables = experiment.learner.meta_variables
        variables = variables() if callable(variables) else variables
        digest = hashlib.sha1()
        for v in variables:
            array = np.asarray(v.numpy() if hasattr(v, "numpy") else v)
            digest.update(str((getattr(v, "path", getattr(v, "name", "")),
                               array.shape)).encode())
            digest.update(array.tobytes())
        optimizer = getattr(experiment.outer_rule, "optimizer", None)
        try:
            optimizer = json.dumps(optimizer.get_config(), sort_keys=True, default=str)
        except AttributeError:
            optimizer = type(optimizer).__name__
        built = {"classes": [type(x).__name__ for x in (
                     experiment.learner, experiment.learner.adapter, experiment.sampler,
                     experiment.outer_rule, experiment.formulation)],
                 "loop": [experiment.loop.num_steps, experiment.loop.log_every,
                          experiment.loop.checkpoint_every],
                 "meta_batch": getattr(experiment, "meta_batch_size", None),
                 "optimizer": optimizer, "meta_variables": len(variables),
                 "weights": digest.hexdigest()}
        operative = sorted((s + "/" if s else "") + sel + "." + p
                           for (s, sel), ps in config._OPERATIVE_CONFIG.items() for p in ps)
        result[path] = {"bindings": bindings, "operative": operative, "built": built}
        gin.clear_config()
    return result


def _run_worker(tree: str, files, out: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", out, *files],
                   cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="the git revision compared with")
    parser.add_argument("--only", nargs="+", help="compare only these runnable files "
                        "(paths from the repository root)")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        out, files = args.worker[0], args.worker[1:]
        with open(out, "w") as f:
            json.dump(_worker(files), f)
        return 0
    with tempfile.TemporaryDirectory() as base_tree:
        archive = subprocess.run(["git", "archive", args.base, "experiments"], cwd=ROOT,
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", base_tree], input=archive, check=True)
        files = sorted(set(runnable_files(base_tree)) & set(runnable_files(ROOT)))
        if args.only:
            files = [f for f in files if f in set(args.only)]
        old = _run_worker(base_tree, files, os.path.join(base_tree, "old.json"))
        new = _run_worker(ROOT, files, os.path.join(base_tree, "new.json"))
    summary = {"base": args.base, "files": len(files), "bindings_identical": 0,
               "unused_bindings_only": 0, "built_identical": 0, "differ": {}}
    for path in files:
        a, b = old[path], new[path]
        used = set(a["operative"]) | set(b["operative"])
        keys = [k for k in set(a["bindings"]) | set(b["bindings"])
                if a["bindings"].get(k) != b["bindings"].get(k)]
        if not keys:
            summary["bindings_identical"] += 1
        elif not [k for k in keys if k in used or k.split(".")[-2] == "evaluate"]:
            summary["unused_bindings_only"] += 1
        if a["built"] == b["built"]:
            summary["built_identical"] += 1
        used_keys = sorted(k for k in keys if k in used or k.split(".")[-2] == "evaluate")
        if a["built"] != b["built"] or used_keys:
            summary["differ"][path] = {
                "built": {k: [a["built"][k], b["built"][k]] for k in a["built"]
                          if a["built"][k] != b["built"][k]},
                "used_bindings": {k: [a["bindings"].get(k), b["bindings"].get(k)]
                                  for k in used_keys}}
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
