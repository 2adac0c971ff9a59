"""Moved: ``metalearn.runs.results`` is now :mod:`metalearn.studies.results` (above training;
BUILD.md, "Migration"). Importing the old path raises an error naming the new one."""

raise ImportError("metalearn.runs.results moved to metalearn.studies.results "
                  "(sweeps and results are above training now): "
                  "from metalearn.studies import results")
