"""Ray, the ``ray`` extra (part of the test extra): sweeps' runs as Ray tasks and the
Gymnasium collector's simulators as Ray actors, on one local instance for the module
(started by :func:`metalearn._ray.connect`, as both parts join Ray; each part finds it
joined and leaves it so)."""

import json
import os

import numpy as np
import pytest

from metalearn import _ray
from metalearn.rl import GymCollector, PendulumGravity
from metalearn.studies import sweeps
from tests.rl_fixtures import sampled_policy

# One worker runs the module: its tests share the instance (tests/conftest.py).
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def ray():
    ray, started = _ray.connect("local", "tests/ray_test.py")
    assert started
    yield ray
    ray.shutdown()


def test_sweep_runs_as_ray_tasks(ray, tmp_path):
    spec = sweeps.SweepSpec(["sinusoid/maml.gin"], [
        "Loop.num_steps = 4", "Experiment.meta_batch_size = 2", "mlp.hidden = (4,)"],
        {"Runtime.seed": ["1"]})
    root = str(tmp_path / "root")
    results = sweeps.run_sweep(spec, root, ray_address="local", log=lambda _: None)
    assert [r["status"] for r in results] == ["ran"]
    assert results[0]["pid"] != os.getpid()  # ran in a Ray worker process
    with open(os.path.join(root, "Runtime.seed=1", "metrics.json")) as f:
        assert json.load(f)["step"] == 4
    assert ray.is_initialized()  # the sweep found Ray joined: it left it so


def test_collection_on_ray_actors_is_bit_identical_to_in_process(ray):
    """The learner's stochastic policy in Pendulum at two gravities: the copies stepped
    by two Ray actors (two copies and one) give the trajectories of the copies stepped
    in this process, bit for bit; each actor ran in another process."""
    environment = PendulumGravity(horizon=5)
    policy = sampled_policy(environment, 3)
    here = GymCollector(environment, rollouts=3)
    actors = GymCollector(environment, rollouts=3, workers=2, ray_address="local")
    assert actors.env.sizes == [2, 1]
    pids = ray.get([a.__ray_call__.remote(lambda self: os.getpid())
                    for a in actors.env.workers.actors])
    assert os.getpid() not in pids and len(set(pids)) == 2, pids
    for gravity in (np.float32(6.0), np.float32(13.0)):
        one = here.collect(policy, gravity, [5, 8])
        two = actors.collect(policy, gravity, [5, 8])
        for field in ("observations", "actions", "rewards", "mask"):
            a, b = (getattr(r.trajectories, field) for r in (one, two))
            assert a.dtype == b.dtype and np.array_equal(a, b), (gravity, field)
        assert np.array_equal(one.log_probs, two.log_probs)
    here.close()
    actors.close()
    assert ray.is_initialized()  # the collector found Ray joined: it left it so
    with pytest.raises(RuntimeError, match="worker processes were ended"):
        actors.collect(policy, np.float32(6.0), [5, 8])
