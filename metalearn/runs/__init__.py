"""Run management below training: the experiment a config builds, the workdir and the
one table of its file names (``workdir.py``), the one reader of gin text
(``gin_text.py``), checks before any work, files written atomically, the workdir lock
and the cluster wait. Sweeps and results are above training, in
:mod:`metalearn.studies`."""
