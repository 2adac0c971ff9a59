"""Benchmark scripts (see benchmarks/README.md) and what they share."""

import collections
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Sequence


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child_result(script: str, args: Sequence[str], what: str) -> Dict[str, Any]:
    """Runs ``python script *args`` in its own process (its peak memory its own, TF's
    logs silenced) and returns the JSON object its last line of output prints, which is
    echoed; ``what`` names the configuration in the error when it fails."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                         env=env)
    if out.returncode != 0:
        raise RuntimeError(f"configuration {what} failed with status {out.returncode}:\n"
                           f"{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(result), flush=True)
    return result


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


def time_steps(step: Callable[[Any], float], batches: Sequence[Any], steps: int,
               warmup: int, tasks: int, imported_mib: float) -> Dict[str, Any]:
    """Times a meta-step as every meta-step benchmark reports it (benchmarks/meta_step.py
    says what each field means): ``step`` runs one batch and returns its loss as a float
    (so it waits for the whole step); the first call (compilation) is timed on its own,
    then ``warmup`` untimed and ``steps`` timed calls over ``batches`` in turn."""
    before = rss_mib()
    start = time.perf_counter()
    step(batches[0])
    first = time.perf_counter() - start
    first_peak = peak_rss_mib()
    after_first = rss_mib()
    reset = reset_peak_rss()  # from here on the peak is the steady steps' own
    for i in range(warmup):
        step(batches[i % len(batches)])
    times, cpu_times = [], []
    loss = float("nan")
    for i in range(steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = step(batches[i % len(batches)])
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    times.sort()
    cpu_times.sort()
    median = times[len(times) // 2]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return dict(
        compile_s=round(first - median, 2), ms_median=round(1000 * median, 1),
        ms_min=round(1000 * times[0], 1), ms_max=round(1000 * times[-1], 1),
        cpu_ms_median=round(1000 * cpu_times[len(cpu_times) // 2], 1),
        tasks_per_s=round(tasks / median, 1),
        peak_rss_mib=round(peak), step_rss_mib=round(peak - before),
        import_rss_mib=round(imported_mib), before_step_rss_mib=round(before),
        first_call_peak_mib=round(first_peak), after_first_call_rss_mib=round(after_first),
        steady_peak_mib=round(peak_rss_mib()) if reset else None, loss=round(loss, 5))


# Events of the executor itself (and of whole functions), not kernels.
_NOT_KERNELS = ("Process", "ParallelFor", "EagerExecute", "EagerKernelExecute", "Run")


def op_times(xspace_bytes: bytes, steps: int) -> dict:
    """Per op type, the kernels' time (ms) and count per step over TensorFlow's compute
    threads (``tf_Compute`` lines of the host plane), from a serialised ``XSpace``."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    space = xplane_pb2.XSpace()
    space.ParseFromString(xspace_bytes)
    ms, count = collections.Counter(), collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name.split(":")[-1]
                if name in _NOT_KERNELS:
                    continue
                ms[name] += event.duration_ps / 1e9 / steps
                count[name] += 1 / steps
    return {name: (ms[name], count[name]) for name in ms}
