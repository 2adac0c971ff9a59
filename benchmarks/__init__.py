"""Benchmark scripts (see benchmarks/README.md) and what they share."""


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def rss_mib() -> float:
    """This process's current resident memory in MiB (Linux ``/proc``)."""
    return _status_mib("VmRSS")


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB since it started or since the last
    :func:`reset_peak_rss` (``VmHWM``)."""
    return _status_mib("VmHWM")


def reset_peak_rss() -> bool:
    """Resets the peak that :func:`peak_rss_mib` reports to the current resident memory
    (Linux >= 4.0: ``5`` written to ``/proc/self/clear_refs``); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
