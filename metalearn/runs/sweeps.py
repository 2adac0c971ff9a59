"""Moved: ``metalearn.runs.sweeps`` is now :mod:`metalearn.studies.sweeps` (above training;
BUILD.md, "Migration"). Importing the old path raises an error naming the new one."""

raise ImportError("metalearn.runs.sweeps moved to metalearn.studies.sweeps "
                  "(sweeps and results are above training now): "
                  "from metalearn.studies import sweeps")
