"""Studies over runs, above training: sweeps that launch many runs (``sweeps.py``) and
the results that compare them (``results.py``: tables, seed intervals, paired
comparisons; the statistics themselves are :mod:`metalearn.statistics`). Consumers of
``metalearn.training``; nothing below imports them."""
