"""Benchmark scripts (see benchmarks/README.md) and what they share."""


def rss_mib() -> float:
    """This process's current resident memory in MiB (Linux ``/proc``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")
