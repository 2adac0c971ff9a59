"""The peer harness (benchmarks/peers.py, peers_same_run.py) without PyTorch or JAX: its
shared pieces match metalearn's net, a missing framework is an error row, and the summary
computes its medians and ratios. The gradient comparison itself needs the peers'
environment: ``python -m benchmarks.peers --check`` there (benchmarks/README.md)."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

import metalearn
from benchmarks import peers, peers_same_run


def test_shared_weights_are_metalearn_conv_nets():
    model = metalearn.models.conv_net((28, 28, 1), 5, filters=4, blocks=4)
    weights = peers.initial_weights(filters=4, blocks=4)
    assert list(weights) == peers.weight_names(4)
    assert [v.path.split("/", 1)[1] for v in model.trainable_variables] == list(weights)
    assert [tuple(v.shape) for v in model.trainable_variables] == \
        [w.shape for w in weights.values()]
    assert model.layers[1].epsilon == peers.BN_EPSILON
    # TensorFlow's "same" padding of the stride-2 convs: 28 -> 14 -> 7 -> 4 -> 2
    assert peers.same_padding(28) == [(0, 1), (0, 1), (1, 1), (0, 1)]
    assert [tuple(l.output.shape[1:3]) for l in model.layers if l.name.startswith("conv")] \
        == [(14, 14), (7, 7), (4, 4), (2, 2)]


def test_episodes_are_meta_steps():
    data = peers.episodes(3)
    assert data["support_x"].shape == (3, 5, 28, 28, 1)
    assert data["query_x"].shape == (3, 75, 28, 28, 1)
    np.testing.assert_array_equal(data["query_y"][0], np.repeat(np.arange(5), 15))


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None,
                    reason="torch is installed here")
def test_a_missing_framework_is_an_error_row():
    config = dict(framework="pytorch", meta_batch=2, inner_steps=1, order="second",
                  threads=0)
    result = peers.measure(config, steps=1, warmup=0, timeout=120, python=sys.executable)
    assert "torch" in result["error"] and "--python" in result["error"]
    assert peers.measure(config, 1, 0, 60, python="/nonexistent/python")["error"].startswith(
        "cannot run")


def test_the_command_line_runs_without_the_frameworks():
    out = subprocess.run([sys.executable, "-m", "benchmarks.peers", "--help"],
                         capture_output=True, text=True, cwd=peers.ROOT)
    assert out.returncode == 0 and "--python" in out.stdout


def _row(runner, ms, peak, before=100, round_=0, **extra):
    return dict(runner=runner, meta_batch=8, inner_steps=1, order="second", round=round_,
                ms_median=ms, cpu_ms_median=ms, compile_s=1.0, peak_rss_mib=peak,
                first_call_peak_mib=peak - 10, before_step_rss_mib=before,
                steady_peak_mib=peak, **extra)


def test_summary_medians_and_ratios():
    rows = [_row("metalearn accumulate", ms, 400, round_=i) for i, ms in enumerate((90, 100, 300))]
    rows += [_row("pytorch", ms, 300, round_=i) for i, ms in enumerate((250, 200, 210))]
    rows += [_row("jax", 150, 500), dict(runner="jax_vmap", meta_batch=8, inner_steps=1,
                                         order="second", error="timed out after 1 s")]
    text = peers_same_run.summarize(rows)
    assert "| 8 | 1 | second | metalearn accumulate | 3/3 | 100.0 | 90.0 - 300.0 |" in text
    assert "| jax_vmap | 0/1 (timed out after 1 s) |" in text
    # best peer jax 150 / metalearn 100; peaks 400 / 300; step adds 300 / 200
    assert "| 8 | 1 | second | accumulate | 100.0 | jax | 150.0 | 1.50 | 1.33 | 1.50 |" in text


def test_runner_thread_suffix():
    assert peers_same_run.split_threads("pytorch:1") == ("pytorch", 1)
    assert peers_same_run.split_threads("metalearn accumulate") == ("metalearn accumulate", 0)
    assert peers_same_run.runners(["accumulate:1"], ["pytorch:1", "jax"]) == \
        ["metalearn accumulate:1", "pytorch:1", "jax"]


def test_profile_op_times_sum_kernels_per_step_over_compute_threads():
    """benchmarks.profile_step's reading of a profiler trace: kernels on tf_Compute lines,
    summed per op type and divided by the steps; executor events and other threads
    left out."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    from benchmarks import op_times  # not profile_step: its flags are global
    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    for i, name in enumerate(["Conv2D", "gradients/Mul:Mul", "Process"]):
        plane.event_metadata[i + 1].id = i + 1
        plane.event_metadata[i + 1].name = name
    events = {"tf_Compute/1": [(1, 4e9), (2, 1e9), (3, 9e9)],
              "tf_Compute/2": [(1, 2e9), (2, 1e9)], "python": [(1, 50e9)]}
    for line_name, rows in events.items():
        line = plane.lines.add(name=line_name)
        for metadata_id, ps in rows:
            line.events.add(metadata_id=metadata_id, duration_ps=int(ps))
    times = op_times(space.SerializeToString(), steps=2)
    assert times == {"Conv2D": (3.0, 1.0), "Mul": (1.0, 1.0)}
