"""Flags shared by the absl entry points (gin's conventional flag names)."""

from __future__ import annotations

import os
from typing import List, Sequence

from absl import flags

from metalearn.repository import EXPERIMENTS_DIR


def define_gin_flags() -> None:
    flags.DEFINE_multi_string("gin_file", [], "Gin config files, parsed in order. A path "
                              "not found as given is looked up under experiments/.")
    flags.DEFINE_multi_string("gin_param", [], "Gin bindings applied after the files, "
                              "e.g. --gin_param='Loop.num_steps=100'.")
    flags.DEFINE_multi_string("module", [], "A module of your own to import before gin "
                              "parses, so that its @gin.configurable classes can be "
                              "bound: a file (--module=path/to/my_rule.py) or a dotted "
                              "name (--module=my_package.my_rule); repeatable. Recorded "
                              "in the workdir (modules.json); a workdir is data: "
                              "restore, evaluation, resuming and a sweep's runs import "
                              "what it records only when given here again (or with "
                              "--trust_workdir).")
    flags.DEFINE_bool("trust_workdir", False, "Import whatever the workdir names (its "
                      "modules.json, the import lines of its config.gin) without giving "
                      "each as --module: only for a workdir you trust, as you would a "
                      "script.")


def define_determinism_flag() -> None:
    flags.DEFINE_bool("deterministic", False, "Turn on TensorFlow's op determinism and "
                      "seed every generator from Runtime.seed (the binding "
                      "Runtime.deterministic=True, recorded in config.gin): the same "
                      "config and seed then give the same weights and metrics on the "
                      "same machine.")


def determinism_params(deterministic: bool) -> List[str]:
    """The gin binding the ``--deterministic`` flag adds (none when it is off)."""
    return ["Runtime.deterministic = True"] if deterministic else []


def resolve_gin_files(paths: Sequence[str]) -> List[str]:
    """Each path as given if it exists, else under the repository's experiments/."""
    resolved = []
    for path in paths:
        candidates = [path, os.path.join(EXPERIMENTS_DIR, path)]
        found = next((c for c in candidates if os.path.isfile(c)), None)
        if found is None:
            raise FileNotFoundError(f"gin file {path!r} not found (looked in {candidates})")
        resolved.append(found)
    return resolved
