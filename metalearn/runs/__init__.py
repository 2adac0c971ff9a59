"""Run management: the experiment a config builds, workdir files written atomically,
checks before any work, sweeps, results and their statistics."""
